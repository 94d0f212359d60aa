"""The thin TrainerCallback around the pure guard: collect each optimizer step's metrics, time it,
add what Trainer does not log (did the weights move? did the GradScaler skip?), ask the guard,
and stop training at the step it fires."""

from __future__ import annotations

import json
import time
from typing import Any

from transformers import TrainerCallback

from tuner.config.trainers import Adapter
from tuner.trial.signals import Signals, weight_sample
from tuner.verdicts.guard import Guard, GuardSettings

# Trainer's end-of-training summary arrives through on_log too; it is not a step.
_SUMMARY_KEYS = {"train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second"}


def step_skipped(flagged: bool, scale_before: float | None, scale_after: float) -> bool:
    """Whether the GradScaler skipped this optimizer step. accelerate's flag (``optimizer_step_was_skipped``) is
    False under a fused AdamW, transformers' default optimizer on CUDA, even when the kernel skipped the update
    (accelerate issue #4242): seen on an H100, 2026-11-27, a DPO trial in fp16-mixed whose scale halved from 65536
    at its step 8 with the flag False. GradScaler lowers its scale on every overflow it skips and on nothing else,
    so a lower scale is a skip whatever the flag says."""
    return flagged or (scale_before is not None and scale_after < scale_before)


class StepMonitor(TrainerCallback):
    def __init__(self, entry: Adapter, grad_scaler: bool, metrics_path=None, settings: GuardSettings | None = None,
                 fault=None, signals: Signals | None = None, stop_at: int | None = None):
        self.guard = Guard(entry, grad_scaler=grad_scaler, settings=settings)
        self.signals = signals  # early-warning readings on sampled steps (tuner.trial.signals); None: off
        self.settings = self.guard.settings
        self.history: list[dict[str, Any]] = []
        self.verdict = None
        self.trainer = None  # set after the trainer exists: the scaler lives on its accelerator
        self.fault = fault  # test hook: called with the step number at each step end
        self.stop_at = stop_at  # the trial's last step, when its trainer is configured for a longer schedule
        self._metrics_file = open(metrics_path, "a") if metrics_path else None
        self._pending: dict[str, Any] = {}
        self._initial: list[Any] | None = None  # a sample of the trainable weights at the start, until they move
        self.train_started_at = None
        self.step_times: list[tuple[int, float]] = []
        self._backoffs = 0  # the GradScaler's back-offs so far (a skipped step lowers its scale)
        self._scale: float | None = None  # the GradScaler's scale at the last step's end (at the start: its first)

    # -- weights moved? ----------------------------------------------------------------------

    def _params_changed(self, model, initial: list[Any]) -> float:
        now = weight_sample(model)
        changed = any(not a.equal(b) for a, b in zip(initial, now))
        if changed:
            self._initial = None  # moved once is enough: the no-update rule has its answer
        return 1.0 if changed else 0.0

    # -- callback events ---------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.train_started_at = time.perf_counter()
        scaler = getattr(getattr(self.trainer, "accelerator", None), "scaler", None)
        self._scale = float(scaler.get_scale()) if scaler is not None else None
        # The explosion rules tolerate a clipped spike: the guard needs the clipping the run really uses.
        self.guard.max_grad_norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        # the patience of a streak rule scales with the run's length: the steps it runs, not its schedule's
        self.guard.run_steps = min(filter(None, (state.max_steps, self.stop_at)), default=None)
        if model is not None:
            self._initial = weight_sample(model)
            if self.signals is not None:
                self.signals.attach(model)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.signals is not None:
            self.signals.begin_step(state.global_step + 1, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        self.step_times.append((step, time.perf_counter()))
        extra: dict[str, Any] = {}
        # Compared each step until the weights first move (steps that rightly leave them alone, such as
        # GradScaler skips or GRPO steps without reward spread, can delay that past the first steps).
        if self._initial is not None and model is not None:
            extra["params_changed"] = self._params_changed(model, self._initial)
        accelerator = getattr(self.trainer, "accelerator", None)
        scaler = getattr(accelerator, "scaler", None)
        if scaler is not None:
            scale = float(scaler.get_scale())
            skipped = step_skipped(bool(accelerator.optimizer_step_was_skipped), self._scale, scale)
            self._scale = scale
            self._backoffs += skipped
            extra["step_skipped"] = 1.0 if skipped else 0.0
            extra["loss_scale"] = scale
            extra["scale_backoffs"] = float(self._backoffs)
        if self.signals is not None:
            extra.update(self.signals.end_step(step, model))
        self._pending = extra
        if self.fault is not None:
            self.fault(step, model)
        if self.stop_at is not None and step >= self.stop_at:
            control.should_training_stop = True  # the first stop_at steps of a longer schedule: this step is logged

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if _SUMMARY_KEYS & logs.keys() or not ({"loss", "grad_norm"} & logs.keys()):
            return
        step = state.global_step
        row = {"step": step, **{k: _number(v) for k, v in logs.items() if _number(v) is not None}, **self._pending}
        if "reward_std" in row and getattr(args, "num_generations", None):
            # How many completions, in how many prompt groups, the step's mean reward averages over: the
            # learning test's power (tuner.verdicts.learning) comes from this and the step's reward spread.
            completions = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            row["reward_count"] = float(completions)
            row["reward_groups"] = float(completions // args.num_generations)
        if self.step_times and self.train_started_at is not None:
            # the step's end, in seconds since training began: throughput while the trial runs (tuner.search._execution)
            row["train_seconds"] = round(self.step_times[-1][1] - self.train_started_at, 4)
        self._pending = {}
        self.history.append(row)
        if self._metrics_file:
            self._metrics_file.write(json.dumps(row, allow_nan=True) + "\n")
            self._metrics_file.flush()
        verdict = self.guard.observe(step, row)
        if verdict is not None and self.verdict is None:
            self.verdict = verdict
            control.should_training_stop = True

    def close(self):
        if self.signals is not None:
            self.signals.detach()
        if self._metrics_file:
            self._metrics_file.close()
            self._metrics_file = None


def _number(value):
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "item"):
        try:
            return float(value.item())
        except (TypeError, ValueError):
            return None
    return None
