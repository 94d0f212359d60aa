"""A search's resources around its loop: Ray, this node's trial launcher, the MLflow and Optuna stores, interrupts.

    prepare()     validate every input before anything starts (tuner.search._prepare: space, model, data, reward,
                  store, Ray)
    run_search()  the stores opened while Ray starts, the search run started (or resumed), the loop run
                  (tuner.search.loop), and everything ended however the search ends: FINISHED, FAILED, or KILLED
                  (Ctrl-C, SIGTERM) with what is kept and the command that resumes it
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from tuner.config.options import SAMPLERS, SearchOptions, options_from, prunes  # noqa: F401 - the search's API
from tuner.report.progress import Progress, SearchInterrupted, resume_command
from tuner.search import _placement as placing
from tuner.search import loop
from tuner.search._prepare import (  # noqa: F401 - prepare, prepare_resume, hardware_precisions: the search's API
    Prepared,
    halves,
    hardware_precisions,
    prepare,
    prepare_resume,
    trial_ranks,
)
from tuner.search._sampling import make_study, study_storage
from tuner.search.ledger import Ledger
from tuner.search.loop import Opened, SearchOutcome  # noqa: F401 - SearchOutcome: the search's API
from tuner.stores import interrupts
from tuner.stores.tags import PLAN_TAG

if TYPE_CHECKING:
    import optuna

    from tuner.stores.run_writer import SearchTracker
    from tuner.trial.launcher import Launcher


def run_search(prepared: Prepared, echo: Callable[[str], None] = print) -> SearchOutcome:
    """Run (or resume) the search, confirm the best candidates, recommend; logs everything to MLflow.

    Ctrl-C or SIGTERM at any moment (Ray starting, trials, confirmation, the results being written) raises
    KeyboardInterrupt within seconds, whatever became of Ray's processes meanwhile (a batch system signals them
    too): SearchInterrupted says what is kept and how to resume once the search run exists, and by then every run
    it started is ended (the search run KILLED); Ray, the trials and the launcher are stopped in any case."""
    from tuner.search import _execution as execution
    from tuner.search import _release
    from tuner.trial import launcher

    o = prepared.options
    started = time.perf_counter()
    stores: Opened | None = None
    interrupted = False
    now = _EndNow(prepared)  # what a signal the main thread cannot take in time ends (interrupts.answered)
    with interrupts.answered(now.end), concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            # The stores open while Ray starts (their tables created, on a fresh store: seconds). An interrupt
            # meanwhile waits for them (opening.result): they are never left half-made.
            prepared.start.set_env()  # before Ray and the trial launcher start: every trial inherits it
            now.opening = opening = pool.submit(_open_stores, prepared)
            if prepared.model_line:
                echo(prepared.model_line)
            for warning in prepared.warnings:
                echo(f"warning: {warning}")
            # Before Ray, whose local workers inherit its address: this node's trial launcher imports torch and TRL
            # while Ray starts (on a Ray cluster's other nodes each worker does).
            now.launcher = None if o.ray_address or not launcher.wanted() else launcher.start()
            ray = execution.init_ray(o.ray_address, o.gpus_per_trial)
            stores = opening.result()
            return _run(prepared, ray, stores, started, echo)  # it ends the search run, also when interrupted
        except KeyboardInterrupt as interrupt:
            interrupts.taken()
            interrupted = True
            if stores is not None:
                raise
            raise _interrupted_while_starting(prepared, now.opening) from interrupt
        finally:
            with interrupts.ending():  # bounded (seconds): a second signal must not leave Ray or trials running
                # The shared weight copies, also on a cluster's other nodes while Ray is up. A local Ray has no
                # other node, and after an interrupt Ray is asked nothing more: its GCS may be gone (shutdown_ray).
                interrupted = interrupted or interrupts.signalled()  # a signal held while the search ended, too
                _release.release_everywhere(prepared.model_path, other_nodes=bool(o.ray_address) and not interrupted)
                execution.shutdown_ray(interrupted)  # also on errors: no Ray process outlives the search
                if now.launcher:
                    launcher.stop(now.launcher)


class _EndNow:
    """What a search has started, for the watcher thread of interrupts.answered to end when the main thread cannot
    take a signal in time (stuck in a Ray call that waits on a GCS the same signal killed): the search run and its
    open trials' runs KILLED, Ray and the launcher killed, the same line as an interrupt the main thread took."""

    def __init__(self, prepared: Prepared):
        self.prepared = prepared
        self.opening: concurrent.futures.Future[Opened] | None = None  # the stores, once open
        self.launcher: Launcher | None = None  # this node's trial launcher

    def end(self) -> None:
        import sys

        from tuner.search import _execution as execution
        from tuner.trial import launcher

        try:
            said = _end_opened(self.prepared, self.opening, timeout=30)
        finally:
            execution.kill_ray()
            if self.launcher:
                launcher.stop(self.launcher)
        print(f"tuner: {said}", file=sys.stderr, flush=True)  # as tuner.cli says an interrupt the main thread took


