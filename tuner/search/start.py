"""How a search starts: cold, from the user's own config (``--from``), or warm from earlier searches (``--warm-start``).

    start = starts(here, warm=..., source=..., first=..., origins=...)   # tuner.search._prepare builds it
    start.first_points(grid=False)   # points the sampler runs first, in order
    start.phases(setup)              # (ahead of the sampler, after confirmation): the phases it adds to the loop
    start.finish(ended, best, config)  # what it changes of the pick, and what it adds to search.json

Every search is one of three starts, or a --from search that also warm-starts (``Starts``, both in that order):

    ColdStart   the shipped space, the sampler's own first trials; its identity (``here``) tagged on its run, so
                that a later search can warm-start from it
    FromConfig  the user's TRL config: its environment set for every trial, trial 0 runs it as written (alone, never
                pruned), its single changes next in the order its verdict calls for (tuner.search._neighbours), the
                faster trial measured again beside it (tuner.search._remeasure), and the answer is their file with
                the fewest changes (tuner.report.fix)
    WarmStart   earlier searches of this model and hardware (tuner.search._warm): their picks run first and are
                confirmed beside their own trials, their trials told to the sampler, and the search goes back to the
                default trials when nothing they found holds here (tuner.search._warm_fallback)

The loop (tuner.search.loop) asks the start, never which start it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.records import TrialRecord

if TYPE_CHECKING:
    from tuner.config.space import SearchSpace
    from tuner.config.trl_config import SourceConfig
    from tuner.report.progress import Progress
    from tuner.search._confirm import Schedule
    from tuner.search._sampling import Proposer
    from tuner.search._warm import Here
    from tuner.search._warm import WarmStart as Warm
    from tuner.search.ledger import Ledger, Phase
    from tuner.stores.run_writer import SearchTracker

__all__ = ["ColdStart", "Ended", "FromConfig", "Setup", "Start", "Starts", "WarmStart", "starts"]


@dataclass
class Setup:
    """What a start's phases are built from (tuner.search.loop.phases_of)."""

    schedule: Schedule  # confirmation: its runs, seeds and candidates (its base_spec and timeout, the trials')
    ledger: Ledger
    proposer: Proposer
    tracker: SearchTracker
    progress: Progress  # progress.say: the search's lines
    n_trials: int  # the search's planned trials


@dataclass
class Ended:
    """A finished search's runs, as its start's ``finish`` reads them."""

    records: list[TrialRecord]  # its trials, by number
    confirmations: list[TrialRecord]
    remeasures: list[TrialRecord]


class Start:
    """The hooks a start answers; each says what it adds to a search, and adds nothing here."""

    here: Here | None = None  # who this search is, for a later search's warm start (tuner.search._warm)
    first_alone = False  # trial 0 runs alone first: the trials after it follow from its verdict
    confirm_ahead = 1  # candidates whose confirmation runs may go out before every trial has ended

    def set_env(self) -> None:
        """Set before Ray and the trial launcher start: every trial inherits it."""

    def first_points(self, grid: bool) -> list[dict[str, Any]]:
        """Params the sampler runs first, in order (a grid holds them already: ``grid``)."""
        return []

    def priors(self) -> list[TrialRecord]:
        """Earlier trials told to the sampler before its first ask."""
        return []

    def known(self) -> Sequence[TrialRecord]:
        """Trials whose speeds count as measured here (the speed stage is skipped: tuner.search._staging)."""
        return ()

    def after_first(self, space: SearchSpace, n_trials: int) -> Callable[[TrialRecord], Iterable[dict[str, Any]]] | None:
        """trial 0's record -> the params to run next."""
        return None

    def keep(self, n_trials: int) -> set[int]:
        """Trial numbers never stopped early (successive halving, the slow-trial stop)."""
        return set()

    def run_params(self) -> dict[str, Any]:
        """MLflow params of the search run it sets (over the options')."""
        return {}

    def tags(self) -> dict[str, str]:
        return self.here.tags() if self.here else {}

    def artifacts(self, space: SearchSpace) -> dict[str, str]:
        """The search run's artifacts it adds: name -> text."""
        return {}

    def opening_lines(self, space: SearchSpace) -> list[str]:
        """What the search says it starts from, after its first line."""
        return []

    def phases(self, setup: Setup) -> tuple[list[Phase], list[Phase]]:
        """(ahead of the sampler's next trial, after confirmation): the phases it adds to the loop."""
        return [], []

    def finish(self, ended: Ended, best: TrialRecord | None, config: dict[str, Any] | None
               ) -> tuple[TrialRecord | None, dict[str, Any] | None, dict[str, Any]]:
        """(the pick, the config the user runs, what it adds to search.json) once the search's runs have ended."""
        return best, config, {}


