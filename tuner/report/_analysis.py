"""What a search's trial records say: where trials failed, what drives stability and speed, and hints.

    breakdown(records)                 # one row per dimension value: trials, statuses, median failed step
    hints(records)                     # ["stability: every fp16-pure trial diverged (3 of 3) and ...: use fp32"]
    pareto_front(records)              # stable trials no other beats on both tokens/s and progress
    importances(records, "is stable")  # fANOVA share of each varied param

Pure functions over trial records (the ``trials`` of a search's ``search.json``, plain dicts), so
they are tested without MLflow. ``tuner.report._render`` lays them out; ``tuner.report.document`` builds the
whole report and publishes it.
"""

from __future__ import annotations

import collections
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, TypeGuard

from tuner.config import precision
from tuner.records import UNSTABLE, Status, TrialRecord
from tuner.verdicts.learning import MIN_EFFECT as MIN_PROGRESS
from tuner.verdicts.recommend import learned

# A trial's outcome is its status, with ok trials split by the trial's learning judgement (tuner.verdicts.learning):
# "not learning" is stable but not significantly better than at its start: stable, but useless.
LEARNED = "learned"
NOT_LEARNING = "not learning"

# The statuses of trials that ran and failed, in the order the tables show them.
FAILED = tuple(s for s in Status if s in UNSTABLE)
BAD_OUTCOMES = (*FAILED, NOT_LEARNING)
VERBS: dict[str, str] = {**{s: s.value for s in (Status.DIVERGED, Status.COLLAPSED, Status.CRASHED)},  # the status is the verb
         Status.OOM: "ran out of memory", Status.TOO_BIG: "did not fit in memory (not run)",
         NOT_LEARNING: "did not learn (status ok, not significantly better than at its start)"}

MIN_HINT_TRIALS = 3  # a hint compares two groups; with fewer trials per side it would be an anecdote
MIN_RATE_GAP = 0.5  # a failure hint needs the failure rates to differ by at least this much
MIN_SPEED_GAIN = 0.2  # a speed hint needs medians >= 20% apart: short CPU trials jitter by ~10%
MIN_PROGRESS_LOSS = 0.25  # a progress hint needs medians >= 25% apart (and more than MIN_PROGRESS)
MIN_IMPORTANCE_TRIALS = 4  # fANOVA's forest on fewer trials ranks noise
MAX_DISCRETE_VALUES = 8  # a param with more distinct values is continuous: shown in decade bands


# -- dimensions: which group a trial belongs to ---------------------------------------------------


def lr_band(value: float) -> str:
    """The decade a positive number falls in: 3e-4 -> "1e-4..1e-3" (a power of ten opens its decade)."""
    exponent = math.floor(math.log10(value) + 1e-9)  # 1e-3 is 0.000999..9 in binary; keep it in its own decade
    return f"1e{exponent}..1e{exponent + 1}"


def _band_key(label: str) -> float:
    return float(label.split("..")[0])


def _label(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def dimensions(records: list[TrialRecord]) -> dict[str, dict[str, list[TrialRecord]]]:
    """Trials grouped per dimension value: {"precision": {"fp16-pure": [records], ...}, "LoRA": {...}, ...}.

    Only dimensions with at least two values among the trials are kept: a constant explains nothing.
    ``use_peft`` is shown as "LoRA" on/off, and continuous params (learning_rate always) in decade bands.
    Conditional params (lora_r ...) group only the trials that have them.
    """
    names: list[str] = []
    for r in records:
        names += [n for n in r.get("params", {}) if n not in names]
    order = ["precision", "use_peft", "loss_type", "gradient_accumulation_steps", "learning_rate"]
    names = [n for n in order if n in names or n == "use_peft"] + [n for n in names if n not in order]

    grouped: dict[str, dict[str, list[TrialRecord]]] = {}
    for name in names:
        values = {n: r["params"][name] for n, r in enumerate(records) if name in r.get("params", {})}
        if name == "use_peft":  # TRL trains without LoRA unless use_peft is set
            values = {n: bool(r.get("params", {}).get("use_peft", False)) for n, r in enumerate(records)}
        if not values or any(isinstance(v, dict) for v in values.values()):
            continue
        distinct = {repr(v) for v in values.values()}
        positive = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values.values())
        floats = all(isinstance(v, float) for v in values.values())
        continuous = positive and floats and len(distinct) > MAX_DISCRETE_VALUES
        banded = positive and (name == "learning_rate" or continuous)
        groups: dict[str, list[TrialRecord]] = collections.defaultdict(list)
        for n, v in values.items():
            groups[lr_band(v) if banded else _label(v)].append(records[n])
        if len(groups) < 2:
            continue
        if not banded and len(groups) > MAX_DISCRETE_VALUES:
            continue  # strings or ints with many values (a seed, a path): no useful breakdown
        ordered = sorted(groups.items(), key=_sort_key(name, banded, values))
        grouped["LoRA" if name == "use_peft" else name] = dict(ordered)
    return grouped


