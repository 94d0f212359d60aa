"""Reading one trial's per-step log the same way for the anchor and for tuner.

A step is non-finite when its logged loss or grad_norm is NaN or infinite. Trainer's default
nan/inf filter rewrites a NaN loss (the anchor logs 0.0 there), so grad_norm is what gives
the anchor's broken steps away; tuner logs with the filter off, so both show.
"""

from __future__ import annotations

import math
from typing import Any

WATCHED = ("loss", "grad_norm")


def first_nonfinite_step(history: list[dict[str, Any]]) -> int | None:
    """The first optimizer step whose loss or grad_norm is NaN/inf, or None."""
    for row in history:
        for key in WATCHED:
            value = row.get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                return int(row["step"])
    return None


def wasted_steps(history: list[dict[str, Any]], steps_run: int) -> int:
    """Optimizer steps run after the first non-finite step (0 when none went non-finite)."""
    first = first_nonfinite_step(history)
    return 0 if first is None else max(0, steps_run - first)


def last_value(history: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in history if isinstance(row.get(key), (int, float))]
    return values[-1] if values else None
