"""The stability guard: watches one trial's per-optimizer-step metrics and names the first step it broke.

Pure logic over numbers (no torch, no transformers), so it is tested on recorded metric sequences
without training anything; the TrainerCallback that feeds it lives with the trial runner.

    guard = Guard("grpo")
    for step, metrics in enumerate(logged_metrics, start=1):
        verdict = guard.observe(step, metrics)
        if verdict is not None:
            print(verdict.status, verdict.reason)  # "diverged" or "collapsed", then one line why
            break

Each rule answers a failure seen in real TRL use (the table in DESIGN.md).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = ["TRAINERS", "GuardSettings", "Verdict", "Guard", "first_verdict"]

TRAINERS = ("grpo", "dpo", "kto", "reward", "sft")

# Metrics computed from the model's outputs: NaN/inf in any of them means the forward pass already broke,
# even when the logged loss looks fine. Prefixes, because TRL names them per reward function and variant.
_OUTPUT_METRIC_PREFIXES = ("reward", "logps/", "logits/", "margin", "accuracy", "mean_reward", "kl", "entropy")


@dataclass(frozen=True)
class GuardSettings:
    """Thresholds of the guard; the defaults fire on the failures in DESIGN.md, not on ordinary noise."""

    # The first finite values set the trial's own loss and grad-norm scale; a median of 3 outvotes one odd step.
    baseline_steps: int = 3
    # Noisy training moves the loss 2-3x; 20x its own scale is a blow-up.
    loss_explosion_factor: float = 20.0
    # The loss scale never drops below this, so GRPO's exactly-0 loss cannot make every loss an "explosion".
    loss_baseline_floor: float = 1.0
    # Grad norms swing 10x in healthy early steps; 100x the baseline median is a blow-up.
    grad_explosion_factor: float = 100.0
    # One exactly-zero grad norm can be a fluke; several in a row means no gradient flows back.
    zero_grad_steps: int = 3
    # GRPO on a hard task may see equal rewards in every group for a few steps before it finds any spread.
    zero_reward_std_steps: int = 5
    # fp16 mixed: GradScaler halves its scale per skip, so a few skips find a working scale; a long run means
    # every step overflows.
    max_skipped_steps: int = 5
    # fp16 mixed: a GradScaler scale below 1 shrinks gradients instead of protecting them from underflow.
    min_loss_scale: float = 1.0
    # By this step some trainable parameter must have moved, or the optimizer is updating nothing.
    no_update_steps: int = 3

    def __post_init__(self) -> None:
        for name in ("baseline_steps", "zero_grad_steps", "zero_reward_std_steps", "no_update_steps"):
            _check_setting(self, name, lambda value: value >= 1, "at least 1")
        _check_setting(self, "max_skipped_steps", lambda value: value >= 0, "at least 0")
        for name in ("loss_explosion_factor", "grad_explosion_factor"):
            _check_setting(self, name, lambda value: value > 1.0, "greater than 1.0")
        _check_setting(self, "loss_baseline_floor", lambda value: value > 0.0, "greater than 0.0")
        _check_setting(self, "min_loss_scale", lambda value: value >= 0.0, "at least 0.0")


def _check_setting(settings: GuardSettings, name: str, is_valid, rule: str) -> None:
    value = getattr(settings, name)
    if not is_valid(value):
        raise ValueError(f"{name} must be {rule}, but got {name}={value!r}.")


@dataclass(frozen=True)
class Verdict:
    """Why and where a trial stopped being worth training."""

    status: str  # "diverged" (numbers blew up) or "collapsed" (numbers fine, nothing is learned)
    reason: str  # one human line naming the metric, its value and the step
    step: int  # the 1-based optimizer step (global_step) the guard fired at
    signal: str  # short machine key, e.g. "non_finite", "grad_explosion", "zero_grad"


class Guard:
    """Feed it each optimizer step's logged metrics; it returns a Verdict the first step something is wrong."""

    def __init__(self, trainer: str, fp16_mixed: bool = False, settings: GuardSettings | None = None):
        if trainer not in TRAINERS:
            raise ValueError(f"trainer must be one of {', '.join(TRAINERS)}, but got {trainer=}.")
        self.trainer = trainer
        self.fp16_mixed = fp16_mixed
        self.settings = settings if settings is not None else GuardSettings()
        self.verdict: Verdict | None = None
        self._loss_baseline: list[float] = []
        self._grad_baseline: list[float] = []
        self._skipped_streak = 0
        self._zero_grad_streak = 0
        self._zero_reward_std_streak = 0

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
                or self._no_update(step, metrics)
            )
        return self.verdict

    def _is_skipped(self, step: int, metrics: dict[str, float]) -> bool:
        if not self.fp16_mixed:
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
            return Verdict("diverged", f"{key} is {value} at step {step}{logged_loss}", step, "non_finite")
        return None

    def _skipped_steps(self, step: int, skipped: bool) -> Verdict | None:
        self._skipped_streak = self._skipped_streak + 1 if skipped else 0
        if self._skipped_streak <= self.settings.max_skipped_steps:
            return None
        reason = (
            f"step_skipped is 1.0 for {self._skipped_streak} steps in a row at step {step} "
            f"(at most {self.settings.max_skipped_steps} tolerated): fp16 gradients overflow every step"
        )
        return Verdict("diverged", reason, step, "skipped_steps")

    def _loss_scale_collapse(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        scale = metrics.get("loss_scale")
        if scale is None or scale >= self.settings.min_loss_scale:
            return None
        reason = f"loss_scale is {scale} at step {step}, below {self.settings.min_loss_scale}: fp16 GradScaler collapsed"
        return Verdict("diverged", reason, step, "loss_scale_collapse")

    def _loss_explosion(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        loss = metrics.get("loss")
        if loss is None:
            return None
        # GRPO loss is often exactly 0 and can be negative, so compare magnitudes against a floored scale.
        if self._loss_baseline:
            baseline = statistics.median(abs(value) for value in self._loss_baseline)
            scale = max(baseline, self.settings.loss_baseline_floor)
            if abs(loss) > self.settings.loss_explosion_factor * scale:
                reason = (
                    f"loss is {loss:g} at step {step}, over {self.settings.loss_explosion_factor:g}x "
                    f"the trial's baseline loss scale {scale:g}"
                )
                return Verdict("diverged", reason, step, "loss_explosion")
        if len(self._loss_baseline) < self.settings.baseline_steps:
            self._loss_baseline.append(loss)
        return None

    def _grad_explosion(self, step: int, metrics: dict[str, float], skipped: bool) -> Verdict | None:
        grad_norm = metrics.get("grad_norm")
        if grad_norm is None or skipped:
            return None
        if self._grad_baseline:
            median = statistics.median(self._grad_baseline)
            if grad_norm > self.settings.grad_explosion_factor * median:
                reason = (
                    f"grad_norm is {grad_norm:g} at step {step}, over {self.settings.grad_explosion_factor:g}x "
                    f"the trial's baseline median {median:g}"
                )
                return Verdict("diverged", reason, step, "grad_explosion")
        # Zero grad norms stay out of the baseline: a zero median would make any gradient an "explosion".
        if grad_norm > 0.0 and len(self._grad_baseline) < self.settings.baseline_steps:
            self._grad_baseline.append(grad_norm)
        return None

    def _zero_grad(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        grad_norm = metrics.get("grad_norm")
        # A GRPO step whose groups all got equal rewards has zero advantages and so zero gradient;
        # that is the zero_reward_std rule's to judge, with its own patience.
        if grad_norm is None or self._has_no_reward_signal(metrics):
            return None
        self._zero_grad_streak = self._zero_grad_streak + 1 if grad_norm == 0.0 else 0
        if self._zero_grad_streak < self.settings.zero_grad_steps:
            return None
        reason = (
            f"grad_norm is 0.0 for {self._zero_grad_streak} steps in a row at step {step}: "
            "no gradient reaches the trainable parameters"
        )
        return Verdict("collapsed", reason, step, "zero_grad")

    def _has_no_reward_signal(self, metrics: dict[str, float]) -> bool:
        return self.trainer == "grpo" and metrics.get("frac_reward_zero_std") == 1.0

    def _zero_reward_std(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        if self.trainer != "grpo" or "frac_reward_zero_std" not in metrics:
            return None
        self._zero_reward_std_streak = self._zero_reward_std_streak + 1 if self._has_no_reward_signal(metrics) else 0
        if self._zero_reward_std_streak < self.settings.zero_reward_std_steps:
            return None
        reason = (
            f"frac_reward_zero_std is 1.0 for {self._zero_reward_std_streak} steps in a row at step {step}: "
            "every group's completions got equal rewards, so GRPO has no learning signal"
        )
        return Verdict("collapsed", reason, step, "zero_reward_std")

    def _no_update(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        if metrics.get("params_changed") != 0.0 or step < self.settings.no_update_steps:
            return None
        reason = (
            f"params_changed is 0.0 at step {step}: no trainable parameter has moved since step 0 "
            "(do the LoRA target modules match the model's layers?)"
        )
        return Verdict("collapsed", reason, step, "no_update")


def first_verdict(
    trainer: str, steps: list[dict], fp16_mixed: bool = False, settings: GuardSettings | None = None
) -> Verdict | None:
    """Replay a recorded sequence; each dict has a "step" key plus metrics. Convenience for tests/reports."""
    guard = Guard(trainer, fp16_mixed, settings)
    for record in steps:
        metrics = {key: value for key, value in record.items() if key != "step"}
        verdict = guard.observe(record["step"], metrics)
        if verdict is not None:
            return verdict
    return None
