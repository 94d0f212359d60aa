"""Watching a search live: a running trial's rows reach the driver while it runs (its trainable tails
metrics.jsonl and reports each new batch to Ray Tune), its MLflow run exists from its first moment and gets its
steps as they come, the terminal shows the running trials, and an interrupted search says how to resume it.

The pieces, without training: the metrics tail, the status line, the trial runs a search writes to a real MLflow
SQLite store (and a real MLflow client to a port nothing listens on for the kept-writes case), a worker's imports;
nothing under test is replaced. A real trial and real Ray Tune searches watched live are
tests/e2e/search/test_live_e2e.py.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from tuner.records import Status
from tuner.report.progress import Progress, resume_command
from tuner.stores import mlflow_store, run_reader, run_writer
from tuner.trial._files import MetricsTail

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
