"""Searches as jobs on a real Ray cluster, set up as docs/distributed.md tells a team: ``ray start --head`` with its
job server on 127.0.0.1, an ``mlflow server`` backed by a real PostgreSQL server (helpers.postgres_server), both
named once for the cluster (TUNER_TRACKING_URI and TUNER_STORE in the head's environment), and tuner submit, jobs,
logs and stop run as a user runs them, from a folder of their own.

One cluster for the module (its start is most of the cost): two searches sent at once both finish with their own
experiments while they share the cluster's CPUs; one is stopped during its trials (runs KILLED, exit 130 in its log)
and resumed to the end as a new job; tuner jobs and tuner logs say what happened; and a second user's search, with
a --store of their own, warm-starts from the first user's through the shared PostgreSQL-backed MLflow server (issue
35's "team's memory": what is shared is MLflow, what stays each user's is the Optuna study in their --store).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import MLFLOW_SERVER_ENV, SFT_SPACE, Spawner, free_port, kill_session, postgres_server, wait_for

from tuner.stores import tags

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}
# The cluster runs with Ray's token authentication on, as docs/distributed.md sets it up: the head with the token and
# token mode; each user with the token only (tuner turns token mode on where it finds one: tests/e2e/jobs/test_token_auth.py)
TOKEN = "7e57c1a55e7e57c1a55e7e57c1a55e00"
HEAD_ENV = {**RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
USER_ENV = {**RAY_ENV, "RAY_AUTH_TOKEN": TOKEN}
JOB_TIMEOUT = 360


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # the tools of this Python, not whatever PATH finds first
    return str(beside) if beside.exists() else shutil.which(name) or name


def _answers(url: str) -> bool:
    """Up: it answers, a 401 included (with token authentication the job server asks for the token there too)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except urllib.error.HTTPError as e:
        return e.code == 401
    except OSError:
        return False


