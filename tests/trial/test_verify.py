"""`tuner verify CONFIG.yaml --steps N` (tuner.trial.verify): a TRL config file run as one guarded trial for the
length the user will run, end to end through the command line on the tiny model.

Runs are 24-40 steps (a few seconds each on a CPU): long enough to hold the claims below, short for the suite.
"""

from __future__ import annotations

import re

import pytest

from tuner import cli
from tuner.trial._faults import FAULT_ENV

# A healthy reward model on the tiny model (fp32, the tiny model's learning rate), with the scheduler mapping that
# used to be a false crash; its model and data are hub ids this machine cannot reach: the flags replace them.
HEALTHY = """\
# trl reward --config healthy.yaml
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: trl-lib/ultrafeedback_binarized
dtype: float32
bf16: false
learning_rate: 0.01
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
per_device_train_batch_size: 8
max_length: 64
seed: 3
output_dir: out
"""


def verify(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "healthy.yaml").write_text(HEALTHY)
    code = cli.main(["verify", "healthy.yaml", "--model", "tiny", "--dataset", "builtin", *args])
    return code, capsys.readouterr().out


@pytest.mark.slow
def test_a_healthy_config_holds_every_step_and_says_what_it_does_not_cover(tmp_path, monkeypatch, capsys,
                                                                          tiny_model):
    code, out = verify(tmp_path, monkeypatch, capsys, "--steps", "40")
    assert code == cli.EXIT_OK, out
    assert "40 steps of reward, seed 3 (the file's seed)" in out
    assert "model: tiny from --model (over the file's model_name_or_path: Qwen/Qwen2.5-0.5B)" in out
    # a line per tenth of the run, in order, covering every step once
    blocks = [tuple(map(int, m)) for m in re.findall(r"steps (\d+)-(\d+): loss", out)]
    assert blocks == [(s, s + 3) for s in range(1, 41, 4)]
    assert "held 40 steps: ok" in out
    assert "learned: yes: loss" in out
    assert "horizon: 40 steps on seed 3; nothing is measured past step 40 or on other seeds" in out
    # the forecast's line: its first risk, or how far the evidence reaches (25x the run)
    (forecast,) = [line for line in out.splitlines() if line.startswith("forecast: ")]
    assert forecast in ("forecast: held 40 steps; no risk signal projects a failure through step 1000",) or \
        forecast.startswith("forecast: at risk: ")


@pytest.mark.slow
def test_a_config_that_fails_late_reports_the_step_and_cause_and_exit_4(tmp_path, monkeypatch, capsys, tiny_model):
    # The fault hook poisons the weights with NaN after step 20 (a real divergence for the guard), past the 20
    # steps a search's trial would have run: verify finds it, at the next step, and says so.
    monkeypatch.setenv(FAULT_ENV, "nan@20")
    code, out = verify(tmp_path, monkeypatch, capsys, "--steps", "30", "--seed", "1")
    assert code == cli.EXIT_NO_TRIAL_OK, out
    assert "seed 1 (--seed)" in out
    (line,) = [line for line in out.splitlines() if line.startswith("failed at step")]
    assert re.match(r"failed at step 2[01] of 30: diverged: ", line), line
    assert "held" not in out and "horizon:" not in out


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.yaml").write_text("# trl sft --config old.yaml\nmodel_name_or_path: tiny\ntorch_dtype: bfloat16\n"
                                       "max_seq_length: 512\n")
    assert cli.main(["verify", "old.yaml", "--steps", "10"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "refuse 2 keys" in err and "dtype" in err and "max_length" in err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["verify", "old.yaml", "--steps", "0"])
    assert exit_.value.code == cli.EXIT_USAGE
