"""Longer rungs for the best stable trials when none has shown learning within ``--max-steps``.

    plan = Extension(base_spec, budget_steps=720, timeout=1800)
    plan.next(ledger, final=True)    # a job (a trial re-run at 3x its steps), WAIT, or None (nothing more)

``--max-steps`` is the first rung, not a wall: a pretrained model at TRL's default learning rates moves its
reward or loss slowly, and 20 steps rarely show it. Once every search trial has finished and none qualifies
(stable and learned, tuner.verdicts.recommend), the best third of the stable trials at the longest rung so far (those
closest to learning: the strongest evidence first, ``closest_to_learning``) are re-run with ``RATE`` times the
steps, the way successive halving's rungs go on upward (20 -> 60 -> 180), until one learns or the next run would overspend ``budget_steps`` (optimizer steps
of the longer runs, all together). A longer run starts again from step 0 with the same params and seed: the
trials keep no checkpoints (they would cost every trial disk and time to spare a few the first rung's steps).
Only after that is "nothing recommended" said. Confirmation then re-runs a candidate at its own length.

The best trial at risk (tuner.verdicts.forecast) gets a rung of its own, to confirm or clear the risk
(``risk_rung_steps``): the first steps of the long run the forecast looked to, not a short run of its own. Its
learning rate follows that run's schedule (TrialSpec.schedule_steps: a linear decay over 500 steps is still near
its peak at step 60, where a 60-step run's has decayed to nothing and hides what the long run meets), and it runs
past the projected failure, to twice its step. bench/horizon/horizon.py's recorded long runs are those rungs' ground
truth: a long run's first N steps are the rung of N steps, step for step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from tuner.records import TrialJob, TrialRecord, is_ok
from tuner.search.ledger import WAIT, Ledger
from tuner.stores.tags import EXTENDS_TAG, EXTENSION_TAG, RUN_NAME_TAG
from tuner.verdicts import recommend as rec
from tuner.verdicts.forecast import horizon_steps

if TYPE_CHECKING:
    from tuner.search._confirm import Schedule
    from tuner.trial import TrialSpec

__all__ = ["RATE", "WAIT", "Extension", "closest_to_learning", "default_budget", "risk_rung_steps"]

RATE = 3  # each rung is 3x the last, as successive halving's (tuner.search._execution.HALVING_RATE)
PAST_PROJECTION = rec.PROJECTED_EARLY  # a risk rung runs to twice the projected step: projections came early


def default_budget(trials: int, max_steps: int) -> int:
    """Three times the steps of the search's own trials: e.g. 12 trials of 20 steps leave 720 steps, enough for
    4 trials at 60 steps and then 2 at 180."""
    return 3 * trials * max_steps


def closest_to_learning(trial: TrialRecord) -> tuple[float, float]:
    """The order longer runs are chosen in: the strongest evidence of learning first (the learning test's p-value,
    tuner.verdicts.learning), then the learning speed so far. A slow learner's speed so far is mostly noise (its start is
    two noisy steps); its p-value weighs the gain against that noise: on the tiny pretrained model the fp32 trials
    that learn within 60 steps reach p ~0.03 in 20, where trials that cannot learn spread evenly over 0-1."""
    p_value = trial.get("progress_p_value")
    return (1.0 if p_value is None else float(p_value), -rec.speed_so_far(trial))


class Extension:
    """Which longer run a free trial slot gets next, once every search trial has finished (a Phase)."""

    def __init__(self, base_spec: TrialSpec, budget_steps: int, timeout: float,
                 announce: Callable[[str], None] = print, beside: Schedule | None = None) -> None:
        self.base_spec, self.budget, self.timeout, self.announce = base_spec, budget_steps, timeout, announce
        # confirmation (tuner.search._confirm): its runs of a rung still under way, for slots that would idle beside it
        self.beside = beside
        self.besides: set[tuple[int, int]] = set()  # (trial number, steps) of the rungs whose runs went beside them
        self.handed: set[tuple[int, int]] = set()  # (trial number, steps) of the runs handed out
        self.spent = 0  # steps of the rungs announced, all together
        self.rung = 0  # the steps of the rung under way
        self.queue: list[TrialRecord] = []  # its trials not yet handed out

    @property
    def most_runs(self) -> int:
        """The most runs next() can hand out: every run is at least RATE x the first rung's steps, each with its
        confirmation seeds beside it."""
        rungs = self.budget // (RATE * self.base_spec.max_steps) if self.budget > 0 else 0
        return rungs * (1 + (max(0, self.beside.seeds) if self.beside is not None else 0))

    def next(self, ledger: Ledger, final: bool) -> TrialJob | str | None:
        if not final:
            return None
        extensions = ledger.longer()
        runs = [*ledger.trials(), *extensions]
        if self.budget <= 0 or not runs:
            return None
        if any(rec.objective(r) > 0 for r in runs):
            return self._risk_rung(runs)  # some trial learned: a longer rung only for a best trial at risk

        if self.queue:  # the rung under way is handed out in full (its steps were counted when it was announced)
            return self._hand(self.queue.pop(0), self.rung)
        if running := self.handed - {(e["number"], e["max_steps"]) for e in extensions}:
            # a rung still running: the next one is chosen from all of its results; meanwhile a slot that would idle
            # confirms a run of it on other seeds
            return self._beside(runs, running) or WAIT
        longest = max(r["max_steps"] for r in runs)
        stable = [r for r in runs if r["max_steps"] == longest and is_ok(r)]
        best = sorted(stable, key=closest_to_learning)[:math.ceil(len(stable) / RATE)]
        steps = longest * RATE
        todo = [r for r in best if (r["number"], steps) not in self.handed]
        fits = min(len(todo), (self.budget - self.spent) // steps)
        if fits < 1:
            return None
        self.rung, self.queue = steps, todo[1:fits]
        self.spent += fits * steps
        self.announce(f"no stable trial has learned within {longest} steps: re-running the best {fits} "
                      f"(trials {', '.join(str(r['number']) for r in todo[:fits])}) for {steps} steps "
                      f"({self.spent} of a {self.budget}-step budget)")
        return self._hand(todo[0], steps)

    def _risk_rung(self, runs: list[TrialRecord]) -> TrialJob | str | None:
        """The best trial at risk (tuner.verdicts.forecast) re-run for RATE x its steps, to confirm or clear the
        risk; nothing when the best has no risk (confirmation's turn), a rung is still running, or it would
        overspend the budget."""
        ranking = rec.ranked(runs)
        if not ranking or not rec.at_risk(ranking[0]):  # none left (the risk came true on its rung), or a safe best
            return None
        best = ranking[0]
        if self.handed - {(e["number"], e["max_steps"]) for e in runs if e.get("extends") is not None}:
            return WAIT
        steps, schedule = risk_rung_steps(best)
        if steps <= best["max_steps"] or (best["number"], steps) in self.handed or self.spent + steps > self.budget:
            return None
        self.spent += steps
        self.announce(f"trial {best['number']} is the best so far but {best['risk']}: re-running it for {steps} steps "
                      f"of a {schedule}-step run's schedule to confirm or clear the risk ({self.spent} of a "
                      f"{self.budget}-step budget)")
        return self._hand(best, steps, schedule)

    def _beside(self, runs: list[TrialRecord], running: set[tuple[int, int]]) -> TrialJob | None:
        """A confirmation run of a rung still under way, for a free slot (None: none left). If the rung learns, its
        confirmation is under way when it ends, instead of starting then (on the tiny pretrained model a 180-step rung
        ran alone on one of 2 slots: 0.21 of the search's slot time idle, bench.studies.slots); if it does not, the
        run took a slot that was idle."""
        if self.beside is None:
            return None
        for number, steps in sorted(running, key=lambda rung: (-rung[1], rung[0])):
            trial = next((r for r in runs if r["number"] == number), None)
            if trial is None:
                continue
            rung = cast(TrialRecord, {**trial, "max_steps": steps, "schedule_steps": 0})
            job = self.beside.beside(rung)
            if job is not None:
                if (number, steps) not in self.besides:
                    self.besides.add((number, steps))
                    self.announce(f"trial {number}'s {steps}-step run leaves a slot free: confirming it on "
                                  f"{self.beside.seeds} more seeds beside it (they count if it learns)")
                return job
        return None

    def _hand(self, trial: TrialRecord, steps: int, schedule: int = 0) -> TrialJob:
        self.handed.add((trial["number"], steps))
        return job(self.base_spec, trial, steps, self.timeout * steps / self.base_spec.max_steps, schedule)


def risk_rung_steps(trial: TrialRecord) -> tuple[int, int]:
    """(steps, schedule) of the rung that confirms or clears ``trial``'s risk: the first steps of the run its forecast
    looked to (``schedule``: its own schedule's length if it already is such a rung, else horizon_steps of its
    steps), RATE x its steps or PAST_PROJECTION x the projected step, whichever is longer, at most the whole run."""
    schedule = int(trial.get("schedule_steps") or horizon_steps(trial["max_steps"]))
    projected = int(trial.get("risk_step") or 0)
    return min(max(RATE * trial["max_steps"], PAST_PROJECTION * projected), schedule), schedule


def job(base_spec: TrialSpec, trial: TrialRecord, steps: int, timeout: float, schedule: int = 0) -> TrialJob:
    """A trial's params and seed again, for ``steps`` steps (of a ``schedule``-step run's learning-rate schedule;
    0: its own)."""
    number = trial["number"]
    return TrialJob(spec=base_spec.job_spec(params=trial["params"], seed=trial["seed"], max_steps=steps,
                                            schedule_steps=schedule),
                    number=number, timeout=timeout,
                    tags={EXTENSION_TAG: "true", EXTENDS_TAG: str(number),
                          RUN_NAME_TAG: f"extend-{number:03d}-{steps}steps"},
                    extra={"extends": number, **({"schedule_steps": schedule} if schedule else {})})
