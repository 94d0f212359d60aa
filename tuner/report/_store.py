"""MLflow for the report: read a search's records and its trials' histories, log report.md and the plots back.

    stored = load_search(uri, "reward-tiny")          # latest search; run_id="..." for another one
    histories = load_histories(uri, stored.search["trials"])
    log_report(uri, stored.run_id, folder / "report.md", plot_paths)

A search's parent run holds its ``search.json`` (trial records and recommendation); each trial's
nested run holds its ``result.json`` (with the per-step history the curves plot). The report is
logged on the parent run as report.md and plots/*.png.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.records import SearchSummary, TrialRecord
from tuner.stores import mlflow_store, run_reader


@dataclass
class StoredSearch:
    """A search as MLflow keeps it: its parent run and its search.json."""

    run_id: str  # the search's parent run
    run_name: str
    params: dict[str, str]  # the parent run's params (sampler, max_steps, ...)
    search: SearchSummary  # search.json


def load_search(uri: str, experiment: str, run_id: str | None = None) -> StoredSearch:
    """The latest search of ``experiment`` (or the search run ``run_id``); an MLflow error is one TunerError line."""
    from mlflow.exceptions import MlflowException

    if mlflow_store.is_server(uri):
        mlflow_store.check_tracking(uri)  # MLflow's client would retry an absent server for minutes
    try:
        run, search = run_reader.load_search(uri, experiment, run_id)
    except MlflowException as e:  # e.g. a --run-id that is not in this store
        where = f"--run-id {run_id}" if run_id else f"--experiment {experiment}"
        cause = " ".join(str(e.message).split())[:200]
        raise TunerError(f"{where}: MLflow at {uri} says: {cause}; check the value, or leave --run-id out to "
                         "report on the latest search") from None
    return StoredSearch(run.info.run_id, run.info.run_name, run.data.params, search)


def load_histories(uri: str, records: list[TrialRecord]) -> dict[int, list[dict[str, Any]]]:
    """Each trial's per-step history from its nested run's result.json, by trial number."""
    mlflow_client = mlflow_store.client(uri)
    histories = {}
    with tempfile.TemporaryDirectory(prefix="tuner-report-") as tmp:
        for r in records:
            if not r.get("run_id"):
                continue
            try:
                path = mlflow_client.download_artifacts(r["run_id"], "result.json", tmp)
            except Exception:  # noqa: BLE001 - a trial run without its result: plot what exists
                continue
            histories[r["number"]] = json.loads(Path(path).read_text()).get("history") or []
    return histories


def log_report(uri: str, run_id: str, markdown: Path, plots: list[Path]) -> None:
    """Log report.md at the top of the search's run and each plot under plots/."""
    mlflow_client = mlflow_store.client(uri)
    mlflow_client.log_artifact(run_id, str(markdown))
    for path in plots:
        mlflow_client.log_artifact(run_id, str(path), "plots")
