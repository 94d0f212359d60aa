"""One trial: build the real TRL trainer, train a few steps under the guard, measure, classify.

Runs without Ray, so a single trial can be reproduced by hand::

    tuner trial --config trial.yaml          # in this process, prints metrics and the verdict

``run_trial`` is the in-process core; ``run_trial_isolated`` runs it in a child process so a
SIGFPE/SIGSEGV/SIGKILL ends that trial as ``crashed`` instead of the caller.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from tuner.errors import TunerError, describe_exception
from tuner.learning import judge_learning
from tuner.records import NO_STOP_STEP, Status, TrialResult


# Test hook for fault injection (documented in the README): "<kind>@<step>", e.g. "sigfpe@3".
# The trial's own process then dies (or raises) at the end of that optimizer step; "nan" instead
# poisons the trainable weights, a real divergence for the guard to catch on the next step.
# TUNER_FAULT_WHEN="key=value[,key=value]" limits it to trials whose params (or seed) match.
FAULT_ENV = "TUNER_FAULT"
FAULT_WHEN_ENV = "TUNER_FAULT_WHEN"
_FAULTS = {"sigfpe": signal.SIGFPE, "sigsegv": signal.SIGSEGV, "sigkill": signal.SIGKILL}


@dataclass
class TrialSpec:
    """Everything one trial needs; the YAML that ``tuner trial --config`` reads is this, as a mapping."""

    trainer: str
    params: dict[str, Any]  # sampled + fixed search params (precision, learning_rate, use_peft, ...)
    model: str = "tiny"  # --model value: "tiny", a local directory, a hub id or an alias
    dataset: str | None = None  # None: the built-in tiny dataset for the trainer
    reward_funcs: list[str] | None = None  # GRPO only; None: tuner's built-in reward
    max_steps: int = 20  # short: the failures this hunts show up in the first steps
    seed: int = 0
    warmup_steps: int = 2  # steps excluded from speed figures: first steps pay for allocation and caching
    fault: str | None = None  # see FAULT_ENV

    @classmethod
    def from_mapping(cls, data: dict, where: str = "<trial>") -> "TrialSpec":
        """A trial config's structure, checked by ``_TrialConfig``; the params' names and types are checked
        against the trainer's TRL config by ``prepare_trial_spec`` (that needs TRL)."""
        if not isinstance(data, dict):
            raise TunerError(f"{where}: a trial config must be a YAML mapping with keys trainer and params")
        try:
            config = _TrialConfig.model_validate(data)
        except ValidationError as error:
            raise TunerError(f"{where}: {_describe(error)}") from None
        if config.fault is not None:
            _parse_fault(config.fault, f"{where}: fault")
        return cls(**config.model_dump())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrialSpec) if f.default is not dataclasses.MISSING}


class _TrialConfig(BaseModel):
    """What a trial config may say: TrialSpec's fields, typed. Strict: `max_steps: true` is a typo, not 1."""

    model_config = ConfigDict(extra="forbid")
    trainer: Literal["grpo", "dpo", "kto", "reward", "sft"]
    params: dict[str, Any]
    model: StrictStr = _DEFAULTS["model"]
    dataset: StrictStr | None = _DEFAULTS["dataset"]
    reward_funcs: list[StrictStr] | None = _DEFAULTS["reward_funcs"]
    max_steps: StrictInt = Field(_DEFAULTS["max_steps"], ge=1)
    seed: StrictInt = Field(_DEFAULTS["seed"], ge=0)
    warmup_steps: StrictInt = Field(_DEFAULTS["warmup_steps"], ge=0)
    fault: StrictStr | None = _DEFAULTS["fault"]

    @field_validator("reward_funcs", mode="before")
    @classmethod
    def _one_name(cls, value):
        return [value] if isinstance(value, str) else value  # `reward_funcs: accuracy_reward` means a list of one


