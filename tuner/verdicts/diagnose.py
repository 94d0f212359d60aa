"""Failures that do not depend on the config: the user's to fix, not the search's to repeat.

    systematic_failure(records)   # "the first 3 trials all crashed the same way: ValueError: ... (my_rewards.py:4 in
                                  #  score); the config does not change it: fix it and search again", or None

The probe (tuner.inputs.probe) catches most of these before any trial: a reward that raises, returns NaN or the wrong
number of rewards on a few rows, data the trainer rejects. What only shows in training (a reward that raises
on row 40, a tokenizer error on a long row) crashes every trial alike, whatever its params: once the first
``MIN_TRIALS`` finished trials, with different params, crashed with the same reason, the search stops.
"""

from __future__ import annotations

import re

from tuner.records import Status, TrialRecord

__all__ = ["MIN_TRIALS", "systematic_failure"]

MIN_TRIALS = 3  # identical crashes of this many different configs, and no trial that got past them

_NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")


def _kind(reason: str) -> str:
    """A crash reason with its numbers blanked: the same error at another step or size is the same error."""
    return _NUMBER.sub("N", reason or "").strip()


def systematic_failure(records: list[TrialRecord], min_trials: int = MIN_TRIALS) -> str | None:
    """Why the search should stop, when the first ``min_trials`` finished trials (by number) all crashed with the
    same reason although their params differ; None otherwise (some trial ran, or the crashes differ)."""
    first = sorted((r for r in records if "confirms" not in r), key=lambda r: r["number"])[:min_trials]
    # Raised errors only: a process killed by a signal or the clock (guard_signal "process_died") can depend on
    # the config, e.g. the out-of-memory killer.
    if len(first) < min_trials or any(r.get("status") != Status.CRASHED or r.get("guard_signal") for r in first):
        return None
    kinds = {_kind(r.get("reason", "")) for r in first}
    configs = {repr(sorted((r.get("params") or {}).items())) for r in first}
    if len(kinds) != 1 or len(configs) < 2 or not first[0].get("reason"):
        return None
    return (f"the first {min_trials} trials all crashed the same way with different params: {first[0]['reason']}; "
            "the config does not change it: fix it (your reward function, data or model) and search again")
