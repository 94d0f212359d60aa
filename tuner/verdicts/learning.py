"""Did a trial learn, and how far and how early? Measured from where the trial started.

    judge_learning("grpo", history)   # -> Learning(effect=0.52, gain=0.69, p_value=3e-12, learned=True, ...)

The metric is the one each trainer optimises: GRPO's mean reward (higher is better), every other
trainer's training loss (lower is better). The **starting level** is the mean of the first tenth of the
finite values, at least ``START_STEPS`` (``start_steps``): in a 20-step trial the first two (the weights have
moved at most once by then); in a 180-step rung the first 18, so a slow learner's start is known as well as
its end (with two steps, their noise alone hides any gain under about a third of a reward unit). A run longer
than any rung (``LONG_RUN``: `tuner verify`, a long `tuner trial`) starts from its first two steps again, so the
same config does not read worse the longer it is verified.

**Effect (``progress``).** The mean improvement over the trial relative to the starting level: the
area between the curve and the starting level, per step, over the steps after the start. For GRPO in
the reward function's units (0.5 = on average the reward sat 0.5 above its start); for the others as a
fraction of the starting loss (0.3 = on average the loss sat 30% below its start). A trial that
reaches the ceiling at step 5 scores higher than one that reaches it at step 15, and both higher than
one that never does: how far *and how early* the metric moved.

**Test.** One-sided, "the last third of the trial is better than the starting level": Welch-style
t statistic of the difference between the last third's mean and the starting level, with each step's
noise taken from the data (a block of despiked steps counted as varying 20% more than independent ones):

- every trainer: the step-to-step noise, from successive differences (robust: each difference is
  clipped at 6 MADs, so one spike that recovers neither fakes nor hides a trend, and a steady trend
  is not counted as noise);
- GRPO, where TRL logs each step's reward spread over its completions (``reward_std``) and the
  monitor writes how many prompt groups the step scored (``reward_groups``): the step mean's variance
  is at least spread^2 / groups (conservative: completions of one prompt count as one observation).
  So a reward that goes from 0.3 to 1.0 and stays there is significant even when every later step is
  tied at the ceiling, where a rank test loses its power.

The p-value comes from Student's t with (n - 2) / 2 degrees of freedom, which keeps the false-alarm rate
at or below ALPHA on Gaussian noise from 6 steps on, and below 2.5x ALPHA on heavy-tailed noise
(tests/unit/verdicts/test_learning.py simulates both).

**Rule.** ``learned`` when p < ALPHA, the last third's gain >= MIN_EFFECT and the effect >= MIN_EFFECT.
A trial that learns and then falls back to its start is not learned (its end is no better than its
start). Error rates per kind of trial (cannot learn, fast solver, slow learner, learns then regresses),
measured on recorded real tiny-model trials by tests/unit/verdicts/test_learning_calibration.py, are in docs/how-a-search-works.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from tuner.config.trainers import Adapter

__all__ = ["ALPHA", "MIN_EFFECT", "MIN_STEPS", "START_STEPS", "Learning", "judge_learning", "despiked", "preload",
           "start_steps", "progress_metric", "step_noise"]

# One-sided significance level. 1%: a search judges dozens of trials and a config judged "learned" by
# chance costs a confirmation run and can be recommended; real learning is far stronger.
ALPHA = 0.01
# The smallest change worth calling learning: 1% of the starting loss, or 0.01 of reward.
MIN_EFFECT = 0.01
# The starting level: at least the first two steps (step 1 is the untouched model; one update by step 2) ...
START_STEPS = 2
# ... and the first tenth of a longer trial.
START_SHARE = 10
# A run longer than the search's longest rung (20 -> 60 -> 180 steps) is a long run (`tuner verify`, a long
# `tuner trial`): its starting level is the untouched model's, its first START_STEPS steps, as a 20-step trial's.
# The first tenth of a 500-step run would be 50 steps, by which a config that reaches the reward ceiling at step 7
# already sits there: measured from that start, its progress read 0.08 at 300 steps where the same config and
# seed read 0.62 at 20. The test keeps its error rate: the start's noise (2 steps) is in its variance, the step
# noise estimated from the whole run; what is lost is power on a slow learner's first steps, which a long run's
# 100+ step tail makes up for.
LONG_RUN = 180
# Two start steps and at least two in the last third, with steps in between.
MIN_STEPS = 6
# A difference further than this many MADs from the median difference is clipped: a spike, not noise. 6, not the
# 2.5 first chosen on the tiny models: a real model's per-batch loss is heavy-tailed (SmolLM2-135M-Instruct, SFT at
# batch 4 on the built-in questions: median 2.0, 95th percentile 4.4, max 7.9), and clipping at 2.5 MADs counted its
# tails as spikes, so the noise read too small: over 600 steps at a learning rate of 1e-12, judged in 30 windows of
# 20 steps, 1 was called learned and 6 had p < 0.05 (1.5 expected). At 6 MADs the same windows gave 0 and 2, and a
# held-out run (seed 1) is in bench/RESULTS.md, "On a real model"; the tiny models' recorded table moved by one GRPO
# fast solver (docs/how-a-search-works.md).
_CLIP_MADS = 6.0
# The despiking window: two steps each side.
_HALF_WINDOW = 2
# How much more the mean of a block of despiked steps varies than that of as many independent steps: a value
# replaced by its window's median moves with its neighbours. About 1.2 on Gaussian noise over 40-180 steps
# (measured: the t statistic's spread without it); tests/unit/verdicts/test_learning.py's false-alarm test holds it.
_DESPIKED_VARIANCE = 1.2


@dataclass(frozen=True)
class Learning:
    """The verdict on one trial's learning, with the numbers behind it."""

    metric: str  # "reward" (GRPO) or "loss"
    effect: float | None  # mean improvement over the start per step (reward units / fraction of the start loss)
    p_value: float | None  # one-sided p-value for "the last third is better than the start"
    steps: int  # finite values used
    learned: bool
    start: float | None = None  # the starting level, in the metric's units
    gain: float | None = None  # the last third's improvement over the start, in the effect's units

    def describe(self) -> str:
        """One line in the user's terms, e.g. 'reward +0.52 above its start 0.31 on average over 40 steps (last third
        +0.69, p=3e-12)': the effect is the mean over the steps of the improvement on the start, not a rate per step."""
        if self.effect is None or self.p_value is None or self.gain is None:  # the numbers come all or none
            return f"too few finite {self.metric} values to judge ({self.steps}; {MIN_STEPS} needed)"
        if self.metric == "reward":
            return (f"reward {self.effect:+.3g} above its start {self.start:.3g} on average over {self.steps} steps "
                    f"(last third {self.gain:+.3g}, p={self.p_value:.2g})")
        return (f"loss {-100 * self.effect:+.1f}% from its start {self.start:.3g} on average over {self.steps} steps "
                f"(last third {-100 * self.gain:+.1f}%, p={self.p_value:.2g})")


