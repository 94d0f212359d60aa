"""Late failure forecast from a short trial's early-warning signals: pure functions of its per-step history.

    risks = forecast(history, trainer="sft", precision="fp16-pure", horizon=500)
    evidence(steps_run=20, risks=risks)
    # "at risk: activations in decoder layer 1 at 38% of float16's range, growing 4.1% a step: overflow expected
    #  near step 60"   or   "held 20 steps; no risk signal projects a failure through step 500"

A trial's guard (tuner.verdicts.guard) says what went wrong in the steps it ran; this says what the trends
of those steps project for a run ``horizon`` steps long (the recommendation's verify length, 25x the trial).
Each rule reads one signal (tuner.trial.signals logs the headroom; the trainer logs the others):

- ``headroom``: the largest activation as a share of the compute dtype's range, growing geometrically: the
  step where the fitted growth reaches 1.0 (overflow), projected only from within 3 decades of it (HEADROOM_FLOOR).
  Only float16 comes near; bfloat16 and float32 have the range of float32.
- ``reward_spread`` (GRPO with beta 0): the share of prompt groups without reward spread (``frac_reward_zero_std``)
  rising while the reward does not: the policy turning deterministic below the ceiling, GRPO's learning
  signal fading; the step where the fitted rise reaches every group (the guard's collapse). With a KL penalty
  (beta > 0) the share levels off below 1 and the rule does not fire.
- ``fp16_weights``: the trainable weights themselves in float16 (tuner.trial.signals' ``weights_fp16``: an fp16-pure
  full fine-tune; a PEFT adapter, which PEFT keeps in float32, does not count), with no float32 master copy for
  the optimizer. A level, not a trend: on bench/horizon/horizon.py's recorded runs every such config ok at 20 steps failed
  by step 500 (5 of 5, at steps 30-260), where the other configs failed 3 times in 69; over all eighteen recorded
  sets, 22 of its 26 flags came true (the two fp16-pure full fine-tunes at the lowest learning rates, set 59's SFT
  config at 1.5e-5 and set 103's DPO config at 2.5e-5, held 500 steps on both seeds).

No rule reads the gradient norm. One did (growing geometrically to 100x its early level within the horizon, or
sitting at 10x it): on the sets the rules were fitted on (bench/horizon/horizon.py, config seeds 17, 23, 29, 37) it
flagged 6 runs, 4 that failed late, every one also flagged by ``fp16_weights``, and 2 that held 500 steps (one SFT
config that did not learn, its gradient norm rising from near zero), so it caught no failure another rule missed.

A trend rule fires only on a fitted trend that is steady (t-statistic >= MIN_T), large (a geometric one at least
doubles over the steps it was fitted on) and projects the failure inside the horizon, so a noisy flat history
or a slow drift does not; the level rules (a reading near the dtype's top, float16 weights) need no trend.
Measured against runs 25x the trial (bench/horizon/horizon.py, docs/horizon.md). Held out (config seeds 43, 53, 61, 79, 83,
97, 101 and 103, each recorded after the rules of its time were frozen): 383 configs ok at 20 steps, 20 failed by
500, 12 flagged (recall 0.60); 15 flags, 12 came true (precision 0.80). No miss had a trend at 20 steps; 5 of the 8 were
reward models at learning rates of 0.36-0.44 whose loss, already spiking, crossed the guard's 20x later. Projecting growth no
further than twice the steps seen was tried and reverted: on set 59 it missed a config whose growth overflowed at
steps 118 and 188. Every recorded set together (fitting sets included): 37 of 52 failures flagged, 37 of 42 flags
came true.
What the rules do not see: failures with no trend in these signals
(a data batch that breaks a run at step 3,000, a learning-rate schedule that warms up past the trial).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from tuner.config.precision import PRECISIONS
from tuner.config.trainers import adapter

__all__ = ["FINAL_NORM", "HEAD", "MIN_T", "VERIFY_FACTOR", "Risk", "evidence", "forecast", "horizon_steps", "said",
           "site_name", "stalling"]

FINAL_NORM, HEAD = -1, -2  # tuner.trial.signals' headroom_site values that are not a decoder layer's index

VERIFY_FACTOR = 25  # a long run is commonly 25-250x a trial's steps: the horizon a trial's forecast looks to
MIN_T = 3.0  # a trend's slope over its standard error: steady, not one run's noise
HEADROOM_NOW = 0.5  # a share of the dtype's range already this high is a risk without any trend
# ... and so is one the training itself grew GROWN_FROM x from the untouched model's (the first reading) to at least
# HEADROOM_GROWN: on bench/horizon/horizon.py's records (12 sets, 2026-11-27), 22 of the 29 fp16 runs that failed by step 500
# passed 1% of float16's range first (a median ~30 steps before), and 2 of the 54 that held ever did (after step
# 200). A pretrained model's own large activations (a real LLM's reach hundreds) are its start, not growth.
HEADROOM_GROWN = 0.01
GROWN_FROM = 100
# A geometric growth is projected over at most 3 decades: activations at 1e-36 of bfloat16's range growing 40% a
# step do not reach its top near step 250 (bench/horizon/horizon.py: 5 of 5 such bf16 projections held 500 steps), they
# level off. Only a share within 3 decades of the top (float16's: from ~65 up) is projected.
HEADROOM_FLOOR = 1e-3
LOST_SHARE = 0.5  # half the sampled weights unchanged by a step at >= half the peak learning rate
FP16_SHARE = 0.5  # most trainable weights in float16: the optimizer works in float16 (a fp32 score head aside)
SOLVED_MARGIN = 0.05  # a GRPO reward this close to its best, and this far above its start: solved (the guard's
#                       saturation_min_gain)
# A margin loss at 1% of its start has separated its pairs: its gradient (-log sigmoid's is sigmoid(-margin), about
# the loss itself) has fallen with it, so the activations its updates grew stop growing. The headroom rule's grown
# level and projection do not fire on such a trial (its level near the top, HEADROOM_NOW, still does). On
# bench/horizon/horizon.py's records (sets 17-103 and the pretrained 71, 73) every float16 reward, DPO or KTO run ok at 20
# steps that failed by step 500 had its loss at 0.37x its start or more; the rule's 4 false flags on sets 47 and 89
# (fp16-pure LoRA reward models, whose activations levelled off at 1e-3-3e-2 of float16's range) sat at 2e-5-6e-4x.
# Fitted on those two sets. It does not make a run safe: three bf16-mixed reward models at lr 0.16-0.44 failed from
# 3e-21-0.12x (a loss near 0 between spikes that crossed the guard's 20x), where float16's range plays no part.
SATURATED = 0.01
GROWTH_SEEN = 2.0  # a geometric trend must at least double over the steps it is fitted on to be projected
_MIN_POINTS = 4


@dataclass(frozen=True)
class Risk:
    signal: str  # headroom, fp16_weights, reward_spread (update_lost: stalling()'s note)
    message: str  # what, where, how fast, and when
    step: int | None = None  # the projected step of the failure, None: no step projected (already there)

    def __str__(self) -> str:
        return self.message


def forecast(history: list[dict[str, Any]], trainer: str, precision: str, horizon: int) -> list[Risk]:
    """The risks a run of ``horizon`` steps faces by the trends of ``history`` (a trial's per-step rows), the
    earliest projected first."""
    rows = [row for row in history if isinstance(row.get("step"), (int, float))]
    if not rows:
        return []
    risks = [risk for rule in (_headroom, _fp16_weights, _reward_spread)
             if (risk := rule(rows, trainer, precision, horizon)) is not None]
    return sorted(risks, key=lambda r: r.step if r.step is not None else 0)


def said(risk: str) -> str:
    """A trial's recorded risk (the forecast's message alone, as TrialResult.risk keeps it) as every line that shows
    it says it: "at risk: activations in ..."; "" for none."""
    return "" if not risk else risk if risk.startswith("at risk") else f"at risk: {risk}"


def horizon_steps(steps: int) -> int:
    """How far a trial of ``steps`` steps is forecast: VERIFY_FACTOR times its length."""
    return VERIFY_FACTOR * max(int(steps), 1)


def evidence(steps_run: int, risks: list[Risk], horizon: int | None = None) -> str:
    """One line: the first risk, or how far the evidence reaches without one."""
    if risks:
        return "at risk: " + risks[0].message + (f" (and {len(risks) - 1} more)" if len(risks) > 1 else "")
    through = f" through step {horizon}" if horizon else ""
    return f"held {steps_run} steps; no risk signal projects a failure{through}"


# -- the rules ------------------------------------------------------------------------------------

def _headroom(rows: list[dict[str, Any]], trainer: str, precision: str, horizon: int) -> Risk | None:
    points = [(row["step"], row["headroom"], row.get("headroom_site")) for row in rows
              if isinstance(row.get("headroom"), (int, float)) and row["headroom"] > 0]
    if not points:
        return None
    dtype = PRECISIONS[precision].compute_dtype
    recent = points[len(points) // 2:] if len(points) >= 2 * _MIN_POINTS else points  # the trend now
    high = max(recent, key=lambda p: p[1] if math.isfinite(p[1]) else math.inf)
    if not math.isfinite(high[1]) or high[1] >= HEADROOM_NOW:
        where = site_name(int(high[2])) if high[2] is not None else "the model"
        return Risk("headroom", f"activations in {where} reached {_share(high[1])} of {dtype}'s range at step "
                                f"{int(high[0])}: overflow is one spike away", None)
    if _saturated(rows, trainer):
        return None  # grown activations, but the loss that grew them has stopped pushing: see SATURATED
    start = points[0][1]
    if high[1] >= HEADROOM_GROWN and high[1] >= GROWN_FROM * start:
        where = site_name(int(high[2])) if high[2] is not None else "the model"
        return Risk("headroom", f"activations in {where} reached {_share(high[1])} of {dtype}'s range at step "
                                f"{int(high[0])}, {high[1] / start:.0f}x their level at step {int(points[0][0])}: "
                                "runs whose training grew them this far overflowed later", None)
    step, share, site = points[-1]
    where = site_name(int(site)) if site is not None else "the model"
    if share < HEADROOM_FLOOR:
        return None
    fit = _fit([s for s, _, _ in recent], [math.log(v) for _, v, _ in recent])
    if not _growing(fit, recent[-1][0] - recent[0][0]):
        return None
    # from the last point, at the fitted growth: log(share) reaches log(1) = 0
    reach = int(step + math.ceil(-math.log(share) / fit.slope))
    if reach > horizon:
        return None
    return Risk("headroom", f"activations in {where} at {_share(share)} of {dtype}'s range, growing "
                            f"{math.expm1(fit.slope):.1%} a step: overflow expected near step {reach}", reach)


def _saturated(rows: list[dict[str, Any]], trainer: str) -> bool:
    """A margin loss (reward, DPO, KTO) whose recent readings (the median of its last quarter, at least 3) sit at
    SATURATED of its start or below: its pairs are separated, and the gradient that grew the weights has nearly
    vanished with the loss."""
    if not adapter(trainer).margin_loss:
        return False
    losses = [row["loss"] for row in rows if isinstance(row.get("loss"), (int, float)) and math.isfinite(row["loss"])]
    if len(losses) < _MIN_POINTS:
        return False
    start = sum(losses[:2]) / 2
    recent = sorted(losses[-max(len(losses) // 4, 3):])
    return start > 0 and 0 <= recent[len(recent) // 2] <= SATURATED * start


def stalling(history: list[dict[str, Any]], precision: str) -> str:
    """A note, not a late-failure risk: half-precision weights whose updates round away (the median share of
    sampled weights a step left unchanged, at a learning rate >= half its peak, at least LOST_SHARE). In
    bench/horizon/horizon.py's runs it did not foretell a failure or a stall: a KTO config in bf16-pure with 81% of its
    sampled weights unchanged a step learned 14x more over 500 steps than over 20. "" when there is nothing to say."""
    risk = _update_lost([r for r in history if isinstance(r.get("step"), (int, float))], precision)
    return risk.message if risk is not None else ""


def _update_lost(rows: list[dict[str, Any]], precision: str) -> Risk | None:
    weights = PRECISIONS[precision].weight_dtype
    if weights == "float32":
        return None
    rates = [row["learning_rate"] for row in rows if isinstance(row.get("learning_rate"), (int, float))]
    peak = max(rates, default=0.0)
    lost = [row["update_lost"] for row in rows if isinstance(row.get("update_lost"), (int, float))
            and row["step"] > 1 and (not peak or row.get("learning_rate", peak) >= 0.5 * peak)]
    if len(lost) < 2:
        return None
    share = sorted(lost)[len(lost) // 2]
    if share < LOST_SHARE:
        return None
    return Risk("update_lost", f"{weights} weights: {share:.0%} of the sampled weights are left unchanged by a step "
                               f"(updates below half of {weights}'s resolution round away): training may stall",
                None)


def _fp16_weights(rows: list[dict[str, Any]], trainer: str, precision: str, horizon: int) -> Risk | None:
    shares = [row["weights_fp16"] for row in rows if isinstance(row.get("weights_fp16"), (int, float))]
    if not shares or max(shares) < FP16_SHARE:
        return None
    return Risk("fp16_weights", f"{max(shares):.0%} of the trainable weights are float16, with no float32 master "
                                "copy: updates below float16's resolution round away and the optimizer's moments "
                                "underflow; most runs like this diverge late (fp16-mixed or bf16 keep float32 weights)",
                None)


def _reward_spread(rows: list[dict[str, Any]], trainer: str, precision: str, horizon: int) -> Risk | None:
    if not adapter(trainer).uses_reward_funcs:  # an online trainer's groups (GRPO's frac_reward_zero_std)
        return None
    # A KL penalty to the reference (beta > 0; TRL logs "kl" only then) holds the share below 1: the guard does not
    # stop such a run once its reward rose (tuner.verdicts.guard). The fitted rise cannot tell the two apart: on the
    # tiny pretrained model the same config with beta 0 and 0.04 rose alike over its first 300 steps (0.32 -> ~0.7).
    if any(row.get("kl") is not None for row in rows):
        return None
    points = [(row["step"], row["frac_reward_zero_std"]) for row in rows
              if isinstance(row.get("frac_reward_zero_std"), (int, float))]
    if len(points) < 2 * _MIN_POINTS:
        return None
    steps, zero = [s for s, _ in points], [v for _, v in points]
    fit = _fit(steps, zero)
    if fit is None or fit.slope <= 0 or fit.t < MIN_T:
        return None
    # The reward still rising in the second half: the spread fades because the policy is solving the task.
    metric = adapter(trainer).progress_metric  # the reward an online trainer optimises
    rewards = [(row["step"], row[metric]) for row in rows[len(rows) // 2:]
               if isinstance(row.get(metric), (int, float))]
    rising = _fit([s for s, _ in rewards], [r for _, r in rewards]) if len(rewards) >= _MIN_POINTS else None
    if rising is not None and rising.slope > 0 and rising.t >= 2.0:
        return None
    # ... or already at its best: the last quarter's mean within SOLVED_MARGIN of the best step, having risen at
    # least that much from the first quarter's: groups lose their spread because every completion is right (the
    # guard's "reward saturated"). bench/horizon/horizon.py (config seed 37): a GRPO config at 0.9 of a 1.0 ceiling by
    # step 16 was flagged without this, and held 500 steps.
    every = [row[metric] for row in rows if isinstance(row.get(metric), (int, float))]
    quarter = max(len(every) // 4, 1)
    if every:
        start, recent = sum(every[:quarter]) / quarter, sum(every[-quarter:]) / quarter
        if recent >= max(every) - SOLVED_MARGIN and recent - start >= SOLVED_MARGIN:
            return None
    now = fit.value(steps[-1])
    if now >= 1.0:
        return None  # already there: the guard's rule, not a forecast
    reach = int(steps[-1] + math.ceil((1.0 - now) / fit.slope))
    if reach > horizon:
        return None
    first = sum(zero[:len(zero) // 4 or 1]) / (len(zero) // 4 or 1)
    return Risk("reward_spread", f"groups without reward spread rose from {first:.2f} to {now:.2f} over "
                                 f"{int(steps[-1])} steps while the reward held: at this rate no group has any near "
                                 f"step {reach}, and GRPO stops learning (collapse)", reach)


def site_name(site: int) -> str:
    """A ``headroom_site`` in words: "decoder layer 3", "the final norm", "the head (logits)"."""
    if site == HEAD:
        return "the head (logits)"
    if site == FINAL_NORM:
        return "the final norm"
    return f"decoder layer {int(site)}"


# -- a least-squares line with its slope's t-statistic --------------------------------------------

@dataclass(frozen=True)
class _Fit:
    slope: float
    intercept: float
    t: float

    def value(self, x: float) -> float:
        return self.intercept + self.slope * x


def _fit(xs: list[float], ys: list[float]) -> _Fit | None:
    n = len(xs)
    if n < _MIN_POINTS or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    error = math.sqrt(residual / (n - 2) / sxx) if n > 2 else 0.0
    t = slope / error if error > 0 else (math.inf if slope else 0.0)
    return _Fit(slope, intercept, t)


def _growing(fit: _Fit | None, span: float) -> TypeGuard[_Fit]:
    """A geometric trend worth projecting: steady (t >= MIN_T) and at least doubling over the steps it was fitted
    on (a slow drift projected 25x past its evidence is not a forecast)."""
    return fit is not None and fit.slope > 0 and fit.t >= MIN_T and fit.slope * span >= math.log(GROWTH_SEEN)


def _share(value: float) -> str:
    return "overflow (inf)" if not math.isfinite(value) else f"{value:.0%}" if value >= 0.01 else f"{value:.1e}"
