"""The built-in tasks for pretrained models (tuner.inputs.tasks): right answers, rows every TRL trainer takes, and a
reward that scores right answers 1.0, never raises, and spreads a group's rewards. Training the tiny model on them
for real (GRPO with the reward, every other trainer on its rows) is tests/training/inputs/test_tasks_training.py."""

from __future__ import annotations

import math
import random
import re
import string

import pytest

from tuner.config.trainers import adapter
from tuner.inputs import tasks
from tuner.inputs.data import check_columns
from tuner.inputs.tasks import (
    FORMAT_CREDIT,
    exact_answer_reward,
    extract_answer,
    grpo_rows,
    kto_rows,
    make_tasks,
    preference_rows,
    sft_rows,
)


def rows(trainer: str, size: int = 256, seed: int = 0, conversational: bool = False):
    """The trainer entry's task rows as a Dataset (tuner.inputs.data.builtin_dataset builds them in standard format)."""
    from datasets import Dataset

    return Dataset.from_list(tasks.ROWS[adapter(trainer).rows](size, seed, conversational))


ALL_ROWS = [grpo_rows, preference_rows, kto_rows, sft_rows]


def _solve(question: str) -> str:
    """The answer to a task question, worked out here from its text alone (not by tuner.inputs.tasks)."""
    q = question
    if m := re.fullmatch(r"What is ([0-9]+(?: [-+*/] [0-9]+)+)\? Answer with the number only\.", q):
        value = eval(m.group(1), {"__builtins__": {}})  # digits, spaces and + - * / only: Python's precedence
        assert value == int(value)
        return str(int(value))
    if m := re.search(r"Each \w+ holds (\d+) \w+\. How many \w+ are in (\d+) of them\?", q):
        return str(int(m.group(1)) * int(m.group(2)))
    if m := re.search(r"\w+ has (\d+) \w+ and gives away (\d+)\.", q):
        return str(int(m.group(1)) - int(m.group(2)))
    if m := re.search(r"largest number in this list: ([\d, ]+)\?", q):
        return str(max(int(n) for n in m.group(1).split(", ")))
    if m := re.search(r"How many letters are in the word '(\w+)'\?", q):
        return str(len(m.group(1)))
    if m := re.search(r"How many times does the letter '(\w)' appear in the word '(\w+)'\?", q):
        return str(m.group(2).count(m.group(1)))
    if m := re.search(r"position of the letter '(\w)' in the English alphabet", q):
        return str(ord(m.group(1)) - ord("a") + 1)
    if m := re.search(r"Which letter comes right after '(\w)'", q):
        return chr(ord(m.group(1)) + 1)
    if m := re.search(r"Write the word '(\w+)' backwards", q):
        return "".join(reversed(m.group(1)))
    if m := re.search(r"Which word comes first in alphabetical order: '(\w+)' or '(\w+)'\?", q):
        return sorted([m.group(1), m.group(2)])[0]
    raise AssertionError(f"no solver for {q!r}")


def _question(prompt) -> str:
    if isinstance(prompt, list):
        return prompt[0]["content"]
    assert prompt.startswith("Question: ") and prompt.endswith("\nAnswer:")
    return prompt[len("Question: ") : -len("\nAnswer:")]


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


# ---- the tasks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_answer_is_right_and_every_near_miss_wrong(seed):
    tasks = make_tasks(1500, seed)
    for task in tasks:
        assert task.answer == _solve(task.question), task
        assert task.wrong and task.answer not in task.wrong and len(set(task.wrong)) == len(task.wrong), task
        assert task.question.isascii()  # the tiny model's tokenizer knows printable ASCII only
    # every kind of task occurs, and the mix holds number and word answers, easy and hard ones
    assert len({task.name for task in tasks}) == 15
    words = sum(not re.fullmatch(r"-?\d+", task.answer) for task in tasks)
    assert 0.05 < words / len(tasks) < 0.5
    assert len({len(task.answer) for task in tasks}) >= 4


def test_rows_are_deterministic_per_seed():
    for build in ALL_ROWS:
        for conversational in (False, True):
            assert build(40, 3, conversational) == build(40, 3, conversational)
            assert build(40, 3, conversational) != build(40, 4, conversational)
            assert build(40, 3, conversational)[:10] == build(10, 3, conversational)  # longer lists extend shorter
    assert rows("grpo", 16, 5).to_list() == rows("grpo", 16, 5).to_list()
    # the exact rows are pinned: the same on every machine and Python (string seeds, no hash randomisation)
    assert grpo_rows(2, 0)[1] == {"prompt": "Question: What is 47 + 32? Answer with the number only.\nAnswer:",
                                  "answer": "79"}


