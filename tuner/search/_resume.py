"""Resume a search whose driver died: same parent run, completed trials kept, the rest re-run.

    tuner search --resume EXPERIMENT

The latest unfinished search of the experiment is continued with the options it was started
with. Trials with a nested MLflow run are kept and not re-run. Trials that were in flight
(RUNNING in the Optuna study with no MLflow run) are marked FAIL in the study and their params
are enqueued again, so the final count of recorded trials equals the count asked for. A trial
stopped before its params were drawn never ran: it is marked FAIL and not enqueued.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import TunerError
from tuner.records import TrialRecord
from tuner.search import _sampling as sampling
from tuner.stores.tags import STUDY_STORAGE_TAG, WARM_BUDGET_TAG, WARM_FALLBACK_TAG, WARM_START_TAG

if TYPE_CHECKING:
    import optuna

    from tuner.config.options import SearchOptions
    from tuner.stores.run_writer import SearchTracker

__all__ = ["resume_options", "reattach"]


def resume_options(options: SearchOptions) -> tuple[SearchOptions, str]:
    """The options the unfinished search was started with (resources from ``options``), and its run id."""
    from tuner.stores import mlflow_store, run_reader

    assert options.resume is not None  # --resume EXPERIMENT: the one case prepare_resume, the caller, is for
    store = Path(options.store)
    uri = options.tracking_uri or mlflow_store.default_tracking_uri(store)
    if not options.tracking_uri and not (store / "mlflow.db").exists():
        raise TunerError(f"--resume {options.resume}: no MLflow store at {store}/mlflow.db; pass the --store the "
                         "search used")
    client = mlflow_store.client(uri)
    run = run_reader.latest_search_run(client, options.resume)
    if run.info.status == "FINISHED":
        raise TunerError(f"--resume {options.resume}: its latest search {run.info.run_name} already finished; "
                         "start a new one with tuner search")
    p = run.data.params
    from_config = p.get("from_config")
    from_config = None if from_config in (None, "None", "null", "") else from_config  # how a None param is logged
    space = p["search_space"]
    if from_config is not None:  # its space is derived from the file again; a --search-space narrowed it
        space = None if space in ("None", "null", "") else space
    resumed = dataclasses.replace(
        options,
        trainer=p["trainer"], model=p["model"], sampler=p["sampler"],
        trials=_trials(run.data.tags, p["trials"]),
        max_steps=int(p["max_steps"]), seed=int(p["seed"]), search_space=space, from_config=from_config,
        dataset=None if p.get("dataset", "builtin") == "builtin" else p["dataset"],
        reward_funcs=json.loads(p.get("reward_funcs", "null")),
        confirm_seeds=int(p.get("confirm_seeds", options.confirm_seeds)),
        confirm_top=int(p.get("confirm_top", options.confirm_top)),
        prune=p["prune"] == "True" if "prune" in p else options.prune,
        budget=json.loads(p.get("budget", "null")),
        # a trial's processes are what it is (one rank or a data-parallel job): kept unless given again
        processes_per_trial=options.processes_per_trial or _ranks(p.get("processes_per_trial")),
        experiment=options.resume,
        # the searches it started from, again (the study already holds their trials); none: it started cold
        warm_start=run.data.tags.get(WARM_START_TAG) or "none",
        optuna_storage=options.optuna_storage or _study_storage(options.resume, run.data.tags.get(STUDY_STORAGE_TAG),
                                                                store),
    )
    return resumed, run.info.run_id


def _study_storage(experiment: str, logged: str | None, store: Path) -> str | None:
    """Where the study of the search being resumed lives: its --optuna-storage (logged with its password hidden), or
    None for the one beside the store."""
    if not logged or logged == sampling.beside_store(store):
        return None
    if "***" in logged:
        raise TunerError(f"--resume {experiment}: its study is in {logged}; pass that --optuna-storage again, with "
                         "its password (it is not logged)")
    return logged


def _trials(tags: dict[str, str], logged: str) -> int | None:
    """The trials a resumed search runs: those it was running, or, for a warm search, as it would have run them. Its
    earlier picks had failed here (WARM_FALLBACK_TAG): the default it went back to. Its budget was cut and no pick
    has failed yet (WARM_BUDGET_TAG): None, so that the warm start's budget rule (tuner.search._warm.WarmStart.budget)
    cuts the default again from the same searches, and can still fall back if a pick fails after the resume."""
    if tags.get(WARM_FALLBACK_TAG):
        return int(tags[WARM_FALLBACK_TAG])
    if tags.get(WARM_BUDGET_TAG) and tags.get(WARM_START_TAG):
        return None
    return int(logged)


def _ranks(logged: str | None) -> int | None:
    return int(logged) if logged and logged.isdigit() and int(logged) > 1 else None


def reattach(tracker: SearchTracker, parent_id: str, make_study: Callable[[str], optuna.Study]
             ) -> tuple[str, optuna.Study, list[TrialRecord]]:
    """(the search's run name, its Optuna study reconciled with MLflow, the records already done)."""
    tracker.attach(parent_id)
    tracker.flush()
    run_name = tracker.study_name()
    records = tracker.stored_trials()
    study = make_study(run_name)
    sampling.reconcile(study, {r["number"]: r for r in records})
    return run_name, study, records
