"""Built-in tasks a pretrained model can learn from: short questions with one exact answer, generated offline.

    from tuner.inputs.tasks import grpo_rows, exact_answer_reward
    grpo_rows(64, seed=0)                  # [{"prompt": "Question: What is 17 + 25? ...\\nAnswer:", "answer": "42"}, ...]
    preference_rows(64)                    # prompt, chosen " 42", rejected " 43" (DPO and reward models)
    kto_rows(64)                           # prompt, completion, label (True/False, half and half)
    sft_rows(64)                           # prompt, completion " 42"
    grpo_rows(64, conversational=True)     # prompt [{"role": "user", "content": "What is 17 + 25? ..."}]
    exact_answer_reward(completions=[" 42", "43", "I don't know"], answer=["42", "42", "42"])  # [1.0, 0.1, 0.0]

Each trainer entry (``tuner.config.trainers``) names its task rows; ``tuner.inputs.data.builtin_dataset`` builds them for any
model but the embedded tiny one, whose own task is ``tuner.inputs._tiny_data``.

**Tasks.** Small arithmetic (sums, differences, products, exact division, a + b * c, word problems, the largest
of a list) and string tasks (letters in a word, how often a letter occurs, a letter's place in the alphabet, the
next letter, a word backwards, which of two words sorts first). Difficulty is mixed on purpose: a 0.5B instruct
model answers "7 + 5" and "the letter after g" but often misses "47 * 86", "how many r in strawberry" or "stone
backwards", so completions for one prompt get different rewards, the spread GRPO learns from. Every answer is
one number or one word, and each question says so ("Answer with the number only.").

**One generator.** For a given seed every kind of rows asks the same questions in the same order; only the
layout differs (``sft_rows(8, 3)`` teaches the answers ``grpo_rows(8, 3)`` asks for). Wrong answers
(DPO/reward ``rejected``, KTO's undesirable completions) are plausible near-misses: off by one or ten, the
other word of a pair, the word not reversed. Rows are the same on every machine and Python (string seeds).

**Formats.** Standard (default): plain-text prompts ending in "\\nAnswer:" and completions starting with a
space, since TRL joins them as ``prompt + completion``; this works for every model, base or instruct, with or
without a chat template. ``conversational=True``: role/content messages, which TRL renders with the model's
chat template (better for instruct models; needs a tokenizer with a chat template).

**Reward.** ``exact_answer_reward`` is 1.0 when the completion's final answer equals the row's ``answer``,
FORMAT_CREDIT (0.1) when it is wrong but a bare answer of the right kind, else 0.0; see its docstring.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.errors import TunerError

__all__ = [
    "FORMAT_CREDIT",
    "Task",
    "exact_answer_reward",
    "extract_answer",
    "grpo_rows",
    "kto_rows",
    "make_tasks",
    "preference_rows",
    "sft_rows",
]

# Reward for a wrong answer that is still what the question asked for: a bare number (or word), nothing else.
# Early in training, or on hard questions, every completion of a group can be wrong; this keeps a group's
# rewards apart (terse wrong answers over rambling ones), so GRPO has a signal towards the asked format until
# answers start to be right. Small, so a right answer (1.0) always outweighs it.
FORMAT_CREDIT = 0.1


@dataclass(frozen=True)
class Task:
    """One question with its exact answer and plausible wrong answers (for rejected / undesirable rows)."""

    question: str  # ends with what to answer with: "Answer with the number only."
    answer: str  # one number ("42", "-8") or one lowercase word ("enots", "h")
    wrong: tuple[str, ...]  # distinct near-misses, none equal to ``answer``
    name: str  # the generator: "add", "reverse", ...


# ---- task generators: each takes a Random and returns a Task -------------------------------------------------

_NUMBER_ONLY = "Answer with the number only."

_WORDS = [
    "apple", "banana", "bottle", "bridge", "candle", "carpet", "castle", "cherry", "coffee", "cotton",
    "dragon", "engine", "farmer", "forest", "garden", "guitar", "hammer", "island", "jacket", "kettle",
    "ladder", "lemon", "letter", "market", "mirror", "monkey", "needle", "orange", "pencil", "pepper",
    "planet", "pocket", "rabbit", "river", "rocket", "saddle", "silver", "spring", "stone", "strawberry",
    "summer", "table", "tomato", "tunnel", "turtle", "valley", "window", "winter", "yellow", "zipper",
    "blanket", "chicken", "dolphin", "elephant", "mountain", "notebook", "penguin", "pillow", "teacher",
    "umbrella", "village", "whistle",
]  # fmt: skip
_ITEMS = [("apples", "basket"), ("pencils", "box"), ("eggs", "carton"), ("books", "shelf"), ("cookies", "jar"),
          ("marbles", "bag"), ("stamps", "album"), ("chairs", "row")]
_NAMES = ["Sam", "Mia", "Tom", "Ana", "Leo", "Zoe", "Max", "Ivy"]


def _near_misses(rng: random.Random, answer: int) -> tuple[str, ...]:
    """Distinct wrong numbers close to ``answer``: off by one, by two, by ten, or its last two digits swapped."""
    candidates = [answer + 1, answer - 1, answer + 10, answer - 10, answer + 2]
    digits = str(abs(answer))
    if len(digits) >= 2 and digits[-1] != digits[-2]:
        swapped = int(digits[:-2] + digits[-1] + digits[-2])
        candidates.append(-swapped if answer < 0 else swapped)
    rng.shuffle(candidates)
    # a negative near-miss only for a negative answer: "-2" is no plausible slip for "80 / 10"
    return tuple(dict.fromkeys(str(c) for c in candidates if c != answer and (c >= 0 or answer < 0)))


def _number_task(rng: random.Random, name: str, question: str, answer: int) -> Task:
    return Task(f"{question} {_NUMBER_ONLY}", str(answer), _near_misses(rng, answer), name)


def _add(rng: random.Random) -> Task:
    a, b = rng.randint(2, 49), rng.randint(2, 49)
    return _number_task(rng, "add", f"What is {a} + {b}?", a + b)


def _add_large(rng: random.Random) -> Task:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return _number_task(rng, "add_large", f"What is {a} + {b}?", a + b)


def _subtract(rng: random.Random) -> Task:
    a, b = rng.randint(10, 99), rng.randint(2, 99)  # sometimes negative
    return _number_task(rng, "subtract", f"What is {a} - {b}?", a - b)


def _multiply_small(rng: random.Random) -> Task:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return _number_task(rng, "multiply_small", f"What is {a} * {b}?", a * b)


def _multiply(rng: random.Random) -> Task:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    return _number_task(rng, "multiply", f"What is {a} * {b}?", a * b)


def _divide(rng: random.Random) -> Task:
    b, quotient = rng.randint(2, 12), rng.randint(2, 25)
    return _number_task(rng, "divide", f"What is {b * quotient} / {b}?", quotient)


def _two_step(rng: random.Random) -> Task:
    a, b, c = rng.randint(2, 30), rng.randint(2, 12), rng.randint(2, 12)
    return _number_task(rng, "two_step", f"What is {a} + {b} * {c}?", a + b * c)


def _word_problem(rng: random.Random) -> Task:
    name = rng.choice(_NAMES)
    items, holder = rng.choice(_ITEMS)
    if rng.random() < 0.5:
        each, count = rng.randint(3, 15), rng.randint(2, 9)
        question = f"Each {holder} holds {each} {items}. How many {items} are in {count} of them?"
        return _number_task(rng, "word_problem", question, each * count)
    have, give = rng.randint(10, 60), rng.randint(2, 9)
    question = f"{name} has {have} {items} and gives away {give}. How many {items} does {name} have left?"
    return _number_task(rng, "word_problem", question, have - give)


def _largest(rng: random.Random) -> Task:
    numbers = rng.sample(range(1, 100), rng.randint(4, 6))
    listed = ", ".join(map(str, numbers))
    task = _number_task(rng, "largest", f"What is the largest number in this list: {listed}?", max(numbers))
    second = sorted(numbers)[-2]  # the likeliest wrong answer comes first
    return Task(task.question, task.answer, (str(second), *[w for w in task.wrong if w != str(second)]), task.name)


def _word_length(rng: random.Random) -> Task:
    word = rng.choice(_WORDS)
    return _number_task(rng, "word_length", f"How many letters are in the word '{word}'?", len(word))


def _letter_count(rng: random.Random) -> Task:
    word = rng.choice(_WORDS)
    repeated = [c for c in sorted(set(word)) if word.count(c) > 1]
    letter = rng.choice(repeated or sorted(set(word)))  # a repeated letter when there is one: harder
    question = f"How many times does the letter '{letter}' appear in the word '{word}'?"
    return _number_task(rng, "letter_count", question, word.count(letter))


def _alphabet_position(rng: random.Random) -> Task:
    letter = rng.choice(string.ascii_lowercase)
    question = f"What is the position of the letter '{letter}' in the English alphabet, counting a as 1?"
    return _number_task(rng, "alphabet_position", question, string.ascii_lowercase.index(letter) + 1)


def _next_letter(rng: random.Random) -> Task:
    index = rng.randrange(len(string.ascii_lowercase) - 1)
    letter, answer = string.ascii_lowercase[index], string.ascii_lowercase[index + 1]
    wrong = [string.ascii_lowercase[i] for i in (index, index - 1, index + 2) if 0 <= i < 26]
    question = f"Which letter comes right after '{letter}' in the alphabet? Answer with the letter only."
    return Task(question, answer, tuple(wrong), "next_letter")


def _reverse(rng: random.Random) -> Task:
    word = rng.choice(_WORDS)
    answer = word[::-1]
    # near-misses: the word itself, the reversal with one pair of neighbours swapped, the reversal cut short
    i = rng.randrange(len(answer) - 1)
    swapped = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
    wrong = [w for w in dict.fromkeys([word, swapped, answer[:-1]]) if w != answer]
    question = f"Write the word '{word}' backwards. Answer with the reversed word only."
    return Task(question, answer, tuple(wrong), "reverse")


def _alphabetical(rng: random.Random) -> Task:
    first, second = rng.sample(_WORDS, 2)
    answer, other = min(first, second), max(first, second)
    question = f"Which word comes first in alphabetical order: '{first}' or '{second}'? Answer with the word only."
    return Task(question, answer, (other,), "alphabetical")


# (generator, weight): about a third easy, a third medium, a third hard for a 0.5B instruct model.
_GENERATORS: list[tuple[Callable[[random.Random], Task], int]] = [
    (_add, 3), (_multiply_small, 2), (_next_letter, 1), (_alphabetical, 1), (_largest, 1),  # easy
    (_subtract, 2), (_add_large, 2), (_divide, 2), (_word_problem, 2), (_word_length, 1),  # medium
    (_alphabet_position, 1),
    (_multiply, 2), (_two_step, 2), (_letter_count, 1), (_reverse, 1),  # hard
]  # fmt: skip


def make_tasks(size: int, seed: int = 0) -> list[Task]:
    """``size`` tasks, the same for the same ``(size, seed)``; a longer list starts with the shorter one."""
    if not isinstance(size, int) or size < 1:
        raise TunerError(f"built-in task count must be at least 1, but got {size=}")
    rng = random.Random(f"tuner.tasks:{seed}")  # a string seed is hashed deterministically (not by PYTHONHASHSEED)
    generators = [generator for generator, _ in _GENERATORS]
    weights = [weight for _, weight in _GENERATORS]
    return [rng.choices(generators, weights)[0](rng) for _ in range(size)]


# ---- rows for each TRL trainer -------------------------------------------------------------------------------


def _prompt(task: Task, conversational: bool) -> str | list[dict[str, str]]:
    if conversational:
        return [{"role": "user", "content": task.question}]
    return f"Question: {task.question}\nAnswer:"


def _completion(text: str, conversational: bool) -> str | list[dict[str, str]]:
    if conversational:
        return [{"role": "assistant", "content": text}]
    return " " + text  # TRL joins standard prompt and completion as prompt + completion


def grpo_rows(size: int = 256, seed: int = 0, conversational: bool = False) -> list[dict[str, Any]]:
    """GRPO rows: ``prompt`` and ``answer`` (a string); TRL passes ``answer`` to reward functions as a keyword."""
    return [{"prompt": _prompt(t, conversational), "answer": t.answer} for t in make_tasks(size, seed)]


def preference_rows(size: int = 256, seed: int = 0, conversational: bool = False) -> list[dict[str, Any]]:
    """DPO and reward-model rows: ``prompt``, ``chosen`` (the right answer), ``rejected`` (a near-miss)."""
    wrong = random.Random(f"tuner.tasks.wrong:{seed}")
    return [
        {"prompt": _prompt(t, conversational), "chosen": _completion(t.answer, conversational),
         "rejected": _completion(wrong.choice(t.wrong), conversational)}
        for t in make_tasks(size, seed)
    ]


def kto_rows(size: int = 256, seed: int = 0, conversational: bool = False) -> list[dict[str, Any]]:
    """KTO rows: ``prompt``, ``completion``, ``label`` (bool): the right answer (True) on even rows, a near-miss
    (False) on odd ones, so desirable and undesirable are balanced as KTO's default weights expect."""
    wrong = random.Random(f"tuner.tasks.wrong:{seed}")
    out = []
    for i, task in enumerate(make_tasks(size, seed)):
        desirable = i % 2 == 0
        text = task.answer if desirable else wrong.choice(task.wrong)
        out.append({"prompt": _prompt(task, conversational), "completion": _completion(text, conversational),
                    "label": desirable})
    return out


