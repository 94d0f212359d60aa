"""The built-in tasks for pretrained models (tuner.inputs.tasks) trained on for real: the tiny model for 2 steps, GRPO
with the exact-answer reward, and every other trainer on its rows (the tasks and the reward themselves are
tests/unit/inputs/test_tasks.py)."""

from __future__ import annotations

import math

import pytest

from tuner.config.trainers import adapter
from tuner.inputs import tasks
from tuner.inputs.tasks import exact_answer_reward, grpo_rows


def rows(trainer: str, size: int = 256, seed: int = 0, conversational: bool = False):
    """The trainer entry's task rows as a Dataset (tuner.inputs.data.builtin_dataset builds them in standard format)."""
    from datasets import Dataset

    return Dataset.from_list(tasks.ROWS[adapter(trainer).rows](size, seed, conversational))


# ---- real training on the tiny model -------------------------------------------------------------------------


def _train(trainer: str, dataset, tmp_path, reward_funcs=None, **params) -> list[dict]:
    from tuner.inputs.models import resolve_model
    from tuner.trial.trainer import build_trainer

    run = {"max_steps": 2, "seed": 0, "output_dir": str(tmp_path / "out"), "use_cpu": True}
    built = build_trainer(adapter(trainer), resolve_model("tiny"), {"per_device_train_batch_size": 4, **params}, dataset,
                          run, reward_funcs=reward_funcs)
    built.train()
    return [log for log in built.state.log_history if "loss" in log]


@pytest.mark.slow
@pytest.mark.parametrize("conversational", [False, True])
def test_grpo_trains_on_the_tasks_with_the_reward(conversational, tiny_model, tmp_path):
    seen = []

    def recording_reward(prompts=None, completions=None, answer=None, **kwargs):
        scores = exact_answer_reward(prompts=prompts, completions=completions, answer=answer, **kwargs)
        seen.append((completions, answer, scores))
        return scores

    logs = _train("grpo", rows("grpo", 16, 0, conversational), tmp_path, [recording_reward],
                  num_generations=4, max_completion_length=8, learning_rate=1e-2)
    assert len(logs) == 2 and all(math.isfinite(log["loss"]) for log in logs)
    assert all(math.isfinite(log["reward"]) for log in logs)
    # TRL handed the reward the answer column, one answer per completion, and our reward scored each one
    completions, answer, scores = seen[0]
    assert len(completions) == len(answer) == len(scores) == 4
    assert all(a in {row["answer"] for row in grpo_rows(16, 0)} for a in answer)
    assert isinstance(completions[0], list if conversational else str)


@pytest.mark.slow
@pytest.mark.parametrize("conversational", [False, True])
@pytest.mark.parametrize("trainer", ["dpo", "kto", "reward", "sft"])
def test_other_trainers_train_on_their_rows(trainer, conversational, tiny_model, tmp_path):
    logs = _train(trainer, rows(trainer, 16, 0, conversational), tmp_path, learning_rate=1e-3)
    assert len(logs) == 2 and all(math.isfinite(log["loss"]) for log in logs)
