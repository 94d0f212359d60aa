"""The user's paths through a real search: a relative dataset, reward module and space file from the user's folder reach
trials that Ray runs in working directories of their own. The rest of the user's inputs (typed values, rewards probed
before any trial, errors told with their place), on real trials without a search, is
tests/training/inputs/test_inputs.py; the files and the in-process `tuner` below are the same as there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import USER_REWARDS as REWARDS
from helpers import tuner_in as tuner

from tuner.config.trainers import adapter
from tuner.inputs.data import builtin_dataset

STORE = "mlflow"  # relative: each test runs in its own tmp_path, so the store would appear there

# GRPO prompts of the user's own (with a column a reward can read); 8 rows: the probe reads 4, a trial a few.
PROMPTS = "".join(json.dumps({"prompt": row["prompt"], "solution": "4"}) + "\n"
                  for row in builtin_dataset(adapter("grpo"), size=8).to_list())


def grpo_search(*args: str) -> tuple[str, ...]:
    return ("search", "--store", STORE, "--dataset", "prompts.jsonl", *args)


# -- paths are the user's paths ----------------------------------------------------------------------------------

# One grid point: grpo is the space's trainer (no --trainer on the command line), and the fixed and searched
# numbers are spelled as people write them (PyYAML reads 1e-2 and 2e-3 as strings). Small so the search takes
# seconds: batch 2 x 2 generations of 6 tokens.
E2E_SPACE = """\
trainer: grpo
fixed:
  per_device_train_batch_size: 2
  num_generations: 2
  max_completion_length: 6
  weight_decay: 1e-2
  use_peft: false
  activation_checkpointing: false
params:
  precision: {type: categorical, choices: [fp32]}
  learning_rate: {type: categorical, choices: [2e-3]}
"""


@pytest.mark.slow
def test_relative_paths_search_from_another_folder_runs_ok_trials(tiny_model, tmp_path, monkeypatch, capsys):
    """The issue's case: a relative dataset (and reward module, and space file) from the user's folder; Ray runs
    each trial in its own working directory, where those relative paths do not exist."""
    folder = tmp_path / "project"
    folder.mkdir()
    code, out, err = tuner(
        folder, monkeypatch, capsys,
        *grpo_search("--reward-func", "my_rewards:length", "--search-space", "space.yaml", "--sampler", "grid",
                     "--max-steps", "3",  # 3 steps: enough to run the trainer for real; the guard needs no more
                     "--confirm-seeds", "0", "--budget", "0", "--experiment", "relative"),
        files={"prompts.jsonl": PROMPTS, "my_rewards.py": REWARDS, "space.yaml": E2E_SPACE})
    # 0 with a recommendation; 3 (tuner.cli.EXIT_NOTHING_RECOMMENDED) when the trial ran ok but 3 steps were too
    # few to show learning. Not 2 (refused) and not 4 (no trial ok): what matters here is that the trial ran.
    assert code in (0, 3), err
    from tuner.stores import mlflow_store

    client = mlflow_store.client(mlflow_store.default_tracking_uri(folder / STORE))
    experiment = client.get_experiment_by_name("relative")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.`tuner.kind` = 'search'")
    assert parent.data.params["trainer"] == "grpo"  # from the space
    assert parent.data.params["dataset"] == str(folder / "prompts.jsonl")
    assert parent.data.params["search_space"] == str(folder / "space.yaml")
    (trial,) = client.search_runs([experiment.experiment_id], filter_string="tags.`tuner.kind` = 'trial'")
    assert trial.data.tags["tuner.status"] == "ok", trial.data.tags.get("tuner.reason")
    spec = yaml.safe_load(Path(client.download_artifacts(trial.info.run_id, "trial.yaml", str(tmp_path))).read_text())
    assert spec["dataset"] == str(folder / "prompts.jsonl")
    assert spec["reward_funcs"] == [f"{folder / 'my_rewards.py'}:length"]
    assert spec["params"]["weight_decay"] == 0.01 and spec["params"]["learning_rate"] == 0.002
