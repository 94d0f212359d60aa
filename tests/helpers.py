"""What several test files share: search spaces, config files, searches run through the Python API, TRL's own
parser, and the processes of end-to-end tests. Test modules import from here (``from helpers import ...``: tests/ is on
sys.path as pytest's rootdir-relative "prepend" import mode puts it there for tests/conftest.py), never from one
another; fixtures that several files use (``anchor``, ``spawn``) are in tests/conftest.py.

Only the standard library, pytest, PyYAML and psutil are imported here at the top: the pure-logic tests that import
this module do not pay for torch, TRL, Ray or MLflow, which each helper imports when it is called.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest
import yaml

if TYPE_CHECKING:
    from tuner.config import trl_config
    from tuner.search import driver

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent  # the repository: tuner/, bench/, docs/, README.md
DATA = TESTS / "data"  # recorded data the tests read (tests/data/README.md)
BENCH_RECORDED = REPO / "bench" / "recorded"  # the data bench writes and tests read (tests/data/README.md, the end)

# -- search spaces ---------------------------------------------------------------------------------------------------

# The anchor: the reward trainer on {fp16-pure, bf16-pure, fp32} x {1e-4, 0.3}.
ANCHOR_SPACE = """\
trainer: reward
fixed:
  per_device_train_batch_size: 8
  use_peft: false
  max_length: 64
params:
  precision: {type: categorical, choices: [fp16-pure, bf16-pure, fp32]}
  learning_rate: {type: categorical, choices: [1.0e-4, 0.3]}
"""

# The reward model at learning rates that learn clearly within 8 to 12 steps (the anchor grid's fp32 cell): a search
# of it recommends, so a confirmation run or a longer rung follows.
CONFIRM_SPACE = """\
trainer: reward
fixed:
  per_device_train_batch_size: 8
  use_peft: false
  max_length: 64
  precision: fp32
params:
  learning_rate: {type: categorical, choices: [1.0e-3, 2.0e-3]}
"""

# The cheapest real trials: SFT on the tiny model, batch 2, 32 tokens, three learning rates that all train cleanly.
SFT_SPACE = """trainer: sft
fixed:
  max_length: 32
  per_device_train_batch_size: 2
params:
  learning_rate: {type: categorical, choices: [1.0e-4, 2.0e-4, 3.0e-4]}
"""

# A small valid grpo space: each bad-space case (tests/unit/config/test_space.py, tests/unit/cli/test_cli_errors.py) breaks one
# thing in it.
VALID_SPACE = """\
trainer: grpo
fixed:
  max_completion_length: 8
params:
  precision: {type: categorical, choices: [fp32, bf16-mixed]}
  learning_rate: {type: float, low: 1.0e-5, high: 1.0e-2, log: true}
  use_peft: {type: categorical, choices: [true, false]}
  lora_r: {type: categorical, choices: [4, 8], when: {use_peft: true}}
"""
USE_PEFT_LINE = "  use_peft: {type: categorical, choices: [true, false]}\n"  # VALID_SPACE's line that lora_r depends on


# -- searches through the Python API ---------------------------------------------------------------------------------


@dataclass
class Finished:
    root: Path  # the working directory the search ran in; ./mlflow is its store
    experiment: str
    prepared: driver.Prepared
    outcome: driver.SearchOutcome
    echoed: list[str]

    def by_params(self, **wanted) -> dict[str, Any]:
        (found,) = [r for r in self.outcome.records if all(r["params"][k] == v for k, v in wanted.items())]
        return found


def run_search_in(root: Path, space: str | None = None, **options) -> Finished:
    """A real search through the Python API, run in ``root`` (so ./mlflow and ./mlflow/ray land there)."""
    from tuner.search import driver

    root.mkdir(parents=True, exist_ok=True)
    if space is not None:
        (root / "space.yaml").write_text(space)
        options["search_space"] = str(root / "space.yaml")
    options.setdefault("experiment", "test")
    echoed: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        prepared = driver.prepare(driver.SearchOptions(store=str(root / "mlflow"), **options))
        outcome = driver.run_search(prepared, echo=echoed.append)
    return Finished(root, options["experiment"], prepared, outcome, echoed)


def mlflow_client(finished: Finished):
    from tuner.stores import client

    return client(finished.prepared.tracking_uri)


def runs_of(finished: Finished, kind: str):
    """The search's MLflow runs tagged ``tuner.kind`` = ``kind`` ("search" or "trial")."""
    client = mlflow_client(finished)
    experiment = client.get_experiment_by_name(finished.experiment)
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`tuner.kind` = '{kind}'",
                              max_results=1000)


