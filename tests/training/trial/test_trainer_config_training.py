"""A trial's training (tuner.trial.trainer.trained_quietly) on the tiny model without the warnings of TRL's and PEFT's
own calls to transformers' renamed checkpointing methods (the config's names, and the filter on its own, are
tests/unit/trial/test_trainer_config.py)."""

from __future__ import annotations

import warnings

import pytest

# Trials in which a library calls transformers' renamed checkpointing methods: TRL's GRPO around each generation,
# its DPO (and KTO) around each reference pass, PEFT as it wraps a model for LoRA. One step each on the tiny model,
# a few seconds.
CALLS_RENAMED = {
    "grpo": ("grpo", {"learning_rate": 1e-4, "per_device_train_batch_size": 4, "num_generations": 4,
                      "max_completion_length": 8}),
    "dpo": ("dpo", {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_length": 32}),
    "reward-lora": ("reward", {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_length": 32,
                               "use_peft": True}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CALLS_RENAMED))
def test_a_tiny_trial_trains_without_a_checkpointing_future_warning(tiny_model, case):
    from tuner.trial import TrialSpec, run_trial

    trainer, params = CALLS_RENAMED[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_trial(TrialSpec(trainer=trainer, params=params, max_steps=1))
        # the trial's filter is gone once it has trained (the libraries it imported may have added their own)
        assert not [f for f in warnings.filters if f[1] is not None and "gradient_checkpointing_enable" in f[1].pattern]
    assert result.status == "ok" and result.steps_run == 1, result.reason
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]
    assert not said, said
