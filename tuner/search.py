"""A search: Optuna proposes, Ray Tune runs trials in parallel, the driver logs and recommends.

    prepare()  validate every input before anything starts (space, model, data, reward, store, Ray)
    run_search()  Ray Tune trials <- OptunaSearcher (ask/tell) ; driver callback -> MLflow + progress

Unstable trials are told to Optuna as COMPLETE with a violated constraint (not FAIL): TPE then
counts them as bad outcomes and steers away from their region instead of ignoring them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tuner import recommend as rec
from tuner.errors import TunerError
from tuner.space import SearchSpace, check_param_names, load_space
from tuner.trial import STABLE, TrialSpec

SAMPLERS = ("tpe", "random", "grid")


@dataclass
class SearchOptions:
    trainer: str = "grpo"
    model: str = "tiny"
    dataset: str | None = None
    reward_funcs: list[str] | None = None
    search_space: str | None = None  # None: search_spaces/<trainer>.yaml
    sampler: str = "tpe"
    trials: int | None = None  # None: 12, or every grid point for --sampler grid
    max_steps: int = 20
    seed: int = 0
    concurrency: int | None = None  # None: as many as the CPUs/GPUs allow
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    ray_address: str | None = None
    store: str = "mlflow"
    tracking_uri: str | None = None
    experiment: str | None = None  # None: "<trainer>-<model name>"
    trial_timeout: float = 1800.0
    resume: bool = False


@dataclass
class Prepared:
    options: SearchOptions
    space: SearchSpace
    model_path: str
    tracking_uri: str
    experiment: str
    n_trials: int
    grid: list[dict[str, Any]] | None
    dropped_precisions: list[str]
    warnings: list[str] = field(default_factory=list)


def _model_label(model: str) -> str:
    return Path(model.rstrip("/")).name or model


def hardware_precisions(gpus_per_trial: float) -> dict[str, str]:
    """Precisions this hardware cannot run, each with why. Dropped with one warning, never
    silently run as something else."""
    import torch

    if gpus_per_trial > 0:
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            return {p: "this GPU has no bfloat16 support" for p in ("bf16-mixed", "bf16-pure")}
        return {}
    # On a CPU, autocast + GradScaler in float16 is not a real training mode: torch's CPU
    # GradScaler exists, but fp16 mixed precision is a GPU feature users never run on a CPU.
    return {"fp16-mixed": "fp16 mixed precision (autocast + GradScaler) needs a CUDA GPU"}


def _check_ray_address(address: str) -> None:
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            pass
    except (OSError, ValueError) as e:
        raise TunerError(
            f"--ray-address {address}: no Ray cluster answers there ({e}); start one with `ray start --head` "
            "and pass the address it prints, or leave --ray-address out to run Ray locally"
        ) from None


def prepare(options: SearchOptions) -> Prepared:
    """Check everything the user gave us; raises TunerError before any run, study or trial exists."""
    from tuner import data, models, rewards, trainers, tracking

    o = options
    if o.sampler not in SAMPLERS:
        raise TunerError(f"--sampler {o.sampler}: unknown sampler; choose one of {', '.join(SAMPLERS)}")
    if o.trials is not None and o.trials < 1:
        raise TunerError(f"--trials {o.trials}: must be at least 1")
    if o.max_steps < 1:
        raise TunerError(f"--max-steps {o.max_steps}: must be at least 1")
    if o.concurrency is not None and o.concurrency < 1:
        raise TunerError(f"--concurrency {o.concurrency}: must be at least 1")
    if o.cpus_per_trial <= 0:
        raise TunerError(f"--cpus-per-trial {o.cpus_per_trial}: must be positive")
    if o.gpus_per_trial < 0:
        raise TunerError(f"--gpus-per-trial {o.gpus_per_trial}: must not be negative")
    if o.gpus_per_trial > 0 and not o.ray_address:
        import torch

        if torch.cuda.device_count() == 0:
            raise TunerError(f"--gpus-per-trial {o.gpus_per_trial}: this machine has no CUDA GPU; drop the flag "
                             "to run on the CPU, or pass --ray-address of a cluster with GPUs")
    trainers.adapter(o.trainer)
    space = load_space(o.search_space, o.trainer)
    check_param_names(space, trainers.config_fields(o.trainer))

    cannot = hardware_precisions(o.gpus_per_trial)
    dropped = [p for p in space.precisions() if p in cannot]
    warnings = [f"precision {p} dropped: {cannot[p]}" for p in dropped]
    space = space.without_precisions(dropped)

    grid = space.grid() if o.sampler == "grid" else None
    n_trials = o.trials or (len(grid) if grid is not None else 12)

    model_path = models.resolve_model(o.model)
    data.load_dataset_spec(o.dataset, o.trainer)
    if o.trainer == "grpo":
        rewards.resolve_reward_funcs(o.reward_funcs)
    elif o.reward_funcs:
        raise TunerError(f"--reward-func is for grpo only; {o.trainer} learns from its dataset's labels")

    uri = o.tracking_uri or tracking.default_tracking_uri(Path(o.store))
    tracking.check_tracking(uri, Path(o.store))
    if o.ray_address:
        _check_ray_address(o.ray_address)
    experiment = o.experiment or f"{o.trainer}-{_model_label(o.model)}"
    return Prepared(o, space, model_path, uri, experiment, n_trials, grid, dropped, warnings)


# -- Optuna inside Ray Tune -----------------------------------------------------------------------


def constraint_of(record: dict[str, Any]) -> float:
    """Optuna constraint: <= 0 feasible. Unstable trials are infeasible, and more so the earlier
    they broke, so the sampler learns a gradient toward the stable region."""
    if record.get("status") == STABLE:
        return 0.0 if rec.learned(record) else 0.5
    steps = max(int(record.get("max_steps") or 1), 1)
    stopped = record.get("stopped_at_step") or 0
    return 1.0 + (1.0 - min(stopped, steps) / steps)


def make_sampler(name: str, seed: int, n_trials: int):
    import warnings

    import optuna

    if name == "tpe":
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        # TPE reads each trial's constraint (set in tell()) and ranks infeasible trials as bad.
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=max(3, min(10, n_trials // 3)),  # random first: TPE needs some history
            multivariate=True,
            group=True,  # LoRA params exist only when LoRA is on: model them as their own group
        )
    return optuna.samplers.RandomSampler(seed=seed)  # grid points are enqueued in order


def make_study(prepared: Prepared, storage: str | None, study_name: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(prepared.options.sampler, prepared.options.seed, prepared.n_trials)
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    if prepared.grid is not None and not study.trials:
        for point in prepared.grid:
            study.enqueue_trial(point, skip_if_exists=False)
    return study


def tell(study, trial, record: dict[str, Any]) -> None:
    """Report a trial to Optuna: always COMPLETE, with its tokens/s and a constraint value."""
    for key in ("status", "reason", "progress", "tokens_per_second", "stopped_at_step"):
        trial.set_user_attr(key, record.get(key))
    trial.set_constraint("stable", constraint_of(record))
    study.tell(trial, float(record.get("tokens_per_second") or 0.0))


def _searcher_class():
    from ray.tune.search import Searcher

    class OptunaSearcher(Searcher):
        """Ray Tune searcher over an Optuna study (ask/tell), with the trial spec as Ray's config."""

        def __init__(self, study, space: SearchSpace, base_spec: dict[str, Any], timeout: float):
            super().__init__(metric="tokens_per_second", mode="max")
            self.study, self.space, self.base_spec, self.timeout = study, space, base_spec, timeout
            self.asked: dict[str, Any] = {}  # Ray trial id -> optuna.Trial

        def suggest(self, trial_id: str):
            trial = self.study.ask()
            params = self.space.suggest(trial)
            self.asked[trial_id] = trial
            spec = {**self.base_spec, "params": params}
            return {"spec": spec, "number": trial.number, "timeout": self.timeout}

        def on_trial_complete(self, trial_id: str, result=None, error: bool = False):
            trial = self.asked.pop(trial_id, None)
            if trial is None:
                return
            record = dict(result or {})
            if error or "status" not in record:
                record = {"status": "crashed", "reason": "Ray lost the trial's worker", "stopped_at_step": 0}
            record["max_steps"] = self.base_spec["max_steps"]
            tell(self.study, trial, record)

    return OptunaSearcher


