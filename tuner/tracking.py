"""MLflow: one parent run per search, one nested run per trial, all written from the driver.

Only the driver process writes (trials hand their metrics back through Ray), so trials running
at the same time never contend for the SQLite store's lock and no metric point is lost.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tuner.errors import TunerError

DEFAULT_STORE = Path("mlflow")  # relative to where tuner runs, like ./mlruns for plain MLflow
SEARCH_TAG = "tuner.kind"  # "search" on parent runs, "trial" on nested runs


def default_tracking_uri(store: Path = DEFAULT_STORE) -> str:
    return f"sqlite:///{Path(store).resolve() / 'mlflow.db'}"


def artifact_location(store: Path = DEFAULT_STORE) -> str:
    return (Path(store).resolve() / "artifacts").as_uri()


def check_tracking(uri: str, store: Path = DEFAULT_STORE) -> None:
    """Fail in one line, before anything runs, when the store cannot be written or reached."""
    if uri.startswith(("http://", "https://")):
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


def client(uri: str):
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow
    from mlflow.tracking import MlflowClient

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


def latest_search_run(mlflow_client, experiment_name: str, run_id: str | None = None):
    if run_id:
        return mlflow_client.get_run(run_id)
    experiment = find_experiment(mlflow_client, experiment_name)
    runs = mlflow_client.search_runs([experiment.experiment_id], filter_string=f"tags.`{SEARCH_TAG}` = 'search'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise TunerError(f"experiment {experiment_name!r} has no tuner search runs; run tuner search first")
    return runs[0]


def _metric_value(value: float) -> float:
    # The stores accept NaN; an infinity is written as the largest float so the point is not lost.
    if math.isinf(value):
        return math.copysign(1.7976931348623157e308, value)
    return value


def _param_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)
    return text[:6000]


class SearchTracker:
    """The parent run of one search and the nested runs of its trials."""

    def __init__(self, uri: str, experiment: str, store: Path = DEFAULT_STORE):
        self.uri = uri
        self.client = client(uri)
        self.experiment_id = get_or_create_experiment(self.client, experiment, uri, store)
        self.parent_id: str | None = None

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={SEARCH_TAG: "search", **tags})
        self.parent_id = run.info.run_id
        self.client.log_batch(self.parent_id, params=[Param(k, _param_value(v)) for k, v in params.items()])
        return self.parent_id

    def log_trial(self, number: int, spec: dict[str, Any], summary: dict[str, Any],
                  history: list[dict[str, Any]], tags: dict[str, str] | None = None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{number:03d}",
            tags={
                "mlflow.parentRunId": self.parent_id,
                SEARCH_TAG: "trial",
                "tuner.trial_number": str(number),
                "tuner.status": summary["status"],
                "tuner.reason": (summary.get("reason") or "")[:5000],
                "tuner.stopped_at_step": str(summary.get("stopped_at_step")),
                **(tags or {}),
            },
        )
        run_id = run.info.run_id
        params = [Param(k, _param_value(v)) for k, v in spec["params"].items()]
        params += [Param(f"tuner.{k}", _param_value(spec[k])) for k in ("max_steps", "seed", "model", "trainer")]
        metrics = [
            Metric(key, _metric_value(value), 0, row["step"])
            for row in history for key, value in row.items()
            if key != "step" and isinstance(value, (int, float))
        ]
        for key in ("tokens_per_second", "samples_per_second", "progress", "peak_memory_mb",
                    "seconds_to_first_step", "wall_seconds", "steps_run"):
            if isinstance(summary.get(key), (int, float)):
                metrics.append(Metric(f"trial/{key}", _metric_value(summary[key]), 0, 0))
        # log_batch takes at most 1000 metrics and 100 params a call
        for i in range(0, max(len(params), 1), 100):
            self.client.log_batch(run_id, params=params[i:i + 100])
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i:i + 1000])
        self.client.log_dict(run_id, spec, "trial.yaml")
        self.client.log_dict(run_id, {**summary, "history": history}, "result.json")
        self.client.set_terminated(run_id, "FINISHED" if summary["status"] == "ok" else "FAILED")
        return run_id

    def log_artifact_text(self, text: str, name: str) -> None:
        self.client.log_text(self.parent_id, text, name)

    def log_artifact_dict(self, data: dict, name: str) -> None:
        self.client.log_dict(self.parent_id, data, name)

    def log_file(self, path: str | os.PathLike) -> None:
        self.client.log_artifact(self.parent_id, str(path))

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.parent_id, k, v)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_id, status)


def load_search(uri: str, experiment: str, run_id: str | None = None) -> tuple[Any, dict]:
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