def progress_metric(entry: Adapter) -> tuple[str, int]:
    """(metric key, +1 if higher is better else -1): the trainer entry says which metric it optimises."""
    metric = entry.progress_metric
    return metric, (1 if metric == "reward" else -1)


def judge_learning(entry: Adapter, history: list[dict[str, Any]]) -> Learning:
    """Effect and test over every logged step of one trial (non-finite values left out)."""
    metric, direction = progress_metric(entry)
    rows = [row for row in history if metric in row and math.isfinite(row[metric])]
    raw = [float(row[metric]) for row in rows]
    if len(raw) < MIN_STEPS:
        return Learning(metric, None, None, len(raw), False)
    head = start_steps(len(raw))
    values = despiked(raw)
    start = statistics.fmean(values[:head])
    scale = 1.0 if direction > 0 else max(abs(start), 1e-8)
    tail = max(START_STEPS, len(values) // 3)
    effect = statistics.fmean(direction * (v - start) for v in values[head:]) / scale
    gain = direction * (statistics.fmean(values[-tail:]) - start) / scale
    noise = step_noise(raw) ** 2
    step_vars = [max(noise, _within_step_variance(row)) for row in rows]
    variance = sum(step_vars[:head]) / head ** 2 + sum(step_vars[-tail:]) / tail ** 2
    if head > START_STEPS:  # a despiked start too (30 steps on); in shorter trials the few degrees of freedom cover it
        variance *= _DESPIKED_VARIANCE
    p_value = _one_sided_p(gain * scale, variance, degrees=(len(values) - 2) / 2)
    learned = p_value < ALPHA and gain >= MIN_EFFECT and effect >= MIN_EFFECT
    return Learning(metric, effect, p_value, len(values), learned, start, gain)


def start_steps(steps: int) -> int:
    """How many of a trial's first values make its starting level: the first tenth, at least START_STEPS; a long
    run's (more than LONG_RUN steps) START_STEPS, the untouched model's."""
    if steps > LONG_RUN:
        return START_STEPS
    return max(START_STEPS, steps // START_SHARE)


def step_noise(values: list[float]) -> float:
    """The standard deviation of one step's value around the trend, from successive differences: a steady
    trend moves every difference alike and is not noise; differences beyond _CLIP_MADS MADs are clipped (spikes)."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    if len(diffs) < 2:
        return 0.0
    centre = statistics.median(diffs)
    deviations = [d - centre for d in diffs]
    clip = _CLIP_MADS * 1.4826 * statistics.median(abs(d) for d in deviations)
    clipped = [max(-clip, min(clip, d)) for d in deviations]
    # A difference of two steps has twice one step's variance.
    return math.sqrt(sum(d * d for d in clipped) / (2 * (len(clipped) - 1)))


def despiked(values: list[float]) -> list[float]:
    """Each value further than 3 scaled MADs from the median of its 5-step window replaced by that median
    (a Hampel filter): one spike that recovers (a loss of 9 at one step) is not an effect; a level the
    metric keeps is never changed. The first START_STEPS values are the start itself and are kept: a trial at
    the floor from its second step on (DPO's loss 0.69 -> 0) started at 0.69, not at the floor."""
    out = list(values[:START_STEPS])
    for i, value in enumerate(values[START_STEPS:], start=START_STEPS):
        window = values[max(0, i - _HALF_WINDOW): i + _HALF_WINDOW + 1]
        centre = statistics.median(window)
        spread = 1.4826 * statistics.median(abs(v - centre) for v in window)
        out.append(centre if abs(value - centre) > 3 * spread else value)
    return out


def _within_step_variance(row: dict[str, Any]) -> float:
    """GRPO: the variance of the step's mean reward, at least spread^2 / prompt groups; 0 where not logged."""
    spread, groups = row.get("reward_std"), row.get("reward_groups")
    if spread is None or not groups or not math.isfinite(spread):
        return 0.0
    return float(spread) ** 2 / float(groups)


def preload() -> None:
    """Load what the test loads on first use (scipy.stats, ~0.6 s of CPU, and whatever its first p-value loads): a
    search's Ray worker calls this before its trial starts, so the first live report does not load it while the
    trial trains beside it."""
    _one_sided_p(1.0, 1.0, 1.0)


def _one_sided_p(difference: float, variance: float, degrees: float) -> float:
    if variance <= 0:
        return 0.0 if difference > 0 else 1.0  # no noise at all: any gain is real, none is none
    from scipy.stats import t

    return float(t.sf(difference / math.sqrt(variance), max(degrees, 1.0)))