def _sort_key(name: str, banded: bool, values: dict[int, Any]) -> Callable:
    if banded:
        return lambda item: _band_key(item[0])
    if name == "precision":
        return lambda item: precision.order(item[0])
    numeric = {_label(v): v for v in values.values() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return lambda item: (0, numeric[item[0]], "") if item[0] in numeric else (1, 0, item[0])


def outcome(record: TrialRecord) -> str:
    """The trial's status, with stable trials split into "learned" and "not learning"."""
    status = record.get("status")
    if status == Status.OK:
        return LEARNED if learned(record) else NOT_LEARNING
    return status or Status.CRASHED


# -- failure breakdown ------------------------------------------------------------------------------


@dataclass
class BreakdownRow:
    dimension: str  # "precision", "LoRA", "learning_rate", ...
    value: str  # "fp16-pure", "on", "1e-4..1e-3", ...
    trials: int
    statuses: dict[str, int]  # status -> trials that ended with it (ok, diverged, collapsed, crashed, oom, invalid)
    learned: int  # ok trials that also learned
    median_failed_step: float | None  # median stopped_at_step of the diverged/collapsed/crashed/oom trials

    @property
    def ok(self) -> int:
        return self.statuses.get(Status.OK, 0)

    @property
    def failed(self) -> int:
        return sum(self.statuses.get(s, 0) for s in FAILED)

    def sentence(self) -> str:
        """'fp16-pure: 7 of 8 trials diverged (median step 4)'; 'bf16-mixed: 0 of 9 failed'."""
        kinds = [(s, self.statuses[s]) for s in FAILED if self.statuses.get(s)]
        step = step_text(self.median_failed_step)
        if not kinds:
            text = f"{self.value}: 0 of {self.trials} failed"
        elif len(kinds) == 1:
            text = f"{self.value}: {self.failed} of {self.trials} trials {kinds[0][0]} (median step {step})"
        else:
            each = ", ".join(f"{n} {s}" for s, n in kinds)
            text = f"{self.value}: {self.failed} of {self.trials} trials failed ({each}; median step {step})"
        not_learning = self.ok - self.learned
        return text + (f", {not_learning} stable but not learning" if not_learning else "")


def step_text(value: float | None) -> str:
    """A step for a sentence or a table: "4", "4.5", or "-" for none."""
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def breakdown(records: list[TrialRecord]) -> list[BreakdownRow]:
    """One row per dimension value: how many trials ran with it and how each ended."""
    rows = []
    for dimension, groups in dimensions(records).items():
        for value, members in groups.items():
            statuses = collections.Counter(str(r.get("status")) for r in members)
            steps = [step for r in members
                     if r.get("status") in FAILED and (step := r.get("stopped_at_step")) is not None]
            rows.append(BreakdownRow(dimension, value, len(members), dict(statuses),
                                     sum(1 for r in members if outcome(r) == LEARNED),
                                     statistics.median(steps) if steps else None))
    return rows


def breakdown_lines(rows: list[BreakdownRow]) -> list[str]:
    """One line per dimension, its values' sentences joined: 'precision: fp16-pure: 7 of 8 ...; fp32: 0 of 9 failed'."""
    lines: dict[str, list[str]] = collections.defaultdict(list)
    for row in rows:
        lines[row.dimension].append(row.sentence())
    return [f"{dimension}: " + "; ".join(sentences) for dimension, sentences in lines.items()]


def crash_reasons(records: list[TrialRecord]) -> list[tuple[int, str, str]]:
    """(trials, status, reason) for each distinct reason of the crashed and oom trials, most common first. The
    step a reason names ("at step 4") is left out, so one cause hitting trials at different steps counts once."""
    counted: collections.Counter = collections.Counter()
    for r in records:
        if r.get("status") in (Status.CRASHED, Status.OOM):
            reason = " ".join((r.get("reason") or "no reason recorded").split())
            counted[(r["status"], re.sub(r",? (at|before) step \d+", "", reason))] += 1
    return [(n, status, reason) for (status, reason), n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))]


# -- Pareto front -----------------------------------------------------------------------------------


def pareto_front(records: list[TrialRecord]) -> list[TrialRecord]:
    """The stable trials no other stable trial beats on both tokens/s and progress, fastest first."""
    measured = [(r, r.get("tokens_per_second"), r.get("progress")) for r in records if r.get("status") == Status.OK]
    points = [(r, speed, progress) for r, speed, progress in measured
              if finite_number(speed) and finite_number(progress)]
    front = [(r, speed, progress) for r, speed, progress in points
             if not any(s >= speed and p >= progress and (s > speed or p > progress) for _, s, p in points)]
    return [r for r, _, _ in sorted(front, key=lambda f: (-f[1], -f[2], f[0].get("number", 0)))]