def replay(space, sampler: str, seed: int, n: int, told: list[dict[str, Any]] | None = None):
    """What the search's proposer (tuner.search._sampling.Proposer: the sampler, staged for tpe) proposes for ``space``
    with ``seed``, asked n times with no training; with ``told``, each proposal is answered with that trial's
    recorded outcome, as the search answered it."""
    import optuna

    from tuner.search._sampling import Proposer, make_sampler

    study = optuna.create_study(sampler=make_sampler(sampler, seed, n), direction="maximize")
    proposer = Proposer(study, space, sampler, n)
    proposed = {}
    for i in range(n):
        trial, proposed[i] = proposer.ask()
        if told is not None:
            proposer.tell(trial, {**told[i], "params": proposed[i]})
    return proposed


# -- TRL's own parser, and the files users hand it -------------------------------------------------------------------


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def trl_parse(trainer: str, path: Path, output_dir: Path, *extra: str):
    """TRL's CLI parser on ``--config path``: (script args, trainer config, ModelConfig, dataset mixture)."""
    import importlib
    import warnings

    parser = importlib.import_module(f"trl.scripts.{trainer}").make_parser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notes about TRL's defaults
        return parser.parse_args_and_config(["--config", str(path), "--output_dir", str(output_dir), *extra])


def cpu_flag(config: dict) -> tuple[str, ...]:
    # What the export's header tells a CPU user of a bf16: true file: add --use_cpu to the trl command.
    return ("--use_cpu", "true") if config.get("bf16") and on_cpu() else ()


def preference_rows(n: int) -> list[dict]:
    """Pairs in the built-in data's words, far longer than the shipped reward space's max_length of 64."""
    import random

    from tuner.inputs._tiny_data import ANIMALS, COLOURS

    rng = random.Random(0)
    rows = []
    for i in range(n):
        words = 40 + (i * 7) % 110  # 40 .. 149 words: a spread of lengths to take a percentile of
        rows.append({"prompt": f"do you like the {rng.choice(COLOURS)} {rng.choice(ANIMALS)}",
                     "chosen": " yes good " + " ".join(rng.choice(COLOURS) for _ in range(words)),
                     "rejected": " no bad " + " ".join(rng.choice(ANIMALS) for _ in range(words))})
    return rows


# A hand-written `trl reward --config` file: a LoRA reward model in fp16 ("half") weights with large gradient
# accumulation, docs/failures.md's first row.
REWARD_HALF = """\
# trl reward --config reward.yaml
model_name_or_path: tiny
dtype: float16       # "half" weights
bf16: false
use_peft: true
lora_r: 8
lora_target_modules: [all-linear]
learning_rate: 2e-4
per_device_train_batch_size: 2
gradient_accumulation_steps: 32
output_dir: out
"""


def read(tmp_path: Path, text: str, trainer: str | None = None) -> trl_config.SourceConfig:
    """``text`` written to tmp_path/my.yaml and read as `tuner search --from` reads it."""
    from tuner.config import trl_config

    path = tmp_path / "my.yaml"
    path.write_text(text)
    return trl_config.read_config(path, trainer)


# tests/data/config/published/: published `trl <trainer> --config` files, each with its source and commit in a comment.
PUBLISHED = sorted((DATA / "config" / "published").glob("*.yaml"))
# How a refreshed file writes a key TRL refuses: its current name (the rest are removed).
CURRENT_NAME = {"torch_dtype": "dtype", "max_seq_length": "max_length", "warmup_ratio": "warmup_steps"}


