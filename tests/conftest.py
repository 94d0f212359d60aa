"""Shared test setup: one tiny-model cache per test session, never the user's ~/.cache/tuner; the fixtures that
several test files use; and the tiers.

Every test file is in one of three tiers, by folder (CONTRIBUTING.md, "Test tiers"): tests/unit/ (pure logic: no TRL
training step, no Ray, no server, no ``tiny_model``), tests/training/ (real TRL trials on the tiny model, in the
test's process or a trial's child process; no Ray, no search) and tests/e2e/ (searches, Ray, servers, clusters, the
real model, the bench's runs). Each tier mirrors the package inside it, one folder per subsystem (and docs/, bench/,
cli/, layout/). Every test gets its tier's mark from its path (``pytest -m unit``, ``-m "not e2e"``), so none is left
unmarked; a test file anywhere else fails collection. Recorded data the tests read is in tests/data/, and the
data bench writes and tests read in bench/recorded/ (``helpers.BENCH_RECORDED``; tests/data/README.md lists both).

What test files share is in tests/helpers.py (``from helpers import ...``); no test module imports another. pytest's
default "prepend" import mode puts tests/ on sys.path when it imports this file, before any test module, so
``helpers`` is importable from every folder, and imported once; it imports each test module by its file name (its
own folder on sys.path), so no two test files may share a name, whatever their folders.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

# One torch (OpenMP) thread per process, as Ray gives each trial of a search (OMP_NUM_THREADS for its 1-CPU slot):
# set before anything imports torch, so it holds for the trials tests run in their own process (run_trial) and for
# every process they start. torch's default, a thread per core, spins those threads against the other xdist worker
# and the trial processes on the same cores: a reward trial of tests/e2e/search/test_from_config.py run in the test's
# process took 228 s with 2 threads on a loaded 2-core machine, 17 s with 1 (bench/headline/reference.py pins it for the
# same reason). A thread count a developer has set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def shared_weights_dir():
    """The session's own folder for tuner.trial.weights' shared copies (in /dev/shm where there is one), removed at
    the end, so test runs never leave copies in the machine's /dev/shm/tuner-weights-<uid>."""
    import shutil
    import tempfile

    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="tuner-test-weights-", dir=shm)
    previous = os.environ.get("TUNER_SHARED_WEIGHTS_DIR")
    os.environ["TUNER_SHARED_WEIGHTS_DIR"] = folder
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
    if previous is None:
        os.environ.pop("TUNER_SHARED_WEIGHTS_DIR", None)
    else:
        os.environ["TUNER_SHARED_WEIGHTS_DIR"] = previous


