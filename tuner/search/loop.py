"""The search loop: what each free trial slot runs next, from one ledger of runs, until the search is done.

    search = Search(proposer, ledger, rules, phases, progress, ahead=[...])
    search.suggest(trial_id)     # a job (tuner.records.TrialJob), None (nothing now) or FINISHED
    search.told(trial_id, result)  # a search trial ended: the sampler learns its outcome
    outcome = run(prepared, opened, placement, progress, started)    # tuner.search.driver, once the stores are open

Each free slot (Ray Tune asks through tuner.search._execution.OptunaSearcher) gets, in this order:

    1. ``ahead``     phases that go before the sampler's next trial (a warm search's earlier pick, confirmed beside
                     its own trial: _warm_fallback.ConfirmFirst)
    2. the sampler   the search's own trials, proposed by Optuna (tuner.search._sampling.Proposer), ``planned`` of them
    3. ``phases``    the follow-ups, the first with something to hand out: the anchored twin (_anchor.Anchor), longer
                     rungs (_extend.Extension), confirmation (_confirm.Schedule), then its start's (tuner.search.start):
                     a warm search's fallback (_warm_fallback.WarmFallback), --from's side-by-side speed re-runs
                     (_remeasure.Remeasure)

Every phase answers the same question from the same ledger (tuner.search.ledger.Phase): a job, WAIT, or None. A new
phase is a class with ``next(ledger, final)`` and ``most_runs``, put in the list ``phases_of`` builds. The driver
(tuner.search.driver) keeps what the loop runs on: Ray, the trial launcher, the stores, interrupts.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.config.options import prunes
from tuner.records import Confirmation, SearchSummary, TrialJob, TrialRecord, new_record
from tuner.report import export
from tuner.report.summary import describe_candidates
from tuner.search._execution import slow_limit
from tuner.search._prepare import halves
from tuner.search.ledger import FINISHED, WAIT, Ledger, Phase
from tuner.stores import interrupts
from tuner.stores.tags import (
    COUNT_TAG_PREFIX,
    OPTUNA_NUMBER_TAG,
    RECOMMENDED_RUN_ID_TAG,
    RECOMMENDED_TRIAL_TAG,
    STOPPED_BECAUSE_TAG,
    STUDY_STORAGE_TAG,
    STUDY_TAG,
)
from tuner.trial import TrialSpec
from tuner.verdicts import diagnose
from tuner.verdicts import recommend as rec

if TYPE_CHECKING:
    import optuna

    from tuner.report.progress import Progress
    from tuner.search._placement import Placement
    from tuner.search._prepare import Prepared
    from tuner.search._sampling import Proposer
    from tuner.stores.run_writer import SearchTracker

__all__ = ["Opened", "Rules", "Search", "SearchOutcome", "finish", "phases_of", "run", "start_run"]


@dataclass
class SearchOutcome:
    """What a finished search found (``run_search``'s result; tuner.report.summary prints it).

    Args:
        experiment: the MLflow experiment it logged to.
        parent_run_id: its search run (the trials' runs are nested under it).
        records: its search trials, by number (rungs, confirmations and remeasures are in ``search``).
        recommended: the pick: the first candidate its confirmation runs confirmed (with its verdict under
            "confirmation"), or None.
        trl_config: the config the user runs (what recommended.yaml holds), or None.
        wall_seconds: from run_search's start to the results written.
        candidates: one confirmation verdict per candidate judged, best first.
        search: what search.json holds: every run, the plan, the export's inputs (`tuner export` renders from it).
        stopped_because: a failure no config avoids that stopped the search early (tuner.verdicts.diagnose), or None.
    """

    experiment: str
    parent_run_id: str
    records: list[TrialRecord]
    recommended: TrialRecord | None
    trl_config: dict[str, Any] | None
    wall_seconds: float
    candidates: list[Confirmation] = field(default_factory=list)
    search: SearchSummary = field(default_factory=lambda: SearchSummary())
    stopped_because: str | None = None


@dataclass
class Opened:
    """A search's stores, opened (tuner.search.driver): its run's tracker, the run's name, the Optuna study, and the
    ledger of its runs so far (a resumed search's trials)."""

    tracker: SearchTracker
    run_name: str
    study: optuna.Study
    ledger: Ledger


@dataclass
class Rules:
    """How the sampler's trials are handed out."""

    base_spec: TrialSpec  # every trial's, but its params
    timeout: float  # a trial's, in seconds
    fits: Callable[[dict[str, Any]], str | None] | None = None  # params -> None, or why they cannot fit (the memory plan)
    prune_slow: bool = False  # stop a trial that runs past slow_limit() of the trials finished before it
    # Run to the end, never pruned: --from's trial 0 (their config: its verdict is the news) and its single changes;
    # a warm search's earlier picks (a whole earlier search's evidence, not to be dropped on a few noisy steps here).
    keep: Collection[int] = ()
    first_alone: bool = False  # --from: trial 0 runs alone first; the changes tried next follow from its verdict


class Search:
    """The loop's state and its one decision: what a free slot runs next."""

    def __init__(self, proposer: Proposer, ledger: Ledger, rules: Rules, phases: Sequence[Phase], progress: Progress,
                 ahead: Sequence[Phase] = ()) -> None:
        self.proposer, self.ledger, self.rules, self.progress = proposer, ledger, rules, progress
        self.phases, self.ahead = list(phases), list(ahead)
        self.asked: dict[str, tuple[optuna.trial.Trial, dict[str, Any]]] = {}  # Ray trial id -> the study's trial
        self.suggested = 0  # search trials handed out in this run
        self.stopped_because: str | None = None  # a failure no config avoids (tuner.verdicts.diagnose): nothing more

    @property
    def max_steps(self) -> int:
        return self.rules.base_spec.max_steps

    @property
    def most_runs(self) -> int:
        """The most runs this search hands out: its trials and every phase's."""
        return self.ledger.planned + sum(phase.most_runs for phase in [*self.ahead, *self.phases])

    def suggest(self, trial_id: str) -> TrialJob | str | None:
        """The next run for a free slot: a phase's ahead of the sampler, the sampler's next trial, a follow-up; None
        when nothing is to run now (runs out there decide what follows), FINISHED when nothing ever will."""
        trials = self.ledger.trials()
        self.stopped_because = self.stopped_because or diagnose.systematic_failure(trials)
        if self.stopped_because:
            return None if self.asked else FINISHED
        if (job := self._from(self.ahead, final=False)) is not None:
            return job
        if self.suggested < self.ledger.planned:
            if self.rules.first_alone and self.suggested and not any(r.get("number") == 0 for r in trials):
                return None  # --from: trial 0 runs alone first; the changes tried next follow from its verdict
            return self._trial(trial_id, trials)
        final = not self.asked  # every search trial has finished
        job = self._from(self.phases, final)
        if job == WAIT:
            return None  # more may follow once the runs out there finish
        if job is None:
            return FINISHED if final else None
        return job

    def _from(self, phases: Sequence[Phase], final: bool) -> TrialJob | str | None:
        for phase in phases:
            if (job := phase.next(self.ledger, final)) is not None:
                if isinstance(job, dict):
                    self.progress.total += 1
                return job
        return None

    def _trial(self, trial_id: str, finished: list[TrialRecord]) -> TrialJob:
        """The sampler's next trial."""
        with interrupts.deferred():  # the study never holds a trial handed out and not yet drawn
            trial, params = self.proposer.ask()
            self.asked[trial_id] = (trial, params)
            self.suggested += 1
        number = self.proposer.number(trial)
        self.ledger.running[number] = params
        job = TrialJob(spec=self.rules.base_spec.job_spec(params=params), number=number, timeout=self.rules.timeout,
                       tags={OPTUNA_NUMBER_TAG: str(trial.number)})
        slow = slow_limit(finished) if self.rules.prune_slow else None
        if number in self.rules.keep:
            job["keep"], slow = True, None
        if slow and slow[0] < self.rules.timeout:
            job["prune_after"] = slow
        too_big = self.rules.fits(params) if self.rules.fits else None
        if too_big:
            job["skip"] = too_big  # the memory plan refused it: recorded as too big, never run
        return job

    def told(self, trial_id: str, result: dict[str, Any]) -> None:
        """A search trial's outcome (a summary, tuner.records.TrialResult's), told to the sampler and into the ledger
        at once; its run's record (the driver's, with its MLflow run id) replaces it there when it is logged. A
        follow-up's is not the sampler's: nothing to do."""
        trial, params = self.asked.pop(trial_id, (None, None))
        if trial is None or params is None:
            return
        base = self.rules.base_spec
        record = new_record(result, number=self.proposer.number(trial), params=params, max_steps=base.max_steps,
                            seed=base.seed)
        with interrupts.deferred():
            self.ledger.running.pop(record["number"], None)
            self.proposer.tell(trial, record)
            self.ledger.told(record)


def start_run(prepared: Prepared, tracker: SearchTracker, run_name: str, concurrency: int) -> None:
    """The search's MLflow run started: its options as params, its study and start as tags; a --from search's file
    and the space around it as artifacts."""
    from pathlib import Path

    from tuner.search._prepare import trial_ranks
    from tuner.search._sampling import shown_url, study_storage
    from tuner.stores import mlflow_store

    o = prepared.options
    with mlflow_store.store_lock(Path(o.store)):
        tracker.start(run_name, {
            "trainer": o.trainer, "model": o.model, "sampler": o.sampler, "trials": prepared.n_trials,
            "max_steps": o.max_steps, "seed": o.seed,
            "search_space": prepared.space.source,
            "dataset": o.dataset or "builtin", "reward_funcs": o.reward_funcs, "concurrency": concurrency,
            "confirm_seeds": o.confirm_seeds, "confirm_top": o.confirm_top, "prune": prunes(o), "halving": halves(o),
            "budget": o.budget, "from_config": o.from_config, "processes_per_trial": trial_ranks(o),
            **prepared.start.run_params(),
        }, {STUDY_TAG: run_name, STUDY_STORAGE_TAG: shown_url(study_storage(o) or ""), **prepared.start.tags()})
    for name, text in prepared.start.artifacts(prepared.space).items():
        tracker.log_artifact_text(text, name)


def phases_of(prepared: Prepared, tracker: SearchTracker, proposer: Proposer, ledger: Ledger, base_spec: TrialSpec,
              progress: Progress) -> tuple[list[Phase], list[Phase]]:
    """(ahead, phases): the search's phases, in the order a free slot asks them; its start adds its own (a warm
    search's earlier pick confirmed ahead of the sampler and its fallback, --from's speed pairs: tuner.search.start)."""
    from tuner.search import _confirm as confirm
    from tuner.search import _extend as extend
    from tuner.search._anchor import Anchor
    from tuner.search.start import Setup

    o, echo = prepared.options, progress.say
    schedule = confirm.Schedule(base_spec, o.confirm_seeds, o.confirm_top, o.trial_timeout, announce=echo,
                                ahead=prepared.start.confirm_ahead)
    budget = extend.default_budget(prepared.n_trials, o.max_steps) if o.budget is None else o.budget
    ahead, after = prepared.start.phases(Setup(schedule, ledger, proposer, tracker, progress, prepared.n_trials))
    phases: list[Phase] = [
        # a GRPO best at risk of losing its reward spread with beta 0: its config with the KL penalty on, once
        Anchor(prepared.space, proposer.reserve, base_spec, o.trial_timeout, announce=echo),
        # longer runs while none learned; a slot that would idle beside a rung confirms it on other seeds
        extend.Extension(base_spec, budget, o.trial_timeout, announce=echo,
                         beside=schedule if confirm.beside_rungs() else None),
        schedule,  # confirmation: the best candidates on other seeds
        *after,
    ]
    return ahead, phases


def run(prepared: Prepared, opened: Opened, placement: Placement, progress: Progress, started: float) -> SearchOutcome:
    """The trials and their follow-ups in one Ray Tune run, then the results written. ``opened.ledger``: the runs so
    far (a resumed search's trials)."""
    from tuner.search import _execution as execution
    from tuner.search._sampling import Asking, Proposer

    tracker, study, run_name, ledger = opened.tracker, opened.study, opened.run_name, opened.ledger
    o = prepared.options
    assert o.trainer is not None  # prepare resolved it (the space's trainer)
    space = prepared.space
    if placement.sharding and not space.values_of("sharding"):
        space.fixed["sharding"] = placement.sharding  # the plan sharded every trial: each trial's params say so
    base_spec = TrialSpec(trainer=o.trainer, params={}, model=prepared.model_path, dataset=o.dataset,
                          reward_funcs=o.reward_funcs, max_steps=o.max_steps, seed=o.seed,
                          ranks=placement.ranks)
    records = ledger.trials()
    remaining = ledger.planned = prepared.n_trials - len(records)
    _opening_lines(prepared, run_name, remaining, placement, progress.say)

    start = prepared.start
    asking = Asking(device=placement.device, fits=placement.check, known=start.known(),
                    after_first=start.after_first(prepared.space, prepared.n_trials))
    proposer = Proposer(study, prepared.space, o.sampler, prepared.n_trials, done=records, asking=asking)
    rules = Rules(base_spec, o.trial_timeout, fits=placement.check, prune_slow=prunes(o),
                  keep=frozenset(start.keep(prepared.n_trials)), first_alone=start.first_alone)
    ahead, phases = phases_of(prepared, tracker, proposer, ledger, base_spec, progress)
    search = Search(proposer, ledger, rules, phases, progress, ahead=ahead)
    if search.most_runs:  # FINISHED when it hands out fewer
        execution.run_trials(name=f"{run_name}-{len(records)}", storage=f"{o.store}/ray", per_trial=placement.resources,
                             concurrency=placement.concurrency,
                             callback=execution.DriverCallback(tracker, progress, ledger),
                             searcher=execution.OptunaSearcher(search), num_samples=search.most_runs,
                             scheduler=execution.Halving(o.max_steps) if halves(o) else None)
    if search.stopped_because:
        progress.say(f"search stopped: {search.stopped_because}")
        tracker.set_tags({STOPPED_BECAUSE_TAG: search.stopped_because[:5000]})
    outcome = finish(prepared, tracker, ledger, placement, progress.say, started)
    outcome.stopped_because = search.stopped_because
    return outcome


def _opening_lines(prepared: Prepared, run_name: str, remaining: int, placement: Placement,
                   echo: Callable[[str], None]) -> None:
    """What the search runs, and what it starts from (earlier searches, the user's config)."""
    o = prepared.options
    echo(f"search {run_name}: {remaining} trials of {o.max_steps} steps, {o.trainer} on {o.model}, "
         f"{o.sampler} sampler, {placement.describe()} (experiment {prepared.experiment!r})")
    for line in prepared.start.opening_lines(prepared.space):
        echo(line)


def finish(prepared: Prepared, tracker: SearchTracker, ledger: Ledger, placement: Placement,
           echo: Callable[[str], None], started: float) -> SearchOutcome:
    """The pick (the first candidate its confirmation runs confirm), the config the user runs, and the search's
    results written to its MLflow run (recommended.yaml, search.json, results.md, its tags)."""
    from tuner.report.progress import results_table
    from tuner.search import _confirm as confirm
    from tuner.search.start import Ended

    o = prepared.options
    assert tracker.parent_id is not None  # the search run, started (or reattached) by the driver before the search
    records = sorted(ledger.trials(), key=lambda r: r["number"])
    extensions = sorted(ledger.longer(), key=lambda r: (r["max_steps"], r["number"]))
    confirmations, remeasures = ledger.confirmations(), sorted(ledger.remeasures(), key=lambda r: (r["pair"], r["number"]))
    verdicts: list[Confirmation] = []
    best: TrialRecord | None
    if o.confirm_seeds > 0:
        best, verdicts = confirm.judge(confirm.candidates([*records, *extensions], o.confirm_top, confirmations),
                                       confirmations)
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
    # what its start makes of the pick: --from's answer is their file with the fewest changes (tuner.search.start)
    best, config, started_from = prepared.start.finish(Ended(records, confirmations, remeasures), best, config)
    search = SearchSummary(trainer=o.entry.name, model=o.model, model_path=prepared.model_path, use_cpu=use_cpu,
                           reward_funcs=export.reward_funcs_of(o.entry, o.reward_funcs), dataset=o.dataset, rule=rec.RULE,
                           confirm_seeds=o.confirm_seeds, recommended=best, trl_config=config, export=export_info,
                           trials=records, extensions=extensions, confirmations=confirmations, remeasures=remeasures,
                           candidates=[v.to_dict() for v in verdicts], plan=placement.summary().to_dict(),
                           source=started_from.get("source"), fix=started_from.get("fix"))
    if best is not None:
        tracker.log_artifact_text(export.render_export(search, prepared.experiment, tracker.parent_id),
                                  "recommended.yaml")
        tracker.set_tags({RECOMMENDED_TRIAL_TAG: str(best["number"]), RECOMMENDED_RUN_ID_TAG: best["run_id"] or ""})
    tracker.log_artifact_dict(search, "search.json")
    tracker.log_artifact_text(results_table([*records, *extensions]), "results.md")
    counts = collections.Counter(r["status"] for r in records)
    tracker.set_tags({f"{COUNT_TAG_PREFIX}{s}": str(n) for s, n in counts.items()})
    return SearchOutcome(prepared.experiment, tracker.parent_id, records, best, config, time.perf_counter() - started,
                         verdicts, search)