def test_every_kind_asks_the_same_questions_with_the_right_answers():
    size, seed = 60, 2
    grpo = grpo_rows(size, seed)
    questions = [_question(row["prompt"]) for row in grpo]
    for row in grpo:
        assert row["answer"] == _solve(_question(row["prompt"]))
    for conversational in (False, True):
        for build in (preference_rows, kto_rows, sft_rows):
            assert [_question(row["prompt"]) for row in build(size, seed, conversational)] == questions
        for row, q in zip(preference_rows(size, seed, conversational), questions, strict=True):
            assert _text(row["chosen"]).strip() == _solve(q) != _text(row["rejected"]).strip()
        for row, q in zip(sft_rows(size, seed, conversational), questions, strict=True):
            assert _text(row["completion"]).strip() == _solve(q)
        kto = kto_rows(size, seed, conversational)
        assert [row["label"] for row in kto] == [i % 2 == 0 for i in range(size)]  # balanced
        for row, q in zip(kto, questions, strict=True):
            assert (_text(row["completion"]).strip() == _solve(q)) is row["label"]
    # standard completions start with a space: TRL joins them to the prompt as prompt + completion
    assert all(row["chosen"].startswith(" ") and row["rejected"].startswith(" ") for row in preference_rows(9))


# ---- rows for TRL's trainers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("conversational", [False, True])
@pytest.mark.parametrize("trainer", ["grpo", "dpo", "kto", "reward", "sft"])
def test_rows_have_the_columns_their_trl_trainer_takes(trainer, conversational):
    from trl.data_utils import is_conversational

    dataset = rows(trainer, 16, 0, conversational)
    assert len(dataset) == 16
    check_columns(dataset, adapter(trainer), "built-in tasks")  # TRL 1.16's accepted column sets, and KTO's bool label
    expected = {
        "grpo": ["prompt", "answer"],
        "dpo": ["prompt", "chosen", "rejected"],
        "reward": ["prompt", "chosen", "rejected"],
        "kto": ["prompt", "completion", "label"],
        "sft": ["prompt", "completion"],
    }[trainer]
    assert dataset.column_names == expected
    assert is_conversational(dataset[0]) is conversational


def test_rows_kinds_and_bad_arguments():
    from tuner.errors import TunerError

    assert tasks.ROWS[adapter("dpo").rows] is tasks.ROWS[adapter("reward").rows] is preference_rows
    with pytest.raises(TunerError, match="unknown trainer 'ppo'"):
        rows("ppo", 4)
    with pytest.raises(TunerError, match="at least 1"):
        grpo_rows(0)


# ---- the reward ----------------------------------------------------------------------------------------------


def _chat(text):
    return [{"role": "assistant", "content": text}]


RIGHT = [" 42", "42", "42.", "The answer is 42.", "17 + 25 = 42", "**42**", "\\boxed{42}", "42.0", " 42\n",
         " 42\nQuestion: What is 1 + 1? Answer with the number only.\nAnswer: 2", "42<|im_end|>7"]


@pytest.mark.parametrize("wrap", [str, _chat], ids=["standard", "conversational"])
def test_reward_scores_right_answers_one(wrap):
    assert exact_answer_reward(completions=[wrap(c) for c in RIGHT], answer=["42"] * len(RIGHT)) == [1.0] * 11
    cases = [("-8", " -8"), ("-8", "25 - 33 = \u22128"), ("1234", "1,234"), ("1234", "It is 1234"),
             ("enots", "enots"), ("enots", "'stone' backwards is 'ENOTS'."), ("h", "h"), ("apple", " Apple")]
    answers, completions = zip(*cases, strict=True)
    assert exact_answer_reward(completions=[wrap(c) for c in completions], answer=list(answers)) == [1.0] * 8


@pytest.mark.parametrize("wrap", [str, _chat], ids=["standard", "conversational"])
def test_reward_scores_wrong_garbled_and_missing_answers_near_zero(wrap):
    bare_wrong = [" 43", "41", "-42", "4 2", "420"]  # "4 2" reads as its last number, 2: wrong but not bare
    garbled = ["", "   ", "I don't know", "forty-two", "42 is not it, 43", "x" * 500, "Answer: \n\nQuestion: 42"]
    scores = exact_answer_reward(completions=[wrap(c) for c in bare_wrong + garbled], answer="42")
    assert scores == [FORMAT_CREDIT] * 3 + [0.0] + [FORMAT_CREDIT] + [0.0] * len(garbled)
    # a word answer: another bare word gets the format credit, a number or a sentence nothing
    assert exact_answer_reward(completions=[wrap("stone"), wrap("7"), wrap("it is stone")], answer="enots") == [
        FORMAT_CREDIT, 0.0, 0.0]
    assert exact_answer_reward(completions=[wrap("42")], answer=[None]) == [0.0]
    assert exact_answer_reward(completions=[wrap("42")], answer=None) == [0.0]
    assert exact_answer_reward(completions=[wrap("42"), wrap("42")], answer=["42"]) == [1.0, 0.0]  # too few answers


