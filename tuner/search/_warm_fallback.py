"""A warm search that goes back to the default trials (tuner.search._warm): when its earlier picks fail here, or
when its trials and confirmations end with nothing confirmed.

    fallback = WarmFallback(warm, echo, searcher, tracker, progress, n_trials)
    proposer.on_told = warm_news(warm, echo, proposer, fallback)
"""

from __future__ import annotations

from tuner.stores.tags import WARM_FALLBACK_TAG

__all__ = ["WarmFallback", "warm_news"]


def warm_news(warm, echo, proposer, fallback: WarmFallback | None):
    """record -> None: says how a warm start's earlier pick did here, when its trial ends; once every pick has
    failed here, a search whose budget they had cut runs the default trials again (``fallback``)."""
    if not warm or not warm.picks:
        return None
    from tuner.search import _warm

    def news(record):
        line = _warm.told_line(record, warm)
        if not line:
            return  # not a pick's trial
        echo(line)
        if fallback is not None and _warm.fell_back(proposer.finished, warm) is not None:
            fallback.now(None)
    return news


class WarmFallback:
    """A warm search whose budget its earlier searches cut (tuner.search._warm.WarmStart.budget) goes back to the
    default trials, once: when every earlier pick has failed here (``_warm.fell_back``), or when its trials and
    confirmations are done and nothing was confirmed. Said, and tagged for --resume; the trials already run kept."""

    def __init__(self, warm, echo, searcher, tracker, progress, n_trials: int):
        self.warm, self.echo, self.searcher, self.tracker, self.progress = warm, echo, searcher, tracker, progress
        self.n_trials, self.done = n_trials, False

    def now(self, why: str | None) -> None:
        from tuner.search import _warm

        trials = self.warm.trials[1]
        if self.done or trials <= self.n_trials:
            return
        self.done = True
        self.searcher.n_search += trials - self.n_trials
        self.progress.total += trials - self.n_trials
        self.echo(_warm.fallback_line(trials, self.warm, why))
        self.tracker.set_tags({WARM_FALLBACK_TAG: str(trials)})