def _trainable(config: dict[str, Any]) -> None:
    """Runs inside a Ray worker: the trial itself runs in a child process of this worker."""
    import ray
    from ray import tune

    from tuner.trial import run_trial_isolated

    spec = TrialSpec(**config["spec"])
    workdir = tempfile.mkdtemp(prefix=f"tuner-trial-{config['number']:03d}-")
    result = run_trial_isolated(spec, workdir, timeout=config["timeout"])
    node = ray.get_runtime_context().get_node_id()
    tune.report({**result.summary(), "history": result.history, "node_id": node, "number": config["number"]})


# -- driver-side logging and progress -----------------------------------------------------------


class _Progress:
    """Counts and the one-line-per-trial progress report."""

    def __init__(self, total: int, echo: Callable[[str], None]):
        self.total, self.echo = total, echo
        self.counts: collections.Counter = collections.Counter()
        self.running = 0
        self.best: dict[str, Any] | None = None
        self.started = time.perf_counter()

    def finished(self, record: dict[str, Any]) -> None:
        self.running = max(0, self.running - 1)
        self.counts[record["status"]] += 1
        best = rec.recommend([r for r in (self.best, record) if r])
        if best is not None:
            self.best = best
        done = sum(self.counts.values())
        speed = record.get("tokens_per_second")
        speed_text = f"{speed:8.0f} tok/s" if speed else "       - tok/s"
        progress = record.get("progress")
        progress_text = f"progress {progress:+.3f}" if progress is not None else "progress    -  "
        where = f" at step {record['stopped_at_step']}" if record["status"] not in (STABLE, "invalid") else ""
        counts = " ".join(f"{s} {self.counts[s]}" for s in ("ok", "diverged", "collapsed", "crashed", "oom", "invalid")
                          if self.counts[s] or s in ("ok", "diverged", "crashed"))
        best = f"trial {self.best['number']} ({self.best['tokens_per_second']:.0f} tok/s)" if self.best else "none yet"
        elapsed = time.perf_counter() - self.started
        self.echo(f"[{done:3d}/{self.total}] trial {record['number']:3d} {record['status']:<9}{where:<12} {speed_text}  "
                  f"{progress_text}  {describe_params(record['params'])}")
        self.echo(f"          running {self.running} | {counts} | best: {best} | {elapsed:.0f}s")


