"""Optuna: the sampler, asking for new params (no repeats), and how a trial's outcome is told. Pure Optuna:
the Ray Tune searcher that drives it is ``tuner.search._execution.OptunaSearcher``.

Every trial is told as COMPLETE with the recommendation's objective (learning speed = progress x
tokens/s, tuner.verdicts.recommend.objective) and a constraint ("stable") that is violated for unstable trials. Told as FAIL they would vanish from TPE's model and it would keep sampling
the region that blows up; as infeasible they rank below every stable trial, so TPE steers away.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.space import SearchSpace
from tuner.errors import TunerError
from tuner.records import Status, TrialRecord
from tuner.verdicts import recommend as rec

if TYPE_CHECKING:
    import optuna

    from tuner.config.options import SearchOptions

__all__ = ["Asking", "Proposer", "absolute_storage", "add_priors", "ask", "beside_store", "check_study_storage", "constraint_of", "distributions", "grid_size",
           "make_sampler", "make_study", "prior_count", "shown_url", "study_storage", "tell"]


def constraint_of(record: TrialRecord) -> float:
    """Optuna constraint: <= 0 feasible. Unstable trials are infeasible, and more so the earlier
    they broke, so the sampler learns a gradient toward the stable region."""
    if record.get("status") == Status.OK:
        return 0.0 if rec.learned(record) else 0.5
    if record.get("status") == Status.PRUNED:
        return 0.0  # stable as far as it ran
    steps = max(int(record.get("max_steps") or 1), 1)
    stopped = record.get("stopped_at_step") or 0
    return 1.0 + (1.0 - min(stopped, steps) / steps)


def _good_share(n: int) -> int:
    # How many of n finished trials TPE models as "good". Optuna's default (10%, at most 25) leaves
    # a 12-trial search one good trial, too few to learn where the stable region is; a quarter
    # moves later proposals away from unstable trials (tests/unit/search/test_search_units.py measures it).
    return min(math.ceil(0.25 * n), 25)


def make_sampler(name: str, seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    import warnings

    import optuna

    if name == "tpe":
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        # TPE reads each trial's constraint (set in tell()) and ranks infeasible trials as bad.
        # gamma is deprecated (removed in Optuna 6, hence the <6 pin) but is the knob that decides
        # how strongly TPE avoids what failed; silence its notice rather than lose the behaviour.
        warnings.filterwarnings("ignore", message="`gamma` has been deprecated", category=FutureWarning)
        return optuna.samplers.TPESampler(
            seed=seed,
            gamma=_good_share,
            n_startup_trials=max(3, min(10, n_trials // 3)),  # random first: TPE needs some history
            multivariate=True,
            group=True,  # LoRA params exist only when LoRA is on: model them as their own group
        )
    return optuna.samplers.RandomSampler(seed=seed)  # grid points are enqueued in order


def check_study_storage(url: str) -> None:
    """--optuna-storage: a URL Optuna can open, checked before any run or study exists. Opening it creates Optuna's
    tables where they are missing (as the first study would), nothing else."""
    import optuna

    try:
        optuna.storages.RDBStorage(url)
    except Exception as error:  # noqa: BLE001 - any driver's error: one line, not its traceback
        text = str(error).strip().splitlines()
        cause = text[0][:200] if text else type(error).__name__
        raise TunerError(f"--optuna-storage {shown_url(url)}: Optuna cannot open it ({cause}); pass an SQLAlchemy URL "
                         "such as sqlite:///PATH/optuna.db or postgresql+psycopg://USER@HOST/DB, or drop "
                         "--optuna-storage for the study beside the store") from None


def study_storage(o: SearchOptions) -> str | None:
    """Where a search's study lives: beside the MLflow store, so optuna-dashboard can open it, or where
    --optuna-storage says."""
    if o.optuna_storage:
        return o.optuna_storage
    Path(o.store).resolve().mkdir(parents=True, exist_ok=True)
    return beside_store(o.store)


def beside_store(store: str | Path) -> str:
    """The study's storage when --optuna-storage is not given: optuna.db in the store folder, by its absolute path."""
    return f"sqlite:///{Path(store).resolve() / 'optuna.db'}"


