"""The MLflow store: where it is (a local SQLite store under --store, or a tracking server), the checks that it
can be used before anything runs, its lock, the client, and a search's experiment in it."""

from __future__ import annotations

import contextlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tuner.errors import TunerError
from tuner.stores import _empty_store as empty_store

DEFAULT_STORE = Path("mlflow")  # relative to where tuner runs, like ./mlruns for plain MLflow


def default_tracking_uri(store: Path = DEFAULT_STORE) -> str:
    return f"sqlite:///{Path(store).resolve() / 'mlflow.db'}"


def artifact_location(store: Path = DEFAULT_STORE) -> str:
    return (Path(store).resolve() / "artifacts").as_uri()


def is_server(uri: str) -> bool:
    """Whether ``uri`` names an MLflow tracking server (else a local store)."""
    return uri.startswith(("http://", "https://"))


def check_tracking(uri: str, store: Path = DEFAULT_STORE) -> None:
    """Fail in one line, before anything runs, when the store cannot be written or reached."""
    if is_server(uri):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as response:
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
        except (OSError, urllib.error.URLError) as e:
            cause = getattr(e, "reason", e)
            raise TunerError(
                f"MLflow tracking server {uri} is unreachable ({cause}); start it (mlflow server --host 127.0.0.1 "
                "--port PORT) or drop --tracking-uri to use the local store ./mlflow"
            ) from None
        return
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
    elif uri.startswith("file:"):
        folder = Path(uri.removeprefix("file://").removeprefix("file:"))
    else:
        folder = Path(store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as e:
        raise TunerError(
            f"MLflow store {folder} is not writable ({e.strerror or e}); pass --store DIR or --tracking-uri "
            "for a writable location"
        ) from None


def check_tracking_scheme(uri: str) -> None:
    """An unknown --tracking-uri scheme otherwise fails inside MLflow after Ray has started. MLflow's store registry
    is private; its public ways to ask (``MlflowClient(uri)``, ``mlflow.set_tracking_uri`` and a first call) build
    the store, which connects to a database or creates one: this asks the registry which scheme it knows, and
    nothing is written."""
    if uri.startswith(("http://", "https://", "sqlite:///", "file:")):
        return
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    try:
        _tracking_store_registry.get_store_builder(uri)
    except Exception:  # noqa: BLE001 - MLflow raises its own exception types for an unsupported scheme
        raise TunerError(
            f"--tracking-uri {uri}: MLflow cannot use this kind of URI; pass http(s)://HOST:PORT of a tracking "
            "server or sqlite:///PATH/mlflow.db, or drop --tracking-uri to use the local store"
        ) from None


@contextlib.contextmanager
def store_lock(store: Path):
    """An exclusive lock on the store folder, for the first open of its SQLite databases."""
    import fcntl

    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def client(uri: str):
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Fail a write to an absent server in seconds (then it is spooled), not after minutes of retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    import mlflow

    if uri.startswith("sqlite:///"):
        empty_store.seed(uri.removeprefix("sqlite:///"))  # a new store: a copy of an empty one, not migrations
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def get_or_create_experiment(mlflow_client, name: str, uri: str, store: Path = DEFAULT_STORE) -> str:
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    # A SQLite store would otherwise put artifacts in ./mlruns; keep them beside the database.
    location = artifact_location(store) if uri.startswith("sqlite:") else None
    return mlflow_client.create_experiment(name, artifact_location=location)


def find_experiment(mlflow_client, name: str):
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is None:
        names = [e.name for e in mlflow_client.search_experiments() if e.name != "Default"]
        known = f"; experiments in this store: {', '.join(names)}" if names else "; this store has no searches yet"
        raise TunerError(f"no experiment named {name!r}{known}")
    return experiment