@pytest.fixture(scope="session", autouse=True)
def tuner_cache_dir(tmp_path_factory):
    """Point TUNER_CACHE_DIR at a folder shared by the whole session (and by the trial child processes,
    which inherit the environment), so tests never read or write ~/.cache/tuner."""
    cache = tmp_path_factory.mktemp("tuner-cache")
    previous = os.environ.get("TUNER_CACHE_DIR")
    os.environ["TUNER_CACHE_DIR"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("TUNER_CACHE_DIR", None)
    else:
        os.environ["TUNER_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def tiny_model(tuner_cache_dir) -> str:
    """The tiny model's folder, built once per session in the session cache. Tests that train request it;
    pure-logic tests do not, so they do not pay for importing torch."""
    from tuner.inputs.models import tiny_model_dir

    return str(tiny_model_dir())


@pytest.fixture(scope="session")
def anchor(tmp_path_factory, tiny_model):
    """The issue's anchor grid (helpers.ANCHOR_SPACE), searched once per session (per xdist worker) whichever file
    asks first: tests/e2e/search/test_search.py, tests/e2e/report/test_export_e2e.py."""
    from helpers import ANCHOR_SPACE, run_search_in

    return run_search_in(
        tmp_path_factory.mktemp("anchor"), ANCHOR_SPACE, trainer="reward", sampler="grid",
        max_steps=20,  # the budget; fp16-pure at 0.3 breaks within the first few steps
        confirm_seeds=1, confirm_top=4,  # erratic lr-0.3 configs rank high on progress; deeper candidates back them up
        experiment="anchor",
    )


@pytest.fixture
def grid_space(tmp_path, tiny_model) -> Path:
    """helpers.GRID_SPACE written to the test's folder (tests/e2e/search/test_reliability*.py); requesting tiny_model
    builds the model once, so parallel searches never race to."""
    from helpers import GRID_SPACE

    path = tmp_path / "space.yaml"
    path.write_text(GRID_SPACE)
    return path


@pytest.fixture
def spawn(tmp_path):
    """A helpers.Spawner in the test's folder: commands in sessions of their own, every one killed at the end."""
    from helpers import Spawner

    spawner = Spawner(tmp_path)
    yield spawner
    spawner.cleanup()


# The test files that take minutes, longest first (roughly: the sum of each file's setup, call and teardown times in
# a suite run on the 2-core runner, --durations=0; the order matters, not the figures). pytest-xdist runs a file whole
# on one worker (--dist loadfile) and hands the files out in collection order (--no-loadscope-reorder in
# pyproject.toml). Its default, the files with most tests first, hands few-test files of minutes (test_from_config,
# test_sigterm_group, test_ranks_search, the two test_reliability files) out near the end, where one of them can leave
# a worker running it alone; started first, the long files overlap each other and the many short ones fill both
# workers to the end. A file not listed keeps its collection order, after these. Only the order changes: every test
# runs as written. Every path here must exist (checked when pytest starts): a file moved or renamed is moved here too.
# Reordered (issue 62) from single-file runs with --durations=0 on the shared 2-core machine (its load varied from
# 2 to 14, so the figures only rank): test_reliability_services 570 s, test_basic_auth 316 s (a users server and a
# search through it: it was not listed, so it started after every file here), test_reliability 313 s,
# test_cluster_jobs 262 s, test_warm_e2e 182-196 s (four real searches: it was near the end of this list),
# test_search 152 s, test_from_config 136 s, test_report_e2e 62 s (added). xdist gives a worker its next file when
# two or fewer of its tests are left, so a long file started late can still leave the other worker idle: a file of
# minutes belongs here.
LONG_FILES = [
    "tests/e2e/search/test_reliability_services.py",
    "tests/e2e/jobs/test_cluster_jobs.py",
    "tests/e2e/search/test_reliability.py",
    "tests/e2e/search/test_from_config.py",
    "tests/e2e/search/test_warm_e2e.py",
    "tests/e2e/stores/test_basic_auth.py",
    "tests/training/verdicts/test_verdict_stability.py",
    "tests/e2e/bench/test_bench_smoke_e2e.py",
    "tests/e2e/inputs/test_packaged.py",
    "tests/e2e/search/test_search.py",
    "tests/e2e/search/test_sigterm_group.py",
    "tests/training/trial/test_trial_training.py",
    "tests/e2e/search/test_ranks_search.py",
    "tests/e2e/search/test_live_e2e.py",
    "tests/e2e/bench/test_bench_gpu.py",
    "tests/e2e/bench/test_real_model.py",
    "tests/e2e/report/test_report_e2e.py",
    "tests/training/trial/test_trainers.py",
    "tests/e2e/report/test_export_e2e.py",
    "tests/training/inputs/test_tasks_training.py",
    "tests/e2e/search/test_from_published_e2e.py",
    "tests/e2e/search/test_pruning_e2e.py",
    "tests/e2e/search/test_extend_e2e.py",
    "tests/training/trial/test_ranks.py",
    "tests/training/trial/test_trainer_config_training.py",
    "tests/training/trial/test_launcher.py",
    "tests/training/inputs/test_tiny_pretrained.py",
]

# -- the tiers --------------------------------------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "training", "e2e")  # lightest first; each is a folder of tests/ and a mark (pyproject.toml)


def tier_of(path: Path) -> str | None:
    """The tier of a file under tests/: the first folder of its path there, when that is a tier's."""
    path = Path(path).resolve()
    if TESTS not in path.parents:
        return None
    parts = path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


class Untiered(pytest.File):
    """A test file outside the tiers' folders: its collection fails, naming the file and where it may go."""

    def collect(self):
        where = self.path.resolve().relative_to(TESTS.parent)
        raise self.CollectError(
            f"{where}: a test file must be in one of tests/unit/, tests/training/ or tests/e2e/ (the tiers: "
            "CONTRIBUTING.md, \"Test tiers\"); move it to its tier's folder for its subsystem")


def pytest_collect_file(file_path: Path, parent):
    if TESTS not in file_path.resolve().parents or tier_of(file_path) is not None:
        return None  # not ours, or in its tier
    if any(fnmatch.fnmatch(file_path.name, pattern) for pattern in parent.config.getini("python_files")):
        return Untiered.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    missing = [path for path in LONG_FILES if not (TESTS.parent / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: LONG_FILES names files that do not exist: {', '.join(missing)}")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks given here
def pytest_collection_modifyitems(items):
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected
