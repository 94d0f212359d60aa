"""Running trials on Ray: the trainable each Ray worker runs, the searcher that hands out Optuna's proposals
(``OptunaSearcher``), and the driver-side callback that records every trial (MLflow + progress).
The driver is the only MLflow writer. Everything Ray is here; ``tuner.search._sampling`` is pure Optuna.

While a trial runs, its trainable reads the rows the trial appends to metrics.jsonl (on the worker's node) and
reports each new batch to Ray Tune as a *live* result, ``{LIVE: True, "first": 12, "rows": [...]}``; Ray Tune
brings it to the driver, where ``DriverCallback.on_trial_result`` streams the rows into the trial's MLflow
run and shows them. A live result is never the trial's outcome: that is the one final report (a dict with
"status"), read in ``on_trial_complete`` by the searcher and the callback.

    run_trials(name=..., storage="mlflow/ray", per_trial={"cpu": 1, "gpu": 0}, concurrency=2,
               callback=DriverCallback(tracker, progress, records), searcher=OptunaSearcher(proposer, ...),
               num_samples=12)
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from ray.tune import Callback
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher

from tuner.config import ray_auth, trainers
from tuner.errors import TunerError
from tuner.records import SUMMARY_FIELDS, Status, TrialJob, TrialRecord, TrialResult, new_record
from tuner.report.progress import Progress
from tuner.search.ledger import FINISHED, Ledger
from tuner.stores import interrupts
from tuner.trial import TrialSpec
from tuner.verdicts.learning import MIN_STEPS

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    from tuner.stores.run_writer import SearchTracker

# The metric Ray Tune reads from every trial's result: the recommendation's objective (tuner.verdicts.recommend).
SEARCH_METRIC = "learning_speed"
# Marks a live result: rows of a trial still running, never its outcome.
LIVE = "tuner_live"
# What successive halving compares trials by at the same step: the objective without its gate
# (tuner.verdicts.recommend.speed_so_far), in live results and final ones alike.
SO_FAR = "learning_speed_so_far"


def is_live(result: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return bool(result and result.get(LIVE))


def _trainable(config: dict[str, Any]) -> None:
    """Runs inside a Ray worker: the trial itself runs in a child process of this worker."""
    import ray
    from ray import tune

    from tuner.trial import run_trial_isolated
    from tuner.trial.measure import so_far
    from tuner.verdicts.learning import preload
    from tuner.verdicts.recommend import objective, speed_so_far

    spec = TrialSpec(**config["spec"])
    if config.get("skip"):  # the memory plan refused it: recorded with its reason, never run
        skipped = TrialResult(status=Status.TOO_BIG, reason=config["skip"]).summary()
        tune.report({**skipped, SEARCH_METRIC: 0.0, SO_FAR: 0.0, "step": 0, "history": [], "number": config["number"],
                     "node_id": ray.get_runtime_context().get_node_id()})
        return
    # The live reports' one slow import, done before the trial starts: a fresh worker (every trial of a search's
    # first round) imported it at the trial's first rows, while the trial trained on the cores beside it; on a
    # 2-core machine that round read 0.5-0.9x the tokens/s of the same config later (docs/how-a-search-works.md).
    preload()
    node = ray.get_runtime_context().get_node_id()  # in every report: a trial halving stops ends on a live one
    workdir = tempfile.mkdtemp(prefix=f"tuner-trial-{config['number']:03d}-")
    seen: list[dict[str, Any]] = []  # every row so far: the figures so far that successive halving judges
    rungs = set(halving_rungs(spec.max_steps))

    def live(rows: list[dict[str, Any]]) -> None:
        # One report ends at each rung's step: successive halving judges every trial by its figures at that step,
        # however many steps ran before the rows were read (a fast machine) or after (the decision's way back).
        for batch in cut_at(rows, rungs):
            # SEARCH_METRIC: Ray Tune requires it in every result; 0.0 means nothing here (LIVE says so).
            first = len(seen)
            seen.extend(batch)
            figures = so_far(spec.entry, seen, spec.params, spec.warmup_steps)
            tune.report({LIVE: True, SEARCH_METRIC: 0.0, SO_FAR: speed_so_far(figures), "so_far": figures,
                         "number": config["number"], "first": first, "rows": batch,
                         "step": batch[-1].get("step"), "node_id": node})

    try:
        slow = config.get("prune_after")
        result = run_trial_isolated(spec, workdir, timeout=config["timeout"], on_rows=live,
                                    prune_after=(float(slow[0]), str(slow[1])) if slow else None)
    finally:  # all it holds is in the result now (its rows, a dead process's last output): nothing left behind
        shutil.rmtree(workdir, ignore_errors=True)
    summary = result.summary()
    # Ray Tune requires the searcher's metric in every result
    tune.report({**summary, SEARCH_METRIC: objective(summary), SO_FAR: speed_so_far(summary), "step": result.steps_run,
                 "history": result.history, "output": result.output, "node_id": node, "number": config["number"]})


def pruned_result(live: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """The outcome of a trial successive halving stopped, from its last live result (its figures so far). ``live``
    as the driver's callbacks get it, or flattened as Ray Tune hands it to the searcher ("so_far/progress")."""
    figures = dict(live.get("so_far") or {k.removeprefix("so_far/"): v for k, v in live.items()
                                          if k.startswith("so_far/")})
    step = int(live.get("step") or figures.get("steps_run") or 0)
    speed, progress = figures.get("tokens_per_second"), figures.get("progress")
    measured = (f"progress {progress:+.3f} x {speed:.0f} tokens/s" if speed and progress is not None
                else "not yet measured")
    reason = (f"{PRUNED_REASON} at step {step} of {max_steps}: its learning speed so far ({measured}) was below "
              f"the top 1/{HALVING_RATE} of the trials that reached that step (Ray Tune's ASHA)")
    return TrialResult(status=Status.PRUNED, reason=reason, stopped_at_step=step,
                       **{k: v for k, v in figures.items() if k != "steps_run"},
                       steps_run=int(figures.get("steps_run") or step)).summary()