def _describe(error) -> str:
    """A trial config's first validation error as "key: what is wrong; how to fix"."""
    errors = error.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"),
                 next((e for e in errors if e["type"] == "missing"), errors[0]))
    loc = [str(part) for part in first["loc"]]
    key, kind, got = ".".join(loc), first["type"], first.get("input")
    names = sorted(_TrialConfig.model_fields)
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(loc[0], names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
        return f"{key}: unknown key; remove it or check its spelling ({hint})"
    if kind == "missing":
        return f"missing key {key!r}; a trial config needs trainer and params"
    if loc == ["trainer"]:
        return f"trainer: unknown trainer {got!r}; choose one of grpo, dpo, kto, reward, sft"
    if loc == ["params"]:
        return f"params: must be a mapping of parameter names to values (got {got!r})"
    if loc[0] in ("max_steps", "seed", "warmup_steps"):
        low = 1 if loc[0] == "max_steps" else 0
        return f"{key}: must be a whole number >= {low}, got {got!r}"
    if loc[0] == "reward_funcs":
        return f"{key}: must be a list of reward function names (got {got!r})"
    return f"{key}: must be a string (got {got!r})"


def load_trial_spec(path: str | os.PathLike) -> TrialSpec:
    from tuner.space import load_yaml

    where = str(path)
    try:
        raw = load_yaml(Path(path).read_text())  # 2e-4 is a number, a key given twice an error
    except FileNotFoundError:
        raise TunerError(f"{where}: trial config not found; pass an existing YAML file to --config") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TunerError(f"{where}: malformed YAML{at}: {getattr(e, 'problem', e)}") from None
    return TrialSpec.from_mapping(raw, where)


def prepare_trial_spec(path: str | os.PathLike) -> TrialSpec:
    """``tuner trial --config``: the config read, every param's name and type checked against the trainer's
    TRL config, paths resolved against this folder, and the model, data and rewards probed
    (``tuner.probe``), before any training starts. Bad input is a TunerError."""
    import logging

    from tuner import probe, values

    quiet_libraries()
    logging.getLogger("datasets").setLevel(logging.CRITICAL)  # its log of a bad file: the error says it in one line
    where = str(path)
    spec = load_trial_spec(path)
    spec.params = values.check_params(spec.params, spec.trainer, f"{where}: params")
    if spec.reward_funcs and spec.trainer != "grpo":
        raise TunerError(f"{where}: reward_funcs: for grpo only; {spec.trainer} learns from its dataset's labels; "
                         "remove reward_funcs")
    inputs = probe.check_user_inputs(
        spec.trainer, spec.model, spec.dataset, spec.reward_funcs,
        missing_reward=f"{where}: reward_funcs: grpo on your own dataset needs a reward for it (tuner's built-in "
                       "reward only scores its built-in data); add reward_funcs: [NAME] with a TRL reward such as "
                       "accuracy_reward, or module:function of yours")
    # The user's paths are the user's: absolute from here on (what the trial and its trial.yaml see).
    spec.model, spec.dataset = inputs.model, inputs.dataset
    spec.reward_funcs = inputs.reward_funcs
    return spec


# -- measurement ------------------------------------------------------------------------------

def throughput(history: list[dict[str, Any]], step_times: list[tuple[int, float]], warmup: int,
               samples_per_step: int) -> tuple[float | None, float | None]:
    """tokens/s and samples/s over the steps after warm-up (TRL logs cumulative ``num_tokens``)."""
    times = dict(step_times)
    tokens = {row["step"]: row["num_tokens"] for row in history if "num_tokens" in row}
    steps = sorted(s for s in times if s > warmup)
    if len(steps) < 2:
        steps = sorted(times)
    if len(steps) < 2:
        return None, None
    first, last = steps[0], steps[-1]
    seconds = times[last] - times[first]
    if seconds <= 0:
        return None, None
    samples = samples_per_step * (last - first) / seconds
    if first in tokens and last in tokens:
        return (tokens[last] - tokens[first]) / seconds, samples
    return None, samples


def _peak_memory_mb() -> float:
    import resource

    import torch

    if torch.cuda.is_available() and torch.cuda.max_memory_allocated() > 0:
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


_NON_FINITE_SAMPLING = "probability tensor contains either `inf`, `nan` or element < 0"


def _is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower()


def _parse_fault(fault: str, where: str) -> tuple[str, int]:
    kind, _, at = str(fault).partition("@")
    known = (*_FAULTS, "oom", "error", "nan")
    if kind not in known or not (at or "1").isdigit() or int(at or 1) < 1:
        raise TunerError(f"{where}: fault must be '<kind>@<step>' with kind one of {', '.join(known)} "
                         f"and step >= 1, got {fault!r}")
    return kind, int(at or 1)


def _fault_applies(spec: "TrialSpec", when: str) -> bool:
    values = {**spec.params, "seed": spec.seed, "trainer": spec.trainer}
    for condition in filter(None, when.split(",")):
        key, _, expected = condition.partition("=")
        if key.strip() not in values or values[key.strip()] != yaml.safe_load(expected):
            return False
    return True


def _fault_hook(spec: "TrialSpec"):
    fault = spec.fault
    where = "fault" if fault else FAULT_ENV
    fault = fault or os.environ.get(FAULT_ENV)
    if not fault or not _fault_applies(spec, os.environ.get(FAULT_WHEN_ENV, "")):
        return None
    kind, at_step = _parse_fault(fault, where)

    def fire(step: int, model=None):
        if step != at_step:
            return
        if kind == "nan":
            import torch

            with torch.no_grad():
                for p in model.parameters():
                    if p.requires_grad:
                        p.fill_(float("nan"))
        elif kind in _FAULTS:
            os.kill(os.getpid(), _FAULTS[kind])
        elif kind == "oom":
            import torch

            raise torch.OutOfMemoryError("injected: CUDA out of memory. Tried to allocate 20.00 GiB")
        else:
            raise RuntimeError(f"injected fault {kind!r}")

    return fire


# -- running ----------------------------------------------------------------------------------


def run_trial(spec: TrialSpec, workdir: str | os.PathLike | None = None, metrics_path=None) -> TrialResult:
    """Train one trial in this process and classify it. Bad configs come back as ``invalid``,
    exceptions as ``crashed``/``oom``; only a dying process escapes (see run_trial_isolated)."""
    import tempfile

    from tuner import data, models, rewards, trainers
    from tuner.monitor import StepMonitor

    started = time.perf_counter()
    try:
        quiet_libraries()
        workdir = Path(workdir or tempfile.mkdtemp(prefix="tuner-trial-"))
        workdir.mkdir(parents=True, exist_ok=True)
        model_path = models.resolve_model(spec.model)
        dataset = data.load_dataset_spec(spec.dataset, spec.trainer)
        reward_funcs = rewards.resolve_reward_funcs(spec.reward_funcs) if spec.trainer == "grpo" else None
        split = trainers.split_params(spec.params)
    except Exception as error:  # noqa: BLE001 - loading failed: this trial's crash, said in one line with its place
        return TrialResult.crashed(describe_exception(error),
                           wall_seconds=time.perf_counter() - started)
    monitor = StepMonitor(spec.trainer, fp16_mixed=split.precision == "fp16-mixed", metrics_path=metrics_path,
                          fault=_fault_hook(spec))
    run = {"max_steps": spec.max_steps, "seed": spec.seed, "output_dir": str(workdir / "out"),
           "use_cpu": not _cuda_available()}
    result = TrialResult(status=Status.OK, device="cpu" if run["use_cpu"] else "cuda")
    try:
        try:
            trainer = trainers.build_trainer(spec.trainer, model_path, spec.params, dataset, run,
                                             reward_funcs=reward_funcs, callbacks=[monitor])
        except (ValueError, TypeError) as e:
            # TRL's configs reject impossible combinations (batch not divisible by num_generations ...)
            result.status, result.reason = Status.INVALID, f"{type(e).__name__}: {_first_line(e)}"
            return result
        monitor.trainer = trainer
        trainer.train()
    except Exception as e:  # noqa: BLE001 - any training failure is this trial's outcome, not the search's
        result.status = Status.OOM if _is_oom(e) else Status.CRASHED
        result.reason = describe_exception(e)
        if _NON_FINITE_SAMPLING in str(e):
            # GRPO samples from the policy: once its weights are NaN, sampling raises before any
            # loss is logged. That is the trial diverging, not the process crashing.
            result.status, result.guard_signal = Status.DIVERGED, "non_finite"
            result.reason = f"sampling from the policy hit non-finite probabilities ({result.reason})"
    finally:
        monitor.close()
        result.history = monitor.history
        result.steps_run = len(monitor.step_times)
        result.wall_seconds = time.perf_counter() - started
        if monitor.step_times:
            result.seconds_to_first_step = monitor.step_times[0][1] - started
        result.peak_memory_mb = _peak_memory_mb()

    if monitor.verdict is not None:
        v = monitor.verdict
        result.status, result.reason, result.stopped_at_step, result.guard_signal = v.status, v.reason, v.step, v.signal
    elif result.status == Status.OK:
        result.stopped_at_step = monitor.step_times[-1][0] if monitor.step_times else 0
    if result.status in (Status.CRASHED, Status.OOM) and monitor.step_times:
        result.stopped_at_step = monitor.step_times[-1][0]
    elif result.status == Status.DIVERGED and monitor.verdict is None:  # failed inside the step after the last one
        result.stopped_at_step = (monitor.step_times[-1][0] if monitor.step_times else 0) + 1
    batch = int(spec.params.get("per_device_train_batch_size", 8)) * int(spec.params.get("gradient_accumulation_steps", 1))
    result.tokens_per_second, result.samples_per_second = throughput(
        monitor.history, monitor.step_times, spec.warmup_steps, batch)
    learning = judge_learning(spec.trainer, monitor.history)
    result.progress, result.progress_p_value, result.learned = learning.effect, learning.p_value, learning.learned
    if result.status == Status.OK and monitor.guard.notes:
        result.reason = "; ".join(monitor.guard.notes)  # e.g. the reward saturated: worth saying, not a failure
    return result


def quiet_libraries() -> None:
    """Silence per-example progress bars and load reports: a search runs hundreds of trials."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# -- isolation --------------------------------------------------------------------------------


def _tuner_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith("TUNER_")}


def _child(spec_dict: dict, workdir: str, environment: dict[str, str] | None = None) -> None:
    """Child-process entry: run the trial, write result.json beside metrics.jsonl."""
    # A forkserver child inherits the environment of when the server started, not the caller's
    # current one: carry TUNER_CACHE_DIR, TUNER_FAULT, ... as they are now.
    if environment is not None:
        for key in [key for key in os.environ if key.startswith("TUNER_") and key not in environment]:
            del os.environ[key]
        os.environ.update(environment)
    started = time.perf_counter()
    try:
        spec = TrialSpec(**spec_dict)
        result = run_trial(spec, workdir, metrics_path=Path(workdir) / "metrics.jsonl")
    except (Exception, SystemExit) as error:  # noqa: BLE001 - told as the trial's reason, not lost in Ray's logs
        result = TrialResult.crashed(describe_exception(error),
                             wall_seconds=time.perf_counter() - started)
    (Path(workdir) / "result.json").write_text(json.dumps(result.summary(), allow_nan=True))


_context = None


def _mp_context():
    # A forkserver with torch/transformers/trl imported once: each trial's child starts in well
    # under a second instead of paying the ~7 s import again, and still dies alone.
    global _context
    if _context is None:
        import multiprocessing

        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["tuner._preload"])
    return _context


def run_trial_isolated(spec: TrialSpec, workdir: str | os.PathLike, timeout: float | None = None) -> TrialResult:
    """Run the trial in a child process; a signal or hard exit becomes ``crashed`` with its cause."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_path = workdir / "metrics.jsonl"
    result_path = workdir / "result.json"
    for stale in (metrics_path, result_path):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    process = _mp_context().Process(target=_child, args=(spec.to_dict(), str(workdir), _tuner_environment()),
                                     daemon=False)
    process.start()
    process.join(timeout)
    timed_out = process.is_alive()
    if timed_out:
        process.kill()
        process.join()
    history = read_metrics(metrics_path)
    if result_path.exists() and process.exitcode == 0:
        result = TrialResult(**json.loads(result_path.read_text()))
        result.history = history
        return result
    result = TrialResult.crashed("", history=history, steps_run=len(history),
                         wall_seconds=time.perf_counter() - started)
    result.stopped_at_step = history[-1]["step"] if history else 0
    if timed_out:
        result.reason = f"timed out after {timeout:.0f} s (--trial-timeout)"
    elif process.exitcode is not None and process.exitcode < 0:
        sig = signal.Signals(-process.exitcode)
        result.reason = f"process killed by {sig.name} ({signal.strsignal(sig)})"
        if sig == signal.SIGKILL:
            result.reason += "; the kernel's out-of-memory killer sends this"
    else:
        result.reason = f"process exited with code {process.exitcode} before reporting a result"
    result.guard_signal = "process_died"
    return result


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by the process dying mid-write
    return rows


def format_result(result: TrialResult) -> str:
    """Human-readable summary for ``tuner trial``."""
    def fmt(v, spec=".4g"):
        return "-" if v is None else format(v, spec)

    lines = [
        f"status:            {result.status}" + (f"  ({result.reason})" if result.reason else ""),
        f"steps run:         {result.steps_run}" + ("" if result.status in NO_STOP_STEP else
                                                     f", stopped at step {result.stopped_at_step}"
                                                     if result.stopped_at_step else ", stopped before step 1"),
        f"tokens/s:          {fmt(result.tokens_per_second, '.1f')}",
        f"samples/s:         {fmt(result.samples_per_second, '.2f')}",
        f"progress:          {fmt(result.progress)}",
        f"peak memory (MB):  {fmt(result.peak_memory_mb, '.0f')}",
        f"to first step (s): {fmt(result.seconds_to_first_step, '.1f')}",
    ]
    return "\n".join(lines)
