"""Bad input: one line on stderr that says what is wrong and where, exit code 2, no traceback, nothing written.

Each case is one bad command line run in its own empty working directory with ``--store tmp/mlflow``. Most run
in this process through ``tuner.cli.main`` (TRL, torch and MLflow are imported once, not once per case); the
cases marked ``process=True`` run as real ``python -m tuner.cli`` subprocesses, one or more from every stage of
``prepare()``, the other commands and argparse, so the no-traceback rule is checked on the real entry point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import USE_PEFT_LINE
from helpers import VALID_SPACE as SPACE  # a small valid grpo space; each space case breaks one thing in it

from tuner import cli

STORE = "tmp/mlflow"
HEALTHY = "http://healthy-server"  # replaced by the address of a stub MLflow server whose /health answers 200


DPO_PAIRS_WITHOUT_REJECTED = '{"prompt": "a", "chosen": " b"}\n'
TRIAL = "trainer: grpo\nmax_steps: 2\nparams: {learning_rate: 0.001}\n"
FROM_DPO = "# trl dpo --config my.yaml\nmodel_name_or_path: tiny\ndtype: float16\nbf16: false\nlearning_rate: 0.3\n"


def space(old: str = "", new: str = "") -> dict[str, str]:
    """The files of a case whose --search-space is SPACE with ``old`` replaced by ``new``."""
    assert old in SPACE
    return {"space.yaml": SPACE.replace(old, new, 1)}


def search(*args: str) -> tuple[str, ...]:
    return ("search", "--store", STORE, *args)


def with_space(*args: str) -> tuple[str, ...]:
    return search("--search-space", "space.yaml", *args)


def export(*args: str) -> tuple[str, ...]:
    return ("export", "--store", STORE, "--experiment", "nope", *args)


def trial(text: str) -> dict:
    return {"args": ("trial", "--config", "trial.yaml"), "files": {"trial.yaml": text}}


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    fragment: str  # must appear in the error line: what is wrong and where
    files: dict[str, str] = field(default_factory=dict)  # written into the working directory first
    env: dict[str, str] = field(default_factory=dict)
    process: bool = False  # True: a real `python -m tuner.cli` subprocess
    store_exists: bool = False  # the store holds an empty MLflow database first; it must not change
    seconds: float = 60  # generous: the slowest cases import TRL on a busy 2-core machine


CASES = [
    # -- the search-space file: all fail before TRL is imported ----------------------------------------------------
    Case("space-malformed-yaml", with_space(), "space.yaml: malformed YAML at line",
         {"space.yaml": "trainer: grpo\nparams: {learning_rate: [1\n"}, process=True),
    Case("space-duplicate-key", with_space(), "space.yaml: duplicate key 'learning_rate' at line 9",
         {"space.yaml": SPACE + "  learning_rate: {type: float, low: 0.1, high: 0.2}\n"}),
    Case("space-not-mapping", with_space(), "space.yaml: a search space must be a YAML mapping",
         {"space.yaml": "- trainer\n- grpo\n"}),
    Case("space-empty-file", with_space(), "space.yaml: a search space must be a YAML mapping", {"space.yaml": ""}),
    Case("space-unknown-top-level-key", with_space(), "space.yaml: fixd: unknown key", space("fixed:", "fixd:")),
    Case("space-unknown-param-key", with_space(), "space.yaml: params.learning_rate.lowx: unknown key; remove it or "
         "check its spelling (did you mean 'low'?)", space("low: 1.0e-5", "lowx: 1.0e-5"), process=True),
    Case("space-unknown-param-type", with_space(), "space.yaml: params.learning_rate: type must be one of float, int",
         space("type: float", "type: real")),
    Case("space-wrong-value-type", with_space(), "space.yaml: params.learning_rate.low: Input should be a valid number",
         space("low: 1.0e-5", 'low: "abc"')),
    Case("space-missing-bound", with_space(), "space.yaml: params.learning_rate.high: required key is missing",
         space("high: 1.0e-2, ", "")),
    Case("space-low-above-high", with_space(), "space.yaml: params.learning_rate: low must not exceed high",
         space("low: 1.0e-5", "low: 1.0")),
    Case("space-nan-bound", with_space(), "space.yaml: params.learning_rate: low and high must be finite",
         space("high: 1.0e-2", "high: .nan")),
    Case("space-log-low-not-positive", with_space(), "space.yaml: params.learning_rate: log scale needs low > 0",
         space("low: 1.0e-5", "low: 0.0")),
    Case("space-empty-choices", with_space(), "space.yaml: params.use_peft.choices: must not be empty",
         space("choices: [true, false]", "choices: []")),
    Case("space-choice-not-a-scalar", with_space(), "space.yaml: params.use_peft.choices.0: must be a number, string",
         space("choices: [true, false]", "choices: [{a: 1}]")),
    Case("space-no-params", with_space(), "space.yaml: params: must not be empty",
         {"space.yaml": "trainer: grpo\nparams: {}\n"}),
    Case("space-condition-unknown-param", with_space(), "space.yaml: params.lora_r.when: condition on unknown "
         "parameter 'use_lora'", space("when: {use_peft: true}", "when: {use_lora: true}")),
    Case("space-condition-before-dependency", with_space(), "space.yaml: params.lora_r.when: 'use_peft' must be "
         "declared before 'lora_r'", {"space.yaml": SPACE.replace(USE_PEFT_LINE, "") + USE_PEFT_LINE}),
    Case("space-unknown-trainer", with_space(), "space.yaml: trainer: unknown trainer 'ppo'",
         space("trainer: grpo", "trainer: ppo")),
    Case("space-trainer-mismatch", with_space("--trainer", "dpo"), "space.yaml: trainer: the space is for 'grpo' but "
         "--trainer is 'dpo'", space()),
    Case("space-unknown-precision", with_space(), "space.yaml: params.precision: unknown precision 'fp8'",
         space("bf16-mixed]", "fp8]")),
    Case("space-param-fixed-and-searched", with_space(), "space.yaml: fixed.learning_rate: also declared under params",
         space("max_completion_length: 8", "max_completion_length: 8\n  learning_rate: 0.001")),
    Case("space-file-missing", search("--search-space", "nope.yaml"), "nope.yaml: search space file not found",
         process=True),
    Case("space-file-is-directory", search("--search-space", "adir"), "adir: cannot read the search space file",
         {"adir/x": ""}),
    Case("grid-with-float-param", with_space("--sampler", "grid"), "space.yaml: params.learning_rate: the grid "
         "sampler needs every param categorical", space(), process=True),
    # -- the space against TRL's config fields and this machine (imports TRL and torch) -------------------------------
    Case("space-unknown-param-name", with_space(), "space.yaml: params.learning_rte: unknown parameter for grpo; did "
         "you mean 'learning_rate'?", space("learning_rate:", "learning_rte:")),
    Case("space-unknown-fixed-name", with_space(), "space.yaml: fixed.max_completion_len: unknown parameter for grpo",
         space("max_completion_length", "max_completion_len")),
    Case("fsdp-on-cpu", with_space("--processes-per-trial", "2"), "space.yaml: sharding: fsdp needs GPUs",
         space("max_completion_length: 8", "max_completion_length: 8\n  sharding: fsdp")),
    Case("precisions-all-need-gpu", with_space(), "space.yaml: params.precision: none of fp16-mixed can run on this "
         "machine", space("[fp32, bf16-mixed]", "[fp16-mixed]")),
    # -- command-line values ---------------------------------------------------------------------------------------
    Case("unknown-flag", search("--bogus"), "unrecognized arguments: --bogus", process=True),
    Case("unknown-command", ("serach",), "argument COMMAND: invalid choice: 'serach'"),
    Case("no-command", (), "choose a command", process=True),
    Case("trainer-bogus", search("--trainer", "bogus"), "argument --trainer: invalid choice: 'bogus'"),
    Case("sampler-bogus", search("--sampler", "bogus"), "argument --sampler: invalid choice: 'bogus'"),
    Case("trials-zero", search("--trials", "0"), "argument --trials: must be at least 1, got 0", process=True),
    Case("trials-not-a-number", search("--trials", "abc"), "argument --trials: expected a whole number, got 'abc'"),
    Case("max-steps-negative", search("--max-steps", "-1"), "argument --max-steps: must be at least 1, got -1"),
    Case("processes-per-trial-zero", search("--processes-per-trial", "0"), "argument --processes-per-trial: must be "
         "at least 1, got 0"),
    Case("concurrency-zero", search("--concurrency", "0"), "argument --concurrency: must be at least 1, got 0"),
    Case("cpus-per-trial-zero", search("--cpus-per-trial", "0"), "argument --cpus-per-trial: must be positive, got 0"),
    Case("gpus-per-trial-negative", search("--gpus-per-trial", "-1"), "argument --gpus-per-trial: must not be "
         "negative, got -1"),
    Case("trial-timeout-zero", search("--trial-timeout", "0"), "argument --trial-timeout: must be positive, got 0"),
    Case("confirm-seeds-negative", search("--confirm-seeds", "-1"), "argument --confirm-seeds: must not be negative"),
    Case("seed-not-a-number", search("--seed", "x"), "argument --seed: invalid int value: 'x'"),
    Case("gpus-per-trial-without-gpu", search("--gpus-per-trial", "1"), "--gpus-per-trial 1.0: this machine has no "
         "CUDA GPU"),
    Case("ray-address-unreachable", search("--ray-address", "127.0.0.1:1"), "--ray-address 127.0.0.1:1: no Ray "
         "cluster answers there", process=True, seconds=15),
    Case("ray-address-without-port", search("--ray-address", "somewhere"), "--ray-address somewhere: expected "
         "HOST:PORT"),
    Case("output-folder-missing", search("-o", "no/such/dir/rec.yaml"), "-o no/such/dir/rec.yaml: folder no/such/dir "
         "does not exist", process=True),
    Case("output-is-a-directory", search("-o", "adir"), "-o adir: is a directory", {"adir/x": ""}),
    Case("reward-func-for-dpo", search("--trainer", "dpo", "--reward-func", "accuracy_reward"),
         "--reward-func is for grpo only", process=True),
    Case("reward-func-not-importable", search("--reward-func", "nope:missing"),
         "reward function 'nope:missing' cannot be imported: No module named 'nope'"),
    Case("reward-func-malformed", search("--reward-func", "nope"), "reward function 'nope' is not 'builtin'"),
    # -- model and data --------------------------------------------------------------------------------------------
    Case("model-path-missing", search("--model", "/does/not/exist"), "model path '/does/not/exist' does not exist"),
    Case("model-dir-not-a-model", search("--model", "notamodel"), "notamodel is a directory but not a model: no "
         "config.json", {"notamodel/readme.txt": "hello"}),
    Case("model-hub-offline", search("--model", "some-org/unreachable-model"), "model 'some-org/unreachable-model' "
         "is neither a local directory nor reachable", env={"HF_HUB_OFFLINE": "1"}),
    Case("dataset-file-missing", search("--dataset", "missing.jsonl"), "dataset file 'missing.jsonl' does not exist"),
    # the last check before the store: every slow check runs first, so this one is also a subprocess
    Case("dataset-missing-column", search("--trainer", "dpo", "--dataset", "pairs.jsonl"), "pairs.jsonl: dpo needs "
         "columns prompt, chosen, rejected; missing: rejected", {"pairs.jsonl": DPO_PAIRS_WITHOUT_REJECTED},
         process=True),
    Case("dataset-empty-file", search("--dataset", "empty.jsonl"), "empty.jsonl: the file is empty",
         {"empty.jsonl": ""}),
    Case("dataset-malformed-jsonl", search("--dataset", "bad.jsonl"), "bad.jsonl: cannot be read as json",
         {"bad.jsonl": '{"prompt": "a"\n'}),
    Case("dataset-unsupported-type", search("--dataset", "data.txt"), "data.txt: unsupported dataset file type",
         {"data.txt": "hello\n"}),
    Case("dataset-hub-offline", search("--dataset", "some-org/unreachable-data"), "dataset 'some-org/unreachable-data' "
         "is neither a local file nor reachable", env={"HF_HUB_OFFLINE": "1"}),
    # -- the store -------------------------------------------------------------------------------------------------
    Case("store-under-proc", search("--store", "/proc/tuner-store"), "MLflow store /proc/tuner-store is not writable"),
    Case("store-under-a-file", search("--store", "afile/store"), "/afile/store is not writable (Not a directory)",
         {"afile": "x"}),
    Case("tracking-server-unreachable", search("--tracking-uri", "http://127.0.0.1:9"), "MLflow tracking server "
         "http://127.0.0.1:9 is unreachable", process=True, seconds=15),
    Case("tracking-uri-unknown-scheme", search("--tracking-uri", "bogus://x"), "--tracking-uri bogus://x: MLflow "
         "cannot use this kind of URI"),
    Case("server-with-unwritable-store", search("--tracking-uri", HEALTHY, "--store", "/proc/tuner-store"),
         "MLflow store /proc/tuner-store is not writable"),
    Case("optuna-storage-unknown-driver", search("--optuna-storage", "bogus://x"), "--optuna-storage bogus://x: "
         "Optuna cannot open it"),
    # unreachable, its password kept out of the message (the fragment has *** where the URL has the password)
    Case("optuna-storage-unreachable", search("--optuna-storage", "postgresql+psycopg://u:hunter2@127.0.0.1:9/db"),
         "--optuna-storage postgresql+psycopg://u:***@127.0.0.1:9/db: Optuna cannot open it"),
    Case("optuna-storage-unwritable", search("--optuna-storage", "sqlite:////proc/tuner/optuna.db"),
         "--optuna-storage sqlite:////proc/tuner/optuna.db: Optuna cannot open it"),
    Case("bad-space-existing-store", with_space(), "space.yaml: params.learning_rate.lowx: unknown key",
         space("low: 1.0e-5", "lowx: 1.0e-5"), process=True, store_exists=True),
    # -- export, trial, ui -----------------------------------------------------------------------------------------
    Case("export-missing-store", export(), "no MLflow store at tmp/mlflow/mlflow.db", process=True),
    Case("export-unknown-experiment", export(), "no experiment named 'nope'; this store has no searches yet",
         store_exists=True),
    Case("export-unknown-run-id", export("--run-id", "abc123"), "--run-id abc123: MLflow at sqlite:",
         store_exists=True),
    Case("export-server-unreachable", export("--tracking-uri", "http://127.0.0.1:9"), "MLflow tracking server "
         "http://127.0.0.1:9 is unreachable", process=True, seconds=15),
    Case("export-output-folder-missing", export("-o", "no/dir/r.yaml"), "-o no/dir/r.yaml: folder no/dir does not "
         "exist"),
    Case("export-bad-format", export("--format", "xml"), "argument --format: invalid choice: 'xml'"),
    Case("report-missing-store", ("report", "--store", STORE, "--experiment", "nope"),
         "no MLflow store at tmp/mlflow/mlflow.db"),
    Case("report-unknown-experiment", ("report", "--store", STORE, "--experiment", "nope"),
         "no experiment named 'nope'", store_exists=True),
    Case("report-unknown-run-id", ("report", "--store", STORE, "--experiment", "nope", "--run-id", "abc123"),
         "abc123", store_exists=True),
    Case("report-server-unreachable", ("report", "--store", STORE, "--experiment", "nope", "--tracking-uri",
                                       "http://127.0.0.1:9"), "http://127.0.0.1:9 is unreachable", seconds=15),
    Case("sync-without-server", ("sync", "--store", STORE), "tuner sync needs --tracking-uri"),
    Case("trial-config-missing", ("trial", "--config", "missing.yaml"), "missing.yaml: trial config not found",
         process=True),
    Case("trial-config-unknown-key", **trial(TRIAL.replace("max_steps", "max_stpes")),
         fragment="trial.yaml: max_stpes: unknown key", process=True),
    Case("trial-config-malformed-yaml", **trial("trainer: [grpo\n"), fragment="trial.yaml: malformed YAML"),
    Case("trial-config-not-mapping", **trial("- grpo\n"), fragment="trial.yaml: a trial config must be a YAML mapping"),
    Case("trial-config-unknown-trainer", **trial(TRIAL.replace("grpo", "ppo")),
         fragment="trial.yaml: trainer: unknown trainer 'ppo'"),
    Case("trial-config-unknown-param", **trial(TRIAL.replace("learning_rate", "learnin_rate")),
         fragment="trial.yaml: params.learnin_rate: unknown parameter for grpo; did you mean 'learning_rate'?"),
    Case("trial-config-bad-max-steps", **trial(TRIAL.replace("max_steps: 2", "max_steps: 0")),
         fragment="trial.yaml: max_steps:"),
    # -- --from: the user's TRL config, refused before any trial; the existing store is not touched
    Case("from-file-missing", search("--from", "nope.yaml"), "nope.yaml: config file not found", process=True,
         store_exists=True),
    Case("from-unknown-key", search("--from", "my.yaml"), "my.yaml: `trl dpo --config` would refuse 1 key: "
         "learnin_rate: unknown; did you mean learning_rate?", {"my.yaml": FROM_DPO + "learnin_rate: 0.1\n"},
         process=True, store_exists=True),
    Case("from-trainer-mismatch", search("--from", "my.yaml", "--trainer", "kto"), "my.yaml: the file says it is for "
         "`trl dpo` but --trainer is kto", {"my.yaml": FROM_DPO}, store_exists=True),
    Case("from-key-of-another-trainer", search("--from", "my.yaml", "--trainer", "reward"),
         "my.yaml: `trl reward --config` would refuse 1 key: reward_funcs: a setting of trl grpo, not of trl reward "
         "(or pass --trainer grpo)",
         {"my.yaml": "model_name_or_path: tiny\nreward_funcs: [accuracy_reward]\n"}),
    # -- --warm-start: a run id that is no search of the store, refused before the store is written
    Case("warm-start-unknown-run", search("--warm-start", "abc123"), "--warm-start abc123: the store has no run "
         "abc123", store_exists=True),
    Case("warm-start-no-store", search("--warm-start", "abc123"), "--warm-start abc123: no MLflow store at",
         process=True),
    Case("ui-missing-store", ("ui", "--store", STORE), "no MLflow store at tmp/mlflow/mlflow.db", process=True),
    Case("ui-bad-port", ("ui", "--store", STORE, "--port", "70000"), "argument --port: must be between 1 and 65535"),
]


# -- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tuner_cache_dir) -> str:
    # the session's tiny-model cache (tests/conftest.py), also handed to the subprocesses
    return str(tuner_cache_dir)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow store database with no searches in it, made once and copied into each case that needs one."""
    from tuner.stores import mlflow_store

    folder = tmp_path_factory.mktemp("empty-store")
    mlflow_store.client(mlflow_store.default_tracking_uri(folder)).search_experiments()
    return folder / "mlflow.db"


