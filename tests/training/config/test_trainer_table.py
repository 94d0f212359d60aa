"""A trainer is one entry of tuner.config.trainers.ADAPTERS plus its space YAML: adding a sixth one touches nothing else.

The test registers a toy entry (TRL's SFT trainer under another name, with its own space file written here) and
drives it through what a user does: the CLI's --trainer choices, the space, the built-in data, a real trial via
`tuner trial --config`, the probe, and the export TRL's CLI reads. Nothing but the entry and the YAML is added.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from tuner import cli
from tuner.config import trainers
from tuner.config.space import load_space
from tuner.config.trainers import adapter
from tuner.inputs import data
from tuner.records import Status
from tuner.report import export

TOY = "toy"

SPACE = {
    "trainer": TOY,
    "fixed": {"max_length": 32},
    "params": {
        "precision": {"type": "categorical", "choices": ["fp32", "bf16-pure"]},
        "learning_rate": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
        "per_device_train_batch_size": {"type": "categorical", "choices": [4]},
    },
}


@pytest.fixture
def toy_trainer(tmp_path, monkeypatch):
    """The sixth trainer: one entry (a copy of SFT's under a new name) and its space YAML, nothing else."""
    space_file = tmp_path / "toy.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    entry = dataclasses.replace(trainers.ADAPTERS["sft"], name=TOY, space_file=str(space_file))
    monkeypatch.setitem(trainers.ADAPTERS, TOY, entry)
    return entry


def test_the_cli_offers_the_new_trainer(toy_trainer):
    args = cli.build_parser().parse_args(["search", "--trainer", TOY])
    assert args.trainer == TOY


def test_its_space_and_data_come_from_the_entry(toy_trainer):
    space = load_space(None, TOY)
    assert space.trainer == TOY and set(space.params) == set(SPACE["params"])
    rows = data.builtin_dataset(adapter(TOY), size=8)
    assert list(rows.column_names) in [list(c) for c in toy_trainer.columns]


def test_an_unknown_name_is_still_refused(toy_trainer):
    with pytest.raises(Exception, match="unknown trainer 'toy2'"):
        trainers.adapter("toy2")


@pytest.mark.slow
def test_a_trial_of_the_new_trainer_runs_through_tuner_trial(toy_trainer, tiny_model, tmp_path, monkeypatch,
                                                              capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trial.yaml").write_text(yaml.safe_dump({
        "trainer": TOY, "max_steps": 6,
        "params": {"precision": "fp32", "learning_rate": 5e-3, "per_device_train_batch_size": 4, "max_length": 32},
    }))
    code = cli.main(["trial", "--config", "trial.yaml"])
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert code == cli.EXIT_OK, out[-2000:]
    assert f"status:            {Status.OK}" in out
    assert [row["step"] for row in rows] == list(range(1, 7))


def test_the_export_of_the_new_trainer_is_a_config_of_its_trl_class(toy_trainer, tiny_model):
    config, _ = export.build(adapter(TOY), {"precision": "fp32", "learning_rate": 5e-3, "per_device_train_batch_size": 4},
                             str(tiny_model), space=load_space(None, TOY), on_cpu=True)
    fields = adapter(TOY).config_fields()
    assert config["learning_rate"] == 5e-3
    assert {k for k in config if k in fields} >= {"learning_rate", "per_device_train_batch_size", "bf16", "fp16"}
