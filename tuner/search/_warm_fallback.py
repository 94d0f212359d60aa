"""A warm search's earlier picks in the running search (tuner.search._warm): one that held here is confirmed
first; when they fail here, or its trials and confirmations end with nothing confirmed, the search goes back to the
default trials.

    ahead = confirm_first(warm, schedule, progress, confirmations, lambda: fallback)  # OptunaSearcher(ahead=)
    fallback = WarmFallback(warm, echo, searcher, tracker, progress, n_trials)
    proposer.on_told = warm_news(warm, echo, proposer, fallback)
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from tuner.records import TrialJob, TrialRecord
from tuner.stores.tags import WARM_FALLBACK_TAG

if TYPE_CHECKING:
    from tuner.report.progress import Progress
    from tuner.search._confirm import Schedule
    from tuner.search._execution import OptunaSearcher
    from tuner.search._sampling import Proposer
    from tuner.search._warm import WarmStart
    from tuner.stores.run_writer import SearchTracker

__all__ = ["WarmFallback", "confirm_first", "warm_news"]


def confirm_first(warm: WarmStart | None, schedule: Schedule, progress: Progress,
                  confirmations: Collection[TrialRecord] = (),
                  fallback_of: Callable[[], WarmFallback | None] = lambda: None
                  ) -> Callable[[list[TrialRecord], dict[int, dict[str, Any]]], TrialJob | None] | None:
    """(finished records, running search trials' params by number) -> the next confirmation run of the earlier
    recommendation, beside its own trial and ahead of the search's other trials (``_warm.to_confirm_first``), then
    of the trial that beats it here (``_warm.challenger``: its runs go ahead of the trials left too), or None;
    None for a search with no pick to confirm. Once its confirmation runs have ended and demoted it, it failed here:
    a search whose budget it had cut goes back to the default trials then (``fallback_of()``, a WarmFallback), not
    only once every trial has ended with nothing confirmed. ``confirmations``: the search's, as they end."""
    if not warm or not warm.picks or schedule.seeds <= 0:
        return None
    from tuner.search import _confirm as confirm
    from tuner.search import _warm

    def ahead(finished: list[TrialRecord], running: dict[int, dict[str, Any]]) -> TrialJob | None:
        pick = _warm.to_confirm_first(finished, running, warm)  # held on this search's seed, or running
        fallback = fallback_of()
        if pick is not None and pick.get("status") is not None and fallback is not None and not fallback.done:
            runs = [r for r in confirmations if r.get("confirms") == pick["number"]]
            if len(runs) >= schedule.seeds:
                verdict = confirm.judge([pick], runs)[1][0]
                if not verdict["confirmed"] and _warm.fell_back(finished, warm, {pick["number"]}) is not None:
                    fallback.now(f"trial {pick['number']}, the earlier recommendation, held on this search's seed and "
                                 f"was demoted on its confirmation seeds ({verdict['demoted_because']})")
        if _warm.confirmation_failed(warm, confirmations):
            pick = None  # a confirmation run of it failed: no more of them
        job = schedule.first(pick, "the earlier recommendation") if pick else None
        if job is None and (rival := _warm.challenger(finished, warm, confirmations)) is not None:
            job = schedule.first(rival, "which beats the earlier recommendation here")
        if job is not None:
            progress.total += 1
        return job
    return ahead


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
    nothing was confirmed. Said, and tagged for --resume; the trials already run kept."""

    def __init__(self, warm: WarmStart, echo: Callable[[str], None], searcher: OptunaSearcher, tracker: SearchTracker,
                 progress: Progress, n_trials: int) -> None:
        self.warm, self.echo, self.searcher, self.tracker, self.progress = warm, echo, searcher, tracker, progress
        self.n_trials, self.done = n_trials, False

    def now(self, why: str | None) -> None:
        from tuner.search import _warm

        trials = self.warm.fallback_trials()
        if self.done or trials <= self.n_trials:
            return
        self.done = True
        self.searcher.n_search += trials - self.n_trials
        self.progress.total += trials - self.n_trials
        self.echo(_warm.fallback_line(trials, self.warm, why))
        self.tracker.set_tags({WARM_FALLBACK_TAG: str(trials)})