class ColdStart(Start):
    def __init__(self, here: Here | None = None) -> None:
        self.here = here


class FromConfig(Start):
    """--from: the user's TRL config. ``first``: trial 0, their config in the space's params (None on a grid, where it
    is the grid's first point and runs once like any other)."""

    def __init__(self, source: SourceConfig, first: dict[str, Any] | None, origins: list[str],
                 here: Here | None = None, narrowed_by: str | None = None) -> None:
        self.source, self.first, self.origins, self.here = source, first, origins, here
        self.narrowed_by = narrowed_by  # the --search-space that narrowed the space derived from their file
        self.first_alone = first is not None

    def set_env(self) -> None:
        self.source.set_env()

    def first_points(self, grid: bool) -> list[dict[str, Any]]:
        return [self.first] if self.first else []

    def after_first(self, space: SearchSpace, n_trials: int) -> Callable[[TrialRecord], Iterable[dict[str, Any]]] | None:
        from tuner.search import _neighbours

        first = self.first
        if first is None:
            return None

        def changes(record: TrialRecord) -> list[dict[str, Any]]:  # its single changes, as its verdict calls for
            return _neighbours.neighbours(space, first, record)[:_neighbours.neighbour_count(n_trials)]
        return changes

    def keep(self, n_trials: int) -> set[int]:
        from tuner.search import _neighbours

        return set(range(1 + _neighbours.neighbour_count(n_trials))) if self.first is not None else set()

    def run_params(self) -> dict[str, Any]:
        # its space is derived from the file again on --resume (tuner.search._resume): the param names only the
        # --search-space file that narrowed it
        return {"search_space": self.narrowed_by}

    def artifacts(self, space: SearchSpace) -> dict[str, str]:
        from tuner.config import trl_config

        # what the search started from, beside what it searched: their file as written, and the space around it
        return {"source_config.yaml": self.source.text, "space.yaml": trl_config.space_yaml(space)}

    def opening_lines(self, space: SearchSpace) -> list[str]:
        from tuner.config import trl_config

        return [f"from {self.source.path}: trial 0 runs it as written, on:", *(f"  {line}" for line in self.origins),
                "the space around it:", *(f"  {line}" for line in trl_config.space_yaml(space).splitlines()),
                *(f"note: {note}" for note in self.source.notes)]

    def phases(self, setup: Setup) -> tuple[list[Phase], list[Phase]]:
        from tuner.search._remeasure import Remeasure

        schedule = setup.schedule
        # the faster trial and theirs again, side by side, before their file is changed for speed
        speed = Remeasure(schedule.base_spec, schedule.timeout, wanted=self.first is not None,
                          announce=setup.progress.say)
        return [], [speed]

    def finish(self, ended: Ended, best: TrialRecord | None, config: dict[str, Any] | None
               ) -> tuple[TrialRecord | None, dict[str, Any] | None, dict[str, Any]]:
        from tuner.report import fix as fixes

        # their file with the fewest changes: the search's answer, or theirs as it is when it was already healthy
        fixed = fixes.answer(self.source, ended.records, best, ended.confirmations, ended.remeasures)
        fixed.inputs = list(self.origins)
        if fixed.healthy and best is None:
            best = next(r for r in ended.records if r.get("number") == 0)
        if fixed.exportable and fixed.text is not None:
            config = fixes.load_text(fixed.text)
        return best, config, {"source": self.source.to_dict(), "fix": fixed.to_dict()}