def absolute_storage(url: str) -> str:
    """An SQLite --optuna-storage whose path is relative (sqlite:///studies.db) by its absolute path: the search's tag,
    a resume from another folder and optuna-dashboard then all name the same file. Any other URL as given."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - check_study_storage says what is wrong with it
        return url
    database = parsed.database or ""
    if not parsed.drivername.startswith("sqlite") or database in ("", ":memory:") or Path(database).is_absolute() \
            or database.startswith("file:"):
        return url
    return parsed.set(database=str(Path(database).resolve())).render_as_string(hide_password=False)


def shown_url(url: str) -> str:
    """A storage URL as logs and messages may carry it: its password, if any, as ***."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL at all: nothing in it parses as a password
        return url


def make_study(sampler_name: str, seed: int, n_trials: int, storage: str | None, study_name: str,
               grid: list[dict[str, Any]] | None = None, first: list[dict[str, Any]] | None = None,
               priors: list[tuple[SearchSpace, list[TrialRecord]]] | None = None) -> optuna.Study:
    """A new study (``first`` enqueued in order from trial 0, then grid points in order), or the existing one of
    that name (resume). ``first``: a ``--from`` search's own config and its single changes, in the space's terms,
    and a warm start's earlier recommendations. ``priors``: a warm start's earlier trials (tuner.search._warm),
    told to the new study before its own trials, whose numbers then still start at 0 (``Proposer.number``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(sampler_name, seed, n_trials)
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    if study.trials:
        # Resumed: a sampler seeded as at the start would replay its first draws, proposing again the params
        # of trials the study already holds. Seeded from the seed and the study's size, it draws new ones.
        study.sampler = make_sampler(sampler_name, resumed_seed(seed, len(study.trials)), n_trials)
    fresh = not study.trials
    if priors and fresh:
        for space, records in priors:
            add_priors(study, space, records)
    if first and fresh:
        for point in first:
            enqueue(study, point)
    if grid is not None and fresh:
        for point in grid:
            study.enqueue_trial(point, skip_if_exists=False)
    return study


# The user attribute that marks a trial of an earlier search told to a warm-started study (its run id): evidence for
# the sampler, not a trial of this search. They are the study's first trials: this search's trial n is study trial
# n + the number of priors.
PRIOR_ATTR = "tuner.prior"


def distributions(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any] | None:
    """The Optuna distributions of ``params``'s searched values in ``space`` (its params active for them), with the
    values in Optuna's terms; None when they do not fit the space: a searched value out of its range or choices, a
    searched param missing, or a fixed setting of the space that the params set otherwise."""
    import optuna

    from tuner.config.space import CategoricalParam, FixedParam, FloatParam, IntParam, _optuna_choices

    for name, value in space.fixed.items():
        if name in params and params[name] != value:
            return None
    found: dict[str, Any] = {}
    chosen: dict[str, Any] = {}
    for name, p in space.params.items():
        if not space.active(name, chosen):
            continue
        if name not in params:
            return None
        value = chosen[name] = params[name]
        if isinstance(p, FixedParam):
            if value != p.value:
                return None
        elif isinstance(p, CategoricalParam):
            if value not in p.choices:
                return None
            found[name] = (optuna.distributions.CategoricalDistribution(_optuna_choices(p.choices)),
                           _optuna_choices([value])[0])
        elif isinstance(p, (FloatParam, IntParam)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not p.low <= value <= p.high:
                return None
            if isinstance(p, FloatParam):
                found[name] = (optuna.distributions.FloatDistribution(p.low, p.high, log=p.log), float(value))
            else:
                if not float(value).is_integer():
                    return None
                found[name] = (optuna.distributions.IntDistribution(p.low, p.high, log=p.log, step=p.step), int(value))
    return found


def add_priors(study: optuna.Study, space: SearchSpace, records: Sequence[TrialRecord]) -> int:
    """Earlier trials (records of another search, with ``source``: its run id) told to the study as they would have
    been told (``tell``): COMPLETE with their objective and constraint, or PRUNED at their last speed. Those whose
    params do not fit ``space`` are left out. How many were told."""
    import optuna

    told = 0
    for record in records:
        fit = distributions(space, record.get("params") or {})
        if fit is None:
            continue
        pruned = record.get("status") == Status.PRUNED
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE,
            value=None if pruned else rec.objective(record),
            intermediate_values={int(record.get("stopped_at_step") or 0): rec.speed_so_far(record)} if pruned else None,
            params={name: value for name, (_, value) in fit.items()},
            distributions={name: dist for name, (dist, _) in fit.items()},
            user_attrs={PRIOR_ATTR: record.get("source", "?"), "status": record.get("status")},
            constraints={"stable": constraint_of(record)},
        ))
        told += 1
    return told


def prior_count(study: optuna.Study) -> int:
    """How many of the study's trials are a warm start's earlier trials (they come first)."""
    return sum(1 for t in study.get_trials(deepcopy=False) if PRIOR_ATTR in t.user_attrs)


def enqueue(study: optuna.Study, point: dict[str, Any]) -> None:
    """Ask the study for these params next (after those asked for before), in Optuna's terms (lists joined)."""
    from tuner.config.space import _optuna_choices

    study.enqueue_trial({k: _optuna_choices([v])[0] if isinstance(v, list) else v for k, v in point.items()},
                        skip_if_exists=False)


