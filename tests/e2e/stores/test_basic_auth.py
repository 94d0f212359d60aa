"""A team's MLflow server with users (`mlflow server --app-name basic-auth`, MLflow's own users-and-permissions app),
the credentials in MLflow's own variables (MLFLOW_TRACKING_USERNAME / _PASSWORD): a search, its export and report, and
`tuner sync` work; no credentials or a wrong password is one line and exit 2 before anything is written; a server
that stops taking the search's credentials mid-search (the password changed) loses nothing: the results wait on disk
and `tuner sync` with the new password delivers every trial. No password ever appears in what tuner prints or logs."""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import (
    MLFLOW_SERVER_ENV,
    SEARCH_TIMEOUT,
    Spawner,
    assert_trial_run_complete,
    expected_exit_code,
    free_port,
    load_search,
    output_of,
    parent_and_trial_runs,
    search_args,
    tuner_command,
    wait_for,
)

ADMIN, ADMIN_PASSWORD = "admin", "admin-Pa55-7e57"
USER, PASSWORD, NEW_PASSWORD = "alice", "alice-Pa55-0ld1", "alice-Pa55-n3w2"
SECRETS = (ADMIN_PASSWORD, PASSWORD, NEW_PASSWORD)


class UsersServer:
    """`mlflow server --app-name basic-auth` on 127.0.0.1 with SQLite behind it; the admin's password from the env."""

    def __init__(self, spawn: Spawner, folder: Path):
        self.spawn, self.folder = spawn, folder
        self.uri = f"http://127.0.0.1:{free_port()}"

    def start(self) -> None:
        env = {"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD, "MLFLOW_FLASK_SERVER_SECRET_KEY": "tuner-test-secret",
               **MLFLOW_SERVER_ENV}
        os.environ.pop("MLFLOW_AUTH_CONFIG_PATH", None)
        self.process = self.spawn.start(
            [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--backend-store-uri",
             f"sqlite:///{self.folder / 'server.db'}", "--default-artifact-root", str(self.folder / "artifacts"),
             "--host", "127.0.0.1", "--port", self.uri.rsplit(":", 1)[1], "--workers", "1"], "mlflow-auth",
            cwd=self.folder, env=env)
        wait_for(self.healthy, "the MLflow server with users", timeout=240, process=self.process)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=3) as response:
                return response.status == 200
        except OSError:
            return False

    def call(self, method: str, path: str, body: dict, user: str = ADMIN, password: str = ADMIN_PASSWORD) -> int:
        request = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                         method=method, headers={"Content-Type": "application/json"})
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("users-server")
    spawner = Spawner(folder)
    users = UsersServer(spawner, folder)
    try:
        users.start()
        assert users.call("POST", "users/create", {"username": USER, "password": PASSWORD}) == 200
        yield users
    finally:
        spawner.cleanup()


def as_user(password: str | None, user: str = USER) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    if password is not None:
        env.update(MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=password)
    return env


