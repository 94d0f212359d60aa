"""Running trials on Ray: the trainable each Ray worker runs, and the driver-side callback that
records every finished trial (MLflow + progress). The driver is the only MLflow writer."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.progress import Progress
from tuner.records import SUMMARY_FIELDS
from tuner.trial import TrialSpec

def _trainable(config: dict[str, Any]) -> None:
    """Runs inside a Ray worker: the trial itself runs in a child process of this worker."""
    import ray
    from ray import tune

    from tuner.recommend import objective
    from tuner.trial import run_trial_isolated

    spec = TrialSpec(**config["spec"])
    workdir = tempfile.mkdtemp(prefix=f"tuner-trial-{config['number']:03d}-")
    result = run_trial_isolated(spec, workdir, timeout=config["timeout"])
    node = ray.get_runtime_context().get_node_id()
    summary = result.summary()
    # learning_speed: the searcher's metric (tuner.sampling), which Ray Tune requires in every result
    tune.report({**summary, "learning_speed": objective(summary), "history": result.history, "node_id": node,
                 "number": config["number"]})


def callback_class():
    from ray.tune import Callback

    class DriverCallback(Callback):
        """In the driver process: the only MLflow writer, and the progress report."""

        def __init__(self, tracker, progress: Progress, records: list[dict[str, Any]],
                     confirmations: list[dict[str, Any]] | None = None):
            self.tracker, self.progress, self.records = tracker, progress, records
            self.confirmations = records if confirmations is None else confirmations

        def on_trial_start(self, iteration, trials, trial, **info):
            self.progress.running += 1

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._record(trial, dict(trial.last_result or {}))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._record(trial, {"status": "crashed", "reason": "Ray lost the trial's worker (node or worker died)",
                                 "stopped_at_step": 0, "history": []})

        def _record(self, trial, result: dict[str, Any]):
            job = trial.config
            spec = job["spec"]
            if "status" not in result:
                result.update(status="crashed", reason="the trial reported no result", stopped_at_step=0)
            history = result.pop("history", []) or []
            summary = {k: result.get(k) for k in SUMMARY_FIELDS}
            run_id = self.tracker.log_trial(job["number"], spec, summary, history, tags=job.get("tags"))
            record = {"number": job["number"], "params": spec["params"], **summary, "run_id": run_id,
                      "node_id": result.get("node_id"), "max_steps": spec["max_steps"], "seed": spec["seed"],
                      **job.get("extra", {})}
            (self.confirmations if "confirms" in record else self.records).append(record)
            self.progress.finished(record)

    return DriverCallback




_reaper = None  # the tuner.reaper of the local Ray this process started, if any


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children()}


def init_ray(ray_address: str | None, gpus_per_trial: float):
    """Start Ray locally (or join ``ray_address``); end it with shutdown_ray(), also on errors."""
    global _reaper
    import ray

    from tuner import reaper

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # the driver logs to MLflow itself
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ctrl-C is KeyboardInterrupt, as SIGTERM is (tuner.cli): Tune's own handler would end the run quietly and
    # the search would be recorded as finished with trials missing, instead of interrupted and resumable.
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    if ray_address:
        kwargs["address"] = ray_address
    else:
        kwargs["num_cpus"] = os.cpu_count()
    before = _children()
    on_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError) as e:
        raise TunerError(f"--ray-address {ray_address}: cannot join the Ray cluster ({e})") from None
    finally:
        if on_sigterm is not None and threading.current_thread() is threading.main_thread():
            # Ray's core worker installs a SIGTERM handler that aborts the process: no cleanup, no ray.shutdown.
            # Keep this process's own (tuner's CLI: KeyboardInterrupt, so the search ends as interrupted).
            signal.signal(signal.SIGTERM, on_sigterm)
    started = sorted(_children() - before)  # a local Ray's processes: they must not outlive this one
    if started:
        _reaper = reaper.start(started)
    if gpus_per_trial > 0 and ray.cluster_resources().get("GPU", 0) < gpus_per_trial:
        gpus = ray.cluster_resources().get("GPU", 0)
        shutdown_ray()
        raise TunerError(f"--gpus-per-trial {gpus_per_trial}: the Ray cluster has "
                         f"{gpus:.0f} GPUs; drop the flag or add GPU nodes")
    return ray


def shutdown_ray() -> None:
    """ray.shutdown(), then the reaper kills whatever of the local Ray outlived it (nothing, normally)."""
    global _reaper
    import ray

    from tuner import reaper

    try:
        ray.shutdown()
    finally:
        if _reaper is not None:
            reaper.stop(_reaper)
            _reaper = None


def run_trials(*, name: str, storage: str | os.PathLike, per_trial: dict[str, float], concurrency: int,
               callback, searcher, num_samples: int) -> None:
    """One Ray Tune run of up to ``num_samples`` trials proposed by ``searcher``."""
    from ray import tune

    tune.Tuner(
        tune.with_resources(_trainable, per_trial),
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=num_samples,
                                    max_concurrent_trials=concurrency, reuse_actors=True),
        run_config=tune.RunConfig(
            name=name, storage_path=str(Path(storage).resolve()), verbose=0, callbacks=[callback],
            # A trial's own crash is handled inside it; this only covers a lost worker or node.
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    ).fit()