def resumed_seed(seed: int, trials_in_study: int) -> int:
    """The sampler seed of a search resumed with ``trials_in_study`` trials: reproducible, and not ``seed``."""
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**32, trials_in_study]).generate_state(1)[0])


# How often a proposal equal to an earlier trial's params is drawn again before it is run anyway (the space
# may have no new point left: a small categorical space, or a grid asked for more trials than it has).
MAX_REDRAWS = 20


def grid_size(space: SearchSpace) -> int | None:
    try:
        return len(space.grid())
    except Exception:  # noqa: BLE001 - a float or int param: the space has no end of new points
        return None


def _repeats_a_trial(study: optuna.Study, trial: optuna.trial.Trial, grid_size: int | None) -> bool:
    """Whether the sampler proposed the params of a trial the study has run or is running. Enqueued trials
    (grid points, in-flight trials re-run after a resume) are asked for on purpose and never count."""
    import optuna

    if _is_enqueued(study, trial):
        return False
    # WAITING: an enqueued trial (an in-flight trial to re-run after a resume) not yet handed out is as taken.
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    others = [t.params for t in study.get_trials(deepcopy=False, states=states)
              if t.number != trial.number and PRIOR_ATTR not in t.user_attrs]
    if grid_size is not None and len({repr(sorted(p.items())) for p in others}) >= grid_size:
        return False  # every point has been tried: a repeat is all that is left
    return trial.params in others


# The search's own number of a study trial, 0, 1, 2, ... in the order trials were handed out: a study's numbers also
# count the proposals drawn again (a small categorical space repeats itself), priors and reserved numbers' neighbours,
# so a search over four points would read 0, 1, 22, 43 by them. Stores written before this attribute existed number
# their trials by the study (less the priors); their resume goes on after the highest such number.
NUMBER_ATTR = "tuner.number"


def search_number(frozen: optuna.trial.FrozenTrial, offset: int) -> int:
    """The search's number of a study trial: its own attribute, else (a store written before it) the study's number
    less the priors before it."""
    number = frozen.user_attrs.get(NUMBER_ATTR)
    return int(number) if number is not None else frozen.number - offset


def next_number(study: optuna.Study) -> int:
    """The number the next trial handed out takes: after every numbered trial of this search (priors left out)."""
    import optuna

    own = [t for t in study.get_trials(deepcopy=False) if PRIOR_ATTR not in t.user_attrs]
    numbered = [int(t.user_attrs[NUMBER_ATTR]) for t in own if NUMBER_ATTR in t.user_attrs]
    if numbered:
        return max(numbered) + 1
    offset = prior_count(study)  # a store numbered by the study: after its highest number handed out (not one queued)
    return max((t.number - offset for t in own if t.state != optuna.trial.TrialState.WAITING), default=-1) + 1


def tell(study: optuna.Study, trial: optuna.trial.Trial, record: TrialRecord) -> None:
    """Report a trial to Optuna: COMPLETE with the recommendation's objective and a constraint value; a trial
    stopped by successive halving as PRUNED."""
    import optuna

    for key in ("status", "reason", "progress", "learned", "tokens_per_second", "stopped_at_step"):
        trial.set_user_attr(key, record.get(key))
    trial.set_constraint("stable", constraint_of(record))
    if record.get("status") == Status.PRUNED:
        # Optuna's own semantics for a trial stopped early: its last intermediate value at the step it reached
        trial.report(rec.speed_so_far(record), int(record.get("stopped_at_step") or 0))
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    study.tell(trial, rec.objective(record))


