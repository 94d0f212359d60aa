"""Reliability and scale, end to end with real processes: trials that die inside a real search, a driver
killed mid-search and resumed, a real MLflow tracking server that goes away and comes back, two searches on
one SQLite store at once (and several opening a fresh one together), and a real two-node Ray cluster that
loses a node mid-search. About 6 minutes on a 2-core machine, most of it Ray starting and importing TRL.

Every test starts its processes in their own session (``start_new_session``) and a finalizer kills every
process still in that session by PID, even when the test fails: Ray's workers change their process group,
but not their session. Nothing here runs ``ray stop``: other people's Ray clusters may share this machine.

    python -m pytest tests/search/test_reliability.py -q -x
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers import (
    SEARCH_TIMEOUT,
    Spawner,
    expected_exit_code,
    kill_session,
    output_of,
    session_members,
    wait_for,
)

pytestmark = pytest.mark.slow

# The cheapest real search: SFT on the tiny model, batch 2, 32 tokens, and a grid over learning rates only,
# so every trial is "ok", takes seconds, and the trial numbers map to known params.
LEARNING_RATES = [1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4, 5.0e-4, 6.0e-4]
SPACE = f"""trainer: sft
fixed:
  max_length: 32                   # short sequences: these trials only have to run, not to learn
  per_device_train_batch_size: 2   # the cheapest batch
params:
  learning_rate: {{type: categorical, choices: {json.dumps(LEARNING_RATES)}}}
"""


# -- processes ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- tuner and MLflow ---------------------------------------------------------------------------------------


@pytest.fixture
def space_file(tmp_path, tiny_model) -> Path:
    """The search space; requesting tiny_model builds the model once, so parallel searches never race to."""
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return path


def tuner(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", *args]


def search_args(space_file: Path, store: Path, experiment: str, trials: int, max_steps: int, *extra: str) -> list[str]:
    return tuner("search", "--trainer", "sft", "--search-space", str(space_file), "--sampler", "grid",
                 "--trials", str(trials), "--max-steps", str(max_steps), "--confirm-seeds", "0",
                 "--budget", "0",  # no longer re-runs (tuner.search._extend): these tests count the search's own trials
                 "--experiment", experiment, "--store", str(store), *extra)


def reading(db: Path):
    """A connection to read a store a search writes or wrote. Not read-only: after a kill -9 mid-write the
    database has a hot journal, which a read-only connection cannot roll back ("attempt to write a readonly
    database"); this one rolls it back, as MLflow or Optuna opening the store next would."""
    return contextlib.closing(sqlite3.connect(db, timeout=5))


def trial_rows(db: Path, experiment: str | None = None) -> list[tuple[str, str]]:
    """(run id, status) of the nested trial runs in an MLflow SQLite database, read directly (no MLflow
    import, no server): cheap enough to poll while a search writes it."""
    if not db.exists():
        return []
    query = ("SELECT r.run_uuid, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
             "JOIN experiments e ON e.experiment_id = r.experiment_id "
             "WHERE t.key = 'tuner.kind' AND t.value = 'trial' AND (?1 IS NULL OR e.name = ?1)")
    try:
        with reading(db) as con:
            return con.execute(query, (experiment,)).fetchall()
    except sqlite3.OperationalError:  # not created yet, or busy: ask again later
        return []


def trials_with_a_verdict(db: Path, experiment: str) -> set[str]:
    """Run ids of the trial runs that got their verdict: not RUNNING, and not ended KILLED by an interrupt (tagged
    interrupted): --resume deletes those and runs their trials again."""
    query = ("SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'tuner.status' "
             "JOIN experiments e ON e.experiment_id = r.experiment_id "
             "WHERE e.name = ? AND r.status != 'RUNNING' AND t.value NOT IN ('running', 'interrupted')")
    kinds = dict(trial_rows(db, experiment))
    with reading(db) as con:
        return {run_id for (run_id,) in con.execute(query, (experiment,)).fetchall() if run_id in kinds}


def finished_trial_rows(db: Path, experiment: str | None = None) -> list[tuple[str, str]]:
    # set_terminated is a trial run's last write: a run that is no longer RUNNING is complete
    return [row for row in trial_rows(db, experiment) if row[1] != "RUNNING"]


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def local_uri(store: Path) -> str:
    return f"sqlite:///{store.resolve() / 'mlflow.db'}"


def runs_of(client, experiment: str) -> tuple[list, list]:
    """(parent search runs, nested trial runs) of an experiment."""
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("tuner.kind") == "search"]
    trials = [r for r in runs if r.data.tags.get("tuner.kind") == "trial"]
    return parents, trials


