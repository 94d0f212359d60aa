"""The stability guard: watches one trial's per-optimizer-step metrics and names the first step it broke.

Pure logic over numbers (no torch, no transformers), so it is tested on recorded metric sequences
without training anything; the TrainerCallback that feeds it lives with the trial runner.

    guard = Guard(adapter("grpo"))
    for step, metrics in enumerate(logged_metrics, start=1):
        verdict = guard.observe(step, metrics)
        if verdict is not None:
            print(verdict.status, verdict.reason)  # "diverged" or "collapsed", then one line why
            break

Each rule answers a failure seen in real TRL use (the table in docs/failures.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tuner.config.trainers import Adapter
from tuner.records import Status

__all__ = ["GuardSettings", "Verdict", "Guard", "first_verdict"]

# Metrics computed from the model's outputs: NaN/inf in any of them means the forward pass already broke,
# even when the logged loss looks fine. Prefixes, because TRL names them per reward function and variant.
_OUTPUT_METRIC_PREFIXES = ("reward", "logps/", "logits/", "margin", "accuracy", "mean_reward", "kl", "entropy")


@dataclass(frozen=True)
class GuardSettings:
    """Thresholds of the guard; the defaults fire on the failures in docs/failures.md's table, not on ordinary noise."""

    # The first finite values set the trial's own loss and grad-norm scale: the median of 3 outvotes one odd
    # step, and the ordinary explosion rules wait until all 3 are in (step 2 against step 1 alone is a coin flip).
    baseline_steps: int = 3
    # Noisy training moves the loss 2-3x; 20x its own scale is a blow-up.
    loss_explosion_factor: float = 20.0
    # While the baseline is still being filled, only a catastrophic jump (the 1e+34 case) is judged.
    early_loss_explosion_factor: float = 1000.0
    # The loss scale never drops below this, so GRPO's exactly-0 loss cannot make every loss an "explosion".
    loss_baseline_floor: float = 1.0
    # Grad norms swing 10x in healthy early steps; 100x the baseline median is a blow-up.
    grad_explosion_factor: float = 100.0
    # A clipped gradient (grad_norm above max_grad_norm) cannot move the weights further than clipping allows:
    # one clipped spike is what clipping is for; this many exploding steps in a row mean training left its basin.
    clipped_explosion_steps: int = 3
    # One exactly-zero grad norm can be a fluke; several in a row means no gradient flows back.
    zero_grad_steps: int = 3
    # GRPO on a hard task may see equal rewards in every group for a few steps before it finds any spread.
    # This many in a row in a run of up to zero_reward_std_run steps (a search's trial); a longer run waits one
    # step more each time its length doubles (zero_reward_std_patience), so that a healthy run's chance of such a
    # streak by luck does not grow with its length (below).
    zero_reward_std_steps: int = 5
    zero_reward_std_run: int = 20
    # Equal rewards in every group after the reward rose at least this much over its first steps is a solved
    # task (the reward saturated), not a collapse.
    saturation_min_gain: float = 0.05
    # fp16 mixed: GradScaler halves its scale per skip, so a few skips find a working scale; a long run means
    # every step overflows.
    max_skipped_steps: int = 5
    # fp16 mixed: a GradScaler scale below 1 shrinks gradients instead of protecting them from underflow.
    min_loss_scale: float = 1.0
    # After this many steps that should have moved the weights (a gradient, a learning rate, not skipped by the
    # GradScaler, not a GRPO step without reward spread) some trainable parameter must have moved.
    no_update_steps: int = 3

    def __post_init__(self) -> None:
        for name in ("baseline_steps", "clipped_explosion_steps", "zero_grad_steps", "zero_reward_std_steps",
                     "zero_reward_std_run", "no_update_steps"):
            _check_setting(self, name, lambda value: value >= 1, "at least 1")
        _check_setting(self, "max_skipped_steps", lambda value: value >= 0, "at least 0")
        for name in ("loss_explosion_factor", "early_loss_explosion_factor", "grad_explosion_factor"):
            _check_setting(self, name, lambda value: value > 1.0, "greater than 1.0")
        _check_setting(self, "loss_baseline_floor", lambda value: value > 0.0, "greater than 0.0")
        _check_setting(self, "min_loss_scale", lambda value: value >= 0.0, "at least 0.0")
        _check_setting(self, "saturation_min_gain", lambda value: value >= 0.0, "at least 0.0")