@dataclass
class Asking:
    """What shapes a Proposer's proposals besides its space and sampler."""

    device: str = "cpu"  # where trials run: the speed stage's expected-fastest precision is the device's
    fits: Callable[[dict[str, Any]], str | None] | None = None  # params -> None, or why they cannot fit in memory
    #                                                            (tuner.search._placement.Placement.check)
    # record -> params to ask for next: a --from search's single changes, chosen by what trial 0 (their config) did
    after_first: Callable[[TrialRecord], Iterable[dict[str, Any]]] | None = None
    known: Sequence[TrialRecord] = ()  # a warm start's earlier trials here, whose speeds count as measured (_staging)


class Proposer:
    """What the searcher asks for each trial and tells back: ``ask`` and ``tell`` below, with the tpe sampler's
    trials staged speed knobs first, then learning knobs on the fastest stable system configs (tuner.search._staging).

        proposer = Proposer(study, space, "tpe", n_trials=12)
        trial, params = proposer.ask()
        proposer.tell(trial, record)      # record: the trial's outcome (tuner.records)
    """

    def __init__(self, study: optuna.Study, space: SearchSpace, sampler: str, n_trials: int,
                 done: Sequence[TrialRecord] = (), asking: Asking | None = None) -> None:
        from tuner.search._staging import Stages

        asking = asking or Asking()
        self.study, self.space = study, space
        self.grid_size = grid_size(space)
        self.stages = Stages.for_space(space, n_trials, asking.device, asking.known) if sampler == "tpe" else None
        self.fits = asking.fits
        self.finished: list[TrialRecord] = list(done)
        self.asked = len(self.finished)  # a resumed search goes on in the stage it had reached
        self.after_first = asking.after_first
        self.numbers: dict[int, int] = {}  # study trial id -> the search's number (NUMBER_ATTR)
        self.next_number = next_number(study)
        self.on_told: Callable[[TrialRecord], None] | None = None  # record -> None: once told (a warm start's news)

    def reserve(self, why: str) -> int:
        """A trial number of the study's for a run the sampler does not propose (tuner.search._anchor's twin): the
        trial is told FAIL at once, with ``why`` as its tuner.skipped attribute, so the sampler and --resume pass
        it by and no later trial takes its number."""
        import optuna

        trial = self.study.ask()
        trial.set_user_attr("tuner.skipped", why)
        number = self.number(trial)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return number

    def number(self, trial: optuna.trial.Trial) -> int:
        """The search's number of a study trial (NUMBER_ATTR): the next one from 0 the first time a trial handed out
        is asked for, kept on the trial; a warm start's earlier trials and proposals drawn again take none."""
        number = self.numbers.get(trial._trial_id)
        if number is None:
            number = trial.user_attrs.get(NUMBER_ATTR)
            if number is None:
                number, self.next_number = self.next_number, self.next_number + 1
                trial.set_user_attr(NUMBER_ATTR, number)
            self.numbers[trial._trial_id] = number = int(number)
        return number

    def ask(self) -> tuple[optuna.trial.Trial, dict[str, Any]]:
        pins: dict[str, Any] = {}
        first = False  # one of the first trials, on the expected-fastest system config
        if self.stages is not None:
            stage, pins = self.stages.pinned(self.asked, self.finished)
            first = self.stages.starts_here(self.asked)
        self.asked += 1
        if not pins:
            trial, params = ask(self.study, self.space, self.grid_size)
        else:
            trial, params = _ask_pinned(self.study, self.space, self.grid_size, pins)
            too_big = self.fits(params) if first and self.fits else None
            if too_big:
                # The expected-fastest system config does not fit this device's memory: drawn again without it,
                # so the speed stage does not spend a trial on a config the searcher would not run.
                import optuna

                trial.set_user_attr("tuner.skipped", f"expected-fastest system config {too_big}; drawn again")
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                assert self.stages is not None  # pins are only ever the stages' (set above)
                trial, params = _ask_pinned(self.study, self.space, self.grid_size, self.stages.learning_pins)
        if self.stages is not None:
            trial.set_user_attr("tuner.stage", stage)
        return trial, params

    def tell(self, trial: optuna.trial.Trial, record: TrialRecord) -> None:
        tell(self.study, trial, record)
        self.finished.append(record)
        if self.after_first is not None and record.get("number") == 0:
            for point in self.after_first(record):
                enqueue(self.study, point)
        if self.on_told is not None:
            self.on_told(record)


