"""A search: Optuna proposes, Ray Tune runs trials in parallel, the driver logs and recommends.

    prepare()  validate every input before anything starts (tuner.search._prepare: space, model, data, reward,
               store, Ray)
    run_search()  Ray Tune trials <- OptunaSearcher (ask/tell) ; driver callback -> MLflow + progress

Unstable trials are told to Optuna as COMPLETE with a violated constraint (not FAIL): TPE then
counts them as bad outcomes and steers away from their region instead of ignoring them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from tuner.config.options import DEFAULT_TRIALS, SAMPLERS, SearchOptions, check_options, options_from, prunes  # noqa: F401 - re-exported
from tuner.records import SearchSummary, TrialJob, TrialRecord
from tuner.report import export
from tuner.report.progress import Progress, SearchInterrupted, results_table, resume_command
from tuner.report.summary import describe_candidates
from tuner.search import _neighbours
from tuner.search._prepare import (  # noqa: F401 - prepare, prepare_resume, halves: the search's API
    Prepared,
    halves,
    hardware_precisions,
    model_label,
    prepare,
    prepare_resume,
    trial_ranks,
)
from tuner.search._sampling import Proposer, beside_store, make_study, shown_url
from tuner.search._warm_fallback import WarmFallback, confirm_first, warm_news
from tuner.stores import interrupts
from tuner.stores.tags import (
    COUNT_TAG_PREFIX,
    PLAN_TAG,
    RECOMMENDED_RUN_ID_TAG,
    RECOMMENDED_TRIAL_TAG,
    STOPPED_BECAUSE_TAG,
    STUDY_STORAGE_TAG,
    STUDY_TAG,
)
from tuner.trial import TrialSpec
from tuner.verdicts import recommend as rec

if TYPE_CHECKING:
    import optuna

    from tuner.search._placement import Placement
    from tuner.stores.run_writer import SearchTracker
    from tuner.trial.launcher import Launcher


@dataclass
class SearchOutcome:
    experiment: str
    parent_run_id: str
    records: list[TrialRecord]
    recommended: TrialRecord | None
    trl_config: dict[str, Any] | None
    wall_seconds: float
    candidates: list[dict[str, Any]] = field(default_factory=list)  # confirmation verdicts
    search: SearchSummary = field(default_factory=lambda: SearchSummary())  # what search.json holds: `tuner export` renders from it
    stopped_because: str | None = None  # a failure no config avoids stopped the search early (tuner.verdicts.diagnose)


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
    stores: _Stores | None = None
    interrupted = False
    now = _EndNow(prepared)  # what a signal the main thread cannot take in time ends (interrupts.answered)
    with interrupts.answered(now.end), concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            # The stores open while Ray starts (their tables created, on a fresh store: seconds). An interrupt
            # meanwhile waits for them (opening.result): they are never left half-made.
            if prepared.source is not None:
                prepared.source.set_env()  # before Ray and the trial launcher start: every trial inherits it
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
            return _run(prepared, ray, *stores, started, echo)  # it ends the search run, also when interrupted
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
        self.opening: concurrent.futures.Future[_Stores] | None = None  # the stores, once open
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


def _interrupted_while_starting(prepared: Prepared, opening: concurrent.futures.Future[_Stores] | None
                                ) -> KeyboardInterrupt:
    """An interrupt before the search run was (re)started in _run: a resumed search's run (left RUNNING by a driver
    that died, maybe) is ended KILLED. What the interrupted search says."""
    with interrupts.ending():
        return _end_opened(prepared, opening)


def _end_opened(prepared: Prepared, opening: concurrent.futures.Future[_Stores] | None, timeout: float | None = None
                ) -> KeyboardInterrupt:
    """The stores of an interrupted search, once open (within ``timeout``): its run, if one was started, ended
    KILLED with its open trials' runs. What the interrupted search says."""
    tracker: SearchTracker | None
    records: list[TrialRecord]
    tracker, records = None, []
    try:
        if opening is not None:
            tracker, _, _, records = opening.result(timeout=timeout)  # records: the search's own list, so far
    except Exception:  # noqa: BLE001 - they could not be opened: the interrupt is the news, not this
        tracker = None
    if tracker is not None:
        tracker.finish("KILLED")  # nothing to end when no search run was started
    return _interruption(prepared, tracker, records)


