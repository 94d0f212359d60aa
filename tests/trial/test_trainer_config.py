"""A trial's TRL config (tuner.trial.trainer.current_names): built under transformers' current argument names, the
same settings as TRL's old names and defaults give, with no deprecation warning in every trial's log; and a trial's
training (tuner.trial.trainer.trained_quietly) without the warnings of TRL's own calls to the renamed methods."""

from __future__ import annotations

import warnings

import pytest

from tuner.config.trainers import ADAPTERS
from tuner.trial.trainer import current_names, trained_quietly


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_a_trials_config_keeps_trls_checkpointing_default_without_a_warning(tmp_path, name):
    config_type = ADAPTERS[name].config_type()
    args = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_type(**current_names(config_type, args))
    said = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert not said, said
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = config_type(**args)  # the old way, TRL's default through its old name
    assert config.activation_checkpointing == old.activation_checkpointing
    assert config.gradient_checkpointing == old.gradient_checkpointing  # still readable under the old name


def test_a_users_old_names_are_carried_under_the_new_ones(tmp_path):
    config_type = ADAPTERS["sft"].config_type()
    args = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "gradient_checkpointing": False,
            "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    config = config_type(**current_names(config_type, args))
    assert config.activation_checkpointing is False
    assert config.activation_checkpointing_kwargs == {"use_reentrant": False}


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


def test_only_trls_calls_to_the_renamed_methods_are_quiet_while_a_trial_trains():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trained_quietly():
            for method in ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable"):
                warnings.warn(f"`{method}` is deprecated and will be removed in v6. Use `...` instead.", FutureWarning)
            # the config's old argument name is tuner's to avoid (current_names), not to hide
            warnings.warn("`gradient_checkpointing` is deprecated and will be removed in v6. Use "
                          "`activation_checkpointing` instead.", FutureWarning)
            warnings.warn("`is_gradient_checkpointing` is deprecated", DeprecationWarning)  # another category
    assert [(w.category, str(w.message).split()[0]) for w in caught] == [
        (FutureWarning, "`gradient_checkpointing`"), (DeprecationWarning, "`is_gradient_checkpointing`")]