def _ask_pinned(study: optuna.Study, space: SearchSpace, grid: int | None, pins: dict[str, Any]
                ) -> tuple[optuna.trial.Trial, dict[str, Any]]:
    """``ask`` with some params fixed (Optuna's PartialFixedSampler around the study's own sampler)."""
    import optuna

    from tuner.config.space import CategoricalParam, _optuna_choices

    fixed = {name: (_optuna_choices([value])[0] if isinstance(space.params[name], CategoricalParam) else value)
             for name, value in pins.items() if name in space.params}
    own = study.sampler
    study.sampler = optuna.samplers.PartialFixedSampler(fixed, own)
    try:
        return ask(study, space, grid)
    finally:
        study.sampler = own


def ask(study: optuna.Study, space: SearchSpace, grid_size: int | None) -> tuple[optuna.trial.Trial, dict[str, Any]]:
    """A new trial and its params; a proposal that repeats an earlier trial is drawn again (told FAIL with the
    user attribute tuner.skipped, so the sampler ignores it and the study shows why)."""
    import optuna

    trial = study.ask()
    params = space.suggest(trial)
    for attempt in range(MAX_REDRAWS + 1):
        if not _repeats_a_trial(study, trial, grid_size):
            break
        trial.set_user_attr("tuner.skipped", "proposed the params of an earlier trial; drawn again")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        untried = _untried_point(study, space, grid_size) if attempt == MAX_REDRAWS - 1 else None
        if untried is not None:
            # A finite space whose sampler keeps proposing taken points: take the first untried one.
            study.enqueue_trial(untried)
        trial = study.ask()
        params = space.suggest(trial)
    return trial, params


def _untried_point(study: optuna.Study, space: SearchSpace, grid_size: int | None) -> dict[str, Any] | None:
    if grid_size is None:
        return None
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    taken = [t.params for t in study.get_trials(deepcopy=False, states=states) if PRIOR_ATTR not in t.user_attrs]
    return next((point for point in space.grid() if point not in taken), None)


def reconcile(study: optuna.Study, recorded: dict[int, TrialRecord]) -> None:
    """A resumed study made to agree with what MLflow holds (``recorded``: trial number -> record).

    A trial logged but never told (the driver died in between) is told now. A trial in flight when the driver
    died, or told but never written, is marked FAIL and its params enqueued to run again, ahead of grid points
    not yet started, so a grid cut short by --trials still covers the points it had begun.
    """
    import optuna

    states = optuna.trial.TrialState
    rerun, waiting = [], []
    offset = prior_count(study)  # a warm start's earlier trials: evidence, never re-run; this search's come after
    for frozen in study.trials:
        if PRIOR_ATTR in frozen.user_attrs:
            continue
        number = search_number(frozen, offset)
        if frozen.state == states.RUNNING and number in recorded:
            tell(study, _running_trial(study, frozen), recorded[number])
        elif frozen.state == states.RUNNING or (frozen.state == states.COMPLETE and number not in recorded):
            if frozen.state == states.RUNNING:
                study.tell(frozen.number, state=states.FAIL)
            # No params yet: the driver died between study.ask() and the draw. An enqueued point (a grid's) is
            # run again; a trial the sampler had not yet drawn never ran and is not.
            params = frozen.params or frozen.system_attrs.get("fixed_params", {})
            if params:
                rerun.append(params)
        elif frozen.state == states.WAITING:
            waiting.append(frozen)
    for frozen in waiting:  # Optuna hands out waiting trials oldest first: re-queue them behind the re-runs
        _fail_waiting(study, frozen)
    for params in rerun + [frozen.params or frozen.system_attrs.get("fixed_params", {}) for frozen in waiting]:
        study.enqueue_trial(params)


# Optuna has no public API for the three storage operations below (reopening a RUNNING trial of another
# process, failing a WAITING trial, telling an enqueued trial from a sampled one); they are kept here, the
# one module that knows Optuna's storage, and each is covered by tests/e2e/search/test_reliability.py's resume tests.

def _running_trial(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> optuna.trial.Trial:
    import optuna

    return optuna.Trial(study, frozen._trial_id)


def _fail_waiting(study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
    import optuna

    study._storage.set_trial_state_values(frozen._trial_id, state=optuna.trial.TrialState.FAIL)


def _is_enqueued(study: optuna.Study, trial: optuna.trial.Trial) -> bool:
    return "fixed_params" in study._storage.get_trial_system_attrs(trial._trial_id)
