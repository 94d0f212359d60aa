"""Every trainer tuner supports trains for real inside a trial: TRL's own trainer on the tiny local model and
the built-in dataset, under the guard. Nothing here is mocked; settings are shrunk for speed only."""

from __future__ import annotations

import math

import pytest

from tuner.trial import TrialSpec, run_trial

MAX_STEPS = 6  # for speed: two timed steps after the 2 warm-up steps, and the fewest the learning judgement reads

# Small batches for speed; a learning rate high enough that 4 steps move the loss.
COMMON = {"per_device_train_batch_size": 4, "learning_rate": 1e-3}
EXTRA = {
    # for speed: 4 completions per prompt (the batch must be divisible by it) and 8 new tokens each
    "grpo": {"num_generations": 4, "max_completion_length": 8, "learning_rate": 1e-2},
    "dpo": {},
    "kto": {},
    "reward": {},
    "sft": {},
}
LORA = {"use_peft": True, "lora_r": 4, "lora_alpha": 8}  # rank 4 for speed


def _trial(trainer: str, tmp_path, **params):
    spec = TrialSpec(trainer=trainer, params={**COMMON, **EXTRA[trainer], **params}, max_steps=MAX_STEPS, seed=0)
    return run_trial(spec, workdir=tmp_path)


def _assert_trained(result) -> None:
    assert result.status == "ok", result.reason
    # One history row per optimizer step, in order: the guard saw every step.
    assert [row["step"] for row in result.history] == list(range(1, MAX_STEPS + 1))
    assert all(math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) for row in result.history)
    # The optimizer moved some trainable parameter at the first step (the monitor checks until they first move).
    assert result.history[0].get("params_changed") == 1.0
    assert all("params_changed" not in row for row in result.history[1:])
    assert result.steps_run == MAX_STEPS and result.stopped_at_step == MAX_STEPS
    assert result.tokens_per_second is not None and result.tokens_per_second > 0
    assert result.samples_per_second is not None and result.samples_per_second > 0


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["grpo", "dpo", "kto", "reward", "sft"])
def test_trainer_trains_for_real(trainer, tiny_model, tmp_path):
    result = _trial(trainer, tmp_path)
    _assert_trained(result)
    assert result.device == "cpu"
    assert result.progress is not None and math.isfinite(result.progress)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["reward", "grpo"])  # a SEQ_CLS adapter and a CAUSAL_LM one
def test_trainer_trains_lora_adapters(trainer, tiny_model, tmp_path):
    result = _trial(trainer, tmp_path, **LORA)
    _assert_trained(result)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["reward", "dpo"])
def test_lora_targets_matching_nothing_is_never_ok(trainer, tiny_model, tmp_path):
    # PEFT refuses an adapter that targets no module (NoMatchingPeftModuleError, a ValueError) while the
    # trainer is built, so the trial is a bad config ("invalid") and trains no step. Were PEFT ever to accept
    # it, nothing would be trainable and the guard's no-update rule would call it "collapsed": never "ok".
    result = _trial(trainer, tmp_path, **LORA, lora_target_modules=["nonexistent_proj"])
    assert result.status != "ok"
    assert result.status == "invalid", result.reason
    assert "target" in result.reason.lower()
    assert result.history == [] and result.steps_run == 0
