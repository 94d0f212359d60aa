"""A search read back from MLflow: its parent run (the latest of an experiment, or one named by --run-id), its
trial runs, and its results table (search.json)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.records import SearchSummary
from tuner.stores.mlflow_store import client, find_experiment
from tuner.stores.tags import KIND_TAG, TRIAL_NUMBER_TAG


def latest_search_run(mlflow_client, experiment_name: str, run_id: str | None = None):
    """The latest search run of the experiment, or the search run ``run_id``, which must be one of its searches."""
    if run_id:
        return _search_run(mlflow_client, experiment_name, run_id)
    experiment = find_experiment(mlflow_client, experiment_name)
    runs = mlflow_client.search_runs([experiment.experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'search'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise TunerError(f"experiment {experiment_name!r} has no tuner search runs; run tuner search first")
    return runs[0]


def _search_run(mlflow_client, experiment_name: str, run_id: str):
    """--run-id: a search's parent run in --experiment; anything else is one line that names both and the fix.
    An id MLflow does not know raises MlflowException: the command says so with the store's address."""
    run = mlflow_client.get_run(run_id)
    experiment = mlflow_client.get_experiment(run.info.experiment_id)
    if experiment.name != experiment_name:
        raise TunerError(f"--run-id {run_id} is a run of experiment {experiment.name!r}, not of --experiment "
                         f"{experiment_name!r}; pass --experiment {experiment.name}, or a search run id of "
                         f"{experiment_name!r}, or leave --run-id out for its latest search")
    kind = run.data.tags.get(KIND_TAG)
    if kind == "trial":
        parent_id = run.data.tags.get("mlflow.parentRunId", "?")
        try:
            search = mlflow_client.get_run(parent_id).info.run_name
        except Exception:  # noqa: BLE001 - the parent's name only makes the message friendlier
            search = "?"
        number = run.data.tags.get(TRIAL_NUMBER_TAG, "?")
        raise TunerError(f"--run-id {run_id} is trial {number} of search {search} (run {parent_id}) in "
                         f"{experiment_name!r}, not a search; pass --run-id {parent_id}, or leave --run-id out for "
                         "the latest search")
    if kind != "search":
        raise TunerError(f"--run-id {run_id} in {experiment_name!r} is not a tuner search run (tag {KIND_TAG} is "
                         f"{kind!r}); pass a search's run id, or leave --run-id out for the latest search")
    return run


def trial_runs(uri: str, parent_id: str) -> list:
    """The nested trial runs of a search (for resume)."""
    mlflow_client = client(uri)
    run = mlflow_client.get_run(parent_id)
    return mlflow_client.search_runs([run.info.experiment_id],
                                     filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=10000)


def load_search(uri: str, experiment: str, run_id: str | None = None) -> tuple[Any, SearchSummary]:
    """The search's parent run and its ``search.json`` artifact (trial table + recommendation)."""
    mlflow_client = client(uri)
    run = latest_search_run(mlflow_client, experiment, run_id)
    try:
        path = mlflow_client.download_artifacts(run.info.run_id, "search.json", tempfile.mkdtemp(prefix="tuner-"))
    except Exception:  # noqa: BLE001 - a search killed before it finished has no table yet
        raise TunerError(
            f"search run {run.info.run_id} in {experiment!r} has no results yet (status {run.info.status}); "
            "wait for it to finish or resume it with tuner search --resume"
        ) from None
    return run, json.loads(Path(path).read_text())