def assert_trial_run_complete(client, run) -> None:
    """A trial's nested run reads back whole: tags, the per-step loss history, its artifacts."""
    tags = run.data.tags
    assert tags["tuner.status"] in ("ok", "diverged", "collapsed", "crashed", "oom", "invalid")
    steps_run = int(run.data.metrics["trial/steps_run"])
    history = client.get_metric_history(run.info.run_id, "loss")
    # one loss point per optimizer step the trial ran, nothing lost on the way to the store
    assert sorted(m.step for m in history) == list(range(1, steps_run + 1)), (tags, history)
    with tempfile.TemporaryDirectory(prefix="reliability-") as folder:
        result = json.loads(Path(client.download_artifacts(run.info.run_id, "result.json", folder)).read_text())
    assert result["status"] == tags["tuner.status"] and result["steps_run"] == steps_run


def load_search(uri: str, experiment: str):
    from tuner.stores.run_reader import load_search as load

    return load(uri, experiment)


def descendants(pid: int) -> dict[int, float]:
    """PID -> start time of every process under ``pid`` (Ray's GCS, raylet, agents, workers, the trials)."""
    found = {}
    for process in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found[process.pid] = process.create_time()
    return found


def still_running(processes: dict[int, float]) -> list[str]:
    """Those of ``processes`` (PID -> start time) still alive, by name."""
    alive = []
    for pid, started in processes.items():
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(process.cmdline())[:80]}")
    return alive


def kill_all(processes: dict[int, float]) -> None:
    for pid, started in processes.items():
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.kill()


# -- 1. trials whose process dies, inside a real search ------------------------------------------------------

# The two ways a trial's process ends badly, one search each (about a minute apiece): killed by a signal (the
# "Floating point exception (core dumped)" of docs/failures.md) is crashed, a raised out-of-memory error is oom.
# SIGSEGV and SIGKILL take the same path as SIGFPE here; test_trial.py kills an isolated trial with each.
FAULTS = [("sigfpe", "crashed", "SIGFPE"), ("oom", "oom", "out of memory")]


