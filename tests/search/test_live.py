"""Watching a search live: a running trial's rows reach the driver while it runs (its trainable tails
metrics.jsonl and reports each new batch to Ray Tune), its MLflow run exists from its first moment and gets its
steps as they come, the terminal shows the running trials, and an interrupted search says how to resume it.

Real parts throughout: real trial child processes, real Ray Tune searches, a real MLflow SQLite store (and a
real MLflow client to a port nothing listens on for the kept-writes case); nothing under test is replaced.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import SFT_SPACE  # the cheapest real trials: SFT on the tiny model, batch 2, 32 tokens

from tuner.records import Status
from tuner.report.progress import Progress, resume_command
from tuner.stores import mlflow_store, run_reader, run_writer
from tuner.trial._files import MetricsTail

STEPS = 40
# Every step of these trials takes at least SLOW_STEP_S longer (the TUNER_FAULT=slow hook), so a trial runs for
# 10 s or more however fast the machine is: long enough to be seen running, never so long that a slow one drags.
SLOW = {"TUNER_FAULT": "slow@1"}


# -- the pieces, without training ------------------------------------------------------------------------------


def test_metrics_tail_hands_over_whole_lines_each_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # no file yet: the trial is still loading
    with path.open("w") as f:
        f.write(json.dumps({"step": 1, "loss": 2.0}) + "\n" + '{"step": 2, "lo')  # the child is mid-write
        f.flush()
        assert tail.read() == [{"step": 1, "loss": 2.0}]
        assert tail.read() == []  # the cut line waits
        f.write('ss": NaN}\n' + json.dumps({"step": 3, "loss": 1.5}) + "\n")
        f.flush()
        rows = tail.read()
    assert [r["step"] for r in rows] == [2, 3] and rows[0]["loss"] != rows[0]["loss"]  # NaN kept as NaN
    assert tail.read() == []


def test_status_line_off_a_terminal_is_one_line_per_interval():
    echoed: list[str] = []
    progress = Progress(4, echoed.append, tty=False)
    start = progress.started_at
    progress.started("ray-a", 3, max_steps=20)
    progress.started("ray-b", 1, max_steps=20, metric="reward")
    progress.tick(start + 5)
    assert echoed == []  # nothing before the first interval
    progress.live("ray-a", {"step": 5, "loss": 1.2345678, "grad_norm": 3.0})
    progress.live("ray-b", {"step": 2, "loss": 0.5, "reward": 0.25})
    progress.tick(start + Progress.live_every + 1)
    progress.tick(start + Progress.live_every + 2)  # within the interval: nothing more
    assert len(echoed) == 1
    line = echoed[0]
    assert line.startswith("live: trial 1 step 2/20 loss 0.5 reward 0.25 | trial 3 step 5/20 loss 1.235 | 0/4 done")
    progress.finished({"number": 1, "status": Status.OK, "params": {}, "seed": 0}, "ray-b")
    progress.tick(start + 2 * Progress.live_every + 3)
    assert echoed[-1].startswith("live: trial 3 step 5/20 loss 1.235 | 1/4 done")
    progress.finished({"number": 3, "status": Status.DIVERGED, "params": {}, "seed": 0}, "ray-a")
    count = len(echoed)
    progress.tick(start + 10 * Progress.live_every)
    assert len(echoed) == count  # nothing running: no status line
    assert not any("\r" in line for line in echoed)


def test_status_line_shows_a_trials_steps_per_second_from_its_step_times():
    progress = Progress(1, [].append, tty=False)
    progress.started("k", 2, max_steps=200)
    progress.trials["k"]["row"] = {"step": 40, "loss": 0.5, "train_seconds": 16.0}  # step 40 ended 16 s into training
    assert progress.status_line().startswith("live: trial 2 step 40/200 loss 0.5 (2.5 steps/s) | 0/1 done")


def test_status_line_on_a_terminal_is_redrawn_in_place_and_cleared_for_other_lines():
    screen = io.StringIO()

    def echo(text):
        screen.write(text + "\n")

    progress = Progress(2, echo, tty=True, stream=screen)
    progress.started("k", 0, max_steps=10)
    progress.live("k", {"step": 1, "loss": 2.0})  # sooner than tty_every after the start: not drawn yet
    progress.tick(progress.started_at + 2)
    progress.live("k", {"step": 4, "loss": 1.0})
    progress.tick(progress.last_status + Progress.tty_every + 0.1)
    drawn = screen.getvalue()
    assert drawn.count("\r\033[K") == 2 and "\n" not in drawn  # one line, redrawn in place
    assert drawn.rpartition("\r\033[K")[2].startswith("live: trial 0 step 4/10 loss 1 | 0/2 done, ")
    progress.say("a line of its own")
    assert screen.getvalue().endswith("\r\033[Ka line of its own\n")  # the status line was cleared first


def test_resume_command_names_the_store_only_when_it_is_not_the_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resume_command("grpo-tiny", "mlflow") == "tuner search --resume grpo-tiny"
    assert resume_command("grpo-tiny", str(tmp_path / "mlflow")) == "tuner search --resume grpo-tiny"
    assert resume_command("my exp", "/data/runs") == "tuner search --resume 'my exp' --store /data/runs"
    assert resume_command("x", "mlflow", "http://h:5000") == "tuner search --resume x --tracking-uri http://h:5000"


# -- a trial's MLflow run in three parts, on a real SQLite store --------------------------------------------------

SPEC = {"trainer": "sft", "params": {"learning_rate": 1e-4}, "max_steps": 4, "seed": 0, "model": "tiny",
        "dataset": None, "reward_funcs": None}


def rows(first: int, last: int) -> list[dict]:
    return [{"step": s, "loss": 1.0 / s, "grad_norm": 0.5} for s in range(first, last + 1)]


def summary(status: str = "ok", steps: int = 4) -> dict:
    return {"status": status, "reason": "", "stopped_at_step": steps, "steps_run": steps, "tokens_per_second": 10.0}


def new_search(store: Path, experiment: str = "live") -> run_writer.SearchTracker:
    tracker = run_writer.SearchTracker(mlflow_store.default_tracking_uri(store), experiment, store)
    tracker.start("search-live", {"trials": 2}, {"tuner.study": "search-live"})
    return tracker


def test_trial_run_is_running_with_its_steps_while_it_runs_and_complete_at_its_end(tmp_path):
    tracker = new_search(tmp_path / "mlflow")
    run_id = tracker.start_trial("key-0", 0, SPEC, tags={"tuner.run_name": "trial-000"})
    client = tracker.client
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.info.run_name == "trial-000"
    assert run.data.tags["tuner.status"] == "running" and run.data.params["learning_rate"] == "0.0001"
    assert run.data.tags["mlflow.parentRunId"] == tracker.parent_id
    tracker.log_steps("key-0", rows(1, 2))
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2]  # visible while it runs
    tracker.log_steps("key-0", rows(3, 3))
    tracker.finish_trial("key-0", SPEC, summary(), rows(1, 4), streamed=3)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["tuner.status"] == "ok"
    # every step once: three streamed, the fourth sent at the end
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2, 3, 4]
    assert run.data.metrics["trial/steps_run"] == 4
    result = json.loads(Path(client.download_artifacts(run_id, "result.json", str(tmp_path))).read_text())
    assert [r["step"] for r in result["history"]] == [1, 2, 3, 4]  # result.json keeps the whole history

    # A trial still running when the driver died stays RUNNING: --resume deletes it and runs it again (a
    # confirmation re-run too: confirmation runs again after the search).
    tracker.start_trial("key-1", 1, {**SPEC, "params": {"learning_rate": 2e-4}})
    tracker.log_steps("key-1", rows(1, 2))
    tracker.start_trial("key-2", 0, {**SPEC, "seed": 1}, tags={"tuner.confirmation": "true", "tuner.confirms": "0"})
    resumed = run_writer.SearchTracker(tracker.uri, "live", tracker.store)
    resumed.attach(tracker.parent_id)
    kept = resumed.stored_trials()
    assert [(r["number"], r["run_id"], r["status"]) for r in kept] == [(0, run_id, "ok")]
    assert [r.info.run_id for r in run_reader.trial_runs(tracker.uri, tracker.parent_id)] == [run_id]


def test_interrupted_search_ends_its_running_trials_killed_and_resume_runs_them_again(tmp_path):
    tracker = new_search(tmp_path / "mlflow")
    run_id = tracker.start_trial("key-0", 0, SPEC)
    tracker.log_steps("key-0", rows(1, 1))
    # an interrupt right after a trial's verdict was written, before the driver noted it: the verdict stays
    done_id = tracker.start_trial("key-1", 1, {**SPEC, "params": {"learning_rate": 2e-4}})
    tracker._send("trial_end", {"key": "key-1", "spec": SPEC, "summary": summary(), "history": rows(1, 4),
                                "streamed": 0, "output": ""})
    assert "key-1" in tracker.open_trials
    tracker.finish("KILLED")
    run = tracker.client.get_run(run_id)
    # no run is left RUNNING: the trial cut short is KILLED and says why
    assert run.info.status == "KILLED" and run.data.tags["tuner.status"] == "interrupted"
    assert tracker.client.get_run(done_id).info.status == "FINISHED"
    assert tracker.client.get_run(done_id).data.tags["tuner.status"] == "ok"
    assert tracker.client.get_run(tracker.parent_id).info.status == "KILLED"
    # --resume keeps the finished trial and deletes the interrupted one: it runs again
    resumed = run_writer.SearchTracker(tracker.uri, "live", tracker.store)
    resumed.attach(tracker.parent_id)
    assert [(r["number"], r["run_id"]) for r in resumed.stored_trials()] == [(1, done_id)]
    assert [r.info.run_id for r in run_reader.trial_runs(tracker.uri, tracker.parent_id)] == [done_id]


def test_a_search_run_never_started_has_nothing_to_end(tmp_path):
    tracker = run_writer.SearchTracker(mlflow_store.default_tracking_uri(tmp_path / "mlflow"), "live", tmp_path / "mlflow")
    tracker.finish("KILLED")  # interrupted before its run was created: nothing written, nothing raised
    assert tracker.client.search_runs([tracker.experiment_id]) == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_gone_mid_trial_keeps_the_writes_and_sync_completes_the_same_run(tmp_path):
    store = tmp_path / "mlflow"
    tracker = new_search(store)
    sqlite_uri = tracker.uri
    live_run = tracker.start_trial("key-0", 0, SPEC)
    tracker.log_steps("key-0", rows(1, 2))
    # The server goes away: the same tracker now talks to an address nothing answers on.
    tracker.uri = f"http://127.0.0.1:{closed_port()}"
    tracker.client = mlflow_store.client(tracker.uri)
    tracker.log_steps("key-0", rows(3, 3))  # tries the server once, then keeps the write
    assert tracker.spool_path.exists()
    started = time.monotonic()
    assert tracker.start_trial("key-1", 1, SPEC) is None  # kept: no run id yet
    tracker.log_steps("key-1", rows(1, 4))
    tracker.finish_trial("key-0", SPEC, summary(), rows(1, 4), streamed=3)
    tracker.finish_trial("key-1", SPEC, summary("diverged", 4), rows(1, 4), streamed=4)
    tracker.finish("FINISHED")
    # while the server is away, the writes that follow go straight to disk (no try, no timeout, each time)
    assert time.monotonic() - started < 5
    assert tracker.pending() == 6

    # tuner sync, in a fresh tracker: the first trial's run was created before the server went away, and is
    # found by its key; the second trial's run is created now.
    sent, left = run_writer.sync_pending(sqlite_uri, store)
    assert (sent, left) == (6, 0) and not tracker.spool_path.exists()
    client = mlflow_store.client(sqlite_uri)
    runs = {r.data.tags["tuner.trial_number"]: r for r in run_reader.trial_runs(sqlite_uri, tracker.parent_id)}
    assert sorted(runs) == ["0", "1"] and runs["0"].info.run_id == live_run
    for number, status in (("0", "FINISHED"), ("1", "FAILED")):
        run = runs[number]
        assert run.info.status == status
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4]
    assert client.get_run(tracker.parent_id).info.status == "FINISHED"


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


def test_a_workers_live_reports_import_nothing_once_the_trial_has_started():
    """A search's Ray worker imports what its live reports need before it starts the trial: a fresh worker (every
    trial of the first round) that imported scipy at the trial's first rows took ~0.6 s of CPU from the trial
    training beside it, and on a 2-core machine that round read 0.5-0.9x the tokens/s of the same config later.
    In a fresh interpreter: the worker's imports, then the live path on a learning GRPO trial's rows (the learning
    test's p-value included): no module is imported on the way."""
    script = """
import random, sys
from tuner.search import _execution
from tuner.config import trainers
from tuner.trial.measure import so_far
from tuner.verdicts.learning import preload
from tuner.verdicts.recommend import objective, speed_so_far
preload()
before = set(sys.modules)
rng = random.Random(0)
rows = [{"step": s, "train_seconds": 0.1 * s, "reward": min(1.0, 0.2 + 0.05 * s) + rng.gauss(0, 0.05),
         "reward_std": 0.3, "reward_groups": 4, "loss": 0.1, "grad_norm": 1.0, "num_tokens": 800 * s}
        for s in range(1, 21)]
params = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "max_completion_length": 12}
figures = so_far(trainers.adapter("grpo"), rows, params, 0)
assert figures["learned"] and figures["progress_p_value"] is not None, figures
speed_so_far(figures), objective({**figures, "status": "ok"})
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
    from tuner.search import _execution

    assert "preload" in _execution._trainable.__code__.co_names  # and the trainable does what the script did
