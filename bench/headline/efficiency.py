"""Search efficiency, TPE vs random, on a lookup built from real measured trials.

Real 20-step trials cost seconds to tens of seconds each on a 2-core CPU, too many for dozens
of searches per sampler. So one real reference search per trainer (random sampler, many trials)
measures configs for real, and each sampler is then run many times against
``NearestMeasured``: a suggested config gets the outcome (status, tokens/s, progress, stop step)
of the closest measured config. What asks and tells is tuner's own: ``tuner.search.Proposer``, the one entry
point tuner's searcher uses (for ``tpe``, tuner's default, it stages speed knobs then learning knobs), with
tuner's samplers, the space's ``suggest`` and tuner's ``tell``.

Two lookups, each reported:

- ``nearest``: the whole outcome, tokens/s included, is the nearest measured trial's. Its weakness: the target
  is the few random trials within 5% of the best, and which measured trial a proposal maps to is decided by
  every knob, learning knobs that do not change tokens/s included. A search whose speed stage holds the
  learning knobs at one safe value maps to whichever trials share those values, whatever its system config.
- ``factored`` (``SpeedAndOutcome``): tokens/s is the speed reference's measurement of the proposal's own
  combination of speed knobs (bench/headline/reference.py measures every combination), as the headline judges a
  pick's speed; whether it stays stable and learns is still the nearest random trial's. The target is then
  "stable, learned, and within 5% of the best stable tokens/s of the speed reference", as in the headline.

Figures per sampler, over seeds:

- trials until the first config whose outcome is stable, learned, and within 5% of the best
  stable tokens/s of the reference search (the recommendation rule's best), and until the first
  in the fastest quarter of the stable, learning reference trials;
- the share of trials spent in the unstable region (outcome not ``ok``) in the first and the
  second half of each search.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from tuner.config.space import CategoricalParam, FixedParam, FloatParam, IntParam, SearchSpace
from tuner.verdicts.learning import MIN_EFFECT

UNSTABLE = ("diverged", "collapsed", "crashed", "oom")
WITHIN = 0.05  # "as good as the best": within 5% of the best stable tokens/s
# ... or, where fewer than this many stable, learning reference trials are that fast, the MIN_TARGETS fastest of them:
# a target set is never empty while the reference has a stable, learning trial. Within 5% of one best alone held a
# single trial (GRPO, 20 random trials of 12 steps), chosen by a single tokens/s reading whose noise on this machine
# is 0.62x-1.30x: which trial it was moved from run to run, and with it whether any sampler could reach it.
MIN_TARGETS = 3


class NearestMeasured:
    """Outcome of the nearest measured config. Distance: one per differing categorical value; for a
    log-scaled number, one per decade of difference (else the share of its range). Params active in
    only one of the two configs add nothing (the param that switched them, e.g. use_peft, counts)."""

    def __init__(self, space: SearchSpace, records: list[dict[str, Any]]):
        if not records:
            raise ValueError("NearestMeasured needs at least one measured record, but got none.")
        self.space, self.records = space, records

    def distance(self, a: dict[str, Any], b: dict[str, Any]) -> float:
        total = 0.0
        for name in self.space.searched_names():
            if name not in a or name not in b:
                continue
            p, x, y = self.space.params[name], a[name], b[name]
            if isinstance(p, (FloatParam, IntParam)):
                if p.log:
                    total += abs(math.log10(x) - math.log10(y))
                else:
                    total += abs(x - y) / ((p.high - p.low) or 1.0)
            elif isinstance(p, CategoricalParam):
                total += 0.0 if x == y else 1.0
            elif not isinstance(p, FixedParam):
                raise TypeError(f"unknown param type for {name}: {type(p).__name__}")
        return total

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        # min() keeps the first of equally near records: ties go to the earliest measured trial
        return min(self.records, key=lambda r: self.distance(params, r["params"]))


class SpeedAndOutcome:
    """The factored lookup: the nearest measured trial's status and learning, with the tokens/s the speed
    reference measured for the config's combination of speed knobs (None when that combination was not
    measured)."""

    def __init__(self, space: SearchSpace, records: list[dict[str, Any]], speed_reference: dict[str, Any]):
        self.nearest = NearestMeasured(space, records)
        self.speed_reference = speed_reference

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        from bench.headline.headline import speed_of

        match = speed_of(self.speed_reference, params)
        return {**self.nearest(params), "tokens_per_second": match.get("tokens_per_second") if match else None}


def targets(records: list[dict[str, Any]], min_targets: int = MIN_TARGETS) -> tuple[dict[str, Any] | None, list[int]]:
    """(the fastest stable record that learned, numbers of the records within WITHIN of its tokens/s, or of the
    ``min_targets`` fastest stable, learning records where fewer are that fast)."""
    qualifying = sorted(_qualifying(records), key=lambda r: -r["tokens_per_second"])
    if not qualifying:
        return None, []
    floor = _floor([r["tokens_per_second"] for r in qualifying], qualifying[0]["tokens_per_second"], min_targets)
    return qualifying[0], [r["number"] for r in _qualifying(records) if r["tokens_per_second"] >= floor]


def _floor(speeds: list[float], best: float, min_targets: int) -> float:
    """Within WITHIN of ``best``, lowered to the ``min_targets``-th fastest of ``speeds`` (fastest first); 0: not
    lowered (the target before issue 38)."""
    if min_targets <= 0 or not speeds:
        return (1.0 - WITHIN) * best
    return min((1.0 - WITHIN) * best, speeds[min(min_targets, len(speeds)) - 1])


def factored_targets(records: list[dict[str, Any]], speed_reference: dict[str, Any],
                     min_targets: int = MIN_TARGETS) -> tuple[float | None, list[dict[str, Any]]]:
    """The factored lookup's target: (the tokens/s floor, the reference trials that are hits at their own config).

    A hit is an outcome stable and learned (the nearest random trial's) at its own combination's tokens/s (the speed
    reference's) of at least the floor: within WITHIN of the best stable tokens/s of the speed reference, lowered to
    the ``min_targets``-th fastest of the stable, learning random trials at their own combinations' speeds, so the
    target set holds at least ``min_targets`` of them (each is a hit when proposed as it is: its nearest trial is
    itself) where the reference learned that many. (None, []) when no random trial learned."""
    from bench.headline.headline import best_stable, speed_of

    best = best_stable(speed_reference)
    at_speed = []
    for r in _qualifying(records):
        match = speed_of(speed_reference, r["params"])
        if best and match and match["status"] == "ok" and match.get("tokens_per_second"):
            at_speed.append({**r, "tokens_per_second": match["tokens_per_second"], "own_tokens_per_second": r["tokens_per_second"]})
    if not at_speed:
        return None, []
    at_speed.sort(key=lambda r: -r["tokens_per_second"])
    floor = _floor([r["tokens_per_second"] for r in at_speed], best["tokens_per_second"], min_targets)
    return floor, [r for r in at_speed if r["tokens_per_second"] >= floor]


def top_quartile(records: list[dict[str, Any]]) -> list[int]:
    """Numbers of the fastest quarter of the qualifying (stable, learned) records: a target that one
    lucky, noisy tokens/s measurement cannot decide alone."""
    qualifying = sorted(_qualifying(records), key=lambda r: r["tokens_per_second"], reverse=True)
    return [r["number"] for r in qualifying[:math.ceil(len(qualifying) / 4)]]


def _qualifying(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Records from before the trend test (bench/recorded/results.json) have no "learned": there, progress > 0.01 was the rule.
    return [r for r in records if r["status"] == "ok" and r.get("tokens_per_second")
            and r.get("learned", (r.get("progress") or 0.0) > MIN_EFFECT)]


def proposer(study, space: SearchSpace, sampler: str, n_trials: int):
    """What tuner's searcher asks and tells through: ``tuner.search.Proposer``."""
    from tuner.search import Proposer

    return Proposer(study, space, sampler, n_trials)


def simulate(space: SearchSpace, lookup, sampler: str, seed: int, budget: int, is_hit, max_steps: int,
             is_top=lambda outcome: False) -> dict[str, Any]:
    """One search of ``budget`` trials on the lookup, asked and told as tuner's searcher does. The outcome
    told is the lookup's, with the params the trial was asked for (what the search would record);
    ``is_hit``/``is_top``: whether an outcome is the target / in the top quarter."""
    import warnings

    import optuna

    from tuner.search import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed, budget))
    asker = proposer(study, space, sampler, budget)
    statuses, first_hit, first_quartile = [], None, None
    for i in range(1, budget + 1):
        trial, params = asker.ask()
        measured = lookup(params)
        asker.tell(trial, {**measured, "params": params, "max_steps": max_steps})
        statuses.append(measured["status"])
        if first_hit is None and is_hit(measured):
            first_hit = i
        if first_quartile is None and is_top(measured):
            first_quartile = i
    half = budget // 2
    return {"seed": seed, "first_hit": first_hit, "first_top_quartile": first_quartile,
            "unstable_first_half": _share(statuses[:half]), "unstable_second_half": _share(statuses[half:])}


