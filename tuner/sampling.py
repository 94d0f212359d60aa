"""Optuna inside Ray Tune: the sampler, the ask/tell searcher, and how a trial's outcome is told.

Every trial is told as COMPLETE with the recommendation's objective (learning speed = progress x
tokens/s, tuner.recommend.objective) and a constraint ("stable") that is violated for unstable trials. Told as FAIL they would vanish from TPE's model and it would keep sampling
the region that blows up; as infeasible they rank below every stable trial, so TPE steers away.
"""

from __future__ import annotations

import math
from typing import Any

from tuner import recommend as rec
from tuner.space import SearchSpace
from tuner.records import Status

__all__ = ["constraint_of", "make_sampler", "make_study", "searcher_class", "tell"]


def constraint_of(record: dict[str, Any]) -> float:
    """Optuna constraint: <= 0 feasible. Unstable trials are infeasible, and more so the earlier
    they broke, so the sampler learns a gradient toward the stable region."""
    if record.get("status") == Status.OK:
        return 0.0 if rec.learned(record) else 0.5
    steps = max(int(record.get("max_steps") or 1), 1)
    stopped = record.get("stopped_at_step") or 0
    return 1.0 + (1.0 - min(stopped, steps) / steps)


def _good_share(n: int) -> int:
    # How many of n finished trials TPE models as "good". Optuna's default (10%, at most 25) leaves
    # a 12-trial search one good trial, too few to learn where the stable region is; a quarter
    # moves later proposals away from unstable trials (tests/test_search.py measures it).
    return min(math.ceil(0.25 * n), 25)


def make_sampler(name: str, seed: int, n_trials: int):
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


def make_study(sampler_name: str, seed: int, n_trials: int, storage: str | None, study_name: str,
               grid: list[dict[str, Any]] | None = None):
    """A new study (grid points enqueued in order), or the existing one of that name (resume)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(sampler_name, seed, n_trials)
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    if study.trials:
        # Resumed: a sampler seeded as at the start would replay its first draws, proposing again the params
        # of trials the study already holds. Seeded from the seed and the study's size, it draws new ones.
        study.sampler = make_sampler(sampler_name, resumed_seed(seed, len(study.trials)), n_trials)
    if grid is not None and not study.trials:
        for point in grid:
            study.enqueue_trial(point, skip_if_exists=False)
    return study


def resumed_seed(seed: int, trials_in_study: int) -> int:
    """The sampler seed of a search resumed with ``trials_in_study`` trials: reproducible, and not ``seed``."""
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**32, trials_in_study]).generate_state(1)[0])


# How often a proposal equal to an earlier trial's params is drawn again before it is run anyway (the space
# may have no new point left: a small categorical space, or a grid asked for more trials than it has).
MAX_REDRAWS = 20


def _grid_size(space: SearchSpace) -> int | None:
    try:
        return len(space.grid())
    except Exception:  # noqa: BLE001 - a float or int param: the space has no end of new points
        return None


def _repeats_a_trial(study, trial, grid_size: int | None) -> bool:
    """Whether the sampler proposed the params of a trial the study has run or is running. Enqueued trials
    (grid points, in-flight trials re-run after a resume) are asked for on purpose and never count."""
    import optuna

    if "fixed_params" in study._storage.get_trial_system_attrs(trial._trial_id):
        return False
    # WAITING: an enqueued trial (an in-flight trial to re-run after a resume) not yet handed out is as taken.
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    others = [t.params for t in study.get_trials(deepcopy=False, states=states) if t.number != trial.number]
    if grid_size is not None and len({repr(sorted(p.items())) for p in others}) >= grid_size:
        return False  # every point has been tried: a repeat is all that is left
    return trial.params in others


def tell(study, trial, record: dict[str, Any]) -> None:
    """Report a trial to Optuna: always COMPLETE, with the recommendation's objective and a constraint value."""
    for key in ("status", "reason", "progress", "learned", "tokens_per_second", "stopped_at_step"):
        trial.set_user_attr(key, record.get(key))
    trial.set_constraint("stable", constraint_of(record))
    study.tell(trial, rec.objective(record))


def searcher_class():
    from ray.tune.search import Searcher

    class OptunaSearcher(Searcher):
        """Ray Tune searcher over an Optuna study (ask/tell), with the trial spec as Ray's config.

        After its ``n_search`` trials have all finished it asks ``then(finished_records)`` once for
        follow-up jobs (confirmation re-runs) and hands those out in the same Ray Tune run, so
        the trial workers, with torch and TRL already imported, are reused.
        """

        def __init__(self, study, space: SearchSpace, base_spec: dict[str, Any], timeout: float,
                     n_search: int, then=None, done: list[dict[str, Any]] = ()):
            super().__init__(metric="learning_speed", mode="max")
            self.study, self.space, self.base_spec, self.timeout = study, space, base_spec, timeout
            self.n_search, self.then = n_search, then
            self.asked: dict[str, Any] = {}  # Ray trial id -> (optuna.Trial, its params)
            self.suggested = 0
            self.finished: list[dict[str, Any]] = list(done)
            self.followups: list[dict[str, Any]] | None = None
            self.grid_size = _grid_size(space)

        def _ask(self):
            """A new trial and its params; a proposal that repeats an earlier trial is drawn again (told FAIL
            with the user attribute tuner.skipped, so the sampler ignores it and the study shows why)."""
            import optuna

            trial = self.study.ask()
            params = self.space.suggest(trial)
            for attempt in range(MAX_REDRAWS + 1):
                if not _repeats_a_trial(self.study, trial, self.grid_size):
                    break
                trial.set_user_attr("tuner.skipped", "proposed the params of an earlier trial; drawn again")
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                untried = self._untried_point() if attempt == MAX_REDRAWS - 1 else None
                if untried is not None:
                    # A finite space whose sampler keeps proposing taken points: take the first untried one.
                    self.study.enqueue_trial(untried)
                trial = self.study.ask()
                params = self.space.suggest(trial)
            return trial, params

        def _untried_point(self) -> dict[str, Any] | None:
            if self.grid_size is None:
                return None
            import optuna

            states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING,
                      optuna.trial.TrialState.WAITING)
            taken = [t.params for t in self.study.get_trials(deepcopy=False, states=states)]
            return next((point for point in self.space.grid() if point not in taken), None)

        def suggest(self, trial_id: str):
            if self.suggested < self.n_search:
                trial, params = self._ask()
                self.asked[trial_id] = (trial, params)
                self.suggested += 1
                spec = {**self.base_spec, "params": params}
                return {"spec": spec, "number": trial.number, "timeout": self.timeout}
            if self.asked:
                return None  # follow-ups depend on every search trial's outcome: wait
            if self.followups is None:
                self.followups = list(self.then(self.finished)) if self.then else []
            return self.followups.pop(0) if self.followups else Searcher.FINISHED

        def on_trial_complete(self, trial_id: str, result=None, error: bool = False):
            trial, params = self.asked.pop(trial_id, (None, None))
            if trial is None:
                return  # a follow-up job: not part of the study
            record = dict(result or {})
            if error or "status" not in record:
                record = {"status": "crashed", "reason": "Ray lost the trial's worker", "stopped_at_step": 0}
            record["max_steps"] = self.base_spec["max_steps"]
            tell(self.study, trial, record)
            record.pop("history", None)
            self.finished.append({**record, "number": trial.number, "params": params})

    return OptunaSearcher
