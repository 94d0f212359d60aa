"""Resume a search whose driver died: same parent run, completed trials kept, the rest re-run.

    tuner search --resume EXPERIMENT

The latest unfinished search of the experiment is continued with the options it was started
with. Trials with a nested MLflow run are kept and not re-run. Trials that were in flight
(RUNNING in the Optuna study with no MLflow run) are marked FAIL in the study and their params
are enqueued again, so the final count of recorded trials equals the count asked for.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from tuner.errors import TunerError

__all__ = ["resume_options", "reattach"]


def resume_options(options) -> tuple[Any, str]:
    """The options the unfinished search was started with (resources from ``options``), and its run id."""
    from tuner import tracking

    store = Path(options.store)
    uri = options.tracking_uri or tracking.default_tracking_uri(store)
    if not options.tracking_uri and not (store / "mlflow.db").exists():
        raise TunerError(f"--resume {options.resume}: no MLflow store at {store}/mlflow.db; pass the --store the "
                         "search used")
    client = tracking.client(uri)
    run = tracking.latest_search_run(client, options.resume)
    if run.info.status == "FINISHED":
        raise TunerError(f"--resume {options.resume}: its latest search {run.info.run_name} already finished; "
                         "start a new one with tuner search")
    p = run.data.params
    resumed = dataclasses.replace(
        options,
        trainer=p["trainer"], model=p["model"], sampler=p["sampler"], trials=int(p["trials"]),
        max_steps=int(p["max_steps"]), seed=int(p["seed"]), search_space=p["search_space"],
        dataset=None if p.get("dataset", "builtin") == "builtin" else p["dataset"],
        reward_funcs=json.loads(p.get("reward_funcs", "null")),
        confirm_seeds=int(p.get("confirm_seeds", options.confirm_seeds)),
        confirm_top=int(p.get("confirm_top", options.confirm_top)),
        experiment=options.resume,
    )
    return resumed, run.info.run_id


def record_from_run(client, run) -> dict[str, Any]:
    from tuner.records import SUMMARY_FIELDS

    folder = tempfile.mkdtemp(prefix="tuner-resume-")
    result = json.loads(Path(client.download_artifacts(run.info.run_id, "result.json", folder)).read_text())
    spec = json.loads(json.dumps(_yaml(client.download_artifacts(run.info.run_id, "trial.yaml", folder))))
    return {"number": int(run.data.tags["tuner.trial_number"]), "params": spec["params"],
            **{k: result.get(k) for k in SUMMARY_FIELDS}, "run_id": run.info.run_id, "node_id": None,
            "max_steps": spec["max_steps"], "seed": spec["seed"]}


def _yaml(path: str):
    import yaml

    return yaml.safe_load(Path(path).read_text())


def reattach(tracker, parent_id: str, make_study) -> tuple[str, Any, list[dict[str, Any]]]:
    """(the search's run name, its Optuna study reconciled with MLflow, the records already done)."""
    import optuna

    from tuner import tracking
    from tuner.sampling import tell

    parent = tracker.client.get_run(parent_id)
    run_name = parent.data.tags["tuner.study"]
    tracker.attach(parent_id)
    tracker.flush()
    records: dict[int, dict[str, Any]] = {}
    for run in tracking.trial_runs(tracker.uri, parent_id):
        if run.data.tags.get("tuner.confirmation") == "true":
            continue  # confirmation runs again after the search
        if run.info.status == "RUNNING":
            # The driver died while writing this run: drop the half, the trial is re-run below.
            tracker.client.delete_run(run.info.run_id)
            continue
        record = record_from_run(tracker.client, run)
        records.setdefault(record["number"], record)
    study = make_study(run_name)
    states = optuna.trial.TrialState
    rerun, waiting = [], []
    for frozen in study.trials:
        if frozen.state == states.RUNNING and frozen.number in records:
            # logged, but the driver died before telling Optuna
            tell(study, optuna.Trial(study, frozen._trial_id), records[frozen.number])
        elif frozen.state == states.RUNNING or (frozen.state == states.COMPLETE and frozen.number not in records):
            # in flight when the driver died, or told but never written: run it again, same params
            if frozen.state == states.RUNNING:
                study.tell(frozen.number, state=states.FAIL)
            rerun.append(frozen.params)
        elif frozen.state == states.WAITING:
            waiting.append(frozen)
    # Optuna hands out waiting trials oldest first; re-runs go ahead of grid points not yet started,
    # so a grid cut short by --trials still covers the points it had begun.
    for frozen in waiting:
        study._storage.set_trial_state_values(frozen._trial_id, state=states.FAIL)
    for params in rerun + [frozen.params or frozen.system_attrs.get("fixed_params", {}) for frozen in waiting]:
        study.enqueue_trial(params)
    return run_name, study, sorted(records.values(), key=lambda r: r["number"])