def finite_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- parameter importances --------------------------------------------------------------------------


@dataclass
class Importance:
    target: str  # "is stable" or "tokens/s"
    values: dict[str, float] = field(default_factory=dict)  # param -> share of the target's variance, largest first
    note: str = ""  # how it was computed, or why it was not


def importances(records: list[TrialRecord], target: str) -> Importance:
    """fANOVA importances (Optuna's evaluator, seeded) of each varied param for "is stable" (1/0) or "tokens/s".

    The study is built in memory from the records; conditional params a trial lacks count as a
    value of their own ("absent"), so lora_r is judged across LoRA and non-LoRA trials alike.
    """
    import optuna

    if target == "is stable":
        used = [r for r in records if r.get("status") != Status.INVALID]
        values = [1.0 if r.get("status") == Status.OK else 0.0 for r in used]
    elif target == "tokens/s":
        speeds = [(r, speed) for r in records if finite_number(speed := r.get("tokens_per_second")) and speed > 0]
        used, values = [r for r, _ in speeds], [float(speed) for _, speed in speeds]
    else:
        raise ValueError(f"target must be 'is stable' or 'tokens/s', but got {target=}.")
    if len(used) < MIN_IMPORTANCE_TRIALS:
        return Importance(target, note=f"not enough trials ({len(used)}; need {MIN_IMPORTANCE_TRIALS})")
    if len(set(values)) < 2:
        same = ("every trial was stable" if values[0] else "no trial was stable") if target == "is stable" \
            else "every trial measured the same tokens/s"
        return Importance(target, note=f"not enough variation: {same} ({len(used)} trials)")
    distributions = _distributions(used)
    if not distributions:
        return Importance(target, note=f"not enough variation: every param was the same in all {len(used)} trials")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for r, value in zip(used, values):
        params = {name: _optuna_value(r["params"].get(name)) for name in distributions}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    scores = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    return Importance(target, dict(scores), note=f"fANOVA over {len(used)} trials")


def _optuna_value(value: Any) -> Any:
    # Optuna choices are None/bool/int/float/str; a list (lora_target_modules) becomes one string.
    return ",".join(map(str, value)) if isinstance(value, list) else value


def _distributions(records: list[TrialRecord]) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    names: list[str] = []
    for r in records:
        names += [n for n in r["params"] if n not in names]
    distributions = {}
    for name in names:
        values = [_optuna_value(r["params"].get(name)) for r in records]
        if any(isinstance(v, dict) for v in values):
            continue
        distinct = list(dict.fromkeys(values))
        if len(distinct) < 2:
            continue
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and (len(distinct) > MAX_DISCRETE_VALUES or name == "learning_rate"):
            low, high = min(values), max(values)
            log = low > 0 and high / low >= 100  # spans decades: the forest should split on its exponent
            if all(isinstance(v, int) for v in values):
                distributions[name] = IntDistribution(low, high, log=log)
            else:
                distributions[name] = FloatDistribution(float(low), float(high), log=log)
        else:
            choices = sorted(distinct, key=lambda v: (v is None, str(type(v)), str(v)))
            distributions[name] = CategoricalDistribution(choices)
    return distributions


# -- hints ------------------------------------------------------------------------------------------


def _name(dimension: str, value: str) -> str:
    """A dimension value in a hint: 'fp16-pure', 'LoRA on', 'learning_rate in 1e-4..1e-3', 'max_grad_norm 0.3'."""
    if dimension == "precision":
        return value
    if dimension == "LoRA":
        return f"LoRA {value}"
    return f"{dimension} in {value}" if ".." in value else f"{dimension} {value}"


def _trials(dimension: str, value: str | None, count: str, plural: bool) -> str:
    """'every fp16-pure trial', '3 of 4 trials with LoRA on', 'no other trial' (value None: the rest)."""
    noun = "trials" if plural else "trial"
    if value is None:
        return f"{count} other {noun}"
    if dimension == "precision":
        return f"{count} {value} {noun}"
    return f"{count} {noun} with {_name(dimension, value)}"