def _interruption(prepared: Prepared, tracker: SearchTracker | None, records: list[TrialRecord]) -> KeyboardInterrupt:
    """What an interrupted search says: what is kept and the command that resumes it, or that nothing was."""
    o = prepared.options
    if tracker is None or tracker.parent_id is None:
        return KeyboardInterrupt("interrupted before the search started; nothing was kept: run the same command "
                                 "again to start it")
    return SearchInterrupted(len(records), prepared.n_trials, prepared.experiment,
                             resume_command(prepared.experiment, o.store, o.tracking_uri))


# A search's stores, opened: its run's tracker, the run's name, the Optuna study, and the trial records so far.
_Stores = tuple["SearchTracker", str, Any, list[TrialRecord]]


def _open_stores(prepared: Prepared) -> _Stores:
    """(tracker, run name, study, records so far): the MLflow experiment and the Optuna study, before any run is
    started (a resumed search: its own run and study, reattached)."""
    from tuner.search import _resume as resuming
    from tuner.stores import mlflow_store, run_writer

    o = prepared.options
    storage = _study_storage(o)

    warm = prepared.warm
    # a warm start's picks run next (a grid holds them already), its earlier trials told first (tuner.search._warm)
    first = [*([prepared.first] if prepared.first else []), *(warm.picks if warm and prepared.grid is None else [])]
    told = warm.to_tell() if warm else []
    priors = [(prepared.space, told)] if told else None

    def study_named(name: str) -> optuna.Study:
        return make_study(o.sampler, o.seed, prepared.n_trials, storage, name, prepared.grid, first or None, priors)

    # Creating the SQLite tables of a fresh store is not safe from two processes at once.
    with mlflow_store.store_lock(Path(o.store)):
        tracker = run_writer.SearchTracker(prepared.tracking_uri, prepared.experiment, Path(o.store))
        if prepared.resume_run_id:
            return (tracker, *resuming.reattach(tracker, prepared.resume_run_id, study_named))
        run_name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        return tracker, run_name, study_named(run_name), []  # before the run: no parent left RUNNING if it fails


def _place(prepared: Prepared, ray: ModuleType) -> Placement:
    """The memory plan for this search on this cluster (tuner.search._placement)."""
    from tuner.search import _placement as placement

    o = prepared.options
    cluster = placement.Cluster.of_ray(ray)
    ranks, gpus = trial_ranks(o), o.gpus_per_trial
    if gpus is None and cluster.gpus > 0 and ranks > 1:
        gpus = ranks  # --processes-per-trial N on GPUs: a process per GPU
    on_gpu = cluster.gpus > 0 if gpus is None else gpus > 0
    placed = placement.place(o.entry, prepared.model_path, prepared.space, cluster, cpus_per_trial=o.cpus_per_trial,
                             gpus_per_trial=gpus, concurrency=o.concurrency, processes_per_trial=1 if on_gpu else ranks)
    placed.concurrency, placed.capped = placement.share_cap(placed, cluster, cluster_share=o.cluster_share,
                                                            max_gpus=o.max_gpus)
    return placed


def _run(prepared: Prepared, ray: ModuleType, tracker: SearchTracker, run_name: str, study: optuna.Study,
         records: list[TrialRecord], started: float, echo: Callable[[str], None]) -> SearchOutcome:
    """The search run's life: started (a resumed one is reattached already), the search, and its end however the
    search ends: FINISHED, FAILED, or KILLED when interrupted, with the runs of its trials still open."""
    o = prepared.options
    status, progress = "FAILED", None
    try:
        placement = _place(prepared, ray)
        for note in placement.notes:
            echo(f"warning: {note}")
        if placement.capped:
            echo(f"share: {placement.capped}")
        placement.concurrency = max(1, min(placement.concurrency, prepared.n_trials))
        if prepared.resume_run_id:
            tracker.resume()
            echo(f"resuming {run_name}: {len(records)} of {prepared.n_trials} trials already done")
        else:
            _start_run(prepared, tracker, run_name, placement.concurrency)
        tracker.set_tags({PLAN_TAG: placement.describe()})
        progress = Progress(prepared.n_trials, echo, done=records)
        outcome = _search(prepared, tracker, study, run_name, records, placement, progress, started)
        status = "FINISHED"
        return outcome
    except KeyboardInterrupt as interrupt:
        interrupts.taken()
        status = "KILLED"
        raise _interruption(prepared, tracker, records) from interrupt
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


