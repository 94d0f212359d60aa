"""The anchored twin: a GRPO trial whose reward spread fades with beta 0 is tried again with the KL penalty on.

    anchor = Anchor(space, proposer.reserve, base_spec, timeout)
    anchor.next(ledger, final=True)   # a job (the best trial's config with beta > 0), WAIT while it runs, or None

GRPO without a KL penalty to the reference (``beta`` 0, TRL's default since 0.19) has nothing that keeps its policy
stochastic: the share of prompt groups whose completions all get one reward climbs towards 1, every advantage is 0,
and learning stops (tuner.verdicts.forecast's ``reward_spread`` risk; the guard's collapse). On the tiny pretrained
model both default searches' GRPO picks (fp32, dapo, beta 0) did just that, at steps 1097-1451 of their 25x runs;
the same configs with beta 0.04 held the share at 0.82-0.89 and their reward went on rising (bench/horizon/anchor.py,
docs/horizon.md). The forecast cannot tell the two apart from a short trial (the share rose alike over the first
300 steps), so the search tries it: when its best trial is at risk by ``reward_spread`` with beta 0, and the space
lets beta be positive, it runs that trial's config with the smallest positive beta the space has, on its seed and
its steps (a longer rung's too), as a trial of its own (a new number). The recommendation's rule then decides
(tuner.verdicts.recommend): the twin, with no such risk, goes first when it learns at least SAFE_SHARE as fast, and
is confirmed as any candidate is. One twin per search; a beta the user fixed is theirs and is left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tuner.config.space import CategoricalParam, FloatParam, SearchSpace
from tuner.records import TrialJob, TrialRecord
from tuner.search.ledger import WAIT, Ledger
from tuner.stores.tags import ANCHORED_TAG, ANCHORS_TAG, RUN_NAME_TAG
from tuner.verdicts import recommend as rec

if TYPE_CHECKING:
    from tuner.trial import TrialSpec

__all__ = ["BETA", "Anchor", "anchored_beta"]

BETA = 0.04  # TRL's GRPO default before 0.19, and the shipped space's other choice


def anchored_beta(space: SearchSpace) -> float | None:
    """The beta the twin runs with: the smallest positive choice of a searched ``beta``, or BETA within a float
    range's bounds; None where beta is not searched (fixed by the user, or no such param) or cannot be positive."""
    param = space.params.get("beta")
    if isinstance(param, CategoricalParam):
        positive = sorted(float(c) for c in param.choices
                          if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0)
        return positive[0] if positive else None
    if isinstance(param, FloatParam) and param.high > 0:
        return min(max(BETA, param.low), param.high)
    return None


def fading_without_anchor(trial: TrialRecord) -> bool:
    """At risk by the reward-spread forecast, with no KL penalty."""
    return trial.get("risk_signal") == "reward_spread" and not (trial.get("params") or {}).get("beta")


class Anchor:
    """Which twin a free slot gets, once every search trial has finished: at most one per search (a Phase)."""

    def __init__(self, space: SearchSpace, reserve: Callable[[str], int], base_spec: TrialSpec,
                 timeout: float, announce: Callable[[str], None] = print) -> None:
        self.space, self.reserve, self.base_spec, self.timeout = space, reserve, base_spec, timeout
        self.announce = announce
        # GRPO's: the trainer whose groups lose their reward spread (the forecast's reward_spread rule)
        self.beta = anchored_beta(space) if space.entry.uses_reward_funcs else None
        self.twin: int | None = None  # the twin's number, once handed out

    @property
    def most_runs(self) -> int:
        return 1 if self.beta is not None else 0

    def next(self, ledger: Ledger, final: bool) -> TrialJob | str | None:
        """The twin of the best trial, WAIT while it runs (its verdict decides what is confirmed), or None."""
        from tuner.search._confirm import with_seen_risk

        if self.beta is None or not final:
            return None
        runs = with_seen_risk(ledger.contenders(), ledger.confirmations())
        if self.twin is not None:
            return None if any(r.get("number") == self.twin for r in runs) else WAIT
        ranking = rec.ranked(runs)
        if not ranking or not fading_without_anchor(ranking[0]):
            return None
        best = ranking[0]
        params = {**best["params"], "beta": self.beta}
        if any(r.get("params") == params for r in runs):
            return None  # the search ran it already
        steps, schedule = int(best["max_steps"]), int(best.get("schedule_steps") or 0)
        self.twin = number = self.reserve(f"the anchored twin of trial {best['number']} (beta {self.beta:g}), run as "
                                          "a follow-up of the search")
        self.announce(f"trial {best['number']} is the best so far but {best.get('risk')}: trying its config with the "
                      f"KL penalty on (beta {self.beta:g}) as trial {number}, on its seed and {steps} steps; it goes "
                      f"first if it learns at least {rec.SAFE_SHARE:g}x as fast with no such risk")
        return TrialJob(spec=self.base_spec.job_spec(params=params, seed=best["seed"], max_steps=steps,
                                                     schedule_steps=schedule),
                        number=number, keep=True,
                        timeout=self.timeout * steps / self.base_spec.max_steps,
                        tags={ANCHORED_TAG: "true", ANCHORS_TAG: str(best["number"]),
                              RUN_NAME_TAG: f"anchor-{number:03d}-of-{best['number']:03d}"},
                        extra={"anchors": int(best["number"]), **({"schedule_steps": schedule} if schedule else {})})
