"""Watching a search live, for real: a trial child process hands its rows over while it runs, a real Ray Tune search
streams its running trials to MLflow and the log, and an interrupted search says what is kept and how to resume (the
pieces, without training, are tests/unit/search/test_live.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import SFT_SPACE  # the cheapest real trials: SFT on the tiny model, batch 2, 32 tokens

from tuner.records import Status
from tuner.report.progress import Progress
from tuner.stores import mlflow_store, run_reader

STEPS = 40
# Every step of these trials takes at least SLOW_STEP_S longer (the TUNER_FAULT=slow hook), so a trial runs for
# 10 s or more however fast the machine is: long enough to be seen running, never so long that a slow one drags.
SLOW = {"TUNER_FAULT": "slow@1"}


# -- a real trial, a real search ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_isolated_trial_hands_over_its_rows_while_it_runs(tiny_model, tmp_path, monkeypatch):
    from tuner.trial import TrialSpec, run_trial_isolated

    for name, value in SLOW.items():  # 10 s or more: many looks while it runs, on any machine
        monkeypatch.setenv(name, value)
    calls: list[list[dict]] = []
    spec = TrialSpec(trainer="sft", params={"per_device_train_batch_size": 2, "max_length": 32}, max_steps=40, seed=0)
    result = run_trial_isolated(spec, tmp_path / "trial", timeout=300,
                                on_rows=calls.append, poll=0.2)
    assert result.status == "ok", result.reason
    handed = [row for batch in calls for row in batch]
    # Rows came over while the trial ran, in several batches, each row once and in order; those logged after the
    # last look while it ran come in one last batch once it ended: every row of its history.
    assert len(calls) >= 2, calls
    assert handed == result.history
    assert [r["step"] for r in result.history] == list(range(1, 41))


def trial_runs_now(db: Path, experiment: str) -> list[tuple[str, str, int]]:
    """(run id, status, loss points) of the experiment's trial runs, read straight from the SQLite file."""
    query = ("SELECT r.run_uuid, r.status, (SELECT COUNT(*) FROM metrics m WHERE m.run_uuid = r.run_uuid "
             "AND m.key = 'loss') FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid JOIN experiments e "
             "ON e.experiment_id = r.experiment_id WHERE t.key = 'tuner.kind' AND t.value = 'trial' AND e.name = ?")
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
            return con.execute(query, (experiment,)).fetchall()
    except sqlite3.OperationalError:  # tables not there yet, or busy
        return []


@pytest.mark.slow
def test_search_streams_running_trials_to_mlflow_and_the_log(tmp_path, tiny_model, monkeypatch):
    import optuna

    from tuner.search import driver as search

    monkeypatch.chdir(tmp_path)
    for name, value in SLOW.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(Progress, "live_every", 1.0)  # the non-terminal status line, often enough to see here
    (tmp_path / "space.yaml").write_text(SFT_SPACE)
    store = tmp_path / "mlflow"
    seen: list[tuple[str, str, int]] = []
    stop = threading.Event()

    def watch():  # what `tuner ui` would show, read from the store while the search runs
        while not stop.is_set():
            seen.extend(trial_runs_now(store / "mlflow.db", "live"))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    echoed: list[str] = []
    try:
        prepared = search.prepare(search.SearchOptions(
            store=str(store), experiment="live", trainer="sft", search_space=str(tmp_path / "space.yaml"),
            sampler="grid", trials=2, max_steps=STEPS, confirm_seeds=0, concurrency=2))
        outcome = search.run_search(prepared, echo=echoed.append)
    finally:
        stop.set()
        watcher.join(10)

    # While running, a trial run existed in MLflow with per-step metrics in it.
    running = [(run_id, points) for run_id, status, points in seen if status == "RUNNING" and points > 0]
    assert running, seen[-10:]
    assert any(0 < points < STEPS for _, points in running)  # seen part-way, not only at the very end

    # The non-terminal log has status lines with the running trials' steps and losses.
    live = [line for line in echoed if line.startswith("live: ")]
    assert any(re.search(rf"trial [01] step \d+/{STEPS} loss \S+", line) for line in live), echoed

    # Live rows never became outcomes: two records, one per trial asked for, each with a real status.
    records = outcome.records
    assert sorted(r["number"] for r in records) == [0, 1]
    assert all(r["status"] in set(Status) and r["steps_run"] >= 1 for r in records), records
    client = mlflow_store.client(prepared.tracking_uri)
    for record in records:
        run = client.get_run(record["run_id"])
        assert run.info.status == ("FINISHED" if record["status"] == "ok" else "FAILED")
        assert run.data.tags["tuner.status"] == record["status"]
        # each step's loss exactly once: streamed while running, the rest at the end, nothing twice
        loss = client.get_metric_history(record["run_id"], "loss")
        assert [m.step for m in loss] == list(range(1, record["steps_run"] + 1))
    assert {run_id for run_id, _ in running} <= {r["run_id"] for r in records}
    # Optuna was told each trial once, with its real outcome (never a live row's placeholder 0.0)
    study = optuna.load_study(study_name=client.get_run(outcome.parent_run_id).data.tags["tuner.study"],
                              storage=f"sqlite:///{store.resolve() / 'optuna.db'}")
    told = [t for t in study.trials if t.state != optuna.trial.TrialState.WAITING]  # the grid's third point waits
    assert [t.state for t in told] == [optuna.trial.TrialState.COMPLETE] * 2
    assert sorted(t.user_attrs["status"] for t in told) == sorted(r["status"] for r in records)


