"""The ledger: every run of a search in one list, each with its kind and the trial it is of.

    ledger = Ledger(done)                 # a resumed search's trials so far
    ledger.told(record)                   # a search trial's outcome, as the sampler is told it
    ledger.add(record)                    # any run's record, as the driver logged it (run id and all)
    ledger.trials()                       # the sampler's trials, in the order they ended
    ledger.contenders()                   # trials, rungs and twins: what a pick is chosen from
    ledger.confirmations(), ledger.remeasures()

A search runs five kinds of run (``Kind``): the sampler's trials, and four kinds of follow-up of a trial ``of``: a
rung (the trial again, for longer: tuner.search._extend), an anchored twin (its config with a KL penalty, a trial
number of its own: tuner.search._anchor), a confirmation (the trial on another seed: tuner.search._confirm) and a
remeasure (the trial again, side by side with trial 0: tuner.search._remeasure). A record says which it is by the one
key its job set (``confirms``, ``extends``, ``anchors``, ``remeasures``: the trial's number; TrialJob.extra), as its
MLflow run does by tag (tuner.stores.tags): ``kind_of`` reads it, and nothing else in the loop needs to.

A search trial ends twice: Ray Tune tells the searcher first (the sampler learns its outcome at once, ``told``) and
the driver's callback then records its run (``add``: the same outcome with its MLflow run id, replacing the told one).
One entry either way.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.records import TrialJob, TrialRecord

__all__ = ["FINISHED", "FOLLOW_KEYS", "WAIT", "Kind", "Ledger", "Phase", "Run", "kind_of"]

WAIT = "wait"  # a phase has nothing to hand out now, but more may follow when the runs out there finish
FINISHED = "FINISHED"  # the search hands out nothing more (Ray Tune's Searcher.FINISHED)


class Kind(enum.StrEnum):
    TRIAL = "trial"  # proposed by the sampler
    RUNG = "rung"  # a trial again for more steps
    TWIN = "twin"  # a trial's config with the KL penalty on: a trial number of its own
    CONFIRMATION = "confirmation"  # a trial again on another seed
    REMEASURE = "remeasure"  # a trial again, side by side with trial 0


# The key a follow-up's record carries (its job's ``extra``), holding the number of the trial it is of.
FOLLOW_KEYS = {Kind.CONFIRMATION: "confirms", Kind.RUNG: "extends", Kind.TWIN: "anchors", Kind.REMEASURE: "remeasures"}


def kind_of(record: Mapping[str, Any]) -> Kind:
    return next((kind for kind, key in FOLLOW_KEYS.items() if key in record), Kind.TRIAL)


@dataclass
class Run:
    kind: Kind
    of: int  # the trial it is of: its own number for a search trial
    record: TrialRecord
    recorded: bool = True  # False: told to the sampler, not yet logged by the driver


class Ledger:
    """The runs of one search, in the order they ended."""

    def __init__(self, done: Iterable[TrialRecord] = (), planned: int = 0) -> None:
        self.runs: list[Run] = []
        self.planned = planned  # search trials the sampler hands out in this run (a warm fallback adds to it)
        self.running: dict[int, dict[str, Any]] = {}  # the search trials out now: number -> params
        for record in done:
            self.add(record)

    def told(self, record: TrialRecord) -> None:
        """A search trial's outcome as the sampler is told it, before the driver has logged its run."""
        self.runs.append(Run(Kind.TRIAL, int(record["number"]), record, recorded=False))

    def add(self, record: TrialRecord) -> Run:
        """A run's record as the driver logged it; a search trial's replaces its told outcome."""
        kind = kind_of(record)
        if kind is Kind.TRIAL:
            for run in self.runs:
                if not run.recorded and run.of == record["number"]:
                    run.record, run.recorded = record, True
                    return run
        fields: Mapping[str, Any] = record
        run = Run(kind, int(fields[FOLLOW_KEYS[kind]] if kind in FOLLOW_KEYS else record["number"]), record)
        self.runs.append(run)
        return run

    def of(self, *kinds: Kind) -> list[TrialRecord]:
        return [run.record for run in self.runs if run.kind in kinds]

    def trials(self) -> list[TrialRecord]:
        return self.of(Kind.TRIAL)

    def longer(self) -> list[TrialRecord]:
        """Rungs and twins: runs beyond the sampler's that compete with its trials for the pick."""
        return self.of(Kind.RUNG, Kind.TWIN)

    def contenders(self) -> list[TrialRecord]:
        """What the pick is chosen from: the trials, then rungs and twins."""
        return [*self.trials(), *self.longer()]

    def confirmations(self) -> list[TrialRecord]:
        return self.of(Kind.CONFIRMATION)

    def remeasures(self) -> list[TrialRecord]:
        return self.of(Kind.REMEASURE)


class Phase(Protocol):
    """One step of a search after (or ahead of) the sampler's trials: which run a free slot gets next.

    ``next`` answers from the ledger: a job (tuner.records.TrialJob), WAIT (nothing now; runs out there decide what
    comes next), or None (nothing from this phase: the next phase is asked). ``final``: every search trial has ended.
    ``most_runs``: the most jobs it can hand out in a search (Ray Tune's sample count is their sum)."""

    @property
    def most_runs(self) -> int: ...

    def next(self, ledger: Ledger, final: bool) -> TrialJob | str | None: ...