def _check_setting(settings: GuardSettings, name: str, is_valid: Callable[[float], bool], rule: str) -> None:
    value = getattr(settings, name)
    if not is_valid(value):
        raise ValueError(f"{name} must be {rule}, but got {name}={value!r}.")


@dataclass(frozen=True)
class Verdict:
    """Why and where a trial stopped being worth training."""

    status: Status  # DIVERGED (numbers blew up) or COLLAPSED (numbers fine, nothing is learned)
    reason: str  # one human line naming the metric, its value and the step
    step: int  # the 1-based optimizer step (global_step) the guard fired at
    signal: str  # short machine key, e.g. "non_finite", "grad_explosion", "zero_grad"


class Guard:
    """Feed it each optimizer step's logged metrics; it returns a Verdict the first step something is wrong.

    Rules key off the metrics a trainer logs (GRPO's ``frac_reward_zero_std``, the monitor's
    ``params_changed`` / ``step_skipped`` / ``loss_scale``), not off the trainer's name. Observations that
    are not failures (the reward saturated) are kept in ``notes``.
    """

    def __init__(self, entry: Adapter, grad_scaler: bool = False, settings: GuardSettings | None = None,
                 max_grad_norm: float | None = None):
        self.entry = entry
        # GRPO's loss is ~0 by construction; a loss near 0 means "solved" only where learning lowers the loss.
        self._learns_on_loss = entry.progress_metric == "loss"
        self.grad_scaler = grad_scaler
        self.settings = settings if settings is not None else GuardSettings()
        # Trainer clips when max_grad_norm > 0; the logged grad_norm is the norm before clipping.
        self.max_grad_norm = max_grad_norm if max_grad_norm and max_grad_norm > 0 else None
        self.verdict: Verdict | None = None
        self.notes: list[str] = []
        self._loss_baseline: list[float] = []
        self._grad_baseline: list[float] = []
        self._rewards: list[float] = []
        self._skipped_streak = 0
        self._zero_grad_streak = 0
        self._clipped_explosion_streak = 0
        self._zero_reward_std_rewards: list[float] = []  # the rewards of the current no-spread streak
        self._saturated_since: int | None = None
        self._thin_since: int | None = None  # an anchored run's no-spread streak past the patience (a note, not a stop)
        self._anchored = False  # a KL penalty to the reference seen (GRPO's beta > 0: TRL logs "kl" only then)
        self._effective_steps = 0
        self._last_learning_rate: float | None = None
        self.run_steps: int | None = None  # the run's planned length (the monitor sets it): the patience's scale

    def observe(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        """Feed one optimizer step's metrics; returns a Verdict the first time the guard fires, else None.

        After it has fired, keeps returning that same verdict.
        """
        if self.verdict is None:
            skipped = self._is_skipped(step, metrics)
            # Divergence before collapse: a NaN step that also has zero grads is reported as the NaN.
            self.verdict = (
                self._non_finite(step, metrics, skipped)
                or self._skipped_steps(step, skipped)
                or self._loss_scale_collapse(step, metrics)
                or self._loss_explosion(step, metrics)
                or self._grad_explosion(step, metrics, skipped)
                or self._zero_grad(step, metrics)
                or self._zero_reward_std(step, metrics)
                or self._no_update(step, metrics, skipped)
            )
        return self.verdict

    def _is_skipped(self, step: int, metrics: dict[str, float]) -> bool:
        if not self.grad_scaler:
            return False
        if "step_skipped" in metrics:
            return metrics["step_skipped"] == 1.0
        # Without the callback's flag, infer what GradScaler does while calibrating: overflowing
        # gradients with a finite loss, and only in the first steps.
        grad_norm = metrics.get("grad_norm")
        return (
            step <= self.settings.max_skipped_steps
            and grad_norm is not None
            and not math.isfinite(grad_norm)
            and math.isfinite(metrics.get("loss", 0.0))
        )

    def _non_finite(self, step: int, metrics: dict[str, float], skipped: bool) -> Verdict | None:
        watched = ["loss", "grad_norm"] + sorted(key for key in metrics if key.startswith(_OUTPUT_METRIC_PREFIXES))
        for key in watched:
            value = metrics.get(key)
            if value is None or math.isfinite(value):
                continue
            if key == "grad_norm" and skipped:
                continue  # GradScaler found the overflow and skipped the update: the weights are untouched
            # Trainer can log a broken step's loss as 0.0, so show it: a 0.0 there is not proof of health.
            logged_loss = f" (loss logged {metrics['loss']})" if key != "loss" and "loss" in metrics else ""
            return Verdict(Status.DIVERGED, f"{key} is {value} at step {step}{logged_loss}", step, "non_finite")
        return None

    def _skipped_steps(self, step: int, skipped: bool) -> Verdict | None:
        self._skipped_streak = self._skipped_streak + 1 if skipped else 0
        if self._skipped_streak <= self.settings.max_skipped_steps:
            return None
        reason = (
            f"step_skipped is 1.0 for {self._skipped_streak} steps in a row at step {step} "
            f"(at most {self.settings.max_skipped_steps} tolerated): fp16 gradients overflow every step"
        )
        return Verdict(Status.DIVERGED, reason, step, "skipped_steps")

    def _loss_scale_collapse(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        scale = metrics.get("loss_scale")
        if scale is None or scale >= self.settings.min_loss_scale:
            return None
        reason = f"loss_scale is {scale} at step {step}, below {self.settings.min_loss_scale}: fp16 GradScaler collapsed"
        return Verdict(Status.DIVERGED, reason, step, "loss_scale_collapse")

    def _loss_explosion(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        loss = metrics.get("loss")
        if loss is None:
            return None
        settings = self.settings
        # GRPO loss is often exactly 0 and can be negative, so compare magnitudes against a floored scale.
        if self._loss_baseline:
            baseline = statistics.median(abs(value) for value in self._loss_baseline)
            scale = max(baseline, settings.loss_baseline_floor)
            complete = len(self._loss_baseline) >= settings.baseline_steps
            factor = settings.loss_explosion_factor if complete else settings.early_loss_explosion_factor
            if abs(loss) > factor * scale:
                of = "the trial's baseline loss scale" if complete else "the loss scale of its first steps"
                reason = f"loss is {loss:g} at step {step}, over {factor:g}x {of} {scale:g}"
                return Verdict(Status.DIVERGED, reason, step, "loss_explosion")
        if len(self._loss_baseline) < settings.baseline_steps:
            self._loss_baseline.append(loss)
        return None

    def _grad_explosion(self, step: int, metrics: dict[str, float], skipped: bool) -> Verdict | None:
        grad_norm = metrics.get("grad_norm")
        if grad_norm is None or skipped:
            return None
        settings = self.settings
        if len(self._grad_baseline) < settings.baseline_steps:
            # Zero grad norms stay out of the baseline: a zero median would make any gradient an "explosion".
            if grad_norm > 0.0:
                self._grad_baseline.append(grad_norm)
            return None
        median = statistics.median(self._grad_baseline)
        if grad_norm <= settings.grad_explosion_factor * median:
            self._clipped_explosion_streak = 0
            return None
        clipped = self.max_grad_norm is not None and grad_norm > self.max_grad_norm
        self._clipped_explosion_streak = self._clipped_explosion_streak + 1 if clipped else 0
        if clipped and self._clipped_explosion_streak < settings.clipped_explosion_steps:
            return None
        reason = (f"grad_norm is {grad_norm:g} at step {step}, over {settings.grad_explosion_factor:g}x "
                  f"the trial's baseline median {median:g}")
        if clipped:
            reason += (f" for {self._clipped_explosion_streak} steps in a row (clipped to {self.max_grad_norm:g}, "
                       "but still exploding)")
        return Verdict(Status.DIVERGED, reason, step, "grad_explosion")

    def _zero_grad(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        grad_norm = metrics.get("grad_norm")
        # A GRPO step whose groups all got equal rewards has zero advantages and so zero gradient;
        # that is the zero_reward_std rule's to judge, with its own patience.
        if grad_norm is None or _has_no_reward_spread(metrics):
            return None
        self._zero_grad_streak = self._zero_grad_streak + 1 if grad_norm == 0.0 else 0
        if self._zero_grad_streak < self.settings.zero_grad_steps:
            return None
        if self._loss_solved(metrics):
            if not any(note.startswith("loss reached") for note in self.notes):
                self.notes.append(f"loss reached {metrics['loss']:.3g} (from {self._loss_baseline[0]:.3g}) with zero "
                                  f"gradients from step {step - self._zero_grad_streak + 1}: the task is solved")
            return None
        reason = (
            f"grad_norm is 0.0 for {self._zero_grad_streak} steps in a row at step {step}: "
            "no gradient reaches the trainable parameters"
        )
        return Verdict(Status.COLLAPSED, reason, step, "zero_grad")

    def _loss_solved(self, metrics: dict[str, float]) -> bool:
        """The loss fell to ~0 (under 1% of its first steps): gradients vanish because nothing is left to learn."""
        loss = metrics.get("loss")
        return (self._learns_on_loss and loss is not None and len(self._loss_baseline) >= 1
                and abs(loss) <= 0.01 * statistics.median(abs(v) for v in self._loss_baseline))

    def _zero_reward_std(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        reward = metrics.get("reward")
        reward = reward if reward is not None and math.isfinite(reward) else None
        self._anchored = self._anchored or metrics.get("kl") is not None
        if not _has_no_reward_spread(metrics):
            self._zero_reward_std_rewards = []
            self._saturated_since = self._thin_since = None
            if reward is not None:
                self._rewards.append(reward)
            return None
        self._zero_reward_std_rewards.append(reward if reward is not None else math.nan)
        streak = self._zero_reward_std_rewards
        if len(streak) < zero_reward_std_patience(self.settings, self.run_steps):
            return None
        before = self._rewards[: self.settings.baseline_steps]
        start = statistics.median(before) if before else None
        level = statistics.fmean(streak)
        # Solved, not collapsed: every group's completions share one reward, about the best the trial has seen
        # (within saturation_min_gain: one group held below the others, at 0.92 beside 1.0, is still solved) and
        # clearly above where it started.
        if (start is not None and math.isfinite(level)
                and level >= max(self._rewards) - self.settings.saturation_min_gain
                and level - start >= self.settings.saturation_min_gain):
            if self._saturated_since is None:
                self._saturated_since = step - len(streak) + 1
                self.notes.append(
                    f"reward saturated: {level:.3g} (from {start:.3g}) for every completion of every group "
                    f"from step {self._saturated_since} (frac_reward_zero_std = 1): the task is solved")
            return None
        # Anchored, and the reward rose: not stuck. A KL penalty to the reference (beta > 0) pulls a policy that has
        # turned deterministic back toward the reference's spread, so no-spread streaks come and go around a steady
        # share, where without it the share climbs to 1 and the gradient is 0 for good. The tiny pretrained model's
        # GRPO picks (fp32, dapo, lr 4e-5 and 7.6e-5; docs/horizon.md): with beta 0 the share of groups without
        # spread reached 0.97 and the guard stopped all 5 runs at steps 1097-1451; the same configs with beta 0.04
        # held the share at 0.82-0.88 through 1,500-4,500 steps, their reward still rising, with streaks up to 11
        # steps. An anchored run whose reward never rose still stops: no spread, nothing learned.
        if (self._anchored and start is not None and math.isfinite(level)
                and level - start >= self.settings.saturation_min_gain):
            if self._thin_since is None:
                self._thin_since = step - len(streak) + 1
                self.notes.append(
                    f"reward spread thin: no group had any for {len(streak)} steps in a row from step "
                    f"{self._thin_since}, with the reward at {level:.3g} (from {start:.3g}); the KL penalty (beta > 0) "
                    "keeps pulling the policy toward the reference's spread, so the run goes on")
            return None
        reason = (
            f"frac_reward_zero_std is 1.0 for {len(streak)} steps in a row at step {step}"
            f"{_reward_words(level, start, max(self._rewards, default=None), self.settings.saturation_min_gain)}: "
            "every group's completions got equal rewards, so GRPO has no learning signal"
        )
        return Verdict(Status.COLLAPSED, reason, step, "zero_reward_std")

    def _no_update(self, step: int, metrics: dict[str, float], skipped: bool) -> Verdict | None:
        # Steps that rightly leave the weights alone do not use up the patience: a GradScaler skip, a GRPO
        # step with no reward spread (zero advantages), a zero gradient (the zero_grad rule's), a zero learning
        # rate (warm-up's first step). The learning rate logged at a step is the next step's, so both count.
        learning_rate = metrics.get("learning_rate")
        idle = (skipped or _has_no_reward_spread(metrics) or metrics.get("grad_norm") == 0.0
                or learning_rate == 0.0 or self._last_learning_rate == 0.0)
        if learning_rate is not None:
            self._last_learning_rate = learning_rate
        if not idle:
            self._effective_steps += 1
        if metrics.get("params_changed") != 0.0 or self._effective_steps < self.settings.no_update_steps:
            return None
        reason = (
            f"params_changed is 0.0 at step {step}: no trainable parameter has moved after "
            f"{self._effective_steps} steps with a gradient and a learning rate (updates smaller than the "
            "weights' precision, e.g. a small learning rate on bf16/fp16 weights, or LoRA target modules "
            "that match none of the model's layers)"
        )
        return Verdict(Status.COLLAPSED, reason, step, "no_update")


def zero_reward_std_patience(settings: GuardSettings, run_steps: int | None) -> int:
    """How many steps in a row without reward spread stop a run of ``run_steps``: ``zero_reward_std_steps`` up to
    ``zero_reward_std_run`` steps, one more for each doubling beyond.

    Why: a healthy GRPO run whose steps each have no spread with probability p (a policy sure of most answers, 4
    groups a step) hits a streak of k somewhere in n steps with probability about n * p**k * (1 - p). Kept at
    its 20-step value for any n, k must grow by log(n / 20) / log(1 / p): one step per doubling holds it for every
    p <= 0.5 (p = 0.5: 0.31 for 20 steps at k = 5, 0.29 for 600 at k = 10; p = 0.3: 0.034 and 0.002). A real collapse
    stays collapsed: it is stopped a few steps later, never missed. The guard's other streak rules (zero grad
    norms, skipped steps, clipped explosions, no update) count events a healthy run almost never has (none in the
    steady and 600-step histories of tests/verdicts), so their patience keeps one value."""
    base = settings.zero_reward_std_steps
    if not run_steps or run_steps <= settings.zero_reward_std_run:
        return base
    return base + math.ceil(math.log2(run_steps / settings.zero_reward_std_run))


def _reward_words(level: float, start: float | None, best: float | None, tolerance: float) -> str:
    """What the reward did before the streak, in words that say it: "has not risen" only when it has not."""
    if start is None or not math.isfinite(level):
        return ""
    if level - start < tolerance:
        return f" and the reward has not risen ({level:.3g}, {start:.3g} at the start)"
    # risen, yet not solved: a reward at its best the saturation rule calls solved before this line is reached
    below = f" but below its best {best:.3g}" if best is not None and best - level >= tolerance else ""
    return f" with the reward at {level:.3g}, up from {start:.3g} at the start{below}"


def _has_no_reward_spread(metrics: dict[str, float]) -> bool:
    """GRPO logs the share of groups whose completions all got the same reward; 1.0 means no learning signal."""
    return metrics.get("frac_reward_zero_std") == 1.0


def first_verdict(
    entry: Adapter, steps: list[dict], grad_scaler: bool = False, settings: GuardSettings | None = None,
    max_grad_norm: float | None = None,
) -> Verdict | None:
    """Replay a recorded sequence (the rows the monitor writes: a "step" key plus metrics) through a Guard."""
    guard = Guard(entry, grad_scaler, settings, max_grad_norm=max_grad_norm)
    for record in steps:
        metrics = {key: value for key, value in record.items() if key != "step"}
        verdict = guard.observe(record["step"], metrics)
        if verdict is not None:
            return verdict
    return None