def describe_params(params: dict[str, Any]) -> str:
    short = {"learning_rate": "lr", "gradient_accumulation_steps": "ga", "per_device_train_batch_size": "bs",
             "max_grad_norm": "clip"}
    parts = [str(params.get("precision", "fp32"))]
    for key, label in short.items():
        if key in params:
            value = params[key]
            parts.append(f"{label}={value:.2g}" if isinstance(value, float) else f"{label}={value}")
    parts.append(f"lora=r{params.get('lora_r', 16)}" if params.get("use_peft") else "lora=off")
    return " ".join(parts)


def _callback_class():
    from ray.tune import Callback

    class DriverCallback(Callback):
        """In the driver process: the only MLflow writer, and the progress report."""

        def __init__(self, tracker, progress: _Progress, records: list[dict[str, Any]]):
            self.tracker, self.progress, self.records = tracker, progress, records

        def on_trial_start(self, iteration, trials, trial, **info):
            self.progress.running += 1

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._record(trial, dict(trial.last_result or {}))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._record(trial, {"status": "crashed", "reason": "Ray lost the trial's worker (node or worker died)",
                                 "stopped_at_step": 0, "history": []})

        def _record(self, trial, result: dict[str, Any]):
            spec = trial.config["spec"]
            if "status" not in result:
                result.update(status="crashed", reason="the trial reported no result", stopped_at_step=0)
            history = result.pop("history", []) or []
            summary = {k: result.get(k) for k in _SUMMARY_FIELDS}
            run_id = self.tracker.log_trial(trial.config["number"], spec, summary, history)
            record = {"number": trial.config["number"], "params": spec["params"], **summary, "run_id": run_id,
                      "node_id": result.get("node_id"), "max_steps": spec["max_steps"]}
            self.records.append(record)
            self.progress.finished(record)

    return DriverCallback


