"""tuner.inputs.sums: GRPO's built-in task for a real instruct model (chat sums) and its reward; pure, no model."""

from __future__ import annotations

import re

import pytest

from tuner.config.trainers import adapter
from tuner.inputs import sums
from tuner.inputs.data import check_columns


def test_sum_rows_are_chat_prompts_with_their_sums_and_the_same_per_seed():
    rows = sums.sum_rows(64, seed=3)
    assert rows == sums.sum_rows(64, seed=3) and rows != sums.sum_rows(64, seed=4)
    for row in rows:
        question = row["prompt"][-1]["content"]
        a, b = map(int, re.fullmatch(r"What is (\d) \+ (\d)\?", question).groups())
        assert row["answer"] == str(a + b)
        # the worked turn before it shows the reply wanted: a bare number
        assert [turn["role"] for turn in row["prompt"]] == ["user", "assistant", "user"]
    check_columns(builtin_rows_for_grpo(), adapter("grpo"), "the sums")


def builtin_rows_for_grpo():
    from tuner.inputs.data import builtin_dataset

    return builtin_dataset(adapter("grpo"), size=8, tiny=False, real=True)


def test_a_real_model_gets_the_sums_for_grpo_and_sft_only():
    from tuner.inputs.data import builtin_dataset

    assert builtin_rows_for_grpo().to_list() == sums.sum_rows(8)
    sft = builtin_dataset(adapter("sft"), size=8, tiny=False, real=True).to_list()
    assert sft == sums.sum_sft_rows(8) and sft != builtin_dataset(adapter("sft"), size=8, tiny=False).to_list()
    # the other trainers keep the questions: their learning shows on them within a rung already
    for trainer in ("dpo", "kto", "reward"):
        assert builtin_dataset(adapter(trainer), size=8, tiny=False, real=True).to_list() == \
            builtin_dataset(adapter(trainer), size=8, tiny=False).to_list()


def test_the_sft_sums_reply_in_one_json_shape_whose_sum_is_right():
    import json

    rows = sums.sum_sft_rows(64, seed=3)
    assert rows == sums.sum_sft_rows(64, seed=3) and rows != sums.sum_sft_rows(64, seed=4)
    for row in rows:
        question = row["prompt"][-1]["content"]
        reply = json.loads(row["completion"][0]["content"])
        a, b = (int(x) for x in question.removeprefix("What is ").removesuffix("?").split(" + "))
        assert reply == {"question": f"{a} + {b}", "sum": a + b}
        assert [turn["role"] for turn in row["prompt"]] == ["system", "user"]


@pytest.mark.parametrize("wrap", [lambda t: t, lambda t: [{"role": "assistant", "content": t}]])
def test_bare_sum_reward_orders_bare_right_over_shorter_wordy_right_over_longer_over_bare_wrong(wrap):
    completions = ["7", "7.", " 7 ", "7<|im_end|>", "is 7", "3 + 4 = 7", "The sum of 3 and 4 is 7.", "8", "seven", "",
                   "3 + 4 = 8"]
    scores = sums.bare_sum_reward(completions=[wrap(c) for c in completions], answer=["7"] * len(completions))
    assert scores[:4] == [1.0] * 4 and scores[7:] == [0.2, 0.0, 0.0, 0.0]
    wordy = scores[4:7]
    # the right sum in words: above a bare wrong number, below the bare answer, and the shorter the higher, so a
    # group of four wordy right answers is not a tie
    assert 0.5 < wordy[2] < wordy[1] < wordy[0] <= 0.5 + sums.BREVITY_CREDIT


def test_bare_sum_reward_never_raises_on_junk():
    assert sums.bare_sum_reward(completions=None) == []
    assert sums.bare_sum_reward(completions=[None, {"content": None}, ["x"], object()], answer="7") == [0.0] * 4