def sft_rows(size: int = 256, seed: int = 0, conversational: bool = False) -> list[dict[str, Any]]:
    """SFT rows in prompt-completion form (TRL trains on the completion only): the right answer."""
    return [{"prompt": _prompt(t, conversational), "completion": _completion(t.answer, conversational)}
            for t in make_tasks(size, seed)]


# The task rows by shape (a trainer entry's ``rows``): (size, seed, conversational) -> rows.
ROWS = {"prompt": grpo_rows, "preference": preference_rows, "unpaired": kto_rows, "completion": sft_rows}


# ---- the reward ----------------------------------------------------------------------------------------------

# Where a completion stops answering: a base model given "Question: ...\nAnswer:" often goes on to write the
# next question and its answer; those numbers are not its answer. Also chat and end-of-text markers, should a
# completion be decoded with its special tokens.
_CONTINUATION = re.compile(
    r"\n\s*(?:question|q|user|human|instruction|problem)\s*:|<\|im_end\|>|<\|im_start\|>|<\|endoftext\|>"
    r"|<\|eot_id\|>|</s>",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")  # 42, -8, 1,234, 42.0
_WORD = re.compile(r"[A-Za-z]+")
_STRIP = "".join(c for c in string.punctuation if c != "-") + string.whitespace  # around a bare answer


def _text(completion: Any) -> str:
    """A completion's text: a string, a message dict, or a list of messages (conversational)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content")
        if isinstance(content, list):  # content parts: [{"type": "text", "text": "..."}]
            return " ".join(str(part.get("text") or "") if isinstance(part, dict) else _text(part)
                            for part in content)
        return "" if content is None else str(content)
    if isinstance(completion, (list, tuple)):
        return "\n".join(_text(message) for message in completion)
    return str(completion)


def _answer_text(completion: Any) -> str:
    text = _text(completion).replace("\u2212", "-")  # a typographic minus sign is a minus
    cut = _CONTINUATION.search(text)
    return text[: cut.start()] if cut else text


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _expected(answer: Any) -> tuple[str, float | str] | None:
    """("number", value) or ("word", lowercase word) for a row's answer; None when there is none.

    GSM8K-style answers ("... #### 72") count by the part after the last "####"."""
    if answer is None or isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        return ("number", float(answer))
    text = str(answer).rsplit("####", 1)[-1].strip().strip(_STRIP)
    if not text:
        return None
    number = _as_number(text) if _NUMBER.fullmatch(text) else None
    if number is not None:
        return ("number", number)
    return ("word", text.lower())


def extract_answer(completion: Any, kind: str = "number") -> str | None:
    """The final answer written in ``completion`` (kind "number": the last number, "word": the last word),
    read up to where the completion starts another question or turn; None when there is none."""
    text = _answer_text(completion)
    found = (_NUMBER if kind == "number" else _WORD).findall(text)
    return found[-1] if found else None


def _score(completion: Any, answer: Any) -> float:
    expected = _expected(answer)
    if expected is None:
        return 0.0
    kind, value = expected
    given = extract_answer(completion, kind)
    if given is None:
        return 0.0
    if kind == "number":
        number = _as_number(given)
        # kind "number": value is a float, which mypy cannot tell from kind; the code is left as the recipe's
        # fingerprint (bench/studies/tiny_pretrained.py) has it
        right = number is not None and abs(number - value) <= 1e-9 * max(1.0, abs(value))  # type: ignore[operator, arg-type]
    else:
        right = given.lower() == value
    if right:
        return 1.0
    bare = _answer_text(completion).strip(_STRIP)
    well_formed = _NUMBER.fullmatch(bare) if kind == "number" else _WORD.fullmatch(bare)
    return FORMAT_CREDIT if well_formed else 0.0


def exact_answer_reward(prompts: list | None = None, completions: list | None = None, answer: Any = None,
                        **kwargs) -> list[float]:
    """GRPO reward for rows with an ``answer`` column (``grpo_rows``; GSM8K-style "... #### 72" works too).

    Per completion (a string, or a list of {"role", "content"} messages):

    - the completion is read up to where it starts another question or chat turn ("\\nQuestion:", "<|im_end|>");
    - a number answer is matched by the LAST number in it (commas in 1,234 and a "-" sign understood; 42.0 = 42),
      so "17 + 25 = 42" and "The answer is 42." are right; a word answer by the last word, case-insensitive;
    - 1.0 when that equals the answer; FORMAT_CREDIT (0.1) when it is wrong but the whole completion is a bare
      number (or word), as the question asks; 0.0 otherwise.

    Never raises: a None, empty or non-text completion, or a missing answer, scores 0.0. ``answer`` is a list with
    one answer per completion (as TRL passes dataset columns) or one answer for all. Returns one float per
    completion.
    """
    if completions is None:
        return []
    if isinstance(completions, (str, dict)):
        completions = [completions]
    try:
        completions = list(completions)
    except Exception:  # noqa: BLE001 - not iterable: nothing to score
        return []
    if isinstance(answer, (list, tuple)):
        answers = list(answer)
    else:
        answers = [answer] * len(completions)
    scores = []
    for i, completion in enumerate(completions):
        try:
            scores.append(_score(completion, answers[i] if i < len(answers) else None))
        except Exception:  # noqa: BLE001 - a reward must not end a training run over one odd completion
            scores.append(0.0)
    return scores