def _share(statuses: list[str]) -> float:
    return sum(s in UNSTABLE for s in statuses) / len(statuses) if statuses else math.nan


def compare(space: SearchSpace, records: list[dict[str, Any]], seeds: list[int], budget: int,
            max_steps: int, samplers: tuple[str, ...] = ("tpe", "random"),
            speed_reference: dict[str, Any] | None = None, min_targets: int = MIN_TARGETS) -> dict[str, Any]:
    """Every sampler on the same lookup and seeds; None figures when the reference found nothing stable and learning.
    ``speed_reference`` given: the factored lookup (``SpeedAndOutcome``) and its target, else ``nearest``.
    ``target_set`` records the target's configs (``min_targets`` 0: the old target, within 5% of one best alone)."""
    measured = [r for r in records if r.get("params")]
    best, hits = targets(measured, min_targets)
    quartile = top_quartile(measured)
    result: dict[str, Any] = {
        "lookup": "factored" if speed_reference else "nearest",
        "reference_trials": len(measured), "budget": budget, "seeds": seeds,
        "reference_statuses": _counts(r["status"] for r in measured),
        "reference_unstable_share": _share([r["status"] for r in measured]),
        "best": None if best is None else {k: best.get(k) for k in ("number", "params", "tokens_per_second", "progress")},
        "targets": hits, "top_quartile": quartile, "min_targets": min_targets, "max_steps": max_steps,
        "target_set": [_summary(r) for r in measured if r["number"] in set(hits)], "samplers": {},
    }
    if speed_reference is not None:
        lookup = SpeedAndOutcome(space, measured, speed_reference)
        five, top = _speed_floors(speed_reference)
        floor, members = factored_targets(measured, speed_reference, min_targets)
        best_speed = None if five is None else five / (1.0 - WITHIN)
        # the members are the reference trials that are hits as they are; another config whose nearest trial learned
        # is a hit too when its own combination is fast enough: the size is a lower bound on the target
        result.update(best_speed=best_speed, targets=None, top_quartile=None, target_set=[_summary(r) for r in members],
                      target_set_lower_bound=True,
                      floor=floor, floor_ratio=floor / best_speed if floor and best_speed else None)
        if floor is None:
            return result
        def is_hit(o): return bool(_qualifying([o])) and o["tokens_per_second"] >= floor  # noqa: E704
        def is_top(o): return bool(_qualifying([o])) and o["tokens_per_second"] >= top  # noqa: E704
    else:
        if best is None:
            return result
        lookup = NearestMeasured(space, measured)
        hit_numbers, top_numbers = set(hits), set(quartile)
        def is_hit(o): return o["number"] in hit_numbers  # noqa: E704
        def is_top(o): return o["number"] in top_numbers  # noqa: E704
    for sampler in samplers:
        runs = [simulate(space, lookup, sampler, seed, budget, is_hit, max_steps, is_top) for seed in seeds]
        found = [r["first_hit"] for r in runs if r["first_hit"] is not None]
        # a search that never hit counts as budget + 1 trials in the median (a lower bound on its cost)
        censored = [r["first_hit"] or budget + 1 for r in runs]
        result["samplers"][sampler] = {
            "runs": runs, "hit": len(found), "median_trials_to_hit": statistics.median(censored),
            "mean_trials_to_hit_when_hit": statistics.fmean(found) if found else None,
            "median_trials_to_top_quartile": statistics.median(r["first_top_quartile"] or budget + 1 for r in runs),
            "top_quartile_hit": sum(r["first_top_quartile"] is not None for r in runs),
            "unstable_first_half": statistics.fmean(r["unstable_first_half"] for r in runs),
            "unstable_second_half": statistics.fmean(r["unstable_second_half"] for r in runs),
        }
    return result


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    """A target-set member as results.json keeps it."""
    return {k: record.get(k) for k in ("number", "params", "tokens_per_second", "own_tokens_per_second", "progress")
            if record.get(k) is not None}


def _speed_floors(speed_reference: dict[str, Any]) -> tuple[float | None, float | None]:
    """(within 5% of the best stable combination's tokens/s, the slowest of the fastest quarter of the stable
    combinations)."""
    speeds = sorted((r["tokens_per_second"] for r in speed_reference["records"]
                     if r["status"] == "ok" and r.get("tokens_per_second")), reverse=True)
    if not speeds:
        return None, None
    return (1.0 - WITHIN) * speeds[0], speeds[math.ceil(len(speeds) / 4) - 1]


def _counts(statuses) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return counts
