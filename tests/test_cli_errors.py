"""Bad input: one line on stderr that says what is wrong and where, exit code 2, no traceback, nothing written.

Each case is one bad command line, run in its own empty working directory with ``--store tmp/mlflow``. Cases
that fail before any heavy import run as real ``python -m tuner.cli`` subprocesses (they cost a fraction of a
second); cases that fail after TRL, torch or datasets are imported run in this process through
``tuner.cli.main`` so the imports are paid once, and a representative few of those run as subprocesses too
(``process=True``), so the no-traceback rule is checked on the real entry point at every stage of ``prepare()``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tuner import cli

STORE = "tmp/mlflow"

# A small valid grpo space; cases break one thing in it.
SPACE = """\
trainer: grpo
fixed:
  max_completion_length: 8
params:
  precision: {type: categorical, choices: [fp32, bf16-mixed]}
  learning_rate: {type: float, low: 1.0e-5, high: 1.0e-2, log: true}
  use_peft: {type: categorical, choices: [true, false]}
  lora_r: {type: categorical, choices: [4, 8], when: {use_peft: true}}
"""


def space(old: str = "", new: str = "") -> dict[str, str]:
    """The files of a case whose --search-space is SPACE with ``old`` replaced by ``new``."""
    assert old in SPACE
    return {"space.yaml": SPACE.replace(old, new, 1) if old else SPACE}


def search(*args: str) -> tuple[str, ...]:
    return ("search", "--store", STORE, *args)


def with_space(*args: str) -> tuple[str, ...]:
    return search("--search-space", "space.yaml", *args)


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    fragment: str  # must appear in the error line: names what is wrong and where
    files: dict[str, str] = field(default_factory=dict)  # written into the working directory first
    env: dict[str, str] = field(default_factory=dict)
    process: bool = True  # False: in this process via cli.main (the case fails after a heavy import)
    store_exists: bool = False  # the store holds a database before the command runs; it must not change


DPO_PREFS_NO_REJECTED = '{"prompt": "a", "chosen": " b"}\n'
GRPO_TRIAL = "trainer: grpo\nmax_steps: 2\nparams: {learning_rate: 0.001}\n"

CASES = [
    # -- the search-space file: all fail before TRL is imported --------------------------------------------
    Case("space-malformed-yaml", with_space(), "space.yaml: malformed YAML at line",
         {"space.yaml": "trainer: grpo\nparams: {learning_rate: [1\n"}),
    Case("space-not-mapping", with_space(), "space.yaml: a search space must be a YAML mapping",
         {"space.yaml": "- trainer\n- grpo\n"}),
    Case("space-empty-file", with_space(), "space.yaml: a search space must be a YAML mapping", {"space.yaml": ""}),
    Case("space-unknown-top-level-key", with_space(), "space.yaml: fixd: unknown key", space("fixed:", "fixd:")),
    Case("space-unknown-param-key", with_space(), "space.yaml: params.learning_rate.lowx: unknown key",
         space("low: 1.0e-5", "lowx: 1.0e-5")),
    Case("space-unknown-param-type", with_space(), "params.learning_rate: type must be one of",
         space("type: float", "type: real")),
    Case("space-wrong-value-type", with_space(), "space.yaml: params.learning_rate.low:",
         space("low: 1.0e-5", 'low: "abc"')),
    Case("space-low-above-high", with_space(), "space.yaml: params.learning_rate: low must not exceed high",
         space("low: 1.0e-5", "low: 1.0")),
    Case("space-log-low-not-positive", with_space(), "params.learning_rate: log scale needs low > 0",
         space("low: 1.0e-5", "low: 0.0")),
    Case("space-empty-choices", with_space(), "space.yaml: params.use_peft.choices:",
         space("choices: [true, false]", "choices: []")),
    Case("space-no-params", with_space(), "space.yaml: params:",
         {"space.yaml": "trainer: grpo\nparams: {}\n"}),
    Case("space-condition-unknown-param", with_space(), "params.lora_r.when: condition on unknown parameter 'use_lora'",
         space("when: {use_peft: true}", "when: {use_lora: true}")),
    Case("space-condition-before-dependency", with_space(), "params.lora_r.when: 'use_peft' must be declared before",
         {"space.yaml": SPACE.replace("  use_peft: {type: categorical, choices: [true, false]}\n", "")
          + "  use_peft: {type: categorical, choices: [true, false]}\n"}),
    Case("space-unknown-trainer", with_space(), "space.yaml: trainer: unknown trainer 'ppo'",
         space("trainer: grpo", "trainer: ppo")),
    Case("space-trainer-mismatch", with_space("--trainer", "dpo"), "space is for 'grpo' but --trainer is 'dpo'",
         space()),
    Case("space-unknown-precision", with_space(), "params.precision: unknown precision 'fp8'",
         space("bf16-mixed]", "fp8]")),
    Case("space-param-fixed-and-searched", with_space(), "fixed.learning_rate: also declared under params",
         space("max_completion_length: 8", "max_completion_length: 8\n  learning_rate: 0.001")),
    Case("space-file-missing", search("--search-space", "nope.yaml"), "nope.yaml: search space file not found"),
    Case("space-file-is-directory", search("--search-space", "adir"), "adir: cannot read the search space file",
         {"adir/x": ""}),
    Case("grid-with-float-param", with_space("--sampler", "grid"),
         "params.learning_rate: the grid sampler needs every param categorical", space()),
    Case("precisions-all-need-gpu", with_space(), "params.precision: none of fp16-mixed can run on this machine",
         space("[fp32, bf16-mixed]", "[fp16-mixed]"), process=False),
    # needs TRL's config fields: the first case past the pure checks, so it also runs as a subprocess
    Case("space-unknown-param-name", with_space(), "params.learning_rte: unknown parameter for grpo; did you mean "
         "'learning_rate'?", space("learning_rate:", "learning_rte:")),
    Case("space-unknown-fixed-name", with_space(), "fixed.max_completion_len: unknown parameter for grpo",
         space("max_completion_length", "max_completion_len"), process=False),
    # -- command-line values -------------------------------------------------------------------------------
    Case("unknown-flag", search("--bogus"), "unrecognized arguments: --bogus"),
    Case("unknown-command", ("serach",), "argument COMMAND: invalid choice: 'serach'"),
    Case("no-command", (), "choose a command"),
    Case("trainer-bogus", search("--trainer", "bogus"), "argument --trainer: invalid choice: 'bogus'"),
    Case("sampler-bogus", search("--sampler", "bogus"), "argument --sampler: invalid choice: 'bogus'"),
    Case("trials-zero", search("--trials", "0"), "argument --trials: must be at least 1, got 0"),
    Case("trials-not-a-number", search("--trials", "abc"), "argument --trials: expected a whole number, got 'abc'"),
    Case("max-steps-negative", search("--max-steps", "-1"), "argument --max-steps: must be at least 1, got -1"),
    Case("concurrency-zero", search("--concurrency", "0"), "argument --concurrency: must be at least 1, got 0"),
    Case("cpus-per-trial-zero", search("--cpus-per-trial", "0"), "argument --cpus-per-trial: must be positive, got 0"),
    Case("gpus-per-trial-negative", search("--gpus-per-trial", "-1"), "argument --gpus-per-trial: must not be negative"),
    Case("trial-timeout-zero", search("--trial-timeout", "0"), "argument --trial-timeout: must be positive"),
    Case("confirm-seeds-negative", search("--confirm-seeds", "-1"), "argument --confirm-seeds: must not be negative"),
    Case("seed-not-a-number", search("--seed", "x"), "argument --seed: invalid int value: 'x'"),
    Case("gpus-per-trial-without-gpu", search("--gpus-per-trial", "1"), "--gpus-per-trial 1.0: this machine has no "
         "CUDA GPU"),
    Case("ray-address-unreachable", search("--ray-address", "127.0.0.1:1"), "--ray-address 127.0.0.1:1: no Ray "
         "cluster answers there"),
    Case("ray-address-without-port", search("--ray-address", "somewhere"), "--ray-address somewhere:"),
    Case("output-folder-missing", search("-o", "no/such/dir/rec.yaml"), "-o no/such/dir/rec.yaml: folder no/such/dir "
         "does not exist"),
    Case("output-is-a-directory", search("-o", "adir"), "-o adir: is a directory", {"adir/x": ""}),
    Case("reward-func-not-importable", search("--reward-func", "nope:missing"),
         "reward function 'nope:missing' cannot be imported", process=False),
    Case("reward-func-malformed", search("--reward-func", "nope"), "reward function 'nope' is not 'builtin'",
         process=False),
    Case("reward-func-for-dpo", search("--trainer", "dpo", "--reward-func", "accuracy_reward"),
         "--reward-func is for grpo only"),
    # -- model and data ------------------------------------------------------------------------------------
    Case("model-path-missing", search("--model", "/does/not/exist"), "model path '/does/not/exist' does not exist"),
    Case("model-dir-not-a-model", search("--model", "notamodel"), "notamodel is a directory but not a model: no "
         "config.json", {"notamodel/readme.txt": "hello"}, process=False),
    Case("model-hub-offline", search("--model", "some-org/unreachable-model"),
         "model 'some-org/unreachable-model' is neither a local directory nor reachable", env={"HF_HUB_OFFLINE": "1"},
         process=False),
    Case("dataset-file-missing", search("--dataset", "missing.jsonl"), "dataset file 'missing.jsonl' does not exist",
         process=False),
    Case("dataset-missing-column", search("--trainer", "dpo", "--dataset", "prefs.jsonl"),
         "prefs.jsonl: dpo needs columns prompt, chosen, rejected; missing: rejected",
         {"prefs.jsonl": DPO_PREFS_NO_REJECTED}),
    Case("dataset-empty-file", search("--dataset", "empty.jsonl"), "empty.jsonl: the file is empty",
         {"empty.jsonl": ""}, process=False),
    Case("dataset-malformed-jsonl", search("--dataset", "bad.jsonl"), "bad.jsonl: cannot be read as json",
         {"bad.jsonl": '{"prompt": "a"\n'}, process=False),
    Case("dataset-unsupported-type", search("--dataset", "data.txt"), "data.txt: unsupported dataset file type",
         {"data.txt": "hello\n"}, process=False),
    Case("dataset-hub-offline", search("--dataset", "some-org/unreachable-data"),
         "dataset 'some-org/unreachable-data' is neither a local file nor reachable", env={"HF_HUB_OFFLINE": "1"},
         process=False),
    # -- the store ---------------------------------------------------------------------------------------------
    Case("store-under-proc", search("--store", "/proc/tuner-store"), "MLflow store /proc/tuner-store is not writable",
         process=False),
    Case("store-under-a-file", search("--store", "afile/store"), "MLflow store", {"afile": "x"}, process=False),
    Case("tracking-server-unreachable", search("--tracking-uri", "http://127.0.0.1:9"),
         "MLflow tracking server http://127.0.0.1:9 is unreachable"),
    Case("tracking-uri-unknown-scheme", search("--tracking-uri", "bogus://x"), "--tracking-uri bogus://x:",
         process=False),
    Case("bad-space-existing-store", with_space(), "params.learning_rate.lowx: unknown key",
         space("low: 1.0e-5", "lowx: 1.0e-5"), store_exists=True),
    # -- export, trial, ui ---------------------------------------------------------------------------------
    Case("export-missing-store", ("export", "--store", STORE, "--experiment", "nope"), "no MLflow store at tmp/mlflow"),
    Case("export-unknown-experiment", ("export", "--store", STORE, "--experiment", "nope"),
         "no experiment named 'nope'", store_exists=True, process=False),
    Case("export-run-id-unknown", ("export", "--store", STORE, "--experiment", "x", "--run-id", "abc123"),
         "--run-id abc123: MLflow at sqlite:", store_exists=True, process=False),
    Case("export-server-unreachable", ("export", "--store", STORE, "--experiment", "x", "--tracking-uri",
                                       "http://127.0.0.1:9"), "MLflow tracking server http://127.0.0.1:9 is unreachable"),
    Case("export-output-folder-missing", ("export", "--store", STORE, "--experiment", "x", "-o", "no/dir/r.yaml"),
         "-o no/dir/r.yaml: folder no/dir does not exist"),
    Case("export-bad-format", ("export", "--store", STORE, "--experiment", "x", "--format", "xml"),
         "argument --format: invalid choice: 'xml'"),
    Case("trial-config-missing", ("trial", "--config", "missing.yaml"), "missing.yaml: trial config not found"),
    Case("trial-config-unknown-key", ("trial", "--config", "trial.yaml"), "trial.yaml: max_stpes: unknown key",
         {"trial.yaml": GRPO_TRIAL.replace("max_steps", "max_stpes")}),
    Case("trial-config-malformed-yaml", ("trial", "--config", "trial.yaml"), "trial.yaml: malformed YAML",
         {"trial.yaml": "trainer: [grpo\n"}),
    Case("trial-config-not-mapping", ("trial", "--config", "trial.yaml"), "trial.yaml: a trial config must be a YAML "
         "mapping", {"trial.yaml": "- grpo\n"}),
    Case("trial-config-unknown-trainer", ("trial", "--config", "trial.yaml"), "trial.yaml: trainer: unknown trainer "
         "'ppo'", {"trial.yaml": GRPO_TRIAL.replace("grpo", "ppo")}),
    Case("trial-config-unknown-param", ("trial", "--config", "trial.yaml"), "trial.yaml: params.learnin_rate: unknown "
         "parameter for grpo; did you mean 'learning_rate'?",
         {"trial.yaml": GRPO_TRIAL.replace("learning_rate", "learnin_rate")}, process=False),
    Case("trial-config-bad-max-steps", ("trial", "--config", "trial.yaml"), "trial.yaml: max_steps: must be a "
         "positive integer", {"trial.yaml": GRPO_TRIAL.replace("max_steps: 2", "max_steps: 0")}),
    Case("ui-missing-store", ("ui", "--store", STORE), "no MLflow store at tmp/mlflow/mlflow.db"),
    Case("ui-bad-port", ("ui", "--store", STORE, "--port", "70000"), "argument --port: must be between 1 and 65535"),
]


# -- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    # tests/conftest.py may already point TUNER_CACHE_DIR at a session folder; otherwise use our own.
    return os.environ.get("TUNER_CACHE_DIR") or str(tmp_path_factory.mktemp("tuner-cache"))


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow store database with no searches in it, made once and copied into each case that needs one."""
    from tuner import tracking

    folder = tmp_path_factory.mktemp("empty-store")
    tracking.client(tracking.default_tracking_uri(folder)).search_experiments()
    return folder / "mlflow.db"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(case: Case, cwd: Path, cache: str, monkeypatch, capsys) -> tuple[int, str, float]:
    started = time.perf_counter()
    if case.process:
        env = {**os.environ, "TUNER_CACHE_DIR": cache, **case.env}
        done = subprocess.run([sys.executable, "-m", "tuner.cli", *case.args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)
        return done.returncode, done.stderr, time.perf_counter() - started
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TUNER_CACHE_DIR", cache)
    monkeypatch.setattr(sys, "path", list(sys.path))  # --reward-func puts the working directory on sys.path
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    try:
        code = cli.main(list(case.args))
    except SystemExit as exit:  # argparse exits
        code = exit.code
    return code, capsys.readouterr().err, time.perf_counter() - started


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, cache_dir, request, monkeypatch, capsys):
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    store = tmp_path / STORE
    if case.store_exists:
        store.mkdir(parents=True)
        (store / "mlflow.db").write_bytes(request.getfixturevalue("empty_store").read_bytes())
        before = _digest(store / "mlflow.db")

    code, stderr, seconds = _run(case, tmp_path, cache_dir, monkeypatch, capsys)

    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), stderr
    assert case.fragment in lines[0]
    assert code == 2, stderr
    # Fails before Ray, MLflow and training start: seconds, not the minutes a trial takes.
    assert seconds < 60, f"took {seconds:.0f}s"
    if case.store_exists:
        # An existing store is left byte-for-byte as it was: no experiment, no run.
        assert _digest(store / "mlflow.db") == before
        assert sorted(p.name for p in store.iterdir()) == ["mlflow.db"]
    else:
        assert not store.exists(), sorted(str(p) for p in store.rglob("*"))
    written = [p for p in tmp_path.rglob("*") if p.name in ("mlflow.db", "optuna.db") and p != store / "mlflow.db"]
    assert not written
    assert not (tmp_path / "mlruns").exists()


# -- help -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--help"], ["search", "--help"]], ids=["tuner", "search"])
def test_help_exits_0_and_shows_examples(args, tmp_path):
    done = subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tuner search" in done.stdout
    assert "example" in done.stdout.lower()
    assert done.stderr == ""
