"""Shared test setup: one tiny-model cache per test session, never the user's ~/.cache/tuner."""

from __future__ import annotations

import os

import pytest


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
