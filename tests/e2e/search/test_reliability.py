"""Reliability, end to end with real processes: trials that die inside a real search (and a crash that every config
hits, and the exit codes that say how a search ended), and a driver killed mid-search and resumed. A tracking server
that goes away, shared stores and a two-node Ray cluster are in test_reliability_services.py (the two files were one:
split so that the test run's two workers can each take one). About 3 minutes on a 2-core machine, most of it Ray
starting and importing TRL.

Every test starts its processes in their own session (``start_new_session``) and a finalizer kills every
process still in that session by PID, even when the test fails: Ray's workers change their process group,
but not their session. Nothing here runs ``ray stop``: other people's Ray clusters may share this machine.
The searches' space, commands and store readers are in tests/helpers.py (``grid_space``: tests/conftest.py).

    python -m pytest tests/e2e/search/test_reliability.py -q -x
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import tempfile
from pathlib import Path

import psutil
import pytest
from helpers import (
    GRID_RATES,
    assert_trial_run_complete,
    descendants,
    expected_exit_code,
    finished_trial_rows,
    kill_all,
    kill_session,
    load_search,
    local_uri,
    output_of,
    parent_and_trial_runs,
    reading,
    search_args,
    session_members,
    still_running,
    store_client,
    trial_rows,
    trials_with_a_verdict,
    tuner_command,
    wait_for,
)

pytestmark = pytest.mark.slow


# -- 1. trials whose process dies, inside a real search ------------------------------------------------------

# The two ways a trial's process ends badly, one search each (about a minute apiece): killed by a signal (the
# "Floating point exception (core dumped)" of docs/failures.md) is crashed, a raised out-of-memory error is oom.
# SIGSEGV and SIGKILL take the same path as SIGFPE here; test_trial.py kills an isolated trial with each.
FAULTS = [("sigfpe", "crashed", "SIGFPE"), ("oom", "oom", "out of memory")]


@pytest.mark.parametrize(("kind", "status", "in_reason"), FAULTS, ids=[kind for kind, _, _ in FAULTS])
def test_trial_dying_inside_a_search_is_recorded_and_the_search_goes_on(kind, status, in_reason, grid_space,
                                                                      tmp_path, spawn):
    store, trials, faulty = tmp_path / "S", 3, GRID_RATES[1]
    # the search's temporary folder (each trial's working folder, Ray's session): short, for Ray's socket paths
    scratch = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    # TUNER_FAULT_WHEN picks one trial: its process dies at the end of step 2, the other two run normally
    try:
        code, out = spawn.run(search_args(grid_space, store, "faults", trials, 3), "search",
                              env={"TUNER_FAULT": f"{kind}@2", "TUNER_FAULT_WHEN": f"learning_rate={faulty}",
                                   "TMPDIR": str(scratch)})
        left = sorted(p.name for p in scratch.glob("tuner-trial-*"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert not left, left  # every trial's working folder went with it, the dead one's too
    assert code == expected_exit_code(load_search(local_uri(store), "faults")[1]), out[-4000:]
    client = store_client(local_uri(store))
    parents, runs = parent_and_trial_runs(client, "faults")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(runs) == trials
    by_rate = {float(run.data.params["learning_rate"]): run for run in runs}
    assert sorted(by_rate) == GRID_RATES[:trials]
    dead = by_rate.pop(faulty)
    assert dead.data.tags["tuner.status"] == status, dead.data.tags
    assert in_reason in dead.data.tags["tuner.reason"], dead.data.tags["tuner.reason"]
    assert dead.data.tags["tuner.stopped_at_step"] in ("1", "2"), dead.data.tags
    # the step before the death reached the store; the dying step was never logged
    assert [m.step for m in client.get_metric_history(dead.info.run_id, "loss")] == [1]
    logs = {run.info.run_id: [a.path for a in client.list_artifacts(run.info.run_id)] for run in runs}
    if status == "crashed":  # a dead process's last words are kept with its trial, and only there
        with tempfile.TemporaryDirectory(prefix="reliability-") as folder:
            output = Path(client.download_artifacts(dead.info.run_id, "process.log", folder)).read_text()
        assert output.splitlines()[-1] == f"injected {kind} at step 2", output
    assert [run_id for run_id, paths in logs.items() if "process.log" in paths] == (
        [dead.info.run_id] if status == "crashed" else []), logs
    for run in by_rate.values():  # the trials beside it are untouched
        assert run.data.tags["tuner.status"] == "ok", run.data.tags
        assert int(run.data.metrics["trial/steps_run"]) == 3
        assert_trial_run_complete(client, run)
    _, search = load_search(local_uri(store), "faults")
    assert sorted(r["status"] for r in search["trials"]) == sorted(["ok", "ok", status])


def test_a_crash_no_config_avoids_stops_the_search_after_the_first_identical_crashes(grid_space, tmp_path, spawn):
    store, trials = tmp_path / "S", 6
    # every trial raises the same error at its first step, whatever its params (a reward or data bug)
    # two at a time on any machine: with as many slots as trials, all would start before the third crash
    code, out = spawn.run(search_args(grid_space, store, "same-crash", trials, 2, "--concurrency", "2"), "same-crash",
                          env={"TUNER_FAULT": "error@1"})
    _, search = load_search(local_uri(store), "same-crash")
    assert {r["status"] for r in search["trials"]} == {"crashed"}
    assert 3 <= len(search["trials"]) < trials, out[-4000:]  # the trials in flight when it stopped finish
    assert "search stopped: the first 3 trials all crashed the same way with different params: RuntimeError: " \
           "injected fault 'error'" in out, out[-4000:]
    assert code == 4, out[-4000:]  # no trial ok
    assert "tuner export" not in out, out[-4000:]  # the summary of a failed search offers no export that would fail


def test_exit_codes_say_whether_a_search_recommended_and_a_failed_search_offers_no_export(grid_space, tmp_path,
                                                                                        spawn):
    # A search whose every trial crashed (exit 4, no export offered) is the test above's.
    store = tmp_path / "S"
    # the trials are ok, but every confirmation run (seed 1) dies: searched, nothing recommended
    code, out = spawn.run(search_args(grid_space, store, "unconfirmed", 2, 3, "--confirm-seeds", "1",
                                      "--confirm-top", "2"), "unconfirmed",
                          env={"TUNER_FAULT": "sigfpe@1", "TUNER_FAULT_WHEN": "seed=1"})
    _, search = load_search(local_uri(store), "unconfirmed")
    assert {r["status"] for r in search["trials"]} == {"ok"} and search["recommended"] is None
    assert code == 3, out[-4000:]
    assert "tuner export" not in out, out[-4000:]
    # and export says why in one line, exit 2
    code, out = spawn.run(tuner_command("export", "--experiment", "unconfirmed", "--store", str(store)), "export", timeout=240)
    assert code == 2 and "recommended nothing" in out and len(out.strip().splitlines()) == 1, out


# -- 2. the driver killed mid-search, then resumed --------------------------------------------------------------


def running_optuna_trials(db: Path) -> list[int]:
    """Numbers of the trials the Optuna study has handed out and not yet been told about."""
    if not db.exists():
        return []
    try:
        with reading(db) as con:
            return [n for (n,) in con.execute("SELECT number FROM trials WHERE state = 'RUNNING' ORDER BY number")]
    except sqlite3.OperationalError:
        return []


def optuna_params(db: Path, numbers: list[int]) -> list[float]:
    """The learning rate each of the study's trials ``numbers`` was given; a trial the driver was stopped in
    the middle of handing out (between ``study.ask()`` and the draw: CI saw it once after a SIGTERM) has none."""
    with reading(db) as con:
        rows = con.execute("SELECT t.number, p.distribution_json, p.param_value FROM trials t JOIN trial_params p "
                           "ON p.trial_id = t.trial_id WHERE p.param_name = 'learning_rate'").fetchall()
    by_number = {n: json.loads(d)["attributes"]["choices"][int(v)] for n, d, v in rows}
    return [by_number[n] for n in numbers if n in by_number]


# grid: the points in flight are re-run and the grid goes on; random: the sampler goes on drawing new points (it
# used to restart, proposing again the params of the trials it had just re-run: 4 trials, 2 distinct configs).
# SIGKILL of the driver alone, as the kernel's OOM killer does: what ray.init started must die with it (Ray's
# dashboard and runtime-env agents used to outlive it); SIGTERM: the driver stops Ray itself, marks its run KILLED
# and exits 130 (Ray's own SIGTERM handler used to abort it).
@pytest.mark.parametrize(("sampler", "kill"), [("grid", signal.SIGKILL), ("random", signal.SIGTERM)],
                         ids=["grid-sigkill", "random-sigterm"])
def test_driver_killed_mid_search_resumes_same_run_keeping_finished_trials(sampler, kill, grid_space, tmp_path,
                                                                           spawn):
    store = tmp_path / "S"
    db = store / "mlflow.db"
    driver = spawn.start(search_args(grid_space, store, "r1", 5, 4, "--sampler", sampler), "search")
    wait_for(lambda: len(finished_trial_rows(db, "r1")) >= 2 and running_optuna_trials(store / "optuna.db"),
             "2 finished trial runs and one in flight", process=driver)
    started = descendants(driver.pid)
    assert len(started) >= 5, started  # Ray's GCS, raylet, agents, workers ... and tuner's reaper
    os.kill(driver.pid, kill)
    code = driver.wait(60)
    if kill == signal.SIGTERM:
        assert code == 130 and "tuner: interrupted" in output_of(driver), output_of(driver)[-4000:]
        assert parent_and_trial_runs(store_client(local_uri(store)), "r1")[0][0].info.status == "KILLED"
    try:  # no kill_session from us first: the search's processes end by themselves
        wait_for(lambda: not still_running(started), "every process the killed driver started to end", timeout=60)
    finally:
        kill_all(started)  # if the test fails, leave nothing behind either
    kill_session(driver.pid)
    assert not session_members(driver.pid)
    in_flight = optuna_params(store / "optuna.db", running_optuna_trials(store / "optuna.db"))
    before = trials_with_a_verdict(db, "r1")
    assert 2 <= len(before) < 5
    if kill == signal.SIGTERM:  # the trials cut short were ended KILLED (interrupted), none left RUNNING
        assert all(status != "RUNNING" for _, status in trial_rows(db, "r1")), trial_rows(db, "r1")
    # A kill -9 can also land while the driver logs a trial: between create_run and set_terminated, which leaves
    # a RUNNING nested run with no metrics or result.json. Leave one behind for a trial that was in flight.
    client = store_client(local_uri(store))
    parent = parent_and_trial_runs(client, "r1")[0][0]
    cut_short = running_optuna_trials(store / "optuna.db")[0]
    half_logged = client.create_run(parent.info.experiment_id, run_name=f"trial-{cut_short:03d}", tags={
        "mlflow.parentRunId": parent.info.run_id, "tuner.kind": "trial", "tuner.trial_number": str(cut_short),
        "tuner.status": "ok", "tuner.reason": "", "tuner.stopped_at_step": "4"}).info.run_id

    resume = spawn.start(tuner_command("search", "--resume", "r1", "--store", str(store)), "resume")
    resumed_started: dict[int, float] = {}  # its processes, noted while it runs: Ray's have sessions of their own

    def ended() -> bool:
        with contextlib.suppress(psutil.Error):
            resumed_started.update(descendants(resume.pid))
        return resume.poll() is not None

    wait_for(ended, "the resumed search to end", interval=0.5)
    code, out = resume.returncode, output_of(resume)
    assert code == expected_exit_code(load_search(local_uri(store), "r1")[1]), out[-4000:]
    # a search that ends normally leaves no Ray process either
    try:
        wait_for(lambda: not session_members(resume.pid) and not still_running(resumed_started),
                 "the resumed search's Ray processes to end", timeout=60)
    finally:
        kill_all(resumed_started)
    client = store_client(local_uri(store))
    parents, trials = parent_and_trial_runs(client, "r1")
    # the same search continued: one parent run, now finished, holding all 5 trials
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert f"run {parents[0].info.run_id}" in out
    assert len(trials) == 5, sorted((t.data.tags["tuner.trial_number"], t.info.status) for t in trials)
    assert {t.data.tags["mlflow.parentRunId"] for t in trials} == {parents[0].info.run_id}
    # trials finished before the kill are kept as they were, not re-run; the half-logged one is not one of them
    assert before <= {t.info.run_id for t in trials}
    assert half_logged not in {t.info.run_id for t in trials}
    assert len({t.data.tags["tuner.trial_number"] for t in trials}) == 5
    for run in trials:
        assert run.data.tags["tuner.status"] == "ok", run.data.tags
        assert_trial_run_complete(client, run)
    _, search = load_search(local_uri(store), "r1")
    assert len(search["trials"]) == 5
    assert {r["run_id"] for r in search["trials"]} == {t.info.run_id for t in trials}
    tried = sorted(float(t.data.params["learning_rate"]) for t in trials)
    # The trials in flight at the kill were re-run with their params, and every trial has params of its own.
    assert set(in_flight) <= set(tried) and len(set(tried)) == 5, (in_flight, tried)
    if sampler == "grid":  # the grid points an uninterrupted search with --trials 5 tries: the first 5 of 6
        assert tried == GRID_RATES[:5], tried
