"""Reliability and scale, end to end with real processes: a real MLflow tracking server that goes away and comes back
(and ``tuner ui``'s own), two searches on one SQLite store at once (and several opening a fresh one together), and a
real two-node Ray cluster that loses a node mid-search. Trials dying inside a search and a driver killed mid-search
are in test_reliability.py. About 3 minutes on a 2-core machine, most of it Ray starting and importing TRL.

Every test starts its processes in their own session (``start_new_session``) and a finalizer kills every
process still in that session by PID, even when the test fails: Ray's workers change their process group,
but not their session. Nothing here runs ``ray stop``: other people's Ray clusters may share this machine.
The searches' space, commands and store readers are in tests/helpers.py (``grid_space``: tests/conftest.py).

    python -m pytest tests/e2e/search/test_reliability_services.py -q -x
"""

from __future__ import annotations

import contextlib
import re
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
    MLFLOW_SERVER_ENV,
    SEARCH_TIMEOUT,
    Spawner,
    assert_trial_run_complete,
    descendants,
    expected_exit_code,
    finished_trial_rows,
    free_port,
    kill_all,
    kill_session,
    load_search,
    local_uri,
    output_of,
    parent_and_trial_runs,
    search_args,
    session_members,
    still_running,
    store_client,
    tuner_command,
    wait_for,
)

pytestmark = pytest.mark.slow


# -- 1. a real MLflow tracking server ------------------------------------------------------------------------


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
             "--workers", "1"], "mlflow-server", env=MLFLOW_SERVER_ENV)
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
    store_client(local_uri(store)).search_experiments()  # an empty store
    port = free_port()
    ui = spawn.start(tuner_command("ui", "--store", str(store), "--port", str(port)), "ui")

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


def test_unreachable_tracking_server_is_one_line_exit_2_before_anything_runs(grid_space, tmp_path, spawn):
    store = tmp_path / "S"
    closed = free_port()  # bound and released: nothing listens there
    code, out = spawn.run(search_args(grid_space, store, "away", 3, 3, "--tracking-uri",
                                      f"http://127.0.0.1:{closed}"), "search", timeout=240)
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: ") and str(closed) in lines[0], out
    # nothing was started or written: no store folder, no spool, no Ray session of ours
    assert not store.exists() or not any(store.iterdir()), list(store.iterdir())


def test_tracking_server_gone_mid_search_spools_then_sync_delivers_everything(grid_space, tmp_path, spawn):
    server = MlflowServer(spawn, tmp_path)
    server.start()
    store = tmp_path / "S"
    trials = 4
    driver = spawn.start(search_args(grid_space, store, "remote", trials, 3, "--concurrency", "1",
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
    code, sync_out = spawn.run(tuner_command("sync", "--store", str(store), "--tracking-uri", server.uri), "sync", timeout=240)
    assert code == 0, sync_out
    assert "sent " in sync_out and "pending" not in sync_out, sync_out
    assert not spooled[0].exists()
    client = store_client(server.uri)
    parents, runs = parent_and_trial_runs(client, "remote")
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


# -- 2. two searches on one local store at once ----------------------------------------------------------------


def test_two_searches_at_once_on_one_sqlite_store(grid_space, tmp_path, spawn):
    store = tmp_path / "S"
    # A store an earlier search already made: its MLflow database and the Optuna one beside it (two searches
    # creating a fresh store together is the next test). What is left here is the writes taking turns.
    import optuna

    store_client(local_uri(store)).search_experiments()
    optuna.storages.RDBStorage(f"sqlite:///{store.resolve() / 'optuna.db'}")
    trials = {"alpha": 3, "beta": 4}
    drivers = {name: spawn.start(search_args(grid_space, store, name, n, 3, "--concurrency", "1"), f"search-{name}")
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
    client = store_client(local_uri(store))
    for name, n in trials.items():
        parents, runs = parent_and_trial_runs(client, name)
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
    client = store_client(local_uri(store))
    for name in names:
        parents, _ = parent_and_trial_runs(client, name)
        assert len(parents) == 1


# -- 3. a real two-node Ray cluster on loopback ------------------------------------------------------------------


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

    def running_trials(self) -> set[int]:
        """The numbers of the trials running on this node now: the children of a trial forkserver, each known by the
        metrics file it holds open (in its workdir, tuner-trial-NNN-*). A child not yet that far is left out."""
        running = set()
        for process in session_members(self.process.pid):
            with contextlib.suppress(psutil.Error):
                if "multiprocessing.forkserver" in " ".join(process.cmdline()):
                    for child in process.children():
                        with contextlib.suppress(psutil.Error):
                            running.update(int(m.group(1)) for f in child.open_files()
                                           if (m := re.search(r"/tuner-trial-(\d+)-[^/]*/metrics\.jsonl$", f.path)))
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


def test_search_spreads_over_a_two_node_cluster_and_survives_losing_a_node(ray_cluster, grid_space, tmp_path,
                                                                           spawn):
    store, trials = tmp_path / "S", 6
    head_id, worker_id = ray_cluster.head.node_id(), ray_cluster.worker.node_id()
    worker_raylet = ray_cluster.worker.raylet()
    driver = spawn.start(search_args(grid_space, store, "cluster", trials, 6, "--ray-address", ray_cluster.address),
                         "search", env=ray_cluster.env)
    # Wait for a second trial on the worker node: one trial has finished there and one is running. Known by their
    # numbers, not their processes: a trial's process is not all a forkserver's child can be.
    seen: list[int] = []

    def second_trial_running_on_worker() -> bool:
        running = ray_cluster.worker.running_trials()
        seen.extend(sorted(running - set(seen)))
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
    assert {head_id, worker_id} <= {r["node_id"] for r in records}, (
        [(r["number"], r["node_id"], r["status"]) for r in records], head_id, worker_id, seen, out[-6000:])
    for record in records:
        if record["status"] != "ok":  # the trial that was on the node when it died, unless Ray re-ran it
            assert record["status"] == "crashed" and "lost" in record["reason"], record
    client = store_client(local_uri(store))
    parents, runs = parent_and_trial_runs(client, "cluster")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(runs) == trials