class TeamCluster:
    """A head node with its job server, and the team's MLflow server and shared store, all on 127.0.0.1."""

    def __init__(self, spawn: Spawner, folder: Path):
        self.spawn, self.folder = spawn, folder
        self.store = folder / "team-store"
        self.tracking_uri = f"http://127.0.0.1:{free_port()}"
        self.dashboard_port = free_port()
        self.url = f"http://127.0.0.1:{self.dashboard_port}"
        self.temp_dir = tempfile.mkdtemp(prefix="tj-", dir="/tmp")  # socket paths must stay short

    def start(self, database: str) -> None:
        self.database = database  # the team's PostgreSQL, MLflow's backend store
        port = self.tracking_uri.rsplit(":", 1)[1]
        mlflow = self.spawn.start([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", database,
                                   # artifacts through the server: every user uploads and downloads them over HTTP
                                   "--artifacts-destination", str(self.folder / "team-artifacts"),
                                   "--host", "127.0.0.1", "--port", port, "--workers", "1"], "mlflow-server",
                                  env=MLFLOW_SERVER_ENV)
        env = {**HEAD_ENV, "TUNER_STORE": str(self.store), "TUNER_TRACKING_URI": self.tracking_uri,
               "TUNER_FAULT": "slow@1",  # every step 0.25 s longer: a search is still in its trials when stopped
               # the jobs run `tuner` from the head's PATH: this Python's, whether or not the caller activated it
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.head = self.spawn.start(
            [_tool("ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port",
             str(free_port()), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
             # its own agent ports: another Ray on the machine (a test beside this one) holds the defaults
             "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
             "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
             "--num-cpus", "4", "--temp-dir", self.temp_dir, "--disable-usage-stats"], "ray-head", env=env)
        wait_for(lambda: _answers(f"{self.url}/api/version"), "the head's job server", timeout=240, process=self.head)
        wait_for(lambda: _answers(f"{self.tracking_uri}/health"), "the MLflow server", timeout=240, process=mlflow)

    def stop(self) -> None:
        kill_session(self.head.pid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    folder = tmp_path_factory.mktemp("team")
    spawner = Spawner(folder)
    cluster = TeamCluster(spawner, folder)
    try:
        with postgres_server(spawner) as database:
            cluster.start(database)
            yield cluster
    finally:
        cluster.stop()
        spawner.cleanup()


@pytest.fixture
def user_folder(tmp_path):
    """A user's folder: the search space the searches read travels with each job."""
    (tmp_path / "sft.yaml").write_text(SFT_SPACE)
    return tmp_path


def tuner(folder: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A tuner command as a user types it, in ``folder``, without the cluster's environment."""
    return subprocess.run([_tool("tuner"), *args], cwd=folder, capture_output=True, text=True, timeout=timeout,
                          env={**_clean_env(), **USER_ENV})


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "RAY_AUTH"))}


def job_id(submitted: subprocess.CompletedProcess) -> str:
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    found = re.search(r"^submitted (tuner-\S+) to ", submitted.stdout, re.MULTILINE)
    assert found, submitted.stdout
    return found.group(1)


def wait_ended(team: TeamCluster, folder: Path, job: str) -> str:
    """The job's log once it has ended (tuner logs --follow returns when it does)."""
    done = tuner(folder, "logs", job, "--follow", "--cluster", team.url, timeout=JOB_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def search_runs(team: TeamCluster, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(team.tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment} on the team's MLflow server"
    runs = client.search_runs([found.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, trials


def test_two_searches_at_once_one_stopped_and_resumed_and_jobs_says_what_happened(team, user_folder):
    common = ["--cluster", team.url, "--search-space", "sft.yaml", "--sampler", "random", "--confirm-seeds", "0",
              "--budget", "0"]  # no confirmation or longer rungs: the job's life is what is tested
    # Two users' searches sent at once (two processes), each with half the cluster's 4 CPUs.
    with subprocess.Popen([_tool("tuner"), "submit", *common, "--trials", "6", "--max-steps", "24"], cwd=user_folder,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**_clean_env(), **USER_ENV}) as other:
        short = tuner(user_folder, "submit", *common, "--trials", "2", "--max-steps", "4")
        out, err = other.communicate(timeout=120)
    first = job_id(short)
    second = job_id(subprocess.CompletedProcess([], other.returncode, out, err))
    experiments = {}
    for job, text in ((first, short.stdout), (second, out)):
        experiments[job] = re.search(r"experiment: (\S+)", text).group(1)
        assert f"tuner logs {job} --follow --cluster {team.url}" in text
    assert experiments[first] != experiments[second]

    # The longer one is stopped once a trial of it has finished: at 0.25 s a step (TUNER_FAULT), 2 trials at a time,
    # its other 5 trials take at least 15 s more, well beyond the few seconds tuner logs and tuner stop take.
    def one_trial_done() -> bool:
        return "[  1/6]" in tuner(user_folder, "logs", second, "--cluster", team.url).stdout

    wait_for(one_trial_done, f"a finished trial of {second}", timeout=JOB_TIMEOUT, interval=2)
    stopped = tuner(user_folder, "stop", second, "--cluster", team.url)
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {second}: STOPPED" in stopped.stdout and f"tuner submit --resume {second}" in stopped.stdout
    log = tuner(user_folder, "logs", second, "--cluster", team.url).stdout
    assert "tuner: exit code 130" in log, log[-3000:]
    assert f"Resume with: tuner submit --resume {second} --cluster {team.url}" in log
    parents, _ = search_runs(team, experiments[second])
    assert [p.info.status for p in parents] == ["KILLED"]

    # The short one ran beside it to its end, with its own experiment: a search on the cluster's store.
    log = wait_ended(team, user_folder, first)
    code = int(re.search(r"^tuner: exit code (\d+)$", log, re.MULTILINE).group(1))
    assert code in (0, 3), log[-3000:]  # recommended, or nothing learned in 4 steps: both a search that ended
    assert "share: 2 trials at a time (--cluster-share 0.5: 2 of the cluster's 4 CPUs)" in log
    parents, trials = search_runs(team, experiments[first])
    assert [p.info.status for p in parents] == ["FINISHED"] and len(trials) >= 2
    assert (team.store / "optuna.db").exists()  # the study in the shared store, not the job's folder

    # Resumed as a new job: it keeps the finished trials and runs the rest.
    resumed_out = tuner(user_folder, "submit", "--resume", second, "--cluster", team.url)
    resumed = job_id(resumed_out)
    assert f"--resume {experiments[second]}" in resumed_out.stdout

    # Meanwhile another user, another folder and a --store of their own: their search warm-starts from the team's
    # finished searches of sft on tiny on this cluster, read through the shared MLflow server (its PostgreSQL). Sent
    # beside the resumed job (each has half the cluster's CPUs), not after it: the first user's short search has
    # finished, and that is the search their warm start is asserted to read.
    # Their Optuna study goes to the team's PostgreSQL too (a database of its own beside MLflow's: both keep an
    # alembic_version table), as --optuna-storage names it.
    bob = user_folder / "bob"
    bob.mkdir()
    (bob / "sft.yaml").write_text(SFT_SPACE)
    studies = _new_database(team.database, "optuna")
    sent = tuner(bob, "submit", *common, "--trials", "2", "--max-steps", "4", "--store", str(bob / "store"),
                 "--optuna-storage", studies)
    theirs = job_id(sent)

    log = wait_ended(team, user_folder, resumed)
    assert re.search(r"^resuming search-\S+: [1-5] of 6 trials already done$", log, re.MULTILINE), log[-3000:]
    assert re.search(r"^tuner: exit code (0|3)$", log, re.MULTILINE), log[-3000:]
    parents, trials = search_runs(team, experiments[second])
    assert [p.info.status for p in parents] == ["FINISHED"]
    numbers = {t.data.tags[tags.TRIAL_NUMBER_TAG] for t in trials if tags.CONFIRMS_TAG not in t.data.tags}
    assert len(numbers) == 6, numbers  # every trial once: the 1-5 kept, the rest run by the resumed job

    log = wait_ended(team, bob, theirs)
    line = next((line for line in log.splitlines() if line.startswith("warm start from")), None)
    assert line is not None and " of sft on tiny (Ray cluster " in line and "; same data)" in line, log[-3000:]
    assert re.search(r"^tuner: exit code (0|3)$", log, re.MULTILINE), log[-3000:]
    (ours,), _ = search_runs(team, re.search(r"experiment: (\S+)", sent.stdout).group(1))
    (first_run,), _ = search_runs(team, experiments[first])
    assert first_run.info.run_id in ours.data.tags[tags.WARM_START_TAG]
    assert ours.data.tags[tags.STUDY_STORAGE_TAG] == studies
    import optuna

    study = optuna.load_study(study_name=ours.data.tags[tags.STUDY_TAG], storage=studies)
    assert len(study.trials) >= 2  # its trials, told to the sampler, in the team's database
    assert not (bob / "store" / "optuna.db").exists() and not (bob / "store" / "mlflow.db").exists()

    # tuner jobs: a line per search, newest first, with what happened to each.
    listing = tuner(user_folder, "jobs", "--cluster", team.url)
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert list(lines)[:2] == [theirs, resumed] and {first, second} <= set(lines), listing.stdout
    assert "STOPPED (resumable)" in lines[second] and experiments[second] in lines[second]
    assert f"resumes {second}" in lines[resumed] and " 6/6 " in lines[resumed]
    assert re.search(r"SUCCEEDED \(recommended\)|FAILED \(nothing recommended\)", lines[first]), lines[first]
    # tuner logs: the search's own output, the results table included
    assert "| trial | status |" in tuner(user_folder, "logs", first, "--cluster", team.url).stdout


def _new_database(server: str, name: str) -> str:
    """A new database on the test's PostgreSQL server (``server``: its SQLAlchemy URI), and its SQLAlchemy URI."""
    import psycopg

    base = server.rsplit("/", 1)[0]
    with psycopg.connect(base.replace("postgresql+psycopg://", "postgresql://") + "/postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"{base}/{name}"


def test_an_unknown_job_and_a_store_in_the_jobs_folder_are_one_line(team, user_folder):
    for command in (["logs", "tuner-nobody-000000"], ["stop", "tuner-nobody-000000"],
                    ["submit", "--resume", "tuner-nobody-000000"]):
        done = tuner(user_folder, *command, "--cluster", team.url)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (command, done.stderr)
        assert "tuner-nobody-000000: no such job on the cluster" in done.stderr
    # A relative --store would live in the job's copy of the folder, which Ray deletes: the job refuses it.
    sent = job_id(tuner(user_folder, "submit", "--cluster", team.url, "--search-space", "sft.yaml", "--store",
                        "here", "--trials", "1"))
    log = wait_ended(team, user_folder, sent)
    assert "tuner: error: --store here: inside the job's working directory" in log and "tuner: exit code 2" in log
    assert "Traceback" not in log


def test_an_unreachable_cluster_and_a_folder_over_the_upload_limit_are_one_line(tmp_path):
    nobody = f"http://127.0.0.1:{free_port()}"
    for command in (["submit"], ["jobs"], ["logs", "tuner-x-1"], ["stop", "tuner-x-1"]):
        done = tuner(tmp_path, *command, "--cluster", nobody)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.count("\n") == 1 and f"--cluster {nobody}: no Ray job server answers there" in done.stderr
    assert tuner(tmp_path, "jobs").stderr.startswith("tuner: error: no cluster named: pass --cluster")
    # Over Ray's 512 MiB upload limit (a sparse file: no disk is used): refused before the cluster is asked.
    with (tmp_path / "data.jsonl").open("wb") as big:
        big.truncate(600 * 2**20)
    done = tuner(tmp_path, "submit", "--cluster", nobody, "--trainer", "sft", "--dataset", "data.jsonl")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "600 MiB to upload with the job, over Ray's limit of 512 MiB (largest: data.jsonl (600 MiB))" in done.stderr
    # --ray-address is not for a submitted search; a file named that is not in the folder does not travel
    for args, said in ((["--ray-address", "auto"], "unrecognized arguments: --ray-address"),
                       (["--from", "missing.yaml"], "--from missing.yaml: no such file in")):
        done = tuner(tmp_path, "submit", "--cluster", nobody, *args)
        assert done.returncode == 2 and said in done.stderr, done.stderr