@pytest.fixture(scope="module")
def healthy_server():
    """A stub tracking server: /health answers 200, anything else 500; ``paths`` lists what was asked."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            paths.append(self.path)
            self.send_response(200 if self.path == "/health" else 500)
            self.end_headers()
            self.wfile.write(b"OK")

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.url, server.paths = f"http://127.0.0.1:{server.server_port}", paths
    yield server
    server.shutdown()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _store_from(db: Path, root: Path) -> tuple[Path, str]:
    """A local store at ``root``/STORE holding a copy of ``db``, and the copy's digest (to show nothing wrote it)."""
    store = root / STORE
    store.mkdir(parents=True)
    (store / "mlflow.db").write_bytes(db.read_bytes())
    return store, _digest(store / "mlflow.db")


def _run(case: Case, cwd: Path, cache: str, monkeypatch, capsys) -> tuple[int, str, str, float]:
    started = time.perf_counter()
    if case.process:
        env = {**os.environ, "TUNER_CACHE_DIR": cache, **case.env}
        done = subprocess.run([sys.executable, "-m", "tuner.cli", *case.args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)
        return done.returncode, done.stdout, done.stderr, time.perf_counter() - started
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TUNER_CACHE_DIR", cache)
    monkeypatch.setattr(sys, "path", list(sys.path))  # --reward-func puts the working directory on sys.path
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    try:
        code = cli.main(list(case.args))
    except SystemExit as exit:  # argparse exits
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err, time.perf_counter() - started


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, cache_dir, request, monkeypatch, capsys):
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    store = tmp_path / STORE
    if case.store_exists:
        store, before = _store_from(request.getfixturevalue("empty_store"), tmp_path)
        capsys.readouterr()  # drop what MLflow said while the fixture made the store

    server = request.getfixturevalue("healthy_server") if HEALTHY in case.args else None
    if server is not None:
        case = dataclasses.replace(case, args=tuple(server.url if a == HEALTHY else a for a in case.args))
        server.paths.clear()

    code, stdout, stderr, seconds = _run(case, tmp_path, cache_dir, monkeypatch, capsys)

    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), stderr
    assert case.fragment in lines[0]
    assert code == 2, stderr
    assert stdout == ""
    # Fails before Ray, MLflow and training start: seconds, not the minutes a trial takes.
    assert seconds < case.seconds, f"took {seconds:.0f}s"
    if case.store_exists:
        # An existing store is left byte-for-byte as it was: no experiment, no run.
        assert _digest(store / "mlflow.db") == before
        assert sorted(p.name for p in store.iterdir()) == ["mlflow.db"]
    else:
        assert not store.exists(), sorted(str(p) for p in store.rglob("*"))
    written = [p for p in tmp_path.rglob("*") if p.name in ("mlflow.db", "optuna.db") and p != store / "mlflow.db"]
    assert not written
    assert not (tmp_path / "mlruns").exists()
    if server is not None:
        # the server was only asked whether it is up and, with one read, whether it takes the credentials
        # (tuner.stores.mlflow_store.check_credentials): no experiment or run was created on it
        assert set(server.paths) <= {"/health", "/api/2.0/mlflow/experiments/search?max_results=1"}


