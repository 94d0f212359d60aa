"""One trial, trained for real on the tiny model: the docs/failures.md divergence reproduced, crashes isolated in a
child process, `tuner trial` end to end, and what a trial measures (pruned past its limit, seeds, a longer
schedule's first steps). Trial configs checked and the measurement functions on hand-made numbers are
tests/unit/trial/test_trial.py."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile

import pytest

from tuner.trial import TrialSpec, run_trial, run_trial_isolated
from tuner.trial._faults import FAULT_ENV

# The docs/failures.md reproduction: a reward model at learning rate 0.3, batch 8, 20 steps.
DIVERGENCE = {"per_device_train_batch_size": 8, "learning_rate": 0.3}


def _finite(row: dict, key: str) -> bool:
    return math.isfinite(row.get(key, 0.0))


# -- the divergence docs/failures.md describes --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("use_peft", [True, False], ids=["lora", "full"])
def test_fp16_pure_reward_model_diverges_and_stops_at_first_non_finite_step(use_peft, tiny_model, tmp_path):
    spec = TrialSpec(trainer="reward", params={**DIVERGENCE, "precision": "fp16-pure", "use_peft": use_peft},
                     max_steps=20, seed=0)
    result = run_trial(spec, workdir=tmp_path)
    assert result.status == "diverged", result.reason
    assert result.guard_signal == "non_finite"
    # Observed on the tiny model (seed 0): both log loss nan, grad_norm nan at step 3, after step 2 logged
    # loss 1.57, grad_norm 73 (LoRA) or loss 0.81, grad_norm 8.3 (full); the same with 1 or 2 CPU threads.
    first_bad = next(row["step"] for row in result.history if not (_finite(row, "loss") and _finite(row, "grad_norm")))
    assert result.stopped_at_step == first_bad < spec.max_steps
    # Zero wasted steps: training stopped at the step that broke, nothing was trained or logged after it.
    assert result.history[-1]["step"] == first_bad
    assert result.steps_run == first_bad
    assert f"at step {first_bad}" in result.reason


@pytest.mark.slow
def test_bf16_pure_reward_model_at_same_learning_rate_never_goes_non_finite(tiny_model, tmp_path):
    spec = TrialSpec(trainer="reward", params={**DIVERGENCE, "precision": "bf16-pure"}, max_steps=20, seed=0)
    result = run_trial(spec, workdir=tmp_path)
    # bfloat16 has float32's exponent range, so the steps that overflow float16 stay finite: the loss jumps and
    # comes back (to 9.2 at step 7 on a CPU with native bf16; 12.4 at step 5 and 5.1 at step 9 on an AVX2-only one,
    # where bf16 is emulated and rounds differently). docs/failures.md saw it stick at ln 2 on its tiny model; this
    # one (seed 0, transformers 5) recovers on both CPUs (loss 0.17 and 0.016 by step 20, from ~0.7, accuracy 1.0),
    # so the guard rightly lets it run as "ok". Its mean progress is not asserted: the mid-trial jumps make it
    # +0.79 on one CPU and -0.04 on the other; where it ends is the claim that holds on both.
    assert result.guard_signal != "non_finite"
    assert all(_finite(row, "loss") and _finite(row, "grad_norm") for row in result.history)
    assert result.status == "ok", result.reason
    assert len(result.history) == 20
    start = sum(row["loss"] for row in result.history[:2]) / 2
    end = sum(row["loss"] for row in result.history[-3:]) / 3
    assert end < 0.5 * start, (start, end)


# -- crashes in a child process ----------------------------------------------------------------------------


# for speed: the cheapest trainer, batch 2, 4 steps; the fault fires at the end of step 2, before it is logged
CRASH_SPEC = {"trainer": "sft", "params": {"per_device_train_batch_size": 2}, "max_steps": 4, "seed": 0}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "via_env", "status", "in_reason"),
    [
        ("sigfpe@2", True, "crashed", "SIGFPE"),  # the TUNER_FAULT hook, set after the forkserver may be running
        ("sigsegv@2", False, "crashed", "SIGSEGV"),
        ("sigkill@2", False, "crashed", "SIGKILL"),
        ("oom@2", False, "oom", "out of memory"),
        (None, False, "ok", ""),  # after all those deaths the forkserver still runs trials
    ],
)
def test_isolated_trial_survives_its_process_dying(fault, via_env, status, in_reason, tiny_model, tmp_path,
                                                   monkeypatch):
    if via_env:
        monkeypatch.setenv(FAULT_ENV, fault)
        spec = TrialSpec(**CRASH_SPEC)
    else:
        monkeypatch.delenv(FAULT_ENV, raising=False)
        spec = TrialSpec(**CRASH_SPEC, fault=fault)
    result = run_trial_isolated(spec, tmp_path / "trial", timeout=300)
    # We are still here: only the child died.
    assert result.status == status, result.reason
    assert in_reason in result.reason
    if fault is None:
        assert [row["step"] for row in result.history] == [1, 2, 3, 4]
        assert result.output == ""  # only a dead process's output is kept
        return
    # The steps before the crash reached metrics.jsonl and are kept; the dying step's row never did.
    assert [row["step"] for row in result.history] == [1]
    assert math.isfinite(result.history[0]["loss"])
    if status == "crashed":
        assert result.guard_signal == "process_died"
        assert result.stopped_at_step == 1
        # the last thing the process wrote to its stderr before the signal
        assert result.output.splitlines()[-1] == f"injected {fault.split('@')[0]} at step 2", result.output


# -- `tuner trial` -----------------------------------------------------------------------------------------


def _tuner_trial(config, cwd) -> subprocess.CompletedProcess:
    # os.environ carries the session's TUNER_CACHE_DIR to the command
    return subprocess.run([sys.executable, "-m", "tuner.cli", "trial", "--config", str(config)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env={**os.environ})


@pytest.mark.slow
def test_tuner_trial_command_prints_the_verdict(tiny_model, tmp_path):
    config = tmp_path / "trial.yaml"
    config.write_text("trainer: reward\nmax_steps: 20\nparams:\n  precision: fp16-pure\n  learning_rate: 0.3\n"
                      "  per_device_train_batch_size: 8\n")
    done = _tuner_trial(config, tmp_path)
    # The trial ran and says what it found, but it is not ok: the exit code says so (README "Exit codes").
    assert done.returncode == 4, done.stderr
    assert "status:            diverged  (loss is nan at step" in done.stdout
    assert '"step": 1' in done.stdout  # the per-step metrics come first
    assert "Traceback" not in done.stderr
    # its progress on stderr, as tuner verify's: a block of steps with the steps done; stdout keeps rows and verdict
    assert re.search(r"^  steps? [\d-]+: loss \S+, grad_norm \S+ \| \d+/20 steps", done.stderr, re.M), done.stderr
    assert "/20 steps" not in done.stdout


# -- measurement -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_sampling_from_nan_weights_is_divergence_not_a_crash(tiny_model, tmp_path, monkeypatch):
    # The "nan" fault poisons the weights after step 2 (a real divergence); GRPO then samples from NaN
    # probabilities inside step 3 and torch raises before any loss is logged.
    spec = TrialSpec(trainer="grpo", max_steps=5, fault="nan@2",  # 5 steps: enough to pass the fault
                     params={"precision": "fp32", "learning_rate": 1e-3, "per_device_train_batch_size": 4,
                             "num_generations": 4, "max_completion_length": 8})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a trial without a workdir makes its own
    result = run_trial(spec)
    assert not list(tmp_path.glob("tuner-trial-*"))  # its own output folder went with it
    assert result.status == "diverged", result.reason
    assert result.stopped_at_step == 3
    assert result.history[-1]["step"] <= 3


@pytest.mark.slow
def test_a_trial_past_its_prune_limit_stops_as_pruned_with_the_reason(tiny_model, tmp_path):
    # slow@1: every step from the first takes 0.25 s longer, so 400 steps cannot end within 4 s; the trial is
    # stopped there as pruned (not crashed: it was stable, only too slow to win), its steps so far kept.
    spec = TrialSpec(**{**CRASH_SPEC, "max_steps": 400}, fault="slow@1")
    rows = []
    result = run_trial_isolated(spec, tmp_path / "trial", timeout=300, on_rows=rows.extend,
                                prune_after=(4.0, "stopped as too slow after 4 s"))
    assert result.status == "pruned" and result.reason == "stopped as too slow after 4 s"
    assert 4.0 <= result.wall_seconds < 60
    assert result.steps_run < 400 and result.stopped_at_step == (result.history[-1]["step"] if result.history else 0)


@pytest.mark.slow
def test_kto_trials_on_two_seeds_train_on_different_batches(tiny_model, tmp_path):
    # KTO takes the rows in order whatever its seed (TRL's sequential sampler); on the tiny model (full fine-tuning,
    # no dropout) two seeds would train the same trial and confirmation would only repeat it. Found by the
    # calibration runs (tests/data/verdicts/calibration/record.py). Each trial shuffles the rows with its seed.
    losses = []
    for seed in (0, 1):
        spec = TrialSpec(trainer="kto", params={"precision": "fp32", "learning_rate": 1e-3, "use_peft": False,
                                                "per_device_train_batch_size": 4}, max_steps=3, seed=seed)
        result = run_trial(spec, workdir=tmp_path / str(seed))
        assert result.status == "ok", result.reason
        losses.append([row["loss"] for row in result.history])
    assert losses[0] != losses[1], losses


def test_a_trial_on_a_longer_schedule_is_that_run_s_first_steps(tiny_model, tmp_path):
    # A search's risk rung (tuner.search._extend) runs the first steps of the long run its forecast looked to: the
    # learning rate decays over schedule_steps, and the trial stops at max_steps, step for step that run's start.
    params = {"precision": "fp32", "learning_rate": 1e-3, "use_peft": False, "per_device_train_batch_size": 4,
              "lr_scheduler_type": "linear"}
    long = run_trial(TrialSpec(trainer="sft", params=params, max_steps=12, seed=0), workdir=tmp_path / "long")
    rung = run_trial(TrialSpec(trainer="sft", params=params, max_steps=4, seed=0, schedule_steps=12),
                     workdir=tmp_path / "rung")
    short = run_trial(TrialSpec(trainer="sft", params=params, max_steps=4, seed=0), workdir=tmp_path / "short")
    assert long.status == rung.status == short.status == "ok", (long.reason, rung.reason, short.reason)
    assert (rung.steps_run, rung.stopped_at_step) == (4, 4)
    first = [(row["step"], row["learning_rate"], row["loss"]) for row in long.history[:4]]
    assert [(row["step"], row["learning_rate"], row["loss"]) for row in rung.history] == first
    # a 4-step run of its own decays to a quarter of its peak by its last step; the rung is at 9/12 of it there
    assert short.history[-1]["learning_rate"] < 0.5 * rung.history[-1]["learning_rate"]
