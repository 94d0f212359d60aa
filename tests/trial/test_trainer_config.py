"""A trial's TRL config (tuner.trial.trainer.current_names): built under transformers' current argument names, the
same settings as TRL's old names and defaults give, with no deprecation warning in every trial's log."""

from __future__ import annotations

import warnings

import pytest

from tuner.config.trainers import ADAPTERS
from tuner.trial.trainer import current_names


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