HALVING_RATE = 3  # successive halving keeps the top 1/3 of trials at each rung
PRUNED_REASON = "stopped by successive halving"  # the reason's start: what the summary groups trials by
MIN_GRACE_STEPS = MIN_STEPS  # the first rung: no earlier than learning can be judged


# A search trial still running at twice the whole run of the best trial so far (stable and learned, same steps),
# and a minute more, cannot win on speed: it is stopped as pruned. The minute keeps the tiny model's 2-second
# trials, whose times jitter by more than 2x on a busy machine, out of it; real models' trials take minutes.
SLOW_FACTOR = 2.0
SLOW_MARGIN_S = 60.0


def slow_limit(finished: list[TrialRecord]) -> tuple[float, str] | None:
    """(seconds, reason) after which a new search trial is stopped as too slow, from the best finished trial."""
    from tuner.verdicts.recommend import recommend

    best = recommend(finished)
    whole = best.get("wall_seconds") if best is not None else None
    if best is None or not whole:
        return None
    limit = max(SLOW_FACTOR * whole, whole + SLOW_MARGIN_S)
    return limit, (f"stopped as too slow after {limit:.0f} s: trial {best['number']}, the best so far, ran its whole "
                   f"{best.get('max_steps') or ''} steps and learned in {whole:.0f} s; this one cannot win on speed")