class WarmStart(Start):
    """--warm-start (on by default): what the search reuses of earlier searches (``warm``, tuner.search._warm)."""

    def __init__(self, warm: Warm, here: Here | None = None) -> None:
        self.warm, self.here = warm, here
        self.confirm_ahead = 2 if warm.picks else 1  # its earlier recommendation, then a trial that beats it here

    def first_points(self, grid: bool) -> list[dict[str, Any]]:
        return [] if grid else list(self.warm.picks)  # a grid holds them already

    def priors(self) -> list[TrialRecord]:
        return self.warm.to_tell()

    def known(self) -> Sequence[TrialRecord]:
        return self.warm.measured_here() if self.warm.speeds_reused else ()

    def keep(self, n_trials: int) -> set[int]:
        return set(self.warm.pick_numbers())

    def tags(self) -> dict[str, str]:
        return {**super().tags(), **self.warm.tags()}

    def opening_lines(self, space: SearchSpace) -> list[str]:
        return [self.warm.line, *(f"warm start: {note}" for note in self.warm.notes)]

    def phases(self, setup: Setup) -> tuple[list[Phase], list[Phase]]:
        from tuner.search._warm_fallback import ConfirmFirst, WarmFallback, warm_news

        warm = self.warm
        # a warm search whose earlier picks fail here, or that confirms nothing, goes back to the default trials it
        # had cut (_warm.fell_back)
        fallback = (WarmFallback(warm, setup.schedule, setup.ledger, setup.n_trials, setup.tracker, setup.progress)
                    if warm.trials else None)
        setup.proposer.on_told = warm_news(warm, setup.progress.say, setup.proposer, fallback)
        return [ConfirmFirst(warm, setup.schedule, fallback)], [fallback] if fallback else []


@dataclass
class Starts(Start):
    """Several starts in one search (a warm start and --from, in that order: the warm fallback decides on confirmation's
    verdicts before --from's speed pairs run): each hook asks them all, in order."""

    parts: list[Start] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.here = next((part.here for part in self.parts if part.here), None)
        self.first_alone = any(part.first_alone for part in self.parts)
        self.confirm_ahead = max((part.confirm_ahead for part in self.parts), default=1)

    def set_env(self) -> None:
        for part in self.parts:
            part.set_env()

    def first_points(self, grid: bool) -> list[dict[str, Any]]:
        # trial 0 is the one that runs alone first (--from's config), whatever else the search starts from
        ordered = sorted(self.parts, key=lambda part: not part.first_alone)
        return [point for part in ordered for point in part.first_points(grid)]

    def priors(self) -> list[TrialRecord]:
        return [record for part in self.parts for record in part.priors()]

    def known(self) -> Sequence[TrialRecord]:
        return [record for part in self.parts for record in part.known()]

    def after_first(self, space: SearchSpace, n_trials: int) -> Callable[[TrialRecord], Iterable[dict[str, Any]]] | None:
        return next((hook for part in self.parts if (hook := part.after_first(space, n_trials)) is not None), None)

    def keep(self, n_trials: int) -> set[int]:
        return set().union(*(part.keep(n_trials) for part in self.parts))

    def run_params(self) -> dict[str, Any]:
        return {k: v for part in self.parts for k, v in part.run_params().items()}

    def tags(self) -> dict[str, str]:
        return {k: v for part in self.parts for k, v in part.tags().items()}

    def artifacts(self, space: SearchSpace) -> dict[str, str]:
        return {k: v for part in self.parts for k, v in part.artifacts(space).items()}

    def opening_lines(self, space: SearchSpace) -> list[str]:
        return [line for part in self.parts for line in part.opening_lines(space)]

    def phases(self, setup: Setup) -> tuple[list[Phase], list[Phase]]:
        ahead: list[Phase] = []
        after: list[Phase] = []
        for part in self.parts:
            a, b = part.phases(setup)
            ahead, after = [*ahead, *a], [*after, *b]
        return ahead, after

    def finish(self, ended: Ended, best: TrialRecord | None, config: dict[str, Any] | None
               ) -> tuple[TrialRecord | None, dict[str, Any] | None, dict[str, Any]]:
        added: dict[str, Any] = {}
        for part in self.parts:
            best, config, more = part.finish(ended, best, config)
            added.update(more)
        return best, config, added


def starts(here: Here | None, warm: Warm | None = None, source: SourceConfig | None = None,
           first: dict[str, Any] | None = None, origins: Sequence[str] = (), narrowed_by: str | None = None) -> Start:
    """The start of a search as tuner.search._prepare found it: --from's file (``source``, trial 0 ``first``, the
    --search-space that narrowed its space), what it reuses of earlier searches (``warm``, empty when none apply), or
    neither."""
    parts: list[Start] = []
    if warm:
        parts.append(WarmStart(warm, here))
    if source is not None:
        parts.append(FromConfig(source, first, list(origins), here, narrowed_by))
    if not parts:
        return ColdStart(here)
    return parts[0] if len(parts) == 1 else Starts(parts)