def _interrupted_while_starting(prepared: Prepared, opening: concurrent.futures.Future[Opened] | None
                                ) -> KeyboardInterrupt:
    """An interrupt before the search run was (re)started in _run: a resumed search's run (left RUNNING by a driver
    that died, maybe) is ended KILLED. What the interrupted search says."""
    with interrupts.ending():
        return _end_opened(prepared, opening)


def _end_opened(prepared: Prepared, opening: concurrent.futures.Future[Opened] | None, timeout: float | None = None
                ) -> KeyboardInterrupt:
    """The stores of an interrupted search, once open (within ``timeout``): its run, if one was started, ended
    KILLED with its open trials' runs. What the interrupted search says."""
    tracker: SearchTracker | None
    ledger = Ledger()
    tracker = None
    try:
        if opening is not None:
            opened = opening.result(timeout=timeout)
            tracker, ledger = opened.tracker, opened.ledger  # the search's own ledger, so far
    except Exception:  # noqa: BLE001 - they could not be opened: the interrupt is the news, not this
        tracker = None
    if tracker is not None:
        tracker.finish("KILLED")  # nothing to end when no search run was started
    return _interruption(prepared, tracker, ledger)


def _interruption(prepared: Prepared, tracker: SearchTracker | None, ledger: Ledger) -> KeyboardInterrupt:
    """What an interrupted search says: what is kept and the command that resumes it, or that nothing was."""
    o = prepared.options
    if tracker is None or tracker.parent_id is None:
        return KeyboardInterrupt("interrupted before the search started; nothing was kept: run the same command "
                                 "again to start it")
    return SearchInterrupted(len(ledger.trials()), prepared.n_trials, prepared.experiment,
                             resume_command(prepared.experiment, o.store, o.tracking_uri))


def _open_stores(prepared: Prepared) -> Opened:
    """(tracker, run name, study, the ledger of runs so far): the MLflow experiment and the Optuna study, before any
    run is started (a resumed search: its own run and study, reattached, and its trials so far)."""
    from tuner.search import _resume as resuming
    from tuner.stores import mlflow_store, run_writer

    o = prepared.options
    storage = study_storage(o)

    # --from's trial 0, then a warm start's picks (a grid holds them already); its earlier trials told first
    first = prepared.start.first_points(grid=prepared.grid is not None)
    told = prepared.start.priors()
    priors = [(prepared.space, told)] if told else None

    def study_named(name: str) -> optuna.Study:
        return make_study(o.sampler, o.seed, prepared.n_trials, storage, name, prepared.grid, first or None, priors)

    # Creating the SQLite tables of a fresh store is not safe from two processes at once.
    with mlflow_store.store_lock(Path(o.store)):
        tracker = run_writer.SearchTracker(prepared.tracking_uri, prepared.experiment, Path(o.store))
        if prepared.resume_run_id:
            run_name, study, records = resuming.reattach(tracker, prepared.resume_run_id, study_named)
            return Opened(tracker, run_name, study, Ledger(records))
        run_name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        return Opened(tracker, run_name, study_named(run_name), Ledger())  # before the run: no parent left RUNNING


def _run(prepared: Prepared, ray: ModuleType, opened: Opened, started: float, echo: Callable[[str], None]
         ) -> SearchOutcome:
    """The search run's life: started (a resumed one is reattached already), the search, and its end however the
    search ends: FINISHED, FAILED, or KILLED when interrupted, with the runs of its trials still open."""
    o = prepared.options
    tracker, run_name, ledger = opened.tracker, opened.run_name, opened.ledger
    status, progress = "FAILED", None
    try:
        placement = placing.for_search(o, prepared.model_path, prepared.space, ray)
        for note in placement.notes:
            echo(f"warning: {note}")
        if placement.capped:
            echo(f"share: {placement.capped}")
        placement.concurrency = max(1, min(placement.concurrency, prepared.n_trials))
        if prepared.resume_run_id:
            tracker.resume()
            echo(f"resuming {run_name}: {len(ledger.trials())} of {prepared.n_trials} trials already done")
        else:
            loop.start_run(prepared, tracker, run_name, placement.concurrency)
        tracker.set_tags({PLAN_TAG: placement.describe()})
        progress = Progress(prepared.n_trials, echo, done=ledger.trials())
        outcome = loop.run(prepared, opened, placement, progress, started)
        status = "FINISHED"
        return outcome
    except KeyboardInterrupt as interrupt:
        interrupts.taken()
        status = "KILLED"
        raise _interruption(prepared, tracker, ledger) from interrupt
    finally:
        say = progress.say if progress is not None else echo
        with interrupts.ending():  # a second signal must not leave the search run RUNNING
            if progress is not None:
                progress.clear()
            tracker.finish(status)
            still = tracker.flush()
        if still:
            say(f"warning: {still} MLflow writes are kept in {tracker.spool_path}; send them when the server is "
                f"back: tuner sync --store {o.store} --tracking-uri {prepared.tracking_uri}")