def _grace_and_max(max_steps: int) -> tuple[int, int]:
    grace = max(MIN_GRACE_STEPS, max_steps // 4)
    return grace, max(grace, 2 * max_steps // 3)


def halving_rungs(max_steps: int) -> list[int]:
    """The steps at which ``Halving`` judges a trial of ``max_steps``: its first rung, then every
    ``HALVING_RATE`` times later up to two thirds of the budget (the milestones of Ray Tune's ASHA bracket)."""
    grace, max_t = _grace_and_max(max_steps)
    count = int(math.log(max_t / grace) / math.log(HALVING_RATE) + 1)
    return [grace * HALVING_RATE ** k for k in range(count)]


def cut_at(rows: list[dict[str, Any]], steps: set[int]) -> list[list[dict[str, Any]]]:
    """``rows`` in order, in batches that each end at one of ``steps`` (or at the last row)."""
    batches: list[list[dict[str, Any]]] = [[]]
    for row in rows:
        batches[-1].append(row)
        if row.get("step") in steps:
            batches.append([])
    return [batch for batch in batches if batch]


def _outside(trial: Trial) -> bool:
    """A run successive halving neither stops nor counts: a confirmation, longer or speed re-run (the config of a
    trial of the search again, on another seed, for longer, or beside another), or a trial never run (``skip``)."""
    extra = trial.config.get("extra", {})
    return bool({"confirms", "extends", "remeasures"} & set(extra)) or bool(trial.config.get("skip"))


class Halving(ASHAScheduler):
    """Ray Tune's asynchronous successive halving (ASHA) on the search's trials, beside the guard: at step
    ``grace`` (a quarter of the budget, at least the steps the learning judgement needs) and every ``HALVING_RATE``
    times later while at least a third of the budget is left, a trial whose learning speed so far (``SO_FAR``)
    is below the top third of the trials that reached that step is stopped: ``pruned``. Trials past the last
    rung run to the end. Re-runs of a trial's config (``_outside``) are neither stopped nor counted; a kept trial
    (a warm search's earlier recommendation, ``--from``'s trial 0 and its single changes) counts at the rung and is
    never stopped.

    A trial's rows reach the driver in batches cut at every rung's step (``halving_rungs``, ``cut_at``): each trial
    is judged by its figures at the rung itself, never by later ones, and one that ran on (even to its end)
    before the decision came back is pruned at the rung all the same: a verdict that does not depend on the
    machine's speed or the rows' latency."""

    def __init__(self, max_steps: int) -> None:
        self.grace, max_t = _grace_and_max(max_steps)
        super().__init__(time_attr="step", metric=SO_FAR, mode="max", max_t=max_t, grace_period=self.grace,
                         reduction_factor=HALVING_RATE, stop_last_trials=False)

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]) -> str:
        if _outside(trial):
            return TrialScheduler.CONTINUE
        action = super().on_trial_result(tune_controller, trial, result)
        # a kept trial's figures at a rung are a trial's like any other: they set the bar there, it is not stopped
        return TrialScheduler.CONTINUE if trial.config.get("keep") else action

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]) -> None:
        # Ray Tune's ASHA records a trial's last result in the highest rung it passed unrecorded: a trial's figures
        # at its end (20 steps), held against the others' at the rung (step 6), where learning speed so far is lower.
        # A warm search's earlier recommendation (kept, so never recorded at the rung) and confirmation re-runs set
        # the bar so for the trials after them (bench/studies/warm_start.py: 23 of the 32 warm trials that started after the
        # recommendation had ended were stopped at the rung). A trial is recorded at the rung itself or not at all.
        self._trial_info.pop(trial.trial_id, None)


class DriverCallback(Callback):
    """In the driver process: the only MLflow writer, and the progress report.

    A trial's MLflow run is created when it starts, gets its live rows while it runs, and its verdict when it
    ends, when its record goes into the search's ledger (tuner.search.ledger); the progress shows the running
    trials' latest step."""

    def __init__(self, tracker: SearchTracker, progress: Progress, ledger: Ledger) -> None:
        self.tracker, self.progress, self.ledger = tracker, progress, ledger
        self.running: dict[str, dict[str, Any]] = {}  # Ray trial id -> its tracker key, run id, rows streamed

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        job: TrialJob = trial.config
        self._open(trial)
        extra = job.get("extra", {})
        self.progress.started(trial.trial_id, job["number"], job["spec"]["max_steps"],
                              seed=job["spec"]["seed"] if "confirms" in extra else None,
                              metric=trainers.adapter(job["spec"]["trainer"]).progress_metric)

    def _open(self, trial: Trial) -> dict[str, Any]:
        job: TrialJob = trial.config
        key = uuid.uuid4().hex
        run_id = self.tracker.start_trial(key, job["number"], job["spec"], tags=job.get("tags"))
        state = self.running[trial.trial_id] = {"key": key, "run_id": run_id, "streamed": 0,
                                                "started": time.perf_counter()}
        return state

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any],
                        **info: Any) -> None:
        if not is_live(result):
            return  # the final report: on_trial_complete records it
        rows, first = result.get("rows") or [], int(result.get("first", 0))
        state = self.running.get(trial.trial_id)
        # Rows go to MLflow in order and each once; after a gap (never seen) the trial's end sends the rest.
        if state is not None and first <= state["streamed"] < first + len(rows):
            self.tracker.log_steps(state["key"], rows[state["streamed"] - first:])
            state["streamed"] = first + len(rows)
        if rows:
            self.progress.live(trial.trial_id, rows[-1])

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self.progress.tick()  # the periodic status line, also while no trial reports

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        result = dict(trial.last_result or {})
        if is_live(result):  # stopped between its live reports: successive halving pruned it
            result = {**pruned_result(result, trial.config["spec"]["max_steps"]), "node_id": result.get("node_id")}
            state = self.running.get(trial.trial_id)
            if state is not None:  # its process reported no wall time: the driver's view, start to stop
                result["wall_seconds"] = time.perf_counter() - state["started"]
        self._record(trial, result)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._record(trial, TrialResult.crashed("Ray lost the trial's worker (node or worker died)").summary())

    def _record(self, trial: Trial, result: dict[str, Any]) -> None:
        job: TrialJob = trial.config
        spec = job["spec"]
        if "status" not in result:
            result.update(TrialResult.crashed("the trial reported no result").summary())
        history = result.pop("history", []) or []
        output = result.pop("output", "") or ""
        record = new_record(result, number=job["number"], params=spec["params"], max_steps=spec["max_steps"],
                            seed=spec["seed"], run_id=None, node_id=result.get("node_id"), **job.get("extra", {}))
        state = self.running.pop(trial.trial_id, None) or self._open(trial)
        self.running.pop(trial.trial_id, None)
        self.tracker.finish_trial(state["key"], spec, {k: record.get(k) for k in SUMMARY_FIELDS}, history,
                                  streamed=state["streamed"], output=output)
        record["run_id"] = state["run_id"] or self.tracker.run_id_of(state["key"])
        self.ledger.add(record)
        self.progress.finished(record, trial.trial_id)