# -- help -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--help"], ["search", "--help"]], ids=["tuner", "search"])
def test_help_exits_0_and_shows_examples(args, tmp_path):
    done = subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tuner search" in done.stdout
    assert "example" in done.stdout.lower()
    assert done.stderr == ""


def test_a_reader_that_goes_away_is_no_error(tmp_path):
    # `tuner jobs | head`: stdout a pipe whose reader is gone before the first write (closed here, so on any
    # machine). tuner ui prints its first line before it starts anything (a store file is all it checks before).
    (tmp_path / "mlflow").mkdir()
    (tmp_path / "mlflow" / "mlflow.db").touch()
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "tuner.cli", "ui", "--port", "1"], cwd=tmp_path, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr


# -- --run-id must be a search of --experiment ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_searches(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A real MLflow store holding a search (parent run + one trial run) in each of experiments alpha and beta,
    tagged as tuner tags them; the checks below fail before any artifact is read."""
    from tuner.stores import mlflow_store

    folder = tmp_path_factory.mktemp("two-searches")
    client = mlflow_store.client(mlflow_store.default_tracking_uri(folder))
    ids = {}
    for name in ("alpha", "beta"):
        experiment = client.create_experiment(name)
        parent = client.create_run(experiment, run_name=f"search-{name}",
                                   tags={"tuner.kind": "search", "tuner.study": f"search-{name}"}).info.run_id
        trial_run = client.create_run(experiment, run_name="trial-000", tags={
            "tuner.kind": "trial", "mlflow.parentRunId": parent, "tuner.trial_number": "0"}).info.run_id
        for run_id in (trial_run, parent):
            client.set_terminated(run_id)
        ids[f"{name}-search"], ids[f"{name}-trial"] = parent, trial_run
    return folder / "mlflow.db", ids


@pytest.mark.parametrize("command", ["export", "report"])
@pytest.mark.parametrize("which", ["other-experiment", "trial"])
def test_run_id_must_be_a_search_of_the_experiment(command, which, two_searches, tmp_path, monkeypatch, capsys):
    db, ids = two_searches
    store, before = _store_from(db, tmp_path)
    capsys.readouterr()
    run_id = ids["beta-search"] if which == "other-experiment" else ids["alpha-trial"]
    monkeypatch.chdir(tmp_path)
    code = cli.main([command, "--store", STORE, "--experiment", "alpha", "--run-id", run_id])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("tuner: error: "), err
    if which == "other-experiment":  # names both experiments, and what to pass instead
        assert (f"--run-id {run_id} is a run of experiment 'beta', not of --experiment 'alpha'; pass --experiment "
                "beta, or a search run id of 'alpha', or leave --run-id out") in lines[0]
    else:  # says whose trial it is and which id to pass
        assert (f"--run-id {run_id} is trial 0 of search search-alpha (run {ids['alpha-search']}) in 'alpha', not a "
                f"search; pass --run-id {ids['alpha-search']}, or leave --run-id out") in lines[0]
    assert _digest(store / "mlflow.db") == before  # nothing written: no report.md, no export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]


# -- --warm-start RUN_ID must be a search run -------------------------------------------------------------------


def test_warm_start_from_a_trial_run_is_one_line_exit_2(two_searches, tmp_path, cache_dir, monkeypatch, capsys):
    db, ids = two_searches
    store, before = _store_from(db, tmp_path)
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_CACHE_DIR", cache_dir)
    code = cli.main(["search", "--store", STORE, "--warm-start", ids["alpha-trial"]])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("tuner: error: "), err
    assert (f"--warm-start {ids['alpha-trial']}: run {ids['alpha-trial']} is not a tuner search run (tag tuner.kind "
            "is 'trial'); pass the search's run id") in lines[0]
    assert _digest(store / "mlflow.db") == before
    assert sorted(p.name for p in store.iterdir()) == ["mlflow.db"]
