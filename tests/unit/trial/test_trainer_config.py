"""A trial's TRL config (tuner.trial.trainer.current_names): built under transformers' current argument names, the
same settings as TRL's old names and defaults give, with no deprecation warning in every trial's log; and the filter
(tuner.trial.trainer.trained_quietly) that quiets TRL's own calls to the renamed methods, on warnings raised here
(real trials under it are tests/training/trial/test_trainer_config_training.py)."""

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
