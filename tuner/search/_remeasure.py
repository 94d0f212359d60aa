"""Side by side: a healthy ``--from`` config is changed for speed only when the faster trial beats it again,
each pair of runs measured in the same stretch of time.

    check = Remeasure(base_spec, timeout, wanted=True)
    check.next(ledger, final=True)   # a job (the faster trial's params, or trial 0's, for the same steps and seed), or None

The search's trials are measured one at a time, each when its turn came: trial 0 alone first, the single changes
after it. A machine's load changes between them (other jobs, a test runner's other worker), and one short run each
ranks the load, not the config: in a fresh-clone suite, bf16 mixed precision on a CPU without native bf16 measured
1.2x its fp32 trial 0 (alone it runs at ~0.7x). So when a trial looks at least ``tuner.report.fix.SPEEDUP`` times
faster than a healthy trial 0, ``tuner.report.fix.PAIRS`` pairs re-run both (the faster trial's run first in each
pair), in slots side by side where the search runs two or more trials at once, and one after the other otherwise.
tuner.report.fix.answer then changes their file only when the faster config won every pair by that margin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tuner.records import TrialJob, TrialRecord
from tuner.search.ledger import Ledger
from tuner.stores.tags import REMEASURE_TAG, REMEASURES_TAG, RUN_NAME_TAG

if TYPE_CHECKING:
    from tuner.trial import TrialSpec

__all__ = ["Remeasure"]


class Remeasure:
    """Which speed re-run a free trial slot gets next, once every search trial has finished (a Phase)."""

    def __init__(self, base_spec: TrialSpec, timeout: float, wanted: bool,
                 announce: Callable[[str], None] = print) -> None:
        self.base_spec, self.timeout, self.wanted, self.announce = base_spec, timeout, wanted, announce
        self.queue: list[TrialJob] | None = None  # None: not decided yet

    @property
    def most_runs(self) -> int:
        from tuner.report.fix import PAIRS

        return 2 * PAIRS if self.wanted else 0

    def next(self, ledger: Ledger, final: bool) -> TrialJob | None:
        from tuner.report import fix

        if not self.wanted or not final:
            return None
        records = ledger.trials()
        if self.queue is None:
            first = next((r for r in records if r.get("number") == 0), None)
            faster = fix.speed_candidate(first, records)  # None when trial 0 is
            self.queue = [] if faster is None or first is None else [
                job(self.base_spec, trial, pair, self.timeout) for pair in range(fix.PAIRS) for trial in (faster, first)]
            if faster is not None and first is not None:
                looked = fix.speed_of(faster) / fix.speed_of(first)
                self.announce(f"trial {faster['number']} ran {looked:.1f}x as fast as your config: measuring both "
                              f"again side by side ({fix.PAIRS} pairs)")
        return self.queue.pop(0) if self.queue else None


def job(base_spec: TrialSpec, trial: TrialRecord, pair: int, timeout: float) -> TrialJob:
    """A trial's params, steps and seed again, as pair ``pair``'s run of it."""
    number, steps = trial["number"], trial.get("max_steps") or base_spec.max_steps
    return TrialJob(spec=base_spec.job_spec(params=trial["params"], seed=trial["seed"], max_steps=steps),
                    number=number, timeout=timeout * steps / base_spec.max_steps,
                    tags={REMEASURE_TAG: "true", REMEASURES_TAG: str(number),
                          RUN_NAME_TAG: f"speed-{number:03d}-pair{pair}"},
                    extra={"remeasures": number, "pair": pair}, keep=True)