class Runs(Protocol):
    """What Ray Tune's searcher hands on: tuner.search.loop.Search."""

    @property
    def max_steps(self) -> int: ...  # a search trial's steps

    def suggest(self, trial_id: str) -> TrialJob | str | None: ...

    def told(self, trial_id: str, result: dict[str, Any]) -> None: ...


class OptunaSearcher(Searcher):
    """Ray Tune's searcher for a search (tuner.search.loop.Search): Ray asks it for the next trial's config (a
    TrialJob, FINISHED, or None: nothing now) and tells it how each trial ended, as an outcome summary; a trial
    successive halving stopped (its last result a live one) is pruned, and one Ray lost (no result) crashed."""

    def __init__(self, search: Runs) -> None:
        super().__init__(metric=SEARCH_METRIC, mode="max")
        self.search = search

    def suggest(self, trial_id: str) -> TrialJob | dict[str, Any] | str | None:
        job = self.search.suggest(trial_id)
        return Searcher.FINISHED if job == FINISHED else job

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if not error and is_live(result):
            result = pruned_result(result, self.search.max_steps)
        if error or not result or "status" not in result:
            result = TrialResult.crashed("Ray lost the trial's worker").summary()
        self.search.told(trial_id, result)


_reaper = None  # the tuner.stores.reaper of the local Ray this process started, if any


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children()}


def _minimal_agents() -> None:
    """A search's own Ray serves no dashboard, metrics or jobs: its agents start minimal, as without ray[default]
    (which tuner installs for tuner submit's job server), ~3 s sooner on a 2-core machine. Ray chooses minimal agents
    where its dashboard dependencies fail to import (ray._private.services); told so for this process's Ray."""
    from ray._private import utils

    if hasattr(utils, "get_dashboard_dependency_error"):
        utils.get_dashboard_dependency_error = lambda: "a search's own Ray: minimal agents"