def test_reward_odd_inputs_and_gsm8k_answers():
    assert exact_answer_reward() == []
    assert exact_answer_reward(completions=None, answer=["1"]) == []
    assert exact_answer_reward(completions=[None, 42, 4.2, b"42", {"content": "42"}, [], [{"role": "assistant"}]],
                               answer="42") == [0.0, 1.0, FORMAT_CREDIT, 1.0, 1.0, 0.0, 0.0]
    assert exact_answer_reward(completions=[[{"role": "assistant", "content": [{"type": "text", "text": "42"}]}]],
                               answer=[42]) == [1.0]
    assert exact_answer_reward(completions=["72", "so 72."], answer=["Natalia sold 48/2 = 24 ... #### 72"] * 2) == [
        1.0, 1.0]
    # TRL passes every other dataset column and its own extras as keywords
    assert exact_answer_reward(prompts=["p"], completions=["7"], answer=["7"], trainer_state=None,
                               completion_ids=[[1]], task="add") == [1.0]
    assert extract_answer("17 + 25 = 42\nQuestion: 3?") == "42"
    assert extract_answer("no digits") is None
    assert extract_answer("The word is enots.", "word") == "enots"


def _junk(rng: random.Random):
    alphabet = string.printable + "\u2212\u00e9\u4e2d\U0001f600\x00"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    choice = rng.randrange(9)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([0, -1, float("nan"), float("inf"), 1e308, True, object(), b"\xff\xfe", set()])
    if choice == 2:
        return [{"role": "assistant", "content": rng.choice([text, None, 5, [text], [{"text": None}], {}])}]
    if choice == 3:
        return [rng.choice([None, text, 3, {"content": text}, ["nested", [text]]])]
    if choice == 4:
        return {"role": rng.choice(["assistant", None]), "no_content": text}
    if choice == 5:
        return "9" * rng.randint(1, 400) + text  # huge numbers
    return text


def _junk_answer(rng: random.Random):
    return rng.choice([None, "", "42", "-3", "enots", "#### ", "####", "1,2,3", 7, 2.5, float("nan"), True, [1],
                       "\u4e2d", "9" * 400])


def test_reward_never_raises_on_junk():
    rng = random.Random(0)
    completions = [_junk(rng) for _ in range(1000)]
    answers = [_junk_answer(rng) for _ in range(1000)]
    scores = exact_answer_reward(prompts=None, completions=completions, answer=answers)
    assert len(scores) == 1000 and set(scores) <= {0.0, FORMAT_CREDIT, 1.0}
    for answer in (None, "42", ["42"], 3, object()):  # one answer for all, a short list, an odd object
        scores = exact_answer_reward(completions=completions, answer=answer)
        assert len(scores) == 1000 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert exact_answer_reward(completions=iter(["1", "2"]), answer="2") == [0.1, 1.0]
    assert exact_answer_reward(completions=5, answer="5") == []  # not a list: nothing to score, no error


def test_reward_spreads_a_mixed_group():
    # A GRPO group: one prompt, several completions, some right, some wrong; rewards must differ within it.
    for row in grpo_rows(30, 0) + grpo_rows(30, 0, conversational=True):
        answer = row["answer"]
        group = [f" {answer}", f"It is {answer}.", " 0" if answer != "0" else " 1", " zzz", "", f"{answer}x1"]
        if isinstance(row["prompt"], list):
            group = [_chat(c.strip()) for c in group]
        scores = exact_answer_reward(prompts=[row["prompt"]] * len(group), completions=group,
                                     answer=[answer] * len(group))
        assert scores[:2] == [1.0, 1.0] and scores[4] == 0.0, (row, scores)
        assert len(set(scores)) >= 2 and max(scores) - min(scores) >= 0.9
    # the rows' own chosen and rejected completions: right 1.0, near-miss 0.1
    batch = preference_rows(50, 1)
    answers = [row["chosen"].strip() for row in batch]
    assert exact_answer_reward(completions=[row["chosen"] for row in batch], answer=answers) == [1.0] * 50
    assert exact_answer_reward(completions=[row["rejected"] for row in batch], answer=answers) == [FORMAT_CREDIT] * 50


def test_reward_is_importable_by_dotted_path():
    import importlib

    from tuner.inputs.rewards import resolve_reward_funcs, reward_func_spec

    module, _, name = "tuner.inputs.tasks.exact_answer_reward".rpartition(".")
    assert getattr(importlib.import_module(module), name) is exact_answer_reward
    assert resolve_reward_funcs(["tuner.inputs.tasks.exact_answer_reward"]) == [exact_answer_reward]
    assert reward_func_spec(exact_answer_reward) == "tuner.inputs.tasks.exact_answer_reward"
