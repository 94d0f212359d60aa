"""A --from search's single changes: trial 0 (the user's config) with one searched knob changed, tried before any
combination of them, in the order trial 0's verdict calls for.

    neighbours(space, first, record)[:neighbour_count(n_trials)]   # enqueued after trial 0 finishes
"""

from __future__ import annotations

import math
from typing import Any

from tuner.config.space import CategoricalParam, FloatParam, SearchSpace
from tuner.config.trl_config import LR_DOWN, LR_UP, SPEED_KNOBS
from tuner.records import Status, TrialRecord

__all__ = ["NEIGHBOUR_SHARE", "NOT_LEARNING_ORDER", "UNSTABLE_ORDER", "neighbour_count", "neighbours"]


# The order single changes are tried in, by what trial 0 (their config) did. Unstable: the precision and the step
# size downwards first (the commonest causes of a config that breaks outright), then GRPO's sampling temperature,
# the loss variant, clipping, warm-up, the batch split, LoRA. Stable but not learning: the step size upwards first.
# Stable and learning: only the knobs that change tokens/s.
UNSTABLE_ORDER = ("precision", "learning_rate", "temperature", "loss_type", "max_grad_norm", "warmup_steps",
                  "per_device_train_batch_size", "lora_r", "lora_alpha", "use_peft")
NOT_LEARNING_ORDER = ("learning_rate", "use_peft", "temperature", "loss_type", "lora_alpha", "lora_r", "warmup_steps",
                      "max_grad_norm", "precision", "per_device_train_batch_size")
NEIGHBOUR_SHARE = 2 / 3  # of the trials after trial 0 spent on single changes; the sampler draws the rest


def _sig(value: float) -> float:
    return float(f"{value:.2g}")


def neighbours(space: SearchSpace, first: dict[str, Any], record: TrialRecord) -> list[dict[str, Any]]:
    """Trial 0 with one searched param changed, each alternative once, taken round-robin (the first alternative of
    every param, then the second ...) in the order trial 0's ``record`` calls for: the smallest changes, tried
    before any combination of them."""
    ok, learned = record.get("status") == Status.OK, bool(record.get("learned"))
    order: tuple[str, ...]
    factors: tuple[float, ...]  # the learning rate's changes to try
    if ok and learned:
        order, factors = SPEED_KNOBS, ()
    elif ok or record.get("status") == Status.COLLAPSED:
        order, factors = NOT_LEARNING_ORDER, (LR_UP, 3.0, 1 / 3)
    else:
        order, factors = UNSTABLE_ORDER, (1 / LR_DOWN, 1 / 3, 3.0)
    options: list[list[dict[str, Any]]] = []
    for name in order:
        if name not in space.params or name not in first:
            continue
        param, mine = space.params[name], first[name]
        values: list[Any]
        if isinstance(param, FloatParam):
            values = [v for v in (_sig(mine * f) for f in factors) if param.low <= v <= param.high and v != mine]
        elif isinstance(param, CategoricalParam):
            values = [c for c in param.choices if c != mine]
        else:
            values = []
        options.append([{**first, name: v} for v in values])
    out = []
    for round_ in range(max((len(o) for o in options), default=0)):
        out += [o[round_] for o in options if round_ < len(o)]
    return out


def neighbour_count(n_trials: int) -> int:
    """How many of a search's trials after trial 0 are single changes (NEIGHBOUR_SHARE of them)."""
    return math.ceil((n_trials - 1) * NEIGHBOUR_SHARE)
