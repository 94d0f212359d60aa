"""The built-in tasks of a real instruct model: single-digit sums in chat form, GRPO's reward for them, and SFT's replies.

    from tuner.inputs.sums import sum_rows, bare_sum_reward
    sum_rows(64)      # [{"prompt": [worked turn, {"role": "user", "content": "What is 3 + 4?"}], "answer": "7"}, ...]
    bare_sum_reward(completions=["7", "3 + 4 = 7", "8", "seven"], answer=["7"] * 4)   # [1.0, 0.6, 0.2, 0.0]

``tuner.inputs.data.builtin_dataset`` gives these rows to GRPO on any model but tuner's own tiny ones: the
exact-answer questions of ``tuner.inputs.tasks`` are too hard for a 135M model to move in a rung (SmolLM2-135M-Instruct's
reward went 0.037 to 0.085 in 30 LoRA steps at 1e-4), while these move within tens of steps (bench/RESULTS.md, "On a
real model"). A completion is read as ``tuner.inputs.tasks`` reads it (up to where it starts another turn).
"""

from __future__ import annotations

import random
from typing import Any

from tuner.errors import TunerError
from tuner.inputs.tasks import _NUMBER, _STRIP, _answer_text

__all__ = ["BARE_SUM_CREDIT", "BREVITY_CREDIT", "bare_sum_reward", "sum_rows", "sum_sft_rows"]

# One worked turn before the question: it shows the reply wanted (the bare number). Without it a 135M instruct model
# sampled at temperature 1.0 never answered bare (0 of 96 completions) and put the right sum last in 19%.
_SUMS_EXAMPLE = ({"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"})
BARE_SUM_CREDIT = {"bare and right": 1.0, "right, with words": 0.5, "bare and wrong": 0.2}
# Within "right, with words" a shorter answer scores up to this much more ("7." 1.0 > "= 7" > "3 + 4 = 7"): a
# group whose four completions all say the right sum in words still differs in reward. With flat levels such
# groups tie, GRPO gets no signal from them, and tuner's guard read 9 tied steps of a full fine-tune at 1e-5 on
# SmolLM2-135M-Instruct as a collapse at step 18, where the same run in TRL went on to the 1.0 ceiling.
BREVITY_CREDIT = 0.3


def sum_rows(size: int = 256, seed: int = 0) -> list[dict[str, Any]]:
    """GRPO rows of single-digit sums in chat form (``prompt``: messages, ``answer``: the sum), the same for the
    same ``(size, seed)``: the built-in GRPO task of a real instruct model (scored by ``bare_sum_reward``)."""
    if not isinstance(size, int) or size < 1:
        raise TunerError(f"built-in task count must be at least 1, but got {size=}")
    rng = random.Random(f"tuner.tasks.sums:{seed}")
    rows = []
    for _ in range(size):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"prompt": [*(dict(turn) for turn in _SUMS_EXAMPLE),
                                {"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return rows


# A short system turn: the chat template's own default (SmolLM2's names the model, ~16 tokens) would take the room of
# the reply in the shipped spaces' 64 tokens. It asks for JSON; the shape within it is what is learned.
_SFT_SYSTEM = {"role": "system", "content": "Reply in JSON."}


def sum_sft_rows(size: int = 256, seed: int = 0) -> list[dict[str, Any]]:
    """SFT rows of the same sums in chat form (``prompt``, ``completion``: messages), the reply in one fixed JSON
    shape (``{"question": "3 + 4", "sum": 7}``): the built-in SFT task of a real instruct model. An instruct model
    does not answer so by itself, and every reply has about a dozen tokens of that shape, so the loss falls well
    clear of its step-to-step noise within a first rung. Replies of 1-4 tokens (the questions of
    ``tuner.inputs.tasks``) left a 135M model's loss so noisy at batch 4 that a 41% fall over 20 steps, and 37%
    over 60, could not be told from noise (bench/RESULTS.md, "On a real model")."""
    if not isinstance(size, int) or size < 1:
        raise TunerError(f"built-in task count must be at least 1, but got {size=}")
    rng = random.Random(f"tuner.tasks.sums.sft:{seed}")
    rows = []
    for _ in range(size):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        reply = f'{{"question": "{a} + {b}", "sum": {a + b}}}'
        rows.append({"prompt": [dict(_SFT_SYSTEM), {"role": "user", "content": f"What is {a} + {b}?"}],
                     "completion": [{"role": "assistant", "content": reply}]})
    return rows


def bare_sum_reward(prompts: list | None = None, completions: list | None = None, answer: Any = None,
                    **kwargs) -> list[float]:
    """GRPO reward of ``sum_rows``: 1.0 for the bare right number ("7", "7."); for the right number said with words
    ("3 + 4 = 7": the last number read, as ``exact_answer_reward`` reads it) 0.5 plus up to BREVITY_CREDIT the
    fewer its words (0.7 for two words, 0.6 for "3 + 4 = 7"); 0.2 for a bare wrong number; else 0.0. The steps
    between them give a small model's groups a spread to learn from in its first tens of steps (the format first,
    then the sums). Never raises; one float per completion."""
    if completions is None:
        return []
    answers = list(answer) if isinstance(answer, (list, tuple)) else [answer] * len(completions)
    scores = []
    for completion, expected in zip(completions, answers):
        try:
            text = _answer_text(completion).strip(_STRIP)
            numbers = _NUMBER.findall(text)
            right = str(expected).strip()
            if text == right:
                scores.append(BARE_SUM_CREDIT["bare and right"])
            elif numbers and numbers[-1] == right:
                words = max(2, len(text.split()))
                scores.append(BARE_SUM_CREDIT["right, with words"] + BREVITY_CREDIT * 2 / (words + 1))
            elif _NUMBER.fullmatch(text):
                scores.append(BARE_SUM_CREDIT["bare and wrong"])
            else:
                scores.append(0.0)
        except Exception:  # noqa: BLE001 - a reward must not end a training run over one odd completion
            scores.append(0.0)
    return scores
