"""Shared test setup: one tiny-model cache per test session, never the user's ~/.cache/tuner.

tests/ mirrors the package, one folder per subsystem. A test module that shares another's helpers or its
once-per-session search imports it by file name (``import test_search``), as pytest imports it (rootdir-relative
"prepend" import mode): every test folder is on sys.path from the start, whichever folders a run collects, so the
module is imported once and its session state is shared.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

for _folder in sorted(Path(__file__).parent.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


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