@pytest.mark.parametrize(("kind", "status", "in_reason"), FAULTS, ids=[kind for kind, _, _ in FAULTS])
def test_trial_dying_inside_a_search_is_recorded_and_the_search_goes_on(kind, status, in_reason, space_file,
                                                                      tmp_path, spawn):
    store, trials, faulty = tmp_path / "S", 3, LEARNING_RATES[1]
    # the search's temporary folder (each trial's working folder, Ray's session): short, for Ray's socket paths
    scratch = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    # TUNER_FAULT_WHEN picks one trial: its process dies at the end of step 2, the other two run normally
    try:
        code, out = spawn.run(search_args(space_file, store, "faults", trials, 3), "search",
                              env={"TUNER_FAULT": f"{kind}@2", "TUNER_FAULT_WHEN": f"learning_rate={faulty}",
                                   "TMPDIR": str(scratch)})
        left = sorted(p.name for p in scratch.glob("tuner-trial-*"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert not left, left  # every trial's working folder went with it, the dead one's too
    assert code == expected_exit_code(load_search(local_uri(store), "faults")[1]), out[-4000:]
    client = mlflow_client(local_uri(store))
    parents, runs = runs_of(client, "faults")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(runs) == trials
    by_rate = {float(run.data.params["learning_rate"]): run for run in runs}
    assert sorted(by_rate) == LEARNING_RATES[:trials]
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


def test_a_crash_no_config_avoids_stops_the_search_after_the_first_identical_crashes(space_file, tmp_path, spawn):
    store, trials = tmp_path / "S", 6
    # every trial raises the same error at its first step, whatever its params (a reward or data bug)
    # two at a time on any machine: with as many slots as trials, all would start before the third crash
    code, out = spawn.run(search_args(space_file, store, "same-crash", trials, 2, "--concurrency", "2"), "same-crash",
                          env={"TUNER_FAULT": "error@1"})
    _, search = load_search(local_uri(store), "same-crash")
    assert {r["status"] for r in search["trials"]} == {"crashed"}
    assert 3 <= len(search["trials"]) < trials, out[-4000:]  # the trials in flight when it stopped finish
    assert "search stopped: the first 3 trials all crashed the same way with different params: RuntimeError: " \
           "injected fault 'error'" in out, out[-4000:]
    assert code == 4, out[-4000:]


def test_exit_codes_say_whether_a_search_recommended_and_a_failed_search_offers_no_export(space_file, tmp_path,
                                                                                        spawn):
    store = tmp_path / "S"
    # every trial's process dies at its first step: no trial ok
    code, out = spawn.run(search_args(space_file, store, "all-crashed", 2, 2), "all-crashed",
                          env={"TUNER_FAULT": "sigfpe@1"})
    _, search = load_search(local_uri(store), "all-crashed")
    assert {r["status"] for r in search["trials"]} == {"crashed"}
    assert code == 4, out[-4000:]
    assert "tuner export" not in out, out[-4000:]  # the summary offers no export that would fail
    # the trials are ok, but every confirmation run (seed 1) dies: searched, nothing recommended
    code, out = spawn.run(search_args(space_file, store, "unconfirmed", 2, 3, "--confirm-seeds", "1",
                                      "--confirm-top", "2"), "unconfirmed",
                          env={"TUNER_FAULT": "sigfpe@1", "TUNER_FAULT_WHEN": "seed=1"})
    _, search = load_search(local_uri(store), "unconfirmed")
    assert {r["status"] for r in search["trials"]} == {"ok"} and search["recommended"] is None
    assert code == 3, out[-4000:]
    assert "tuner export" not in out, out[-4000:]
    # and export says why in one line, exit 2
    code, out = spawn.run(tuner("export", "--experiment", "unconfirmed", "--store", str(store)), "export", timeout=240)
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
def test_driver_killed_mid_search_resumes_same_run_keeping_finished_trials(sampler, kill, space_file, tmp_path,
                                                                           spawn):
    store = tmp_path / "S"
    db = store / "mlflow.db"
    driver = spawn.start(search_args(space_file, store, "r1", 5, 4, "--sampler", sampler), "search")
    wait_for(lambda: len(finished_trial_rows(db, "r1")) >= 2 and running_optuna_trials(store / "optuna.db"),
             "2 finished trial runs and one in flight", process=driver)
    started = descendants(driver.pid)
    assert len(started) >= 5, started  # Ray's GCS, raylet, agents, workers ... and tuner's reaper
    os.kill(driver.pid, kill)
    code = driver.wait(60)
    if kill == signal.SIGTERM:
        assert code == 130 and "tuner: interrupted" in output_of(driver), output_of(driver)[-4000:]
        assert runs_of(mlflow_client(local_uri(store)), "r1")[0][0].info.status == "KILLED"
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
    client = mlflow_client(local_uri(store))
    parent = runs_of(client, "r1")[0][0]
    cut_short = running_optuna_trials(store / "optuna.db")[0]
    half_logged = client.create_run(parent.info.experiment_id, run_name=f"trial-{cut_short:03d}", tags={
        "mlflow.parentRunId": parent.info.run_id, "tuner.kind": "trial", "tuner.trial_number": str(cut_short),
        "tuner.status": "ok", "tuner.reason": "", "tuner.stopped_at_step": "4"}).info.run_id

    resume = spawn.start(tuner("search", "--resume", "r1", "--store", str(store)), "resume")
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
    client = mlflow_client(local_uri(store))
    parents, trials = runs_of(client, "r1")
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
        assert tried == LEARNING_RATES[:5], tried


# -- 3. a real MLflow tracking server ------------------------------------------------------------------------


class MlflowServer:
    def __init__(self, spawn: Spawner, folder: Path):
        self.spawn, self.db, self.artifacts = spawn, folder / "server.db", folder / "server-artifacts"
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = self.spawn.start(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--default-artifact-root", str(self.artifacts), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"], "mlflow-server")
        wait_for(self.healthy, f"MLflow server on port {self.port}", timeout=240, process=self.process)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=3) as response:
                return response.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        kill_session(self.process.pid)
        self.process.wait(30)
        assert not self.healthy()


def test_tuner_ui_stops_its_mlflow_server_and_workers_on_sigterm(tmp_path, spawn):
    store = tmp_path / "S"
    mlflow_client(local_uri(store)).search_experiments()  # an empty store
    port = free_port()
    ui = spawn.start(tuner("ui", "--store", str(store), "--port", str(port)), "ui")

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as response:
                return response.status == 200
        except OSError:
            return False

    wait_for(healthy, f"tuner ui's MLflow server on port {port}", timeout=240, process=ui)
    served = descendants(ui.pid)
    assert served, "tuner ui runs the MLflow server as its child"
    ui.send_signal(signal.SIGTERM)
    assert ui.wait(60) == 130, output_of(ui)[-4000:]
    try:
        wait_for(lambda: not still_running(served), "the MLflow server and its workers to end", timeout=30)
    finally:
        kill_all(served)
    with socket.socket() as s:
        # The port is free again: no listener holds it (SO_REUSEADDR lets closed connections in TIME_WAIT, left by
        # the health checks above, not count, as any server restarting on it would).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_unreachable_tracking_server_is_one_line_exit_2_before_anything_runs(space_file, tmp_path, spawn):
    store = tmp_path / "S"
    closed = free_port()  # bound and released: nothing listens there
    code, out = spawn.run(search_args(space_file, store, "away", 3, 3, "--tracking-uri",
                                      f"http://127.0.0.1:{closed}"), "search", timeout=240)
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: ") and str(closed) in lines[0], out
    # nothing was started or written: no store folder, no spool, no Ray session of ours
    assert not store.exists() or not any(store.iterdir()), list(store.iterdir())


def test_tracking_server_gone_mid_search_spools_then_sync_delivers_everything(space_file, tmp_path, spawn):
    server = MlflowServer(spawn, tmp_path)
    server.start()
    store = tmp_path / "S"
    trials = 4
    driver = spawn.start(search_args(space_file, store, "remote", trials, 3, "--concurrency", "1",
                                     "--tracking-uri", server.uri), "search")
    wait_for(lambda: finished_trial_rows(server.db, "remote"), "the first trial run on the server", process=driver)
    server.kill()
    search_code = driver.wait(SEARCH_TIMEOUT)
    out = output_of(driver)
    # the search did not depend on the server: it finished and said where its results wait
    assert search_code in (0, 3), out[-4000:]  # every trial ok (checked below): recommended, or none qualified
    assert out.count(f"warning: MLflow server {server.uri} is not answering") == 1, out[-4000:]
    spooled = list((store / "pending").glob("*.jsonl"))
    assert len(spooled) == 1, spooled
    parent_id = spooled[0].stem
    assert f"run {parent_id}" in out

    server.start()  # the same port and database, as after a restart
    code, sync_out = spawn.run(tuner("sync", "--store", str(store), "--tracking-uri", server.uri), "sync", timeout=240)
    assert code == 0, sync_out
    assert "sent " in sync_out and "pending" not in sync_out, sync_out
    assert not spooled[0].exists()
    client = mlflow_client(server.uri)
    parents, runs = runs_of(client, "remote")
    assert [p.info.run_id for p in parents] == [parent_id]
    assert parents[0].info.status == "FINISHED"
    # every trial arrived exactly once, whether it was sent live or from the spool, with its full loss history
    assert sorted(int(r.data.tags["tuner.trial_number"]) for r in runs) == list(range(trials))
    for run in runs:
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        assert run.data.tags["tuner.status"] == "ok"
        assert int(run.data.metrics["trial/steps_run"]) == 3
        assert_trial_run_complete(client, run)
    _, search = load_search(server.uri, "remote")
    assert len(search["trials"]) == trials
    assert search_code == expected_exit_code(search)


# -- 4. two searches on one local store at once ----------------------------------------------------------------


