"""`tuner verify CONFIG.yaml --steps N` (tuner.trial.verify): a TRL config file run as one guarded trial for the
length the user will run, end to end through the command line on the tiny model (bad input and the lengths read from
an export's header, without a trial, are tests/unit/trial/test_verify.py).

Runs are 2-40 steps (a few seconds each on a CPU): long enough to hold the claims below, short for the suite.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import exported

from tuner import cli
from tuner.config.space import load_space
from tuner.config.trainers import adapter
from tuner.config.trl_lengths import length_fields
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
    assert "\nlengths: max_length 64 (the file's)\n" in out
    # a line per tenth of the run, in order, covering every step once
    blocks = [tuple(map(int, m)) for m in re.findall(r"steps (\d+)-(\d+): loss", out)]
    assert blocks == [(s, s + 3) for s in range(1, 41, 4)]
    # each with the steps done and the pace; the time left until the last
    done = [int(m) for m in re.findall(r"\| (\d+)/40 steps, [\d.]+ steps/s", out)]
    assert done == list(range(4, 41, 4)) and out.count(" left\n") == 9
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


def test_a_hand_written_config_without_lengths_says_it_runs_trls_default(tmp_path, monkeypatch, capsys, tiny_model):
    # HEALTHY without its max_length: the run has TRL's default, and says so before it trains (2 steps: the line is
    # the claim)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(HEALTHY.replace("max_length: 64\n", ""))
    code = cli.main(["verify", "mine.yaml", "--steps", "2", "--model", "tiny", "--dataset", "builtin"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    default = length_fields(adapter("reward"))["max_length"]
    lines = out.splitlines()
    assert f"lengths: max_length {default} (TRL's default: the file sets none)" in lines
    assert lines.index(f"lengths: max_length {default} (TRL's default: the file sets none)") < lines.index(
        "held 2 steps: ok")


# A config the tiny model learns its GRPO task with in 20 steps (the default search's pick on this CPU: trial 7 of
# issue 66's search), over the shipped space's fixed settings.
GRPO_PICK = {"precision": "fp32", "learning_rate": 0.057, "per_device_train_batch_size": 8,
             "gradient_accumulation_steps": 2, "max_grad_norm": 1.0, "warmup_steps": 0, "lr_scheduler_type": "constant",
             "beta": 0.0, "loss_type": "dr_grpo", "epsilon": 0.1, "activation_checkpointing": False, "use_peft": False}


def test_trl_default_lengths_runs_trls_default_and_says_what_the_search_ran(tmp_path, tiny_model):
    from tuner.trial.verify import prepare_verify

    path = str(exported({**load_space(None, "grpo").fixed, **GRPO_PICK}, tiny_model, tmp_path / "recommended.yaml"))
    default = length_fields(adapter("grpo"))["max_completion_length"]
    spec, lines = prepare_verify(path, 10)
    assert spec.params["max_completion_length"] == 12  # the trials' length runs, not TRL's default
    assert f"lengths: max_completion_length 12 (the search's trials; --trl-default-lengths runs TRL's default " \
           f"{default})" in lines
    spec, lines = prepare_verify(path, 10, trl_default_lengths=True)
    assert "max_completion_length" not in spec.params
    assert f"lengths: max_completion_length {default} (TRL's default, --trl-default-lengths; the search's trials ran " \
           "12)" in lines


def readme_verify_line() -> list[str]:
    """The quick start's `tuner verify ...` line of README.md, as words (its comment left out)."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    (line,) = [line for line in readme.splitlines() if line.startswith("tuner verify ")]
    return shlex.split(line.partition("#")[0])[1:]


@pytest.mark.slow
def test_the_readme_verify_line_runs_at_the_pace_of_the_searchs_trials(tmp_path, monkeypatch, capsys, tiny_model):
    """Issue 66: the README's `tuner verify recommended.yaml --steps 500` on the default search's export took 24 s a
    step (TRL's 512 completion tokens), not the trials' pace (12); as written, with fewer steps for the suite."""
    from tuner.trial import TrialSpec, run_trial

    steps = 10  # enough steps for a pace; the README's 500 are measured in docs/export.md
    params = {**load_space(None, "grpo").fixed, **GRPO_PICK}
    # the search's trial of this pick, as a search runs it (the shipped space's fixed settings; one CPU thread, as
    # tests/conftest.py sets for every test): its pace per step
    trial = run_trial(TrialSpec(trainer="grpo", params=params, max_steps=steps), tmp_path / "trial")
    ends = [row["train_seconds"] for row in trial.history]
    assert trial.status == "ok" and len(ends) == steps, trial.reason
    trial_pace = (ends[-1] - ends[0]) / (steps - 1)

    exported(params, tiny_model, tmp_path / "recommended.yaml")
    words = readme_verify_line()
    assert words[:2] == ["verify", "recommended.yaml"] and "--steps" in words, words
    words[words.index("--steps") + 1] = str(steps)
    monkeypatch.chdir(tmp_path)
    code = cli.main(words)
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    default = length_fields(adapter("grpo"))["max_completion_length"]
    assert f"\nlengths: max_completion_length 12 (the search's trials; --trl-default-lengths runs TRL's default " \
           f"{default})\n" in out
    # the whole run's pace, in its last block line; 5x: room for a loaded machine, far below TRL's default's ~40x
    last = re.findall(rf"\| {steps}/{steps} steps, ([\d.]+) steps/s", out)
    assert last, out
    verify_pace = 1 / float(last[-1])
    assert verify_pace < 5 * trial_pace, (verify_pace, trial_pace)
