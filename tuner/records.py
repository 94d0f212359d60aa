"""A trial's outcome, defined once: its status, what one trial measures, and the record the driver keeps.

    Status.DIVERGED in UNSTABLE                      # True: numbers blew up
    TrialResult.crashed("process killed by SIGFPE")   # the one constructor of a crashed outcome
    new_record(result.summary(), number=3, params={...}, max_steps=20, seed=0)

A ``TrialResult`` is what one trial process returns. A ``TrialRecord`` is that result (without its per-step
history) plus who the trial was: it crosses Ray (a result dict), Optuna (user attributes), MLflow (tags,
result.json) and search.json, so it is a ``TypedDict``: a plain dict at run time, one typed declaration here.
So are the two other shapes that cross a boundary as plain data: a ``TrialJob`` (what the driver hands Ray Tune
as a trial's config) and a ``SearchSummary`` (the search.json that export, report and resume read back).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast


class Status(enum.StrEnum):
    """How a trial ended. A StrEnum: equal to its value, so records read back from JSON compare equal."""

    OK = "ok"  # ran its steps with every number finite and no collapse (whether it learned is separate)
    DIVERGED = "diverged"  # numbers blew up: NaN/inf, exploding loss or gradients, fp16 scaler collapse
    COLLAPSED = "collapsed"  # numbers fine, nothing can be learned: no gradient, no reward spread, no update
    CRASHED = "crashed"  # the trial raised or its process died (SIGFPE, SIGSEGV, timeout, lost worker)
    OOM = "oom"  # out of GPU or host memory
    INVALID = "invalid"  # TRL refused the config before training (e.g. batch not divisible by num_generations)
    PRUNED = "pruned"  # stable so far, stopped by successive halving: its learning speed could not catch up
    TOO_BIG = "too_big"  # the memory plan (tuner.search._placement) says it cannot fit its share of the machine: not run


# Trials that failed, ran or not: what the report counts as failures and the sampler steers away from.
UNSTABLE = frozenset({Status.DIVERGED, Status.COLLAPSED, Status.CRASHED, Status.OOM, Status.TOO_BIG})
# Statuses with no step to report: the trial ran to the end, or never started.
NO_STOP_STEP = frozenset({Status.OK, Status.INVALID, Status.TOO_BIG})


@dataclass
class TrialResult:
    """What one trial measured and how it ended (``tuner.trial`` fills it in its own process)."""

    status: Status
    reason: str = ""
    stopped_at_step: int | None = None  # the step the guard fired at, or the last step reached by a crash
    steps_run: int = 0
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    progress: float | None = None  # learning effect, higher is better: reward gained / relative loss drop (tuner.verdicts.learning)
    progress_p_value: float | None = None  # one-sided p-value: the last third better than the start
    learned: bool = False  # the last third significantly better than the start, by tuner.verdicts.learning.MIN_EFFECT
    peak_memory_mb: float | None = None
    memory_estimate_mb: float | None = None  # tuner.trial.memory's estimate of that peak, made before training
    seconds_to_first_step: float | None = None
    wall_seconds: float | None = None
    guard_signal: str | None = None
    risk: str = ""  # the late-failure forecast (tuner.verdicts.forecast): "" when none, else its first risk in words
    risk_signal: str | None = None  # which signal it reads: headroom, fp16_weights, reward_spread
    risk_step: int | None = None  # the step it projects the failure at (None: already there, or no risk)
    device: str | None = None  # "cpu" or "cuda": the export sets use_cpu from it
    history: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""  # the end of what the trial's process printed, when it died: MLflow keeps it as process.log

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # "ok" read back from result.json is Status.OK

    @classmethod
    def crashed(cls, reason: str, *, stopped_at_step: int = 0, **measured: Any) -> "TrialResult":
        """A trial that raised or whose process died, ``reason`` saying why in one line."""
        return cls(status=Status.CRASHED, reason=reason, stopped_at_step=stopped_at_step, **measured)

    def summary(self) -> dict[str, Any]:
        """Every field but the per-step history (which goes to MLflow as metrics) and the process's output
        (which goes to MLflow as a file)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in _NOT_SUMMARY}


_NOT_SUMMARY = ("history", "output")
# Every field of a trial's result but its per-step history and its process's output.
SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(TrialResult) if f.name not in _NOT_SUMMARY)


class TrialRecord(TypedDict, total=False):
    """A finished trial as the driver keeps it: TrialResult's summary fields plus who the trial was."""

    number: int  # the Optuna trial number (confirmation re-runs keep their candidate's number)
    params: dict[str, Any]
    run_id: str | None  # its nested MLflow run
    node_id: str | None  # the Ray node it ran on
    max_steps: int
    seed: int
    confirms: int  # set on confirmation re-runs: the candidate trial's number
    extends: int  # set on a longer rung's re-runs (tuner.search._extend): the trial run again for longer
    anchors: int  # set on an anchored twin (tuner.search._anchor): the GRPO trial it runs with the KL penalty on
    schedule_steps: int  # set on a risk rung (tuner.search._extend): the long run's schedule it ran the first steps of
    source: str  # set on a warm start's prior trials (tuner.search._warm): the earlier search run they came from
    remeasures: int  # set on a --from search's speed re-runs (tuner.search._remeasure): the trial measured again
    pair: int  # ... and which pair of runs side by side it belongs to
    confirmation: dict[str, Any]  # set on the recommended record only: its Confirmation, as a mapping
    # TrialResult's summary fields:
    status: Status
    reason: str
    stopped_at_step: int | None
    steps_run: int
    tokens_per_second: float | None
    samples_per_second: float | None
    progress: float | None
    progress_p_value: float | None
    learned: bool
    peak_memory_mb: float | None
    memory_estimate_mb: float | None
    seconds_to_first_step: float | None
    wall_seconds: float | None
    guard_signal: str | None
    risk: str
    risk_signal: str | None
    risk_step: int | None
    device: str | None