def test_two_searches_at_once_on_one_sqlite_store(space_file, tmp_path, spawn):
    store = tmp_path / "S"
    # A store an earlier search already made: its MLflow database and the Optuna one beside it (two searches
    # creating a fresh store together is the next test). What is left here is the writes taking turns.
    import optuna

    mlflow_client(local_uri(store)).search_experiments()
    optuna.storages.RDBStorage(f"sqlite:///{store.resolve() / 'optuna.db'}")
    trials = {"alpha": 3, "beta": 4}
    drivers = {name: spawn.start(search_args(space_file, store, name, n, 3, "--concurrency", "1"), f"search-{name}")
               for name, n in trials.items()}
    for name, driver in drivers.items():
        try:
            code = driver.wait(SEARCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"search {name} still running after {SEARCH_TIMEOUT}s:\n{output_of(driver)[-4000:]}")
        assert code == expected_exit_code(load_search(local_uri(store), name)[1]), \
            f"search {name}:\n{output_of(driver)[-4000:]}"
    with contextlib.closing(sqlite3.connect(store / "mlflow.db")) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    client = mlflow_client(local_uri(store))
    for name, n in trials.items():
        parents, runs = runs_of(client, name)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED", name
        assert len(runs) == n, (name, [r.data.tags.get("tuner.trial_number") for r in runs])
        assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parents[0].info.run_id}
        for run in runs:
            assert_trial_run_complete(client, run)
        _, search = load_search(local_uri(store), name)
        assert sorted(r["number"] for r in search["trials"]) == list(range(n))


# What a search does first with its store: the MLflow tracker (its client creates the tables of a fresh
# database) and the Optuna study beside it. Each process imports everything, says it is ready, then waits for
# the go, so they reach the fresh store within milliseconds of each other, as two searches started together do.
OPEN_STORE = """
import sys, time
from pathlib import Path

import mlflow.store.tracking.sqlalchemy_store, optuna  # noqa: F401 - imported before the go, not after
from tuner.search import _sampling as sampling
from tuner.stores import mlflow_store, run_writer

store, name = Path(sys.argv[1]), sys.argv[2]
(store / f"ready-{name}").touch()
while not (store / "go").exists():
    time.sleep(0.01)
# the same first open that search.run_search does: both databases created under the store's lock
with mlflow_store.store_lock(store):
    tracker = run_writer.SearchTracker(mlflow_store.default_tracking_uri(store), name, store)
    sampling.make_study("tpe", 0, 1, f"sqlite:///{store.resolve() / 'optuna.db'}", f"search-{name}")
    tracker.start(f"search-{name}", {"trials": 1}, {})
print("opened", name)
"""


def test_searches_starting_together_on_a_fresh_store_all_open_it(tmp_path, spawn):
    store = tmp_path / "S"
    store.mkdir()
    names = ["a", "b", "c", "d"]
    openers = [spawn.start([sys.executable, "-c", OPEN_STORE, str(store), name], f"open-{name}") for name in names]
    wait_for(lambda: all((store / f"ready-{name}").exists() for name in names), "the openers to import", timeout=240)
    (store / "go").touch()
    for name, opener in zip(names, openers):
        try:
            code = opener.wait(240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"opener {name} still running:\n{output_of(opener)[-4000:]}")
        assert code == 0 and f"opened {name}" in output_of(opener), output_of(opener)[-4000:]
    client = mlflow_client(local_uri(store))
    for name in names:
        parents, _ = runs_of(client, name)
        assert len(parents) == 1


# -- 5. a real two-node Ray cluster on loopback ------------------------------------------------------------------


def _ray_cli() -> str:
    beside = Path(sys.executable).parent / "ray"  # the ray of this Python, not whatever PATH finds first
    return str(beside) if beside.exists() else shutil.which("ray")


class RayNode:
    """One ``ray start --block`` in its own session: its raylet and everything it starts stay in that session,
    and killing the session removes the node. --block also makes it take the node down when its raylet dies."""

    def __init__(self, process: subprocess.Popen, temp_dir: str):
        self.process, self.temp_dir = process, temp_dir

    def raylet(self) -> psutil.Process:
        return next(p for p in session_members(self.process.pid) if p.name() == "raylet")

    def node_id(self) -> str:
        flag = next(a for a in self.raylet().cmdline() if a.startswith("--node_id="))
        return flag.removeprefix("--node_id=")

    def trial_processes(self) -> set[int]:
        """PIDs of the trials running on this node now: the children of a trial forkserver."""
        running = set()
        for process in session_members(self.process.pid):
            with contextlib.suppress(psutil.Error):
                if "multiprocessing.forkserver" in " ".join(process.cmdline()):
                    running.update(child.pid for child in process.children())
        return running


