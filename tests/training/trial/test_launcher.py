"""The node's trial launcher (tuner.trial.launcher): trials forked from one process that imported torch and TRL
once, each still dying alone, killed when asked or when whoever asked goes away, and gone when the driver is.

Real processes throughout: a real launcher process, real trials on the tiny model, real signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tuner.trial import TrialSpec, run_trial_isolated
from tuner.trial import launcher as node_launcher
from tuner.trial._faults import FAULT_ENV

# the cheapest trial there is: SFT, batch 2, 4 steps (tests/training/trial/test_trial_training.py's crash spec)
SPEC = {"trainer": "sft", "params": {"per_device_train_batch_size": 2}, "max_steps": 4, "seed": 0}


def wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


@pytest.fixture
def launcher(tiny_model):
    process = node_launcher.start()
    try:
        yield process
    finally:
        node_launcher.stop(process)
    assert node_launcher.ENV not in os.environ  # the driver's environment is as it was


@pytest.mark.slow
def test_trials_are_the_launchers_children_and_die_alone(launcher, tmp_path, monkeypatch):
    assert os.environ[node_launcher.ENV] == launcher.socket_path
    # The fault is set here, after the launcher started: the child runs with the asking process's environment
    # (as Ray's CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS for the slot would reach it), not the launcher's.
    monkeypatch.setenv(FAULT_ENV, "sigfpe@2")
    crashed = run_trial_isolated(TrialSpec(**SPEC), tmp_path / "crash", timeout=300)
    assert crashed.status == "crashed" and "SIGFPE" in crashed.reason, crashed.reason
    assert [row["step"] for row in crashed.history] == [1]
    assert crashed.output.splitlines()[-1] == "injected sigfpe at step 2", crashed.output
    monkeypatch.setenv(FAULT_ENV, "slow@1")  # 0.25 s more per step: rows are seen while it runs, on any machine
    assert launcher.poll() is None  # the launcher lived through its child's death
    forked: set[int] = set()  # the launcher's children while the trial ran: the trial's process
    ok = run_trial_isolated(TrialSpec(**SPEC), tmp_path / "ok", timeout=300,
                            on_rows=lambda rows: forked.update(descendants(launcher.pid)), poll=0.05)
    assert ok.status == "ok", ok.reason
    assert [row["step"] for row in ok.history] == [1, 2, 3, 4]
    assert forked and not forked & descendants(os.getpid()) - descendants(launcher.pid)
    assert (tmp_path / "ok" / node_launcher.LOG_NAME).exists()  # the child's own output, beside its metrics


@pytest.mark.slow
def test_kill_and_a_vanished_asker_end_the_trial(launcher, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_FAULT", "slow@1")  # 0.25 s more per step: still running when killed
    spec = {**SPEC, "max_steps": 400}
    process = node_launcher.LaunchedProcess.start_or_none(spec, str(tmp_path / "a"))
    wait_for(lambda: (tmp_path / "a" / "metrics.jsonl").exists(), "the first step")
    assert process.is_alive()
    process.kill()
    process.join(30)
    assert process.exitcode == -signal.SIGKILL and process.pid not in descendants(launcher.pid)
    assert (tmp_path / "a" / "metrics.jsonl").exists()  # killed on its asker's word: the asker reads its folder

    # A Ray worker that dies (here: a process that asks, then is killed) takes its trial with it.
    asker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from tuner.trial.launcher import LaunchedProcess
        process = LaunchedProcess.start_or_none({spec!r}, {str(tmp_path / "b")!r})
        print(process.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        child = int(asker.stdout.readline())
        assert child in descendants(launcher.pid)
        asker.kill()
        asker.wait()
        wait_for(lambda: child not in descendants(launcher.pid), "the orphaned trial to be killed", timeout=30)
        wait_for(lambda: not (tmp_path / "b").exists(), "the orphaned trial's folder to go", timeout=30)
    finally:
        asker.kill()


@pytest.mark.slow
def test_the_launcher_goes_with_the_driver_and_takes_its_trials(tiny_model, tmp_path):
    # a driver that starts a launcher and a trial through it, then dies by SIGKILL (no cleanup of its own)
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        os.environ["TUNER_FAULT"] = "slow@1"
        from tuner.trial import launcher
        from tuner.trial.launcher import LaunchedProcess
        process = launcher.start()
        trial = LaunchedProcess.start_or_none({ {**SPEC, "max_steps": 400}!r}, {str(tmp_path / "t")!r})
        print(process.pid, trial.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        served, trial = map(int, driver.stdout.readline().split())
        assert psutil.pid_exists(served) and psutil.pid_exists(trial)
        # the trial's child makes its folder just after it is forked: wait for it, and only then kill the driver
        wait_for(lambda: (tmp_path / "t" / node_launcher.LOG_NAME).exists(), "the trial's folder", timeout=60)
        driver.kill()
        driver.wait()
        wait_for(lambda: not psutil.pid_exists(served) and not psutil.pid_exists(trial), "the launcher and its trial "
                 "to go", timeout=60)
        assert not (tmp_path / "t").exists()  # and the trial's folder: the search it belonged to is gone
    finally:
        driver.kill()


def test_without_a_launcher_the_caller_starts_the_child_itself(tmp_path, monkeypatch):
    monkeypatch.delenv(node_launcher.ENV, raising=False)
    assert node_launcher.LaunchedProcess.start_or_none(SPEC, str(tmp_path)) is None
    monkeypatch.setenv(node_launcher.ENV, str(tmp_path / "no-such-socket"))  # another node's, or gone
    assert node_launcher.LaunchedProcess.start_or_none(SPEC, str(tmp_path)) is None