def client_as(monkeypatch, uri: str, password: str, user: str = USER):
    """An MLflow client of this test's process as ``user`` (MLflow reads the variables at each request; monkeypatch
    puts them back after the test)."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def no_secret_in(*texts: str) -> None:
    for text in texts:
        assert not any(secret in text for secret in SECRETS), text[-2000:]


@pytest.mark.slow
def test_no_credentials_or_a_wrong_password_is_one_line_and_nothing_is_written(server, grid_space, tmp_path, spawn,
                                                                                   monkeypatch):
    for password, said in ((None, "asks for a user (HTTP 401) and none were given"),
                           ("wrong-password", f"asks for a user (HTTP 401) and it refused user '{USER}' and that "
                                              "password")):
        store = tmp_path / f"S-{password}"
        code, out = spawn.run(search_args(grid_space, store, "refused", 2, 3, "--tracking-uri", server.uri),
                              f"search-refused-{password}", timeout=240, env=as_user(password))
        assert code == 2, out
        lines = out.strip().splitlines()
        assert len(lines) == 1 and said in lines[0] and "MLFLOW_TRACKING_PASSWORD" in lines[0], out
        no_secret_in(out)
        assert not store.exists() or not any(store.iterdir())
        code, out = spawn.run(tuner_command("sync", "--store", str(store), "--tracking-uri", server.uri),
                              f"sync-refused-{password}", timeout=120, env=as_user(password))
        assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert client_as(monkeypatch, server.uri, ADMIN_PASSWORD, ADMIN).get_experiment_by_name("refused") is None


@pytest.mark.slow
def test_a_password_changed_mid_search_loses_nothing_and_sync_delivers_every_trial(server, grid_space, tmp_path,
                                                                                  spawn, monkeypatch):
    store, trials = tmp_path / "S", 4
    driver = spawn.start(search_args(grid_space, store, "users", trials, 3, "--concurrency", "1", "--tracking-uri",
                                     server.uri), "search", env={**as_user(PASSWORD), "TUNER_FAULT": "slow@1"})

    def first_trial_logged() -> bool:
        client = client_as(monkeypatch, server.uri, ADMIN_PASSWORD, ADMIN)
        experiment = client.get_experiment_by_name("users")
        return experiment is not None and bool(client.search_runs(
            [experiment.experiment_id], filter_string="tags.`tuner.kind` = 'trial' and attributes.status = 'FINISHED'"))

    wait_for(first_trial_logged, "the first trial run on the server", process=driver)
    assert server.call("PATCH", "users/update-password", {"username": USER, "password": NEW_PASSWORD}) == 200
    search_code = driver.wait(SEARCH_TIMEOUT)
    out = output_of(driver)
    assert search_code in (0, 3), out[-4000:]
    assert out.count(f"warning: MLflow server {server.uri} no longer takes this search's credentials") == 1, \
        out[-4000:]
    spooled = list((store / "pending").glob("*.jsonl"))
    assert len(spooled) == 1, spooled

    code, sync_out = spawn.run(tuner_command("sync", "--store", str(store), "--tracking-uri", server.uri), "sync-old",
                               timeout=120, env=as_user(PASSWORD))
    assert code == 2 and spooled[0].exists(), sync_out  # the old password: one line, the writes still kept
    code, sync_out = spawn.run(tuner_command("sync", "--store", str(store), "--tracking-uri", server.uri), "sync",
                               timeout=240, env=as_user(NEW_PASSWORD))
    assert code == 0 and not spooled[0].exists(), sync_out
    client = client_as(monkeypatch, server.uri, NEW_PASSWORD)
    parents, runs = parent_and_trial_runs(client, "users")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(int(r.data.tags["tuner.trial_number"]) for r in runs) == list(range(trials))
    for run in runs:
        assert run.data.tags["tuner.status"] == "ok" and int(run.data.metrics["trial/steps_run"]) == 3
        assert_trial_run_complete(client, run)
        no_secret_in(json.dumps(run.data.tags), json.dumps(run.data.params))
    no_secret_in(json.dumps(parents[0].data.tags), json.dumps(parents[0].data.params), out, sync_out)
    _, search = load_search(server.uri, "users")
    assert len(search["trials"]) == trials and search_code == expected_exit_code(search)
    # the export and the report read it with the user's credentials
    code, exported = spawn.run(tuner_command("export", "--experiment", "users", "--tracking-uri", server.uri, "-o",
                                             str(tmp_path / "r.yaml")), "export", timeout=120,
                               env=as_user(NEW_PASSWORD))
    assert code == (0 if search_code == 0 else 2), exported  # nothing recommended: export says so, exit 2
    code, report = spawn.run(tuner_command("report", "--experiment", "users", "--tracking-uri", server.uri),
                             "report", timeout=120, env=as_user(NEW_PASSWORD))
    assert code == 0 and "trials" in report, report
    no_secret_in(exported, report)
