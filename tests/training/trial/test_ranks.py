"""A trial that spans several processes (tuner.trial.ranks): 2 gloo ranks on the CPU through the same code path
GPUs take (torch's elastic launcher, HF Trainer's DDP), with a rank dying, a rank going NaN, and the agent killed."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import rank_processes

from tuner.trial import TrialSpec, run_trial, run_trial_isolated
from tuner.trial._faults import FAULT_ENV, FAULT_WHEN_ENV

pytestmark = pytest.mark.slow

GRPO = {"learning_rate": 0.05, "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 12}


def _rank_results(workdir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text())["result"] for p in workdir.glob("rank[0-9]*.json")}


def _rank_pids(workdir: Path) -> list[int]:
    return rank_processes(str(workdir).encode())


def test_a_two_rank_trial_trains_as_one_job_and_gets_its_verdict(tiny_model, tmp_path):
    result = run_trial(TrialSpec(trainer="grpo", params=GRPO, max_steps=6, ranks=2), tmp_path)
    assert result.status == "ok", result.reason
    assert [row["step"] for row in result.history] == [1, 2, 3, 4, 5, 6]
    # Both ranks trained the same steps in one DDP job on gloo; each step's reward averages both ranks' completions.
    ranks = _rank_results(tmp_path)
    assert sorted(ranks) == [0, 1] and all(r["status"] == "ok" and r["steps_run"] == 6 for r in ranks.values())
    for rank in (0, 1):
        assert f"rank {rank} of 2: MULTI_CPU" in (tmp_path / f"rank{rank}.log").read_text()
    assert all(row["reward_count"] == 2 * GRPO["per_device_train_batch_size"] for row in result.history)
    assert result.tokens_per_second > 0 and result.progress is not None


def test_nan_on_one_rank_stops_both_ranks_at_that_step(tiny_model, tmp_path, monkeypatch):
    # rank 1's weights turn NaN after step 2; DDP all-reduces its NaN gradients and Trainer averages the ranks'
    # losses, so both ranks' guards see step 3 non-finite and stop there together.
    monkeypatch.setenv(FAULT_ENV, "nan@2")
    monkeypatch.setenv(FAULT_WHEN_ENV, "rank=1")
    spec = TrialSpec(trainer="reward", params={"per_device_train_batch_size": 4, "learning_rate": 1e-3},
                     max_steps=10, ranks=2)
    result = run_trial(spec, tmp_path)
    assert result.status == "diverged" and result.guard_signal == "non_finite", result.reason
    assert result.stopped_at_step == 3 and result.history[-1]["step"] == 3
    assert math.isfinite(result.history[1]["loss"]) and not math.isfinite(result.history[2]["loss"])
    ranks = _rank_results(tmp_path)
    assert {r["status"] for r in ranks.values()} == {"diverged"}
    assert [ranks[0]["stopped_at_step"], ranks[1]["stopped_at_step"]] == [3, 3]


def test_a_rank_killed_by_sigfpe_ends_its_trial_as_crashed_and_the_next_trial_runs(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "sigfpe@2")
    monkeypatch.setenv(FAULT_WHEN_ENV, "rank=1")
    spec = TrialSpec(trainer="grpo", params=GRPO, max_steps=6, ranks=2)
    result = run_trial_isolated(spec, tmp_path / "dies", timeout=300)
    assert result.status == "crashed" and result.guard_signal == "process_died"
    assert result.reason.startswith("rank 1 of 2: process killed by SIGFPE"), result.reason
    assert result.output.splitlines()[-1] == "injected sigfpe at step 2", result.output  # rank 1's last words
    assert [row["step"] for row in result.history] == [1]  # rank 0's rows up to the step rank 1 died in
    assert _rank_pids(tmp_path / "dies") == []  # rank 0 was stopped, not left waiting for rank 1
    monkeypatch.delenv(FAULT_ENV)
    after = run_trial_isolated(spec, tmp_path / "next", timeout=300)
    assert after.status == "ok", after.reason


def test_no_rank_outlives_its_trial_process(tiny_model, tmp_path, monkeypatch):
    # Every step from step 1 on sleeps: the trial is still running when its process (the ranks' agent) is killed.
    monkeypatch.setenv(FAULT_ENV, "slow@1")
    spec = TrialSpec(trainer="sft", params={"per_device_train_batch_size": 2}, max_steps=400, ranks=2)
    workdir = tmp_path / "killed"
    from tuner.trial._isolation import _start

    process = _start(spec.to_dict(), str(workdir))
    deadline = time.monotonic() + 240
    while not (workdir / "metrics.jsonl").exists() or len(_rank_pids(workdir)) < 2:
        assert time.monotonic() < deadline and process.is_alive(), "the ranks never started training"
        time.sleep(0.5)
    ranks = _rank_pids(workdir)
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    deadline = time.monotonic() + 30
    while set(ranks) & set(_rank_pids(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(ranks) & set(_rank_pids(workdir)), "a rank outlived its trial's process"
