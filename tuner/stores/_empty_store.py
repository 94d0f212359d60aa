"""A fresh local MLflow store in milliseconds: a copy of an empty one, made once per MLflow version.

MLflow creates a new SQLite store by running every one of its schema migrations (about a hundred Python
files through alembic): 1.5 s of CPU here, and more while Ray and the trial launcher start beside it. Every
first search in a folder, every benchmark search and most tests start from a new store. So the first time,
the empty schema is built once into the cache folder (``$TUNER_CACHE_DIR``, default ``~/.cache/tuner``), named
by MLflow's version, and each new store starts as a copy of it. The copy holds tables only (no experiment):
MLflow itself then adds its Default experiment, with this store's own artifact location.

    seed("/path/mlflow/mlflow.db")   # before the first MlflowClient opens it; nothing if it already exists

Anything unexpected (a read-only cache, an MLflow without the private helper used here) leaves the store
to MLflow's own creation: slower, never different.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path

from tuner.stores.cache import cache_dir


def template_path() -> Path:
    import mlflow

    return cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"


def seed(database: str | os.PathLike) -> bool:
    """Start the SQLite store ``database`` as a copy of the empty template, if it does not exist yet.
    True when it did; False when the store existed or MLflow will create it itself."""
    database = Path(database)
    if database.exists():
        return False
    template = _template()
    if template is None:
        return False
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        return _place(template.read_bytes(), database)
    except OSError:  # a folder that cannot be written: MLflow meets it as it would have, and says so
        return False


def _template() -> Path | None:
    try:
        path = template_path()
        if not path.is_file():
            _build(path)
        return path
    except Exception:  # noqa: BLE001 - only an optimization: MLflow creates the store itself
        return None


def _build(path: Path) -> None:
    """MLflow's own creation of its tables (what its store runs on an empty database), into ``path``."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=".mlflow-empty-", suffix=".db")
    os.close(handle)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{scratch}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(scratch, path)  # whole or not at all; a builder that loses a race writes the same
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)


def _place(content: bytes, database: Path) -> bool:
    """Write ``database`` whole, never over one that appeared meanwhile (another process's, maybe in use)."""
    scratch = database.with_name(f".{database.name}.{uuid.uuid4().hex}")
    handle = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the user's umask, as MLflow's own
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
        os.link(scratch, database)  # fails if it exists: the first one stays
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(scratch)