def _start_run(prepared: Prepared, tracker: SearchTracker, run_name: str, concurrency: int) -> None:
    from tuner.stores import mlflow_store

    o = prepared.options
    with mlflow_store.store_lock(Path(o.store)):
        tracker.start(run_name, {
            "trainer": o.trainer, "model": o.model, "sampler": o.sampler, "trials": prepared.n_trials,
            "max_steps": o.max_steps, "seed": o.seed,
            "search_space": o.search_space if prepared.source is not None else prepared.space.source,
            "dataset": o.dataset or "builtin", "reward_funcs": o.reward_funcs, "concurrency": concurrency,
            "confirm_seeds": o.confirm_seeds, "confirm_top": o.confirm_top, "prune": prunes(o), "halving": halves(o),
            "budget": o.budget, "from_config": o.from_config, "processes_per_trial": trial_ranks(o),
        }, {STUDY_TAG: run_name, STUDY_STORAGE_TAG: shown_url(_study_storage(o) or ""),
            **(prepared.here.tags() if prepared.here else {}), **(prepared.warm.tags() if prepared.warm else {})})
    if prepared.source is not None:
        from tuner.config import trl_config

        # what the search started from, beside what it searched: their file as written, and the space around it
        tracker.log_artifact_text(prepared.source.text, "source_config.yaml")
        tracker.log_artifact_text(trl_config.space_yaml(prepared.space), "space.yaml")