def hints(records: list[TrialRecord], min_count: int = MIN_HINT_TRIALS) -> list[str]:
    """Plain-language findings the trials support, each with its counts and what it is about: "stability:"
    (diverged, collapsed, crashed, oom), "learning:" (stable but not learning, less progress) or "speed:".

    A hint compares the trials with one dimension value against the trials with the others, and
    needs at least ``min_count`` trials on each side: failure rates MIN_RATE_GAP apart, progress
    medians MIN_PROGRESS_LOSS apart, tokens/s medians MIN_SPEED_GAIN apart. A value that fails more
    often but runs faster when stable is a trade-off, said as one: never "avoid X" beside "X ran faster".
    """
    failure, progress, speed = [], [], []
    compared, faster = [], set()
    for dimension, groups in dimensions(records).items():
        for value, members in groups.items():
            others = {v: g for v, g in groups.items() if v != value}
            rest = [r for g in others.values() for r in g]
            if len(members) < min_count or len(rest) < min_count:
                continue
            other = next(iter(others)) if len(others) == 1 else None
            compared.append((dimension, value, other, members, rest))
            found = _progress_hint(dimension, value, other, members, rest, min_count)
            if found:
                progress.append(found)
            found = _speed_hint(dimension, value, other, members, rest, min_count)
            if found:
                speed.append(found)
                faster.add((dimension, value))
    for dimension, value, other, members, rest in compared:
        hint = _failure_hint(dimension, value, other, members, rest, (dimension, value) in faster)
        if hint:
            failure.append(hint)
    failure.sort(key=lambda item: -item[0])
    return [text for _, text in failure] + progress + speed


def _failure_hint(dimension, value, other, members, rest, faster: bool = False) -> tuple[float, str] | None:
    counted = collections.Counter(outcome(r) for r in members)
    for bad in sorted(BAD_OUTCOMES, key=lambda o: -counted[o]):
        k, n = counted[bad], len(members)
        k_rest, n_rest = sum(1 for r in rest if outcome(r) == bad), len(rest)
        gap = k / n - k_rest / n_rest
        if not k or gap < MIN_RATE_GAP:
            continue
        verb = VERBS[bad]
        first = (f"{_trials(dimension, value, 'every', False)} {verb} ({k} of {n})" if k == n
                 else f"{_trials(dimension, value, f'{k} of {n}', True)} {verb}")
        second = (f"and {_trials(dimension, other, 'no', False)} did (0 of {n_rest})" if k_rest == 0
                  else f"vs {_trials(dimension, other, f'{k_rest} of {n_rest}', True)}")
        about = "learning" if bad == NOT_LEARNING else "stability"
        if faster:  # its stable trials ran faster (a speed hint says so): a trade-off, not a value to avoid
            better = _name(dimension, other) if other is not None else "the other values"
            gain = "more stable" if about == "stability" else "learns more often"
            advice = f"{gain} with {better}, but {_name(dimension, value)} ran faster (see speed)"
        elif other is not None and all(outcome(r) == LEARNED for r in rest):
            advice = f"use {_name(dimension, other)}"
        else:  # "use" only a value whose every trial learned: never "use X" beside a hint that X failed
            advice = f"avoid {_name(dimension, value)}"
        return gap, f"{about}: {first} {second}: {advice}"
    return None


def _rest(dimension: str, other: str | None) -> str:
    return "the others" if other is None else f"with {_name(dimension, other)}"


def _medians(members, rest, key, min_count):
    a = [r[key] for r in members if r.get("status") == Status.OK and finite_number(r.get(key))]
    b = [r[key] for r in rest if r.get("status") == Status.OK and finite_number(r.get(key))]
    if len(a) < min_count or len(b) < min_count:
        return None
    return statistics.median(a), statistics.median(b), len(a), len(b)


def _progress_hint(dimension, value, other, members, rest, min_count) -> str | None:
    found = _medians(members, rest, "progress", min_count)
    if found is None:
        return None
    mine, theirs, n, n_rest = found
    # Only the side that learned less speaks, so a two-valued dimension gives one hint, not a mirror pair.
    if mine >= theirs or theirs - mine <= MIN_PROGRESS:
        return None
    scale = max(abs(theirs), MIN_PROGRESS)
    if (theirs - mine) / scale < MIN_PROGRESS_LOSS:
        return None
    how = f"{(theirs - mine) / theirs:.0%} less progress" if theirs > 0 and mine > 0 else "less progress"
    return (f"learning: stable trials with {_name(dimension, value)} made {how} than {_rest(dimension, other)} "
            f"(median {mine:+.3f} vs {theirs:+.3f}, {n} vs {n_rest} trials)")


def _speed_hint(dimension, value, other, members, rest, min_count) -> str | None:
    found = _medians(members, rest, "tokens_per_second", min_count)
    if found is None:
        return None
    mine, theirs, n, n_rest = found
    # Only the faster side speaks: that is the one to act on.
    if theirs <= 0 or mine / theirs - 1 < MIN_SPEED_GAIN:
        return None
    return (f"speed: stable trials with {_name(dimension, value)} ran {mine / theirs - 1:.0%} faster "
            f"than {_rest(dimension, other)} "
            f"(median {mine:.0f} vs {theirs:.0f} tokens/s, {n} vs {n_rest} trials)")