def trainer_of(path: Path) -> str:
    (line,) = [line for line in path.read_text().splitlines() if line.startswith("# trl ")]
    return line.split()[2]


def trl_refuses(trainer: str, path: Path) -> list[str]:
    """The keys ``trl <trainer> --config path`` refuses, found as TRL's CLI finds them: not a field of its
    dataclasses, and not an option of ``accelerate launch`` (TRL's own ``accelerate_config`` aside)."""
    import importlib
    import io
    import warnings

    from accelerate.commands.launch import launch_command_parser

    parser = importlib.import_module(f"trl.scripts.{trainer}").make_parser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        *_, remaining, _ = parser.parse_args_and_config(
            ["--config", str(path), "--output_dir", "/tmp/unused", "--use_cpu", "true"],
            return_remaining_strings=True, separate_remaining_strings=True)
    refused = []
    for flag, value in zip(remaining[::2], remaining[1::2]):
        if flag == "--accelerate_config":
            continue
        with contextlib.redirect_stderr(io.StringIO()):
            _, unknown = launch_command_parser().parse_known_args([flag, value, "train.py"])
        if unknown:
            refused.append(flag[2:])
    return refused


def refreshed(path: Path, folder: Path) -> Path:
    """The file with each key TRL refuses written under its current name, or removed when it has none."""
    raw = yaml.safe_load(path.read_text())
    refused = set(trl_refuses(trainer_of(path), path))
    new = {CURRENT_NAME.get(k, k): v for k, v in raw.items() if k not in refused or k in CURRENT_NAME}
    out = folder / path.name
    out.write_text(f"# trl {trainer_of(path)} --config {path.name}\n" + yaml.safe_dump(new, sort_keys=False))
    return out


# -- processes -------------------------------------------------------------------------------------------------------

# Generous: one short search takes about 2 minutes on a 2-core machine that other test suites load too
# (most of it is Ray starting and each Ray worker importing torch and TRL once).
SEARCH_TIMEOUT = 480


def session_members(sid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getsid(process.pid) == sid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every live process of the session ``sid`` (one we started with start_new_session)."""
    for _ in range(5):
        members = session_members(sid)
        if not members:
            return
        for process in members:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(members, timeout=10)


class Spawner:
    """Starts commands in their own session with output in a log file; kills every session at the end (the
    ``spawn`` fixture of tests/conftest.py)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, args: list[str], name: str, cwd: Path | None = None,
              env: dict[str, str] | None = None, user: str | None = None) -> subprocess.Popen:
        """``user``: run as that user and its group (only root may: a server that refuses to run as root)."""
        log = self.folder / f"{name}.log"
        ids: dict[str, Any] = {}
        if user is not None:
            import pwd

            ids = {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
        with log.open("ab") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=cwd or self.folder, env={**os.environ, **(env or {})},
                                       start_new_session=True, **ids)
        process.log = log  # type: ignore[attr-defined]
        self.started.append((process, log))
        return process

    def run(self, args: list[str], name: str, timeout: float = SEARCH_TIMEOUT, **kwargs) -> tuple[int, str]:
        """Run to the end (killed with its whole session after ``timeout``): (exit code, output)."""
        process = self.start(args, name, **kwargs)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_session(process.pid)
            pytest.fail(f"{name} still running after {timeout:.0f}s; output:\n{output_of(process)[-4000:]}")
        return code, output_of(process)

    def cleanup(self) -> None:
        for process, _ in reversed(self.started):
            kill_session(process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)


def output_of(process: subprocess.Popen) -> str:
    return process.log.read_text(errors="replace")  # type: ignore[attr-defined]