class RayCluster:
    def __init__(self, spawn: Spawner):
        self.spawn = spawn
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Set explicitly on every node and the driver: with RAY_AUTH_MODE unset, `ray start --head` turns token
        # auth on when ~/.ray/auth_token exists (any local ray.init() writes one) but a joining `ray start`
        # does not send the token, and the second node is refused.
        self.env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    # every step 0.25 s longer: a trial is still running when a test looks, on any machine
                    "TUNER_FAULT": "slow@1"}
        self.nodes: list[RayNode] = []

    def start_node(self, name: str, *args: str) -> RayNode:
        # Our own short temp dir (socket paths must stay under 107 bytes): never /tmp/ray, where other
        # people's clusters keep the address that `ray status` or ray.init("auto") would pick up.
        temp_dir = tempfile.mkdtemp(prefix="tr-", dir="/tmp")
        process = self.spawn.start([_ray_cli(), "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus",
                                    "1", "--temp-dir", temp_dir, "--disable-usage-stats", *args], name, env=self.env)
        node = RayNode(process, temp_dir)
        self.nodes.append(node)
        wait_for(lambda: "block forever" in output_of(process), f"{name} to start", timeout=240, process=process)
        return node

    def stop(self) -> None:
        for node in reversed(self.nodes):
            kill_session(node.process.pid)
            shutil.rmtree(node.temp_dir, ignore_errors=True)


@pytest.fixture
def ray_cluster(spawn):
    """A head node and a second node on this machine, 1 CPU each: two trials at a time, one per node."""
    cluster = RayCluster(spawn)
    try:
        cluster.head = cluster.start_node("ray-head", "--head", "--port", str(cluster.port),
                                          "--include-dashboard=false", "--dashboard-port", str(free_port()))
        cluster.worker = cluster.start_node("ray-worker", "--address", cluster.address)
        yield cluster
    finally:
        cluster.stop()


def test_search_spreads_over_a_two_node_cluster_and_survives_losing_a_node(ray_cluster, space_file, tmp_path,
                                                                           spawn):
    store, trials = tmp_path / "S", 6
    head_id, worker_id = ray_cluster.head.node_id(), ray_cluster.worker.node_id()
    worker_raylet = ray_cluster.worker.raylet()
    driver = spawn.start(search_args(space_file, store, "cluster", trials, 6, "--ray-address", ray_cluster.address),
                         "search", env=ray_cluster.env)
    # Wait for the second trial process on the worker node: one trial has finished there and one is running.
    seen: set[int] = set()

    def second_trial_running_on_worker() -> bool:
        running = ray_cluster.worker.trial_processes()
        seen.update(running)
        return len(seen) >= 2 and bool(running)

    wait_for(second_trial_running_on_worker, "a second trial on the worker node", process=driver, interval=0.2)
    worker_raylet.kill()  # the node is lost with a trial on it
    try:
        code = driver.wait(SEARCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"search still running {SEARCH_TIMEOUT}s after the node died:\n{output_of(driver)[-4000:]}")
    out = output_of(driver)
    _, search = load_search(local_uri(store), "cluster")
    assert code == expected_exit_code(search), out[-4000:]
    records = search["trials"]
    # every trial is accounted for once, the lost one included
    assert sorted(r["number"] for r in records) == list(range(trials)), records
    # trials ran on both nodes, and each record says which
    assert {head_id, worker_id} <= {r["node_id"] for r in records}, [(r["number"], r["node_id"]) for r in records]
    for record in records:
        if record["status"] != "ok":  # the trial that was on the node when it died, unless Ray re-ran it
            assert record["status"] == "crashed" and "lost" in record["reason"], record
    client = mlflow_client(local_uri(store))
    parents, runs = runs_of(client, "cluster")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(runs) == trials
