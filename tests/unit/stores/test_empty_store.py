"""A new local MLflow store starts as a copy of an empty one (tuner.stores._empty_store): the same store MLflow builds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tuner.stores import _empty_store as empty_store
from tuner.stores import mlflow_store


def _schema(database: Path) -> tuple[list, list]:
    """Every table and index with its columns and constraints (as a set: MLflow's own migrations write a table's
    constraints in an order that differs from one store to the next), and the schema's revision."""
    with sqlite3.connect(database) as db:
        tables = db.execute("select type, name, sql from sqlite_master where name not like 'sqlite_%' "
                            "order by type, name").fetchall()
        revision = db.execute("select version_num from alembic_version").fetchall()
    return [(kind, name, sorted((sql or "").split(", \n"))) for kind, name, sql in tables], revision


def _use(database: Path, store: Path) -> list[float]:
    client = mlflow_store.client(f"sqlite:///{database}")
    experiment = mlflow_store.get_or_create_experiment(client, "e", f"sqlite:///{database}", store)
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "loss", 1.5, step=3)
    client.set_terminated(run.info.run_id)
    return [m.value for m in client.get_metric_history(run.info.run_id, "loss")]


def test_a_seeded_store_is_the_store_mlflow_builds_itself(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    own = tmp_path / "own" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{own}").search_experiments()  # MLflow's migrations, no template

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    seeded = tmp_path / "seeded" / "mlflow.db"
    assert empty_store.seed(seeded)
    assert empty_store.template_path().is_file()
    assert _schema(seeded) == _schema(own)
    assert _use(seeded, seeded.parent) == [1.5]
    client = mlflow_store.client(f"sqlite:///{seeded}")
    # MLflow's Default experiment, added by MLflow itself on the first open, and this store's own experiment
    assert {e.name for e in client.search_experiments()} == {"Default", "e"}
    assert client.get_experiment_by_name("e").artifact_location == (seeded.parent / "artifacts").as_uri()


def test_an_existing_store_is_never_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    database = tmp_path / "store" / "mlflow.db"
    assert _use(database, database.parent) == [1.5]
    before = database.read_bytes()
    assert not empty_store.seed(database)
    assert database.read_bytes() == before
    assert _use(database, database.parent) == [1.5]  # the run already there is still there beside a new one
    client = mlflow_store.client(f"sqlite:///{database}")
    assert len(client.search_runs([client.get_experiment_by_name("e").experiment_id])) == 2


@pytest.mark.parametrize("cache", ["a-file", "missing-parent-is-a-file/x"])
def test_without_a_usable_cache_mlflow_creates_the_store_itself(tmp_path, monkeypatch, cache):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "missing-parent-is-a-file").write_text("not a folder")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / cache))
    database = tmp_path / "store" / "mlflow.db"
    assert not empty_store.seed(database)
    assert not database.exists()
    assert _use(database, database.parent) == [1.5]


def test_a_store_folder_that_cannot_be_made_is_left_to_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "a-file").write_text("not a folder")
    assert not empty_store.seed(tmp_path / "a-file" / "mlflow.db")  # no exception: MLflow reports it as before
    assert empty_store.template_path().is_file()
    assert not list(tmp_path.glob("**/.mlflow.db.*"))  # no scratch copy left behind
