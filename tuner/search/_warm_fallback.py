"""A warm search's earlier picks in the running search (tuner.search._warm): one that held here is confirmed
first; when they fail here, or its trials and confirmations end with nothing confirmed, the search goes back to the
default trials. Both are phases of the search loop (tuner.search.loop).

    fallback = WarmFallback(warm, schedule, ledger, n_trials, tracker, progress)   # a phase after confirmation
    ahead = ConfirmFirst(warm, schedule, fallback)                                # a phase ahead of the sampler
    proposer.on_told = warm_news(warm, progress.say, proposer, fallback)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tuner.records import TrialJob, TrialRecord
from tuner.search.ledger import WAIT, Ledger
from tuner.stores.tags import WARM_FALLBACK_TAG

if TYPE_CHECKING:
    from tuner.report.progress import Progress
    from tuner.search._confirm import Schedule
    from tuner.search._sampling import Proposer
    from tuner.search._warm import WarmStart
    from tuner.stores.run_writer import SearchTracker

__all__ = ["ConfirmFirst", "WarmFallback", "warm_news"]


class ConfirmFirst:
    """Ahead of the search's next trial: the next confirmation run of the earlier recommendation, beside its own
    trial (``_warm.to_confirm_first``), then of the trial that beats it here (``_warm.challenger``: its runs go ahead
    of the trials left too), or None. Once its confirmation runs have ended and demoted it, it failed here: a search
    whose budget it had cut goes back to the default trials then (``fallback``), not only once every trial has ended
    with nothing confirmed. A phase with nothing to do for a search with no pick to confirm."""

    def __init__(self, warm: WarmStart | None, schedule: Schedule, fallback: WarmFallback | None) -> None:
        self.reused, self.schedule, self.fallback = warm, schedule, fallback
        self.wanted = bool(warm and warm.picks and schedule.seeds > 0)

    @property
    def most_runs(self) -> int:
        return 0  # counted in the confirmation schedule's (Schedule.most_runs: its ``ahead`` candidates)

    def next(self, ledger: Ledger, final: bool) -> TrialJob | None:
        from tuner.search import _confirm as confirm
        from tuner.search import _warm

        warm, schedule, fallback = self.reused, self.schedule, self.fallback
        if not self.wanted or warm is None:
            return None
        finished, confirmations = ledger.trials(), ledger.confirmations()
        pick = _warm.to_confirm_first(finished, ledger.running, warm)  # held on this search's seed, or running
        if pick is not None and pick.get("status") is not None and fallback is not None and not fallback.done:
            runs = [r for r in confirmations if r.get("confirms") == pick["number"]]
            if len(runs) >= schedule.seeds:
                verdict = confirm.judge([pick], runs)[1][0]
                if not verdict.confirmed and _warm.fell_back(finished, warm, {pick["number"]}) is not None:
                    fallback.now(f"trial {pick['number']}, the earlier recommendation, held on this search's seed and "
                                 f"was demoted on its confirmation seeds ({verdict.demoted_because})")
        if _warm.confirmation_failed(warm, confirmations):
            pick = None  # a confirmation run of it failed: no more of them
        job = schedule.first(pick, "the earlier recommendation") if pick else None
        if job is None and (rival := _warm.challenger(finished, warm, confirmations)) is not None:
            job = schedule.first(rival, "which beats the earlier recommendation here")
        return job


def warm_news(warm: WarmStart | None, echo: Callable[[str], None], proposer: Proposer, fallback: WarmFallback | None
              ) -> Callable[[TrialRecord], None] | None:
    """record -> None: says how a warm start's earlier pick did here, when its trial ends; once every pick has
    failed here, a search whose budget they had cut runs the default trials again (``fallback``)."""
    if not warm or not warm.picks:
        return None
    from tuner.search import _warm

    def news(record: TrialRecord) -> None:
        line = _warm.told_line(record, warm)
        if not line:
            return  # not a pick's trial
        echo(line)
        if fallback is not None and _warm.fell_back(proposer.finished, warm) is not None:
            fallback.now(None)
    return news


class WarmFallback:
    """A warm search whose budget its earlier searches cut (tuner.search._warm.WarmStart.budget) goes back to the
    default trials (less the speed stage where the earlier speeds count here: WarmStart.fallback_trials), once: when
    every earlier pick has failed here (``_warm.fell_back``), or when its trials and confirmations are done and
    nothing was confirmed (a phase, after confirmation). Said, and tagged for --resume; the trials already run kept."""

    def __init__(self, warm: WarmStart, schedule: Schedule, ledger: Ledger, n_trials: int, tracker: SearchTracker,
                 progress: Progress) -> None:
        self.reused, self.schedule, self.ledger, self.tracker, self.progress = warm, schedule, ledger, tracker, progress
        self.n_trials, self.done = n_trials, False

    @property
    def most_runs(self) -> int:
        """The trials it can add (handed out by the sampler, beyond the search's own)."""
        return max(0, self.reused.fallback_trials() - self.n_trials)

    def next(self, ledger: Ledger, final: bool) -> str | None:
        """WAIT while confirmations run (whether anything is confirmed is not known), and once it falls back (the
        sampler hands out the trials it now has room for); None otherwise."""
        from tuner.search import _confirm as confirm
        from tuner.verdicts import recommend as rec

        if not final or self.done:
            return None
        schedule, confirmations = self.schedule, ledger.confirmations()
        if schedule.handed - {(c["number"], c["seed"], c["max_steps"]) for c in confirmations}:
            return WAIT  # its confirmations still run: whether anything is confirmed is not known
        runs = ledger.contenders()
        best = (confirm.judge(confirm.candidates(runs, schedule.top, confirmations), confirmations)[0]
                if schedule.seeds > 0 else rec.recommend(runs))
        if best is None:
            self.now("nothing it ran here was confirmed")
            return WAIT  # the searcher hands out the trials it now has room for
        return None

    def now(self, why: str | None) -> None:
        from tuner.search import _warm

        trials = self.reused.fallback_trials()
        if self.done or trials <= self.n_trials:
            return
        self.done = True
        self.ledger.planned += trials - self.n_trials
        self.progress.total += trials - self.n_trials
        self.progress.say(_warm.fallback_line(trials, self.reused, why))
        self.tracker.set_tags({WARM_FALLBACK_TAG: str(trials)})