def _search(prepared: Prepared, tracker: SearchTracker, study: optuna.Study, run_name: str, records: list[TrialRecord],
            placement: Placement, progress: Progress, started: float) -> SearchOutcome:
    """The trials and their confirmation in one Ray Tune run, then the results written."""
    from tuner.search import _confirm as confirm
    from tuner.search import _execution as execution
    from tuner.search import _extend as extend
    from tuner.search import _remeasure as remeasure
    from tuner.search._anchor import Anchor

    o = prepared.options
    assert o.trainer is not None  # prepare resolved it (the space's trainer)
    space = prepared.space
    if placement.sharding and not space.values_of("sharding"):
        space.fixed["sharding"] = placement.sharding  # the plan sharded every trial: each trial's params say so
    base_spec = TrialSpec(trainer=o.trainer, params={}, model=prepared.model_path, dataset=o.dataset,
                          reward_funcs=o.reward_funcs, max_steps=o.max_steps, seed=o.seed,
                          ranks=placement.ranks).to_dict()
    ray_storage = Path(o.store) / "ray"
    echo = progress.say  # a line of its own clears the live status line from a terminal first
    remaining = prepared.n_trials - len(records)
    echo(f"search {run_name}: {remaining} trials of {o.max_steps} steps, {o.trainer} on {o.model}, "
         f"{o.sampler} sampler, {placement.describe()} (experiment {prepared.experiment!r})")
    warm = prepared.warm
    if warm:  # what earlier searches it starts from (tuner.search._warm)
        echo(warm.line)
        for note in warm.notes:
            echo(f"warm start: {note}")
    if prepared.source is not None:
        from tuner.config import trl_config

        echo(f"from {prepared.source.path}: trial 0 runs it as written, on:")
        for line in prepared.origins:
            echo(f"  {line}")
        echo("the space around it:")
        for line in trl_config.space_yaml(prepared.space).splitlines():
            echo(f"  {line}")
        for note in prepared.source.notes:
            echo(f"note: {note}")
    confirmations: list[TrialRecord] = []
    extensions: list[TrialRecord] = []  # longer re-runs of the best stable trials, when none learned
    remeasures: list[TrialRecord] = []  # a --from search's speed re-runs, side by side with trial 0

    # a warm search confirms its earlier recommendation, then a trial that beats it here, ahead of its other trials
    schedule = confirm.Schedule(base_spec, o.confirm_seeds, o.confirm_top, o.trial_timeout, announce=echo,
                                ahead=2 if warm and warm.picks else 1)
    budget = extend.default_budget(prepared.n_trials, o.max_steps) if o.budget is None else o.budget
    longer = extend.Extension(base_spec, budget, o.trial_timeout, announce=echo)
    speed = remeasure.Remeasure(base_spec, o.trial_timeout, wanted=prepared.first is not None, announce=echo)
    # a GRPO best at risk of losing its reward spread with beta 0: its config with the KL penalty on, once
    anchor = Anchor(prepared.space, lambda why: proposer.reserve(why), base_spec, o.trial_timeout, announce=echo)

    fallback: WarmFallback | None = None

    def next_job(finished: list[TrialRecord], final: bool) -> TrialJob | str | None:
        """After the search's trials: a GRPO best's anchored twin, longer runs while none learned, then
        confirmation, then a --from search's speed re-runs; a warm search left with nothing confirmed first goes
        back to the default trials."""
        job: TrialJob | str | None = (anchor.next(confirm.with_seen_risk([*records, *extensions], confirmations))
                                      if final else None)
        if job == execution.WAIT:
            return job  # the twin runs: whether it goes first decides what is confirmed
        if job is None:
            job = longer.next(records, extensions) if final else None
        if job is None:
            job = schedule.next([*finished, *extensions], final, confirmations)
        if job is None and final and fallback is not None and not fallback.done:
            if schedule.handed - {(c["number"], c["seed"]) for c in confirmations}:
                return execution.WAIT  # its confirmations still run: whether anything is confirmed is not known
            runs = [*finished, *extensions]
            best = (confirm.judge(confirm.candidates(runs, o.confirm_top, confirmations), confirmations)[0]
                    if o.confirm_seeds > 0
                    else rec.recommend(runs))
            if best is None:
                fallback.now("nothing it ran here was confirmed")
                return execution.WAIT  # the searcher hands out the trials it now has room for
        if job is None and final:
            job = speed.next(records)
        if isinstance(job, dict):
            progress.total += 1
        return job

    after_first = None
    if prepared.first is not None:
        # trial 0 done: its single changes next, in the order its verdict calls for
        def after_first(record: TrialRecord) -> list[dict[str, Any]]:
            assert prepared.first is not None  # as tested above: this function exists only then
            return _neighbours.neighbours(prepared.space, prepared.first, record)[
                :_neighbours.neighbour_count(prepared.n_trials)]
    proposer = Proposer(study, prepared.space, o.sampler, prepared.n_trials, done=records,
                        device=placement.device, fits=placement.check, after_first=after_first,
                        known=warm.measured_here() if warm and warm.speeds_reused else ())
    # a warm search's earlier recommendation: confirmed beside its own trial; demoted there, the search falls back
    ahead = confirm_first(warm, schedule, progress, confirmations, lambda: fallback)
    keep = set(range(1 + _neighbours.neighbour_count(prepared.n_trials))) if prepared.first is not None else set()
    keep |= set(warm.pick_numbers()) if warm else set()
    searcher = execution.OptunaSearcher(proposer, base_spec, o.trial_timeout, n_search=remaining,
                                        then=next_job, done=records, fits=placement.check, prune_slow=prunes(o),
                                        keep=keep, first_alone=prepared.first is not None, ahead=ahead)
    # a warm search whose earlier picks fail here, or that confirms nothing, goes back to the default trials it had
    # cut (_warm.fell_back)
    fallback = WarmFallback(warm, echo, searcher, tracker, progress, prepared.n_trials) if warm and warm.trials \
        else None
    proposer.on_told = warm_news(warm, echo, proposer, fallback)
    spare = max(0, warm.fallback_trials() - prepared.n_trials) if warm and warm.trials else 0
    at_most = remaining + spare + anchor.most_runs + longer.most_runs + schedule.most_runs + speed.most_runs  # FINISHED when it has fewer
    if at_most:
        execution.run_trials(name=f"{run_name}-{len(records)}", storage=ray_storage, per_trial=placement.resources,
                             concurrency=placement.concurrency,
                             callback=execution.DriverCallback(tracker, progress, records, confirmations, extensions,
                                                               remeasures),
                             searcher=searcher, num_samples=at_most,
                             scheduler=execution.Halving(o.max_steps) if halves(o) else None)
    records.sort(key=lambda r: r["number"])
    if searcher.stopped_because:
        echo(f"search stopped: {searcher.stopped_because}")
        tracker.set_tags({STOPPED_BECAUSE_TAG: searcher.stopped_because[:5000]})
    extensions.sort(key=lambda r: (r["max_steps"], r["number"]))
    runs = [*records, *extensions]
    cands = confirm.candidates(runs, o.confirm_top, confirmations) if o.confirm_seeds > 0 else []
    remeasures.sort(key=lambda r: (r["pair"], r["number"]))
    outcome = _finish(prepared, tracker, records, cands, confirmations, started, echo, placement, extensions,
                      remeasures)
    outcome.stopped_because = searcher.stopped_because
    return outcome


def _study_storage(o: SearchOptions) -> str | None:
    # The study lives beside the MLflow store so optuna-dashboard can open it, or where --optuna-storage says.
    if o.optuna_storage:
        return o.optuna_storage
    Path(o.store).resolve().mkdir(parents=True, exist_ok=True)
    return beside_store(o.store)


def _finish(prepared: Prepared, tracker: SearchTracker, records: list[TrialRecord], cands: list[TrialRecord],
            confirmations: list[TrialRecord], started: float, echo: Callable[[str], None], placement: Placement,
            extensions: Sequence[TrialRecord] = (), remeasures: Sequence[TrialRecord] = ()) -> SearchOutcome:
    from tuner.search import _confirm as confirm

    o = prepared.options
    assert tracker.parent_id is not None  # the search run, started (or reattached) by _run before the search
    verdicts: list[dict[str, Any]] = []
    best: TrialRecord | None
    if o.confirm_seeds > 0:
        best, verdicts = confirm.judge(cands, confirmations)
        for line in describe_candidates(verdicts):
            echo(line)
    else:
        best = rec.recommend([*records, *extensions])
    config, export_info = None, None
    use_cpu = all(r.get("device") in (None, "cpu") for r in records)
    if best is not None:
        # what the user will run: the search's choices and the user's own settings, lengths for the user's data
        config, export_info = export.build(o.entry, best["params"], prepared.model_path, space=prepared.space,
                                           dataset=o.dataset, hub_dataset=export.hub_dataset(o.dataset),
                                           reward_funcs=export.reward_funcs_of(o.entry, o.reward_funcs), on_cpu=use_cpu)
    fixed = None
    if prepared.source is not None:
        from tuner.report import fix as fixes

        # their file with the fewest changes: the search's answer, or theirs as it is when it was already healthy
        fixed = fixes.answer(prepared.source, records, best, confirmations, remeasures)
        fixed["inputs"] = list(prepared.origins)
        if fixed["healthy"] and best is None:
            best = next(r for r in records if r.get("number") == 0)
        if fixed["exportable"]:
            config = fixes.load_text(fixed["text"])
    search = SearchSummary(trainer=o.entry.name, model=o.model, model_path=prepared.model_path, use_cpu=use_cpu,
                           reward_funcs=export.reward_funcs_of(o.entry, o.reward_funcs), dataset=o.dataset, rule=rec.RULE,
                           confirm_seeds=o.confirm_seeds, recommended=best, trl_config=config, export=export_info,
                           trials=records, extensions=list(extensions), confirmations=confirmations,
                           remeasures=list(remeasures),
                           candidates=verdicts, plan=placement.summary(),
                           source=prepared.source.to_dict() if prepared.source is not None else None, fix=fixed)
    if best is not None:
        tracker.log_artifact_text(export.render_export(search, prepared.experiment, tracker.parent_id),
                                  "recommended.yaml")
        tracker.set_tags({RECOMMENDED_TRIAL_TAG: str(best["number"]),
                          RECOMMENDED_RUN_ID_TAG: best["run_id"] or ""})
    tracker.log_artifact_dict(search, "search.json")
    tracker.log_artifact_text(results_table([*records, *extensions]), "results.md")
    counts = collections.Counter(r["status"] for r in records)
    tracker.set_tags({f"{COUNT_TAG_PREFIX}{s}": str(n) for s, n in counts.items()})
    return SearchOutcome(prepared.experiment, tracker.parent_id, records, best, config, time.perf_counter() - started,
                         verdicts, search)