class TrialJob(TypedDict, total=False):
    """One trial as the driver hands it to Ray Tune (the trial's ``config``): what the trainable runs, and what
    the driver's callback needs to log and record it. Search trials, confirmation re-runs and longer rungs alike."""

    spec: dict[str, Any]  # the TrialSpec as a mapping (TrialSpec.to_dict): trainer, params, model, seed, max_steps...
    number: int  # the Optuna trial number (a re-run has the number of the trial it re-runs)
    timeout: float  # seconds before the trial is killed as crashed
    tags: dict[str, str]  # MLflow tags of its run beyond the usual ones (tuner.stores.tags: confirmation, extension)
    extra: dict[str, int]  # kept on its record: {"confirms": n} on a confirmation, {"extends": n} on a longer rung
    #                        (and "schedule_steps" on a risk rung), {"anchors": n} on an anchored twin,
    #                        {"remeasures": n, "pair": k} on a speed re-run
    prune_after: tuple[float, str]  # (seconds, why): stopped as pruned if still running then (too slow to win)
    keep: bool  # never stopped early by successive halving or as too slow (trial 0 of a --from search)
    skip: str  # why it is not run at all (the memory plan says it does not fit): recorded as too_big


@dataclass(frozen=True)
class Spread:
    """The least, mean and greatest of a figure over a candidate's runs (its own and its confirmation seeds')."""

    min: float
    mean: float
    max: float


@dataclass
class Confirmation:
    """A candidate's verdict once its confirmation seeds ran (tuner.search._confirm.judge): confirmed, or demoted and
    why. The recommended record keeps it as a mapping under ``confirmation`` (to_dict), and search.json keeps every
    candidate's under ``candidates``; from_dict reads either back."""

    number: int  # the candidate trial
    confirmed: bool  # every seed stayed ok, and together they show learning
    seeds: list[int | None]  # the candidate's own seed, then its confirmation seeds
    statuses: list[str]  # each seed's status, in that order
    tokens_per_second: Spread | None  # over the seeds; None: none measured
    progress: Spread | None
    demoted_because: str = ""  # "" when confirmed
    risk: str = ""  # the forecast's risk on any of its seeds (tuner.verdicts.forecast), or ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Confirmation:
        def spread(value: Mapping[str, float] | None) -> Spread | None:
            return Spread(value["min"], value["mean"], value["max"]) if value else None

        return cls(number=data["number"], confirmed=bool(data["confirmed"]), seeds=list(data.get("seeds") or []),
                   statuses=[str(s) for s in data.get("statuses") or []],
                   tokens_per_second=spread(data.get("tokens_per_second")), progress=spread(data.get("progress")),
                   demoted_because=data.get("demoted_because") or "", risk=data.get("risk") or "")


class SearchSummary(TypedDict, total=False):
    """A finished search as its parent run keeps it (the ``search.json`` artifact): `tuner export`, `tuner report`
    and `tuner search --resume` read it back."""

    trainer: str  # the trainer table's name
    model: str | None  # --model as given (the search's prepare puts the tiny model's alias for none)
    model_path: str  # the folder it resolved to
    use_cpu: bool  # every trial ran on a CPU
    reward_funcs: list[str] | None  # as the export names them
    dataset: str | None
    rule: str  # the recommendation rule, in words (tuner.verdicts.recommend.RULE)
    confirm_seeds: int
    recommended: TrialRecord | None  # None: nothing recommended
    trl_config: dict[str, Any] | None  # the recommended config as `trl <trainer> --config` takes it
    export: dict[str, Any] | None  # how the export was decided: lengths and why, notes
    trials: list[TrialRecord]  # the search's own trials
    extensions: list[TrialRecord]  # longer rungs' re-runs
    confirmations: list[TrialRecord]  # confirmation re-runs
    remeasures: list[TrialRecord]  # --from: speed re-runs side by side with trial 0 (tuner.search._remeasure)
    candidates: list[dict[str, Any]]  # each candidate's Confirmation, as a mapping
    plan: dict[str, Any]  # the memory plan (tuner.search's placement)
    source: dict[str, Any] | None  # --from: the user's TRL config (tuner.config.trl_config.SourceConfig as a mapping)
    fix: dict[str, Any] | None  # --from: trial 0's verdict, the changes and their evidence, the edited file


def new_record(result: Mapping[str, Any], *, number: int, params: dict[str, Any], max_steps: int, seed: int,
               run_id: str | None = None, node_id: str | None = None, **extra: int) -> TrialRecord:
    """The driver's record of a finished trial, from its result summary (missing fields are None); ``extra``:
    confirms, extends, remeasures and pair, as its job says (TrialJob.extra)."""
    summary = {k: result.get(k) for k in SUMMARY_FIELDS}
    summary["status"] = Status(summary["status"] or Status.CRASHED)
    # The summary's keys are SUMMARY_FIELDS, TrialResult's fields: declared in TrialRecord one by one.
    return cast(TrialRecord, {"number": number, "params": params, **summary, "run_id": run_id, "node_id": node_id,
                              "max_steps": max_steps, "seed": seed, **extra})


def is_ok(record: Mapping[str, Any] | TrialResult) -> bool:
    status = record.status if isinstance(record, TrialResult) else record.get("status")
    return status == Status.OK
