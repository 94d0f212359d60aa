"""Shared test setup: one tiny-model cache per test session, never the user's ~/.cache/tuner; and the fixtures
that several test files use.

tests/ mirrors the package, one folder per subsystem. What test files share is in tests/helpers.py (``from helpers
import ...``); no test module imports another. pytest's default "prepend" import mode puts tests/ on sys.path when it
imports this file, before any test module, so ``helpers`` is importable from every folder, and imported once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One torch (OpenMP) thread per process, as Ray gives each trial of a search (OMP_NUM_THREADS for its 1-CPU slot):
# set before anything imports torch, so it holds for the trials tests run in their own process (run_trial) and for
# every process they start. torch's default, a thread per core, spins those threads against the other xdist worker
# and the trial processes on the same cores: a reward trial of tests/search/test_from_config.py run in the test's
# process took 228 s with 2 threads on a loaded 2-core machine, 17 s with 1 (bench/reference.py pins it for the
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
    asks first: tests/search/test_search.py, tests/report/test_export.py."""
    from helpers import ANCHOR_SPACE, run_search_in

    return run_search_in(
        tmp_path_factory.mktemp("anchor"), ANCHOR_SPACE, trainer="reward", sampler="grid",
        max_steps=20,  # the budget; fp16-pure at 0.3 breaks within the first few steps
        confirm_seeds=1, confirm_top=4,  # erratic lr-0.3 configs rank high on progress; deeper candidates back them up
        experiment="anchor",
    )


@pytest.fixture
def grid_space(tmp_path, tiny_model) -> Path:
    """helpers.GRID_SPACE written to the test's folder (tests/search/test_reliability*.py); requesting tiny_model
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
# runs as written.
LONG_FILES = [
    "tests/jobs/test_cluster_jobs.py",
    "tests/search/test_from_config.py",
    "tests/search/test_reliability_services.py",
    "tests/search/test_reliability.py",
    "tests/search/test_verdict_stability.py",
    "tests/test_real_model.py",
    "tests/inputs/test_packaged.py",
    "tests/test_bench_smoke.py",
    "tests/search/test_search.py",
    "tests/search/test_sigterm_group.py",
    "tests/trial/test_trial.py",
    "tests/search/test_ranks_search.py",
    "tests/search/test_live.py",
    "tests/test_bench_gpu.py",
    "tests/trial/test_trainers.py",
    "tests/report/test_export.py",
    "tests/inputs/test_tasks.py",
    "tests/search/test_from_published.py",
    "tests/search/test_warm.py",
    "tests/search/test_pruning.py",
    "tests/search/test_extend.py",
    "tests/trial/test_ranks.py",
    "tests/trial/test_trainer_config.py",
    "tests/trial/test_launcher.py",
    "tests/inputs/test_tiny_pretrained.py",
]


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected
