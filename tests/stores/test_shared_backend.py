"""A team's memory (docs/how-a-search-works.md, "Warm start"): two users, each in a folder of their own with a --store
of their own, point --tracking-uri at one MLflow server whose backend is a real PostgreSQL server, and the second
user's search warm-starts from the first user's. What is shared is the MLflow store (runs, tags, search.json through
the server's artifact proxy); what stays each user's is the Optuna study in their --store.

PostgreSQL comes from pip (the ``pgserver`` wheel bundles its binaries; only those are used here: the server runs in
the foreground in its own session, on a free port of 127.0.0.1, no Unix socket, and is stopped at the end). MLflow's
server reaches it with psycopg (v3). Both are in the ``test`` extra (pyproject.toml).

    python -m pytest tests/stores/test_shared_backend.py -q
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from helpers import CONFIRM_SPACE, Spawner, expected_exit_code, free_port, kill_session, wait_for

from tuner.stores.tags import STUDY_STORAGE_TAG, WARM_START_TAG

pytestmark = pytest.mark.slow


def postgres_binaries() -> Path:
    """The bin/ folder of pgserver's PostgreSQL, found without importing pgserver (its import sets up its own
    server registry and lock file, none of which is used here)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pgserver is not installed (pip install -e '.[test]')")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


@pytest.fixture
def postgres(spawn: Spawner):
    """A PostgreSQL server of this test's own: its SQLAlchemy URI (trust authentication, user postgres)."""
    psycopg = pytest.importorskip("psycopg")
    binaries = postgres_binaries()
    # PostgreSQL refuses to run as root: as root, it runs as nobody, in a folder nobody owns (not under pytest's
    # tmp_path, whose pytest-of-root folder only root may enter).
    user = "nobody" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="tuner-postgres-"))
    if user:
        import pwd

        os.chown(folder, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    data, port = folder / "data", free_port()
    server: subprocess.Popen | None = None
    try:
        code, out = spawn.run([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth", "trust",
                               "--encoding", "UTF8", "--no-sync"], "initdb", timeout=120, cwd=folder, user=user)
        assert code == 0, out[-4000:]
        server = spawn.start([str(binaries / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                              "-k", "",  # no Unix socket: TCP on 127.0.0.1 only
                              "-c", "fsync=off"], "postgres", cwd=folder, user=user)

        def ready() -> bool:
            try:
                psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=3).close()
                return True
            except psycopg.OperationalError:
                return False

        wait_for(ready, f"PostgreSQL on port {port}", timeout=60, process=server, interval=0.2)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:  # stopped before its folder goes, also when the test failed
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # a fast shutdown: its shared memory goes with it (a kill leaves some)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(30)
            kill_session(server.pid)  # what is left of it, if anything
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def team_server(spawn: Spawner, postgres: str, tmp_path: Path) -> str:
    """The team's MLflow server on that database, serving artifacts itself (users upload and download through it)."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = spawn.start([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres,
                          "--artifacts-destination", str(tmp_path / "team-artifacts"), "--host", "127.0.0.1",
                          "--port", str(port), "--workers", "1"], "mlflow-server")

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=3) as response:
                return response.status == 200
        except OSError:
            return False

    wait_for(healthy, f"MLflow server on port {port}", timeout=240, process=server, interval=0.5)
    return uri


def search(spawn: Spawner, user: Path, uri: str) -> tuple[int, str]:
    """``tuner search`` as ``user`` would run it: in their folder, their own --store, the team's --tracking-uri.
    The cheap search of tests/search/test_warm.py: 2 trials of 8 steps of the reward model at learning rates that
    learn clearly, so a recommendation is likely (the assertions hold either way)."""
    user.mkdir()
    (user / "space.yaml").write_text(CONFIRM_SPACE)
    return spawn.run([sys.executable, "-m", "tuner.cli", "search", "--trainer", "reward", "--search-space",
                      "space.yaml", "--trials", "2", "--max-steps", "8", "--seed", "0", "--confirm-seeds", "0",
                      "--experiment", user.name, "--store", str(user / "store"), "--tracking-uri", uri],
                     user.name, cwd=user)


def search_runs(client) -> list:
    """The finished search runs on the server, oldest first."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string="tags.`tuner.kind` = 'search' and "
                              "attributes.status = 'FINISHED'", order_by=["attributes.start_time ASC"])


def summary_of(client, run, folder: Path) -> dict:
    """The run's search.json, downloaded through the server."""
    folder = folder / "downloaded" / run.info.run_id
    folder.mkdir(parents=True)
    return json.loads(Path(client.download_artifacts(run.info.run_id, "search.json", str(folder))).read_text())


def test_one_users_search_warm_starts_another_users_through_a_shared_postgres_backed_server(
        team_server, spawn, tmp_path, tiny_model):
    from tuner.stores import client as mlflow_client

    client = mlflow_client(team_server)
    alice, bob = tmp_path / "alice", tmp_path / "bob"

    code, out = search(spawn, alice, team_server)
    (first,) = search_runs(client)
    theirs = summary_of(client, first, tmp_path)
    assert code == expected_exit_code(theirs), out[-4000:]
    assert not any(line.startswith("warm start") for line in out.splitlines())  # an empty team store: a cold start

    code, out = search(spawn, bob, team_server)
    older, second = search_runs(client)
    assert older.info.run_id == first.info.run_id
    ours = summary_of(client, second, tmp_path)
    assert code == expected_exit_code(ours), out[-4000:]
    line = next((line for line in out.splitlines() if line.startswith("warm start from")), None)
    assert line is not None, f"bob's search did not warm-start from alice's; output:\n{out[-4000:]}"
    # the hardware is this machine's (cpu, or its GPU's name): both users ran here
    assert line.startswith(f"warm start from search {first.info.run_name} of reward on tiny ("), line
    assert "; same data): " in line, line
    told = len(theirs["trials"])  # all in this space: every one is told to bob's sampler
    assert f"{told} earlier trial{'s' if told != 1 else ''} told to the sampler" in line, line
    best = theirs["recommended"]
    if best is not None:
        assert "trial 0 = its recommendation" in line, line
        (trial0,) = [r for r in ours["trials"] if r["number"] == 0]
        assert trial0["params"]["learning_rate"] == best["params"]["learning_rate"]
    else:
        assert "no recommendation of theirs to run first" in line, line
    assert second.data.tags[WARM_START_TAG] == first.info.run_id
    # shared: the MLflow store on the server; each user's own: the Optuna study, in their --store
    for user, run in ((alice, first), (bob, second)):
        assert run.data.tags[STUDY_STORAGE_TAG] == f"sqlite:///{(user / 'store').resolve() / 'optuna.db'}"
        assert (user / "store" / "optuna.db").exists() and not (user / "store" / "mlflow.db").exists()