def init_ray(ray_address: str | None, gpus_per_trial: float | None) -> ModuleType:
    """Start Ray locally (or join ``ray_address``); end it with shutdown_ray(), also on errors."""
    global _reaper
    import ray
    from ray._private import ray_constants

    from tuner.stores import reaper

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # the driver logs to MLflow itself
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ctrl-C is KeyboardInterrupt, as SIGTERM is (tuner.cli): Tune's own handler would end the run quietly and
    # the search would be recorded as finished with trials missing, instead of interrupted and resumable.
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    # ray.shutdown() sends the driver's last task events to the GCS and waits up to 5 s for them; after a signal to
    # the whole job (or a Ray that died) there is no GCS, and the wait is pure delay (then again in Ray's atexit).
    os.environ.setdefault("RAY_task_events_shutdown_flush_timeout_ms", "500")
    # The driver's core worker, created in the middle of ray.init, installs Ray's C++ failure-signal handler, which
    # takes SIGTERM too: a SIGTERM before this process's own handler is back (below) printed a stack and aborted the
    # driver (SIGABRT), leaving Ray's processes behind. Off in this process (RAY_DISABLE_FAILURE_SIGNAL_HANDLER, as
    # read when ray was imported; Ray's other processes keep theirs): SIGTERM stays Python's throughout.
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    if ray_address:
        kwargs["address"] = ray_address
        ray_auth.use_token_if_any()  # a cluster with Ray's token authentication: its token, where Ray keeps it
    else:
        # "local": a Ray of this search's own. Without an address Ray joins the cluster that `ray start` last
        # recorded on this machine (/tmp/ray/ray_current_cluster) or that RAY_ADDRESS names, and then refuses
        # num_cpus (ValueError): a search beside anyone's `ray start` failed with a traceback.
        kwargs["address"] = "local"
        kwargs["num_cpus"] = os.cpu_count()
        _minimal_agents()
    # Before ray.init: what it starts is killed however the driver ends, even in the middle of ray.init (Ray ends
    # the driver itself when a raylet a signal killed fails its registration).
    _reaper = reaper.start(os.getpid(), known=sorted(_children()))
    on_sigterm = signal.getsignal(signal.SIGTERM)
    said = {"text": ""}  # what Ray's C++ client wrote on stderr while joining a cluster (ray_address only)
    try:
        try:
            with _sessions_of_their_own(), _port_waits_in_slices(), _fd2_kept(said, bool(ray_address)):
                ray.init(**kwargs)
        finally:
            if on_sigterm is not None and threading.current_thread() is threading.main_thread():
                # ray.init installs a SIGTERM handler that ends the process (sys.exit(15)): no cleanup, no
                # ray.shutdown. Keep this process's own (tuner's CLI: KeyboardInterrupt, the search interrupted).
                signal.signal(signal.SIGTERM, on_sigterm)
    except SystemExit as e:
        # Ray's handler ran: a SIGTERM while Ray started (the search ended with exit code 15, saying nothing). It is
        # an interrupt like any other.
        if on_sigterm is None or e.code != signal.SIGTERM:
            raise
        raise KeyboardInterrupt from None
    except ray.exceptions.AuthenticationError as e:  # a cluster with token authentication: no token, or not its
        raise ray_auth.auth_error(f"--ray-address {ray_address}", sent=ray_auth.is_refusal(e)) from None
    except (ConnectionError, RuntimeError) as e:
        if interrupts.signalled():  # Ray failed to start because the signal also ended its processes
            raise KeyboardInterrupt from None
        if "InvalidAuthToken" in said["text"] or "Unauthenticated" in said["text"]:
            # the GCS refused the driver (Ray's C++ client says so on stderr, then ray.init gives up connecting)
            raise ray_auth.auth_error(f"--ray-address {ray_address}", sent=ray_auth.token_source() is not None) from None
        sys.stderr.write(said["text"])
        raise TunerError(f"--ray-address {ray_address}: cannot join the Ray cluster ({e})") from None
    if gpus_per_trial and ray.cluster_resources().get("GPU", 0) < gpus_per_trial:
        gpus = ray.cluster_resources().get("GPU", 0)
        shutdown_ray()
        raise TunerError(f"--gpus-per-trial {gpus_per_trial}: the Ray cluster has "
                         f"{gpus:.0f} GPUs; drop the flag or add GPU nodes")
    return ray


@contextlib.contextmanager
def _fd2_kept(said: dict[str, str], keep: bool) -> Iterator[None]:
    """While joining a cluster, Ray's C++ client writes a line a second to stderr (file descriptor 2, past Python)
    as long as the cluster refuses it ("InvalidAuthToken" from a cluster with token authentication): kept aside in
    ``said["text"]`` so the refusal can be one line; written out as it was when the join succeeds."""
    if not keep:
        yield
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            said["text"] = kept.read().decode(errors="replace")
            if ok:
                sys.stderr.write(said["text"])


@contextlib.contextmanager
def _sessions_of_their_own() -> Iterator[None]:
    """While ray.init runs, the processes it starts (GCS, raylet, monitors; the raylet's agents and workers follow
    the raylet) get sessions of their own: a signal to the driver's process group (``kill -TERM -PGID``,
    ``timeout``, Ctrl-C on a terminal) reaches the driver only, and the driver stops them itself, after asking
    them nothing more (shutdown_ray). Ray dying at the same moment as the driver is what made the driver wait for
    a GCS that was gone; inside ray.init, where Ray waits on its processes in C++ that no signal handler cuts
    short, it is not survivable at all (a raylet dying while the driver registers with it: Ray ends the driver,
    exit code 1). Slurm, systemd and container runtimes signal by cgroup, sessions aside: for them shutdown_ray
    and tuner.stores.interrupts.answered are what keeps the driver from waiting. Ray ties the processes to the driver
    (PR_SET_PDEATHSIG) and tuner's reaper kills what is left, so they still die with the driver. (Ray's own
    subprocess class, swapped in ray._private.services for the call; left as it is where Ray cannot tie its
    processes to the driver and its own reaper kills them by process group.)"""
    from ray._private import services, utils

    # Ray's class or None, subclassed below: declared Any, as mypy takes a variable as a base class only then
    popen: Any = getattr(services, "ConsolePopen", None)
    if popen is None or not utils.detect_fate_sharing_support():
        yield
        return

    class InItsOwnSession(popen):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = InItsOwnSession
    try:
        yield
    finally:
        services.ConsolePopen = popen


