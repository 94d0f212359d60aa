"""tuner.stores.mlflow_store.check_tracking_scheme: a --tracking-uri MLflow cannot use fails in one line, before
anything runs; one it can use passes, without a store being built."""

from __future__ import annotations

import importlib.metadata

import pytest

from tuner.errors import TunerError
from tuner.stores import mlflow_store


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "https://mlflow.example.org", "sqlite:////tmp/x/mlflow.db",
                                 "file:///tmp/mlruns", "/tmp/mlruns", "mlruns", "databricks", "databricks://profile",
                                 "postgresql://u@h/db", "postgresql+psycopg2://u@h/db", "mysql+pymysql://u@h/db",
                                 "mssql+pyodbc://u@h/db", "C:\\mlruns"])
def test_a_scheme_mlflow_knows_passes(uri, tmp_path):
    mlflow_store.check_tracking_scheme(uri)
    assert not any(tmp_path.iterdir())  # nothing built


@pytest.mark.parametrize("uri", ["bogus://x", "s3://bucket/mlruns", "postgres://u@h/db", "postgresql+a+b://u@h/db",
                                 "databricks-uc", "uc"])
def test_a_scheme_mlflow_does_not_know_is_one_line(uri):
    with pytest.raises(TunerError) as caught:
        mlflow_store.check_tracking_scheme(uri)
    assert str(caught.value).startswith(f"--tracking-uri {uri}: MLflow cannot use this kind of URI")
    assert "\n" not in str(caught.value)


def test_a_plugins_scheme_passes(monkeypatch):
    plugin = importlib.metadata.EntryPoint("myplugin", "my_plugin.store:Store", mlflow_store.PLUGIN_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [plugin] if kw.get("group") == mlflow_store.PLUGIN_GROUP else real(**kw))
    mlflow_store.check_tracking_scheme("myplugin://somewhere")
    with pytest.raises(TunerError):
        mlflow_store.check_tracking_scheme("otherplugin://somewhere")


def test_the_written_out_schemes_are_what_the_installed_mlflow_registers():
    # The one place that reads MLflow's private registry: to catch an MLflow that adds or drops a scheme.
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    plugins = {e.name for e in importlib.metadata.entry_points(group=mlflow_store.PLUGIN_GROUP)}
    registered = set(_tracking_store_registry._registry) - plugins - {"databricks-uc", "uc"}
    assert registered == mlflow_store.BUILT_IN_SCHEMES | set(mlflow_store.DATABASE_ENGINES)