def wait_for(condition, what: str, timeout: float = SEARCH_TIMEOUT, process: subprocess.Popen | None = None,
             interval: float = 1.0):
    """Poll ``condition`` until it returns something truthy; fail if ``process`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            pytest.fail(f"waiting for {what}: the process exited with {process.returncode} first; output:\n"
                        f"{output_of(process)[-4000:]}")
        time.sleep(interval)
    tail = f"; output:\n{output_of(process)[-4000:]}" if process is not None else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}{tail}")


def expected_exit_code(search: dict) -> int:
    """The rule (README "Exit codes"): 0 when a config was recommended, 3 when some trial was ok but none
    qualified, 4 when no trial was ok."""
    if search["recommended"] is not None:
        return 0
    return 3 if any(r["status"] == "ok" for r in search["trials"]) else 4


def rank_processes(marker: bytes, where: str = "cmdline") -> list[int]:
    """Live rank processes (tuner.trial._rank) whose command line (or ``where="environ"``: environment) holds
    ``marker``; a zombie has ended and is not counted."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"tuner.trial._rank" not in (entry / "cmdline").read_bytes() or marker not in (entry / where).read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def at_once(build, builders: int) -> list:
    """``build()`` called from ``builders`` threads at once; what each returned (an error any raised fails)."""
    results, errors = [], []

    def one():
        try:
            results.append(build())
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(builders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


# -- searches through the CLI, read back from their store (tests/e2e/search/test_reliability*.py) --------------------------

# The cheapest real search: SFT on the tiny model, batch 2, 32 tokens, and a grid over learning rates only,
# so every trial is "ok", takes seconds, and the trial numbers map to known params (the ``grid_space`` fixture).
GRID_RATES = [1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4, 5.0e-4, 6.0e-4]
GRID_SPACE = f"""trainer: sft
fixed:
  max_length: 32                   # short sequences: these trials only have to run, not to learn
  per_device_train_batch_size: 2   # the cheapest batch
params:
  learning_rate: {{type: categorical, choices: {json.dumps(GRID_RATES)}}}
"""


# The environment of the MLflow servers tests start themselves (a team's server, a tracking server that goes away, a
# server with users): no job execution. MLflow 3's server otherwise starts a job runner for its GenAI jobs (8 more
# processes, each importing MLflow), which tuner never submits jobs to: on the loaded 2-core machine a server took
# 40-43 s to answer /health with it and 20-25 s without, and its processes took CPU from the trials for the rest of
# the test. `tuner ui`'s own server keeps MLflow's default (test_reliability_services.py stops it and its workers).
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tuner_command(*args: str) -> list[str]:
    """``tuner ARGS`` as a command line, run by this Python."""
    return [sys.executable, "-m", "tuner.cli", *args]


def search_args(space: Path, store: Path, experiment: str, trials: int, max_steps: int, *extra: str) -> list[str]:
    """``tuner search`` over ``space`` (GRID_SPACE), the grid sampler, no confirmation runs and no re-runs."""
    return tuner_command("search", "--trainer", "sft", "--search-space", str(space), "--sampler", "grid",
                         "--trials", str(trials), "--max-steps", str(max_steps), "--confirm-seeds", "0",
                         "--budget", "0",  # no re-runs (tuner.search._extend): these tests count the search's own trials
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


def store_client(uri: str):
    """An MlflowClient of the store at ``uri`` (a local SQLite one's folder made first)."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def local_uri(store: Path) -> str:
    return f"sqlite:///{store.resolve() / 'mlflow.db'}"


def parent_and_trial_runs(client, experiment: str) -> tuple[list, list]:
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


# -- memory estimates of real model shapes (tests/unit/trial/test_memory.py, tests/unit/search/test_packing.py) ---------------

def qwen05_config():
    """Qwen2.5-0.5B's shape, built locally."""
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)


def qwen05_estimate(**changes):
    """``estimate`` for the Qwen2.5-0.5B shape, bf16-mixed, batch 8 x 1024 tokens, with ``changes``."""
    from tuner.trial.memory import estimate

    config = changes.pop("config", None) or qwen05_config()
    params = {"precision": "bf16-mixed", "per_device_train_batch_size": 8, **changes.pop("params", {})}
    keywords = {"trainer_needs_reference": False, "sequence_classifier": False, "max_length": 1024,
                "fused_lm_head": True, **changes}
    return estimate(config, params=params, **keywords)


QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1000000.0,
               rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16")
FULL_FT = {"precision": "bf16-mixed", "use_peft": False, "per_device_train_batch_size": 8}  # fp32 weights, AdamW


def qwen7b_config():
    from transformers import AutoConfig

    return AutoConfig.for_model("qwen2", **QWEN_7B)


# -- a PostgreSQL server of a test's own ------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server(spawn: Spawner):
    """A real PostgreSQL server on a free port of 127.0.0.1 (no Unix socket), for as long as the ``with`` lasts:
    yields its SQLAlchemy URI for MLflow (psycopg v3, trust authentication, user postgres). Its binaries come from
    pip (the ``pgserver`` wheel bundles them; pgserver itself is not imported: its import sets up a registry and lock
    file of its own). Stopped, and its folder removed, also when the test fails."""
    import importlib.util
    import shutil
    import signal

    psycopg = pytest.importorskip("psycopg")
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pgserver is not installed (pip install -e '.[test]')")
    binaries = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
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
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # a fast shutdown: its shared memory goes with it (a kill leaves some)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(30)
            kill_session(server.pid)  # what is left of it, if anything
        shutil.rmtree(folder, ignore_errors=True)


# -- shared by tests/unit/trial/test_memory.py and tests/training/trial/test_memory_training.py --------------

def meta_model(config, sequence_classifier=False):
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    with torch.device("meta"):
        if sequence_classifier:
            config = copy.deepcopy(config)
            config.num_labels = 1
            return AutoModelForSequenceClassification.from_config(config)
        return AutoModelForCausalLM.from_config(config)


def numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def close(estimated, real, tolerance):
    return abs(estimated - real) <= tolerance * real


# -- shared by the tiers of tests/*/trial/test_verify*.py and tests/*/report/test_export*.py -----------------

def exported(params: dict, model: str, path: Path, trainer: str = "grpo") -> Path:
    """The file `tuner export` writes for a search on the shipped space whose pick is ``params``."""
    from tuner.config.space import load_space
    from tuner.config.trainers import adapter
    from tuner.report import export
    from tuner.verdicts import recommend

    entry = adapter(trainer)
    config, info = export.build(entry, params, model, space=load_space(None, trainer), on_cpu=True,
                                reward_funcs=export.reward_funcs_of(entry, None))
    search = {"trainer": trainer, "rule": recommend.RULE, "trl_config": config, "export": info,
              "recommended": {"number": 7, "tokens_per_second": 6309.0, "progress": 0.647}}
    path.write_text(export.render_export(search, f"{trainer}-tiny", "RUN"))
    return path


def sampled_params(trainer: str, use_peft: bool, precision: str, seed: int) -> dict:
    """One point of the shipped space for ``trainer`` (seeded), with LoRA and precision set as asked."""
    import optuna

    from tuner.config.space import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction="maximize")
    study.enqueue_trial({"use_peft": use_peft})
    params = load_space(None, trainer).suggest(study.ask())
    assert params["use_peft"] is use_peft
    return {**params, "precision": precision}


# -- shared by the tiers of tests/*/inputs/test_inputs*.py: a user's folder and `tuner` run in it ------------

# A user's reward module: good, broken and odd rewards.
USER_REWARDS = """\
import math


def length(completions, **kwargs):
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def boom(completions, **kwargs):
    raise ValueError("this reward is broken")


def one_reward(completions, **kwargs):
    return [1.0]


def not_a_number(completions, **kwargs):
    return [math.nan] * len(completions)


def words(completions, **kwargs):
    return ["many"] * len(completions)
"""


def write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def tuner_in(folder: Path, monkeypatch, capsys, *args: str, files: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`tuner ARGS` run in ``folder`` (its working directory), in this process."""
    from tuner import cli

    write_files(folder, files or {})
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))  # reward modules put their folder on sys.path
    capsys.readouterr()
    try:
        code = cli.main(list(args))
    except SystemExit as exit:  # argparse
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err