@pytest.mark.slow
def test_interrupted_search_says_what_is_kept_and_how_to_resume(tmp_path, tiny_model):
    (tmp_path / "space.yaml").write_text(SFT_SPACE)
    store, db = tmp_path / "S", tmp_path / "S" / "mlflow.db"
    args = [sys.executable, "-m", "tuner.cli", "search", "--trainer", "sft", "--search-space",
            str(tmp_path / "space.yaml"), "--sampler", "grid", "--trials", "3", "--max-steps", str(STEPS),
            "--confirm-seeds", "0", "--concurrency", "1", "--experiment", "stopped", "--store", str(store)]
    out = tmp_path / "search.log"
    with out.open("wb") as log:
        driver = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=tmp_path, start_new_session=True, env={**os.environ, **SLOW})
    try:
        deadline = time.monotonic() + 480
        # one trial done, the next one running with steps in MLflow already
        while not (len([r for r in trial_runs_now(db, "stopped") if r[1] != "RUNNING"]) >= 1
                   and any(r[1] == "RUNNING" and r[2] > 0 for r in trial_runs_now(db, "stopped"))):
            assert driver.poll() is None, out.read_text()[-4000:]
            assert time.monotonic() < deadline, out.read_text()[-4000:]
            time.sleep(0.3)
        driver.send_signal(signal.SIGTERM)
        code = driver.wait(120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    text = out.read_text()
    assert code == 130, text[-4000:]
    found = re.search(r"^tuner: interrupted; (\d) of 3 trials are kept\. Resume with: (.+)$", text, re.M)
    assert found, text[-4000:]
    kept = int(found.group(1))
    statuses = [status for _, status, _ in trial_runs_now(db, "stopped")]
    # the finished trials are kept; the one cut short is ended KILLED (no run is left RUNNING) and runs again
    assert kept == statuses.count("FINISHED") >= 1 and statuses.count("KILLED") == 1, statuses
    assert sorted(set(statuses)) == ["FINISHED", "KILLED"], statuses
    command = shlex.split(found.group(2))
    assert command[:4] == ["tuner", "search", "--resume", "stopped"] and str(store) in command

    # the command it printed resumes the search: the kept trials stay, the rest run, 3 in all
    resumed = subprocess.run([sys.executable, "-m", "tuner.cli", *command[1:]], cwd=tmp_path, capture_output=True,
                             text=True, timeout=480, start_new_session=True)
    assert resumed.returncode in (0, 3), (resumed.stdout + resumed.stderr)[-4000:]
    assert f"{kept} of 3 trials already done" in resumed.stdout
    uri = mlflow_store.default_tracking_uri(store)
    parent = run_reader.latest_search_run(mlflow_store.client(uri), "stopped")
    assert parent.info.status == "FINISHED"
    runs = run_reader.trial_runs(uri, parent.info.run_id)  # the interrupted trial's RUNNING run was deleted
    # every grid point once (the trial cut short ran again, under a new trial number), each run complete
    assert sorted(float(r.data.params["learning_rate"]) for r in runs) == [1.0e-4, 2.0e-4, 3.0e-4]
    assert all(r.info.status == "FINISHED" and r.data.tags["tuner.status"] == "ok" for r in runs)