_SUMMARY_FIELDS = ("status", "reason", "stopped_at_step", "steps_run", "tokens_per_second", "samples_per_second",
                   "progress", "peak_memory_mb", "seconds_to_first_step", "wall_seconds", "guard_signal", "device")


@dataclass
class SearchOutcome:
    experiment: str
    parent_run_id: str
    records: list[dict[str, Any]]
    recommended: dict[str, Any] | None
    trl_config: dict[str, Any] | None
    wall_seconds: float


def _init_ray(prepared: Prepared):
    import ray

    o = prepared.options
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # the driver logs to MLflow itself
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    if o.ray_address:
        kwargs["address"] = o.ray_address
    else:
        kwargs["num_cpus"] = os.cpu_count()
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError) as e:
        raise TunerError(f"--ray-address {o.ray_address}: cannot join the Ray cluster ({e})") from None
    if o.gpus_per_trial > 0 and ray.cluster_resources().get("GPU", 0) < o.gpus_per_trial:
        ray.shutdown()
        raise TunerError(f"--gpus-per-trial {o.gpus_per_trial}: the Ray cluster has "
                         f"{ray.cluster_resources().get('GPU', 0):.0f} GPUs; drop the flag or add GPU nodes")
    return ray


def run_search(prepared: Prepared, echo: Callable[[str], None] = print) -> SearchOutcome:
    from ray import tune

    from tuner import tracking

    o = prepared.options
    started = time.perf_counter()
    for warning in prepared.warnings:
        echo(f"warning: {warning}")
    ray = _init_ray(prepared)
    resources = ray.cluster_resources()
    per_trial = {"cpu": o.cpus_per_trial, "gpu": o.gpus_per_trial}
    limit = int(resources.get("CPU", 1) // o.cpus_per_trial)
    if o.gpus_per_trial:
        limit = min(limit, int(resources.get("GPU", 0) // o.gpus_per_trial))
    concurrency = max(1, min(o.concurrency or limit, prepared.n_trials))

    tracker = tracking.SearchTracker(prepared.tracking_uri, prepared.experiment, Path(o.store))
    run_name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    study_storage = _study_storage(o)
    tracker.start(run_name, {
        "trainer": o.trainer, "model": o.model, "sampler": o.sampler, "trials": prepared.n_trials,
        "max_steps": o.max_steps, "seed": o.seed, "search_space": prepared.space.source,
        "dataset": o.dataset or "builtin", "concurrency": concurrency,
    }, {"tuner.study": run_name, "tuner.study_storage": study_storage or ""})
    study = make_study(prepared, study_storage, run_name)
    base_spec = TrialSpec(trainer=o.trainer, params={}, model=prepared.model_path, dataset=o.dataset,
                          reward_funcs=o.reward_funcs, max_steps=o.max_steps, seed=o.seed).to_dict()
    searcher = _searcher_class()(study, prepared.space, base_spec, o.trial_timeout)
    records: list[dict[str, Any]] = []
    progress = _Progress(prepared.n_trials, echo)
    echo(f"search {run_name}: {prepared.n_trials} trials of {o.max_steps} steps, {o.trainer} on {o.model}, "
         f"{o.sampler} sampler, {concurrency} at a time (experiment {prepared.experiment!r})")
    status = "FAILED"
    try:
        tuner = tune.Tuner(
            tune.with_resources(_trainable, per_trial),
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=prepared.n_trials,
                                        max_concurrent_trials=concurrency, reuse_actors=True),
            run_config=tune.RunConfig(
                name=run_name, storage_path=str(Path(o.store).resolve() / "ray"), verbose=0,
                callbacks=[_callback_class()(tracker, progress, records)],
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
        tuner.fit()
        records.sort(key=lambda r: r["number"])
        outcome = _finish(prepared, tracker, records, started)
        status = "FINISHED"
        return outcome
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.finish(status)
        ray.shutdown()


def _study_storage(o: SearchOptions) -> str | None:
    # The study lives beside the MLflow store so optuna-dashboard can open it.
    folder = Path(o.store).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


def _finish(prepared: Prepared, tracker, records: list[dict[str, Any]], started: float) -> SearchOutcome:
    o = prepared.options
    best = rec.recommend(records)
    config = None
    use_cpu = all(r.get("device") in (None, "cpu") for r in records)
    if best is not None:
        config = rec.trl_config(o.trainer, best["params"], prepared.model_path, use_cpu=use_cpu,
                                reward_funcs=_export_reward_funcs(o), dataset=_hub_dataset(o.dataset))
        tracker.log_artifact_text(rec.render(config, "yaml", header=f"tuner: trial {best['number']}; {rec.RULE}"),
                                  "recommended.yaml")
        tracker.set_tags({"tuner.recommended_trial": str(best["number"]),
                          "tuner.recommended_run_id": best["run_id"]})
    search = {"trainer": o.trainer, "model": o.model, "model_path": prepared.model_path, "use_cpu": use_cpu,
              "reward_funcs": _export_reward_funcs(o), "dataset": o.dataset, "rule": rec.RULE,
              "recommended": best, "trl_config": config, "trials": records}
    tracker.log_artifact_dict(search, "search.json")
    tracker.log_artifact_text(results_table(records), "results.md")
    counts = collections.Counter(r["status"] for r in records)
    tracker.set_tags({f"tuner.count.{s}": str(n) for s, n in counts.items()})
    return SearchOutcome(prepared.experiment, tracker.parent_id, records, best, config, time.perf_counter() - started)


def _export_reward_funcs(o: SearchOptions) -> list[str] | None:
    if o.trainer != "grpo":
        return None
    from tuner.rewards import reward_func_spec

    return [reward_func_spec(s) for s in (o.reward_funcs or ["builtin"])]


def _hub_dataset(dataset: str | None) -> str | None:
    return dataset if dataset and not Path(dataset).exists() else None


def results_table(records: list[dict[str, Any]]) -> str:
    """Markdown table of every trial: the parent run's results.md and the end of `tuner search`."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    rows = ["| trial | status | stopped at | tokens/s | progress | params | reason |",
            "|---:|---|---:|---:|---:|---|---|"]
    for r in records:
        stopped = r.get("stopped_at_step") if r["status"] != STABLE else ""
        rows.append(f"| {r['number']} | {r['status']} | {stopped} | {fmt(r.get('tokens_per_second'), '.0f')} | "
                    f"{fmt(r.get('progress'), '+.3f')} | {describe_params(r['params'])} | "
                    f"{(r.get('reason') or '')[:80]} |")
    return "\n".join(rows) + "\n"


def summary_text(outcome: SearchOutcome) -> str:
    lines = [f"\n{len(outcome.records)} trials in {outcome.wall_seconds:.0f}s (experiment {outcome.experiment!r}, "
             f"run {outcome.parent_run_id})", f"rule: {rec.RULE}"]
    if outcome.recommended is None:
        lines.append(rec.failure_summary(outcome.records))
    else:
        best = outcome.recommended
        lines.append(f"recommended: trial {best['number']}: {best['tokens_per_second']:.0f} tokens/s, progress "
                     f"{best['progress']:+.3f}, {describe_params(best['params'])}")
        lines.append(json.dumps(best["params"], sort_keys=True))
    lines.append("review:  tuner ui          (MLflow UI on http://127.0.0.1:5000)")
    lines.append(f"export:  tuner export --experiment {outcome.experiment} -o recommended.yaml")
    return "\n".join(lines)


def options_from(**kwargs) -> SearchOptions:
    names = {f.name for f in dataclasses.fields(SearchOptions)}
    return SearchOptions(**{k: v for k, v in kwargs.items() if k in names})
