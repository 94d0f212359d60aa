"""One tuner search, as the benchmark runs it: tuner's public API, then the histories from MLflow.

    python -m bench.headline.tuner_search --out tuner.json --trainer reward --sampler tpe --seed 0 --trials 12

The time measured is from ``prepare`` to ``run_search`` returning (Ray start and stop, every
trial, the confirmation re-runs, MLflow logging, the recommendation). Each trial's per-step history is
read back from the ``result.json`` artifact of its nested MLflow run, as a user reviewing the search would
find it, and so is the run's start and end (``run_seconds``: for a trial that successive halving stopped,
the only measure of how long its process ran, since such a trial reports no ``wall_seconds``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.headline.history import first_nonfinite_step, wasted_steps


def run_tuner_search(trainer: str, search_space: str | None, sampler: str, max_steps: int, store: str,
                     trials: int | None = None, seed: int = 0, confirm_seeds: int | None = None,
                     model: str | None = None) -> dict[str, Any]:
    """``confirm_seeds`` None keeps tuner's default (the top candidates re-run on more seeds); ``model`` None: tuner's
    default (the tiny model)."""
    from tuner.search.driver import SearchOptions, prepare, run_search
    from tuner.stores.mlflow_store import client

    lines: list[str] = []
    started = time.perf_counter()
    extra = {} if confirm_seeds is None else {"confirm_seeds": confirm_seeds}
    if model is not None:
        extra["model"] = model
    prepared = prepare(SearchOptions(trainer=trainer, search_space=search_space, sampler=sampler, trials=trials,
                                     max_steps=max_steps, seed=seed, store=store, warm_start="none", **extra))
    outcome = run_search(prepared, echo=lambda line: (lines.append(line), print(line, flush=True)))
    seconds = time.perf_counter() - started

    mlflow = client(prepared.tracking_uri)
    parent = mlflow.get_run(outcome.parent_run_id)
    records = []
    for record in outcome.records:
        history = _history(mlflow, record["run_id"])
        records.append({**record, "history": history, "first_nonfinite_step": first_nonfinite_step(history),
                        "wasted_steps": wasted_steps(history, int(record.get("steps_run") or 0)),
                        "run_seconds": _run_seconds(mlflow, record["run_id"])})
    confirmations = []
    for run in mlflow.search_runs([parent.info.experiment_id], filter_string=(
            f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`tuner.confirmation` = 'true'")):
        result = _result(mlflow, run.info.run_id)
        history = result.pop("history", [])
        confirmations.append({**result, "confirms": int(run.data.tags.get("tuner.confirms", -1)),
                              "seed": int(run.data.params.get("tuner.seed", -1)), "run_id": run.info.run_id,
                              "run_seconds": _run_seconds(mlflow, run.info.run_id),
                              "first_nonfinite_step": first_nonfinite_step(history),
                              "wasted_steps": wasted_steps(history, int(result.get("steps_run") or 0))})
    params_of = {r["number"]: r["params"] for r in records}
    for c in confirmations:
        c["params"] = params_of.get(c["confirms"])
    confirmations.sort(key=lambda c: (c["confirms"], c["seed"]))
    # the longer re-runs (tuner.search._extend: a pretrained model's 60- and 180-step rungs) and the re-measured
    # speeds (tuner.search._remeasure) are trial processes too: the slot share counts them inside
    summary = outcome.search or {}
    longer = [{**{k: r.get(k) for k in ("number", "max_steps", "status", "steps_run", "wall_seconds", "extends", "run_id")},
               "run_seconds": _run_seconds(mlflow, r.get("run_id"))}
              for key in ("extensions", "remeasures") for r in (summary.get(key) or [])]
    return {
        "side": "tuner", "trainer": trainer, "sampler": sampler, "search_space": prepared.space.source,
        "max_steps": max_steps, "seed": seed, "seconds": seconds, "search_wall_seconds": outcome.wall_seconds,
        "concurrency": int(parent.data.params.get("concurrency", 1)), "dropped_precisions": prepared.dropped_precisions,
        "records": records, "confirmations": confirmations, "extensions": longer, "recommended": outcome.recommended,
        "log": lines,
    }


def _run_seconds(mlflow, run_id: str | None) -> float | None:
    """How long the trial's MLflow run was open: from the trial's start to its verdict, as the driver saw them."""
    if not run_id:
        return None
    info = mlflow.get_run(run_id).info
    return (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else None


def _result(mlflow, run_id: str) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="bench-result-")
    try:
        return json.loads(Path(mlflow.download_artifacts(run_id, "result.json", folder)).read_text())
    except Exception:  # noqa: BLE001 - a trial stopped by successive halving may have no result.json
        return {}


def _history(mlflow, run_id: str) -> list[dict[str, Any]]:
    return _result(mlflow, run_id).get("history", [])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="write the records here (JSON)")
    parser.add_argument("--trainer", default="reward")
    parser.add_argument("--space", default=None, help="search-space YAML (default: the shipped one)")
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--confirm-seeds", type=int, default=None, help="default: tuner's own default")
    parser.add_argument("--store", default=None, help="MLflow store folder (default: a new temp dir)")
    parser.add_argument("--model", default=None, help="tuner's --model (default: tuner's, the tiny model)")
    args = parser.parse_args(argv)
    store = args.store or tempfile.mkdtemp(prefix="bench-tuner-")
    outcome = run_tuner_search(args.trainer, args.space, args.sampler, args.max_steps, store, args.trials,
                               args.seed, args.confirm_seeds, args.model)
    Path(args.out).write_text(json.dumps(outcome, indent=1))


if __name__ == "__main__":
    main()