PORT_WAIT_SLICE_MS = 200  # how long a signal can wait while ray.init waits for the GCS's port


@contextlib.contextmanager
def _port_waits_in_slices() -> Iterator[None]:
    """While ray.init starts a local GCS, it waits for the GCS to write its port (up to 30 s) in one C++ call that
    holds the GIL: a signal's Python handler cannot run meanwhile, and a signal to the whole job kills that GCS,
    so the interrupt waited the full 30 s. Here the same wait is made in slices of PORT_WAIT_SLICE_MS, and a signal
    is acted on between two. (Ray's own function, swapped in ray._private.node for the call; left as it is when a
    Ray version has no such function.)"""
    from ray._private import node

    wait = getattr(node, "wait_for_persisted_port", None)
    if wait is None:
        yield
        return

    def sliced(directory: str, node_id: str, port_name: str, timeout_ms: int = 30_000, poll_interval_ms: int = 100
               ) -> int:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                return wait(directory, node_id, port_name, timeout_ms=min(left_ms, PORT_WAIT_SLICE_MS),
                            poll_interval_ms=poll_interval_ms)
            except RuntimeError as e:  # "Timed out waiting for file ...": another slice, until the deadline
                if "Timed out" not in str(e) or time.monotonic() >= deadline:
                    raise

    node.wait_for_persisted_port = sliced
    try:
        yield
    finally:
        node.wait_for_persisted_port = wait


def shutdown_ray(interrupted: bool = False) -> None:
    """ray.shutdown(), then the reaper kills whatever of the local Ray outlived it (nothing, normally).

    ``interrupted`` (Ctrl-C, SIGTERM): the reaper kills the local Ray first, then ray.shutdown() only lets go of it
    (this process can start Ray again). A batch system signals every process of a job at once (Slurm's scancel,
    systemd, a container stop), so Ray's GCS and raylet may be dying with this process: anything that asks them
    waits for an answer that never comes (a dead GCS: 60 s, then Ray ends the process with exit code 1), even
    ray.shutdown()'s graceful stop (a second per process that does not exit). Killed first, none is waited for.
    The teardown of Ray's core worker when the process exits can still crash against the GCS that is gone
    (SIGSEGV): tuner's CLI ends such a search without it (interrupts.exit_now). A main thread already inside such
    a call when the signal came is answered by tuner.stores.interrupts.answered. Ray's processes in sessions of their own
    (_sessions_of_their_own) are spared a signal to the driver's process group only."""
    import ray

    try:
        if interrupted:
            kill_ray()
        ray.shutdown()
    finally:
        kill_ray()


def kill_ray() -> None:
    """The reaper kills what is left of the local Ray now, without ray.shutdown(): nothing is asked of Ray, and
    this may run in another thread than one stuck in a Ray call (tuner.stores.interrupts.answered)."""
    global _reaper
    from tuner.stores import reaper

    process, _reaper = _reaper, None
    if process is not None:
        reaper.stop(process)


def run_trials(*, name: str, storage: str | os.PathLike, per_trial: dict[str, float], concurrency: int,
               callback: Callback, searcher: Searcher, num_samples: int, scheduler: TrialScheduler | None = None) -> None:
    """One Ray Tune run of up to ``num_samples`` trials proposed by ``searcher`` (``scheduler``: e.g. Halving)."""
    from ray import tune

    tune.Tuner(
        tune.with_resources(_trainable, per_trial),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=num_samples,
                                    max_concurrent_trials=concurrency, reuse_actors=True),
        run_config=tune.RunConfig(
            name=name, storage_path=str(Path(storage).resolve()), verbose=0, callbacks=[callback],
            # A trial's own crash is handled inside it; this only covers a lost worker or node.
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    ).fit()
