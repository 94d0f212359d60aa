"""Did a trial learn? A trend test over every step of the trial, and an effect size in the trainer's units.

    judge_learning("reward", history)   # -> Learning(effect=0.41, p_value=2e-6, learned=True, ...)

The metric is the one each trainer optimises: GRPO's mean reward (higher is better), every other
trainer's training loss (lower is better).

**Test.** One-sided Mann-Kendall trend test on the metric's per-step values, in the direction of
learning: S counts, over every pair of steps (i < j), +1 when the later value is better and -1 when
worse; under "no trend" (values exchangeable, as a trial with a learning rate of ~0 or frozen weights
produces: each step only sees another batch or another sample of completions) S is centred on 0 with
a known variance (ties corrected), and the normal approximation gives the p-value. It is rank-based,
so one spike (a loss of 9 at one step that recovers) cannot fake or hide a trend, and it uses every
step, so a trial that learns fast is not penalised for it (the old "first vs last quarter over their
noise" rule counted a quarter's own downward trend as noise).

**Effect.** The Theil-Sen slope (median of pairwise slopes, robust to spikes) times the trial's length
in steps: for GRPO the reward gained over the trial (in the reward function's units); for the others
the relative loss drop over the trial (0.3 = the fitted loss fell by 30% of its fitted start).

**Rule.** ``learned`` when p < ALPHA and effect >= MIN_EFFECT. Error rates, measured on recorded
real tiny-model trials of every trainer by tests/test_learning_calibration.py: trials that cannot
learn (learning rate 1e-9) are called learned in at most 5% of seeds; trials that clearly learn are
called learned in at least 95%.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

__all__ = ["ALPHA", "MIN_EFFECT", "MIN_STEPS", "Learning", "judge_learning", "mann_kendall", "theil_sen_slope",
           "progress_metric"]

# One-sided significance level. 1%: a search judges dozens of trials and a config judged "learned" by
# chance costs a confirmation run and can be recommended; the true trends of learning trials are far
# stronger (tests/test_learning_calibration.py).
ALPHA = 0.01
# The smallest change worth calling learning: 1% of the starting loss, or 0.01 of reward.
MIN_EFFECT = 0.01
# Fewer finite values cannot reach p < ALPHA even when every step improves (6 steps: p ~ 0.004).
MIN_STEPS = 6
# Long histories are averaged into this many consecutive bins: the test stays O(bins^2) and the bin
# means are as exchangeable as the steps under "no trend".
_MAX_POINTS = 200


@dataclass(frozen=True)
class Learning:
    """The verdict on one trial's learning, with the numbers behind it."""

    metric: str  # "reward" (GRPO) or "loss"
    effect: float | None  # reward gained, or relative loss drop, over the trial (fitted); higher is better
    p_value: float | None  # one-sided Mann-Kendall p-value for "the metric improves with the steps"
    steps: int  # finite values the test used
    learned: bool

    def describe(self) -> str:
        """One line in the user's terms, e.g. 'loss -35% over 20 steps (trend p=2e-06)'."""
        if self.effect is None or self.p_value is None:
            return f"too few finite {self.metric} values to judge ({self.steps}; {MIN_STEPS} needed)"
        if self.metric == "reward":
            change = f"reward {self.effect:+.3g}"
        else:
            change = f"loss {-100 * self.effect:+.1f}%"
        return f"{change} over {self.steps} steps (trend p={self.p_value:.2g})"


def progress_metric(trainer: str) -> tuple[str, int]:
    """(metric key, +1 if higher is better else -1): the trainer entry says which metric it optimises."""
    from tuner.trainers import adapter

    metric = adapter(trainer).progress_metric
    return metric, (1 if metric == "reward" else -1)


def judge_learning(trainer: str, history: list[dict[str, Any]]) -> Learning:
    """Trend test and effect size over every logged step of one trial (non-finite values left out)."""
    metric, direction = progress_metric(trainer)
    values = [float(row[metric]) for row in history if metric in row and math.isfinite(row[metric])]
    if len(values) < MIN_STEPS:
        return Learning(metric, None, None, len(values), False)
    points = _binned(values, _MAX_POINTS)
    p_value = mann_kendall(points, direction)
    slope = theil_sen_slope(points) * len(points) / len(values)  # per original step
    span = len(values) - 1
    if direction > 0:
        effect = slope * span
    else:
        start = statistics.median(v - slope * i for i, v in enumerate(values))  # fitted value at step 1
        effect = -slope * span / max(abs(start), 1e-8)
    return Learning(metric, effect, p_value, len(values), p_value < ALPHA and effect >= MIN_EFFECT)


def mann_kendall(values: list[float], direction: int = 1) -> float:
    """One-sided Mann-Kendall p-value for a trend in ``direction`` (+1 rising, -1 falling)."""
    n = len(values)
    s = 0
    for i in range(n - 1):
        vi = values[i]
        for vj in values[i + 1:]:
            s += (vj > vi) - (vj < vi)
    s *= direction
    ties = _tie_counts(values)
    variance = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18
    if variance <= 0:
        return 1.0  # every value equal: no trend at all
    z = (s - 1) / math.sqrt(variance) if s > 0 else (s + 1) / math.sqrt(variance) if s < 0 else 0.0
    return 1.0 - statistics.NormalDist().cdf(z)


def theil_sen_slope(values: list[float]) -> float:
    """Median of the slopes between every pair of steps: one wild step moves it little."""
    slopes = [(values[j] - values[i]) / (j - i) for i in range(len(values) - 1) for j in range(i + 1, len(values))]
    return statistics.median(slopes) if slopes else 0.0


def _tie_counts(values: list[float]) -> list[int]:
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return [c for c in counts.values() if c > 1]


def _binned(values: list[float], limit: int) -> list[float]:
    if len(values) <= limit:
        return values
    size = math.ceil(len(values) / limit)
    return [statistics.fmean(values[i:i + size]) for i in range(0, len(values), size)]
