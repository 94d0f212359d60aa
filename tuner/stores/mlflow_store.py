"""The MLflow store: where it is (a local SQLite store under --store, or a tracking server), the checks that it
can be used before anything runs, its lock, the client, and a search's experiment in it."""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import importlib.util
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tuner.errors import TunerError
from tuner.stores import _empty_store as empty_store

DEFAULT_STORE = Path("mlflow")  # relative to where tuner runs, like ./mlruns for plain MLflow

# The URI schemes MLflow's tracking-store registry registers (mlflow.tracking._tracking_service.utils,
# _register_tracking_stores, read in MLflow 3.17). They are written out because no public MLflow API lists them:
# the registry is private, and the public ways to ask (MlflowClient(uri), mlflow.set_tracking_uri and a first call)
# build the store, which connects to a database or creates one. "" is a plain path (a file store). MLflow also
# registers "databricks-uc" and "uc", only to refuse them as tracking URIs: they are left out, so they fail here.
BUILT_IN_SCHEMES = frozenset({"", "file", "databricks", "http", "https"})
# SQLAlchemy's engines (mlflow.store.db.db_types.DATABASE_ENGINES), registered when SQLAlchemy is installed; a
# driver may follow the engine: postgresql+psycopg2.
DATABASE_ENGINES = ("postgresql", "mysql", "sqlite", "mssql")
# Tracking-store plugins: packages add a scheme under this public entry-point group (MLflow's plugin docs).
PLUGIN_GROUP = "mlflow.tracking_store"


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
        check_credentials(uri)
        return
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
    elif uri.startswith("file:"):
        folder = Path(uri.removeprefix("file://").removeprefix("file:"))
    else:
        folder = Path(store)
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:  # nothing created here: the search makes it
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-test-"):
            pass
    except OSError as e:
        raise TunerError(
            f"MLflow store {folder} is not writable ({e.strerror or e}); pass --store DIR or --tracking-uri "
            "for a writable location"
        ) from None


# MLflow's own client credentials (mlflow.environment_variables): a server with users (`mlflow server --app-name
# basic-auth`) takes a user and password, or a bearer token.
USER_ENV, PASSWORD_ENV, TOKEN_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"


def check_credentials(uri: str) -> None:
    """One read a search needs (the experiments' list, one row) with MLflow's credentials from its environment
    variables: a server with users that refuses them fails here in one line, before anything is written. The
    password is never part of the message."""
    import base64

    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password, token = (os.environ.get(name) for name in (USER_ENV, PASSWORD_ENV, TOKEN_ENV))
    if user and password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10):
            return
    except urllib.error.HTTPError as e:
        if e.code not in (401, 403):
            return  # not a question of credentials: the writes say what is wrong, as before
        if e.code == 403:
            raise TunerError(f"MLflow tracking server {uri}: user {user!r} may not read its experiments (HTTP 403); "
                             "ask its admin for READ (and EDIT to search) permission") from None
        given = (f"it refused user {user!r} and that password" if user and password else
                 f"it refused the token in {TOKEN_ENV}" if token else "none were given")
        raise TunerError(f"MLflow tracking server {uri} asks for a user (HTTP 401) and {given}: set {USER_ENV} and "
                         f"{PASSWORD_ENV} to a user of that server (MLflow's own variables)") from None
    except (OSError, urllib.error.URLError):
        return  # /health answered a moment ago: leave a flaky read to the writes and their spool


def check_tracking_scheme(uri: str) -> None:
    """An unknown --tracking-uri scheme otherwise fails inside MLflow after Ray has started. The URI's scheme, as
    MLflow reads it, is looked up in MLflow's schemes (BUILT_IN_SCHEMES, DATABASE_ENGINES) and its plugins'; nothing
    is built or written."""
    if not _mlflow_knows(_scheme(uri)):
        raise TunerError(
            f"--tracking-uri {uri}: MLflow cannot use this kind of URI; pass http(s)://HOST:PORT of a tracking "
            "server or sqlite:///PATH/mlflow.db, or drop --tracking-uri to use the local store"
        )


def _scheme(uri: str) -> str:
    """The scheme MLflow picks a tracking store by (mlflow.utils.uri.get_uri_scheme): the bare names databricks,
    databricks-uc and uc are schemes themselves; a one-letter scheme is a Windows drive, so a path."""
    if uri in ("databricks", "databricks-uc", "uc"):
        return uri
    scheme = urllib.parse.urlparse(uri).scheme
    return "" if len(scheme) == 1 and scheme.isalpha() else scheme


def _mlflow_knows(scheme: str) -> bool:
    if scheme.startswith(DATABASE_ENGINES):  # MLflow's rule: ENGINE or ENGINE+DRIVER, nothing else
        engine, _, driver = scheme.partition("+")
        return engine in DATABASE_ENGINES and "+" not in driver and importlib.util.find_spec("sqlalchemy") is not None
    if scheme in BUILT_IN_SCHEMES:
        return True
    return scheme in {e.name for e in importlib.metadata.entry_points(group=PLUGIN_GROUP)}


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
