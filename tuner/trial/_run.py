"""Running one trial in this process: build the real TRL trainer, train under the guard, measure, classify.

    result = run_trial(TrialSpec(trainer="sft", params={"learning_rate": 1e-3}, max_steps=6))
    print(format_result(result))

Bad configs come back as ``invalid``, exceptions as ``crashed``/``oom``; only a dying process escapes
(``tuner.trial._isolation`` runs a trial in a child process for that).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from tuner.errors import describe_exception
from tuner.inputs.quiet import quiet_libraries
from tuner.records import NO_STOP_STEP, Status, TrialResult
from tuner.trial._faults import fault_hook
from tuner.trial._spec import TrialSpec
from tuner.trial.measure import is_oom, peak_memory_mb, reset_peak_memory, samples_per_step, throughput
from tuner.verdicts.forecast import forecast, horizon_steps
from tuner.verdicts.learning import judge_learning

_NON_FINITE_SAMPLING = "probability tensor contains either `inf`, `nan` or element < 0"
_CUDA_ASSERT = "device-side assert triggered"
_SAMPLING_DIVERGED = "sampling from the policy hit non-finite probabilities"


def run_trial(spec: TrialSpec, workdir: str | os.PathLike | None = None, metrics_path=None) -> TrialResult:
    """Train one trial in this process and classify it. Bad configs come back as ``invalid``,
    exceptions as ``crashed``/``oom``; only a dying process escapes (see run_trial_isolated).
    Without ``workdir``, TRL's output folder is a temporary one, removed when the trial ends. A spec of
    several ``ranks`` runs as that many processes (tuner.trial.ranks), this one their agent."""
    if spec.ranks > 1:
        from tuner.trial.ranks import run_ranks

        if workdir is not None:
            return run_ranks(spec, workdir, metrics_path)
        with tempfile.TemporaryDirectory(prefix="tuner-trial-", ignore_cleanup_errors=True) as scratch:
            return run_ranks(spec, scratch, metrics_path)
    if workdir is not None:
        return _run_in(spec, Path(workdir), metrics_path)
    with tempfile.TemporaryDirectory(prefix="tuner-trial-", ignore_cleanup_errors=True) as scratch:
        return _run_in(spec, Path(scratch), metrics_path)


def _run_in(spec: TrialSpec, workdir: Path, metrics_path) -> TrialResult:
    from tuner.config import precision as precisions
    from tuner.config import trainers
    from tuner.inputs import data, models, rewards
    from tuner.trial._monitor import StepMonitor
    from tuner.trial.signals import Signals
    from tuner.trial.trainer import build_trainer, trained_quietly

    started = time.perf_counter()
    reset_peak_memory()
    try:
        quiet_libraries()
        workdir.mkdir(parents=True, exist_ok=True)
        model_path = models.resolve_model(spec.model)
        tiny, real = models.is_tiny(model_path), not models.is_built_here(model_path)
        entry = spec.entry
        dataset = data.load_dataset_spec(spec.dataset, entry, tiny=tiny, real=real)
        if entry.rows_in_order:
            dataset = dataset.shuffle(seed=spec.seed)  # the seed picks the batches, as a random sampler's does
        reward_funcs = (rewards.resolve_reward_funcs(spec.reward_funcs or [data.builtin_reward(tiny, real)])
                        if entry.uses_reward_funcs else None)
        split = trainers.split_params(spec.params)
    except Exception as error:  # noqa: BLE001 - loading failed: this trial's crash, said in one line with its place
        return TrialResult.crashed(describe_exception(error),
                           wall_seconds=time.perf_counter() - started)
    monitor = StepMonitor(entry, grad_scaler=precisions.PRECISIONS[split.precision].grad_scaler, metrics_path=metrics_path,
                          fault=fault_hook(spec), signals=Signals(split.precision, spec.signals_every),
                          stop_at=spec.max_steps)
    run = {"max_steps": spec.run_steps, "seed": spec.seed, "output_dir": str(workdir / "out"),
           "use_cpu": not _cuda_available()}
    result = TrialResult(status=Status.OK, device="cpu" if run["use_cpu"] else "cuda")
    try:
        try:
            trainer = build_trainer(entry, model_path, spec.params, dataset, run,
                                             reward_funcs=reward_funcs, callbacks=[monitor])
        except (ValueError, TypeError) as e:
            # TRL's configs reject impossible combinations (batch not divisible by num_generations ...)
            result.status, result.reason = Status.INVALID, f"{type(e).__name__}: {_first_line(e)}"
            return result
        monitor.trainer = trainer
        if "RANK" in os.environ:  # a rank (tuner.trial.ranks): its log says what kind of job it is part of
            print(f"rank {os.environ.get('RANK')} of {os.environ['WORLD_SIZE']}: "
                  f"{trainer.accelerator.distributed_type.value}, fsdp: {trainer.is_fsdp_enabled}", flush=True)
        with trained_quietly():  # no FutureWarning for TRL's own calls to transformers' renamed methods
            trainer.train()
    except Exception as e:  # noqa: BLE001 - any training failure is this trial's outcome, not the search's
        result.status = Status.OOM if is_oom(e) else Status.CRASHED
        result.reason = describe_exception(e)
        if sampling_diverged(e, steps_done=len(monitor.step_times)):
            # GRPO samples from the policy: once its weights are NaN, sampling raises before any
            # loss is logged. That is the trial diverging, not the process crashing.
            result.status, result.guard_signal = Status.DIVERGED, "non_finite"
            result.reason = f"{_SAMPLING_DIVERGED} ({result.reason})"
    finally:
        monitor.close()
        result.history = monitor.history
        result.steps_run = len(monitor.step_times)
        result.wall_seconds = time.perf_counter() - started
        if monitor.step_times:
            result.seconds_to_first_step = monitor.step_times[0][1] - started
        result.peak_memory_mb = peak_memory_mb()
        result.memory_estimate_mb = _memory_estimate_mb(spec, model_path, "cpu" if run["use_cpu"] else "cuda")

    if monitor.verdict is not None:
        v = monitor.verdict
        result.status, result.reason, result.stopped_at_step, result.guard_signal = v.status, v.reason, v.step, v.signal
    elif result.status == Status.OK:
        result.stopped_at_step = monitor.step_times[-1][0] if monitor.step_times else 0
    if result.status in (Status.CRASHED, Status.OOM) and monitor.step_times:
        result.stopped_at_step = monitor.step_times[-1][0]
    elif result.status == Status.DIVERGED and monitor.verdict is None:  # failed inside the step after the last one
        result.stopped_at_step = (monitor.step_times[-1][0] if monitor.step_times else 0) + 1
    ranks = int(os.environ.get("WORLD_SIZE") or 1)  # a rank of a data-parallel job: every rank takes a batch
    result.tokens_per_second, result.samples_per_second = throughput(  # num_tokens: TRL counts every rank's
        monitor.history, monitor.step_times, spec.warmup_steps, samples_per_step(spec.params) * ranks)
    learning = judge_learning(entry, monitor.history)
    result.progress, result.progress_p_value, result.learned = learning.effect, learning.p_value, learning.learned
    if result.status == Status.OK:  # what the trends say of a run VERIFY_FACTOR times as long (tuner.verdicts.forecast),
        # or of the longer run whose first steps the trial is (its schedule's length)
        horizon = spec.schedule_steps if spec.schedule_steps > spec.max_steps else horizon_steps(result.steps_run)
        risks = forecast(monitor.history, entry.name, split.precision, horizon)
        if risks:
            result.risk, result.risk_signal, result.risk_step = str(risks[0]), risks[0].signal, risks[0].step
    if result.status == Status.OK and monitor.guard.notes:
        result.reason = "; ".join(monitor.guard.notes)  # e.g. the reward saturated: worth saying, not a failure
    return result


def sampling_diverged(error: BaseException, steps_done: int) -> bool:
    """Whether ``error`` is sampling from a policy whose probabilities went non-finite. On a CPU torch.multinomial
    says so. On CUDA its check is a device-side assert, reported at the next sync, inside transformers' decoding
    loop (an H100 run of 2026-11-27: fp16-pure GRPO configs whose activations had reached 42% of float16's range;
    bench/horizon-gpu-seed107.json.gz). An assert there counts only after an optimizer step: before any, the
    weights are the model's own, and an assert is a real crash (a token id past the vocabulary, say)."""
    import traceback

    if _NON_FINITE_SAMPLING in str(error):
        return True
    if _CUDA_ASSERT not in str(error) or steps_done < 1:
        return False
    frames = traceback.extract_tb(error.__traceback__)
    return any(f"{os.sep}generation{os.sep}" in frame.filename and "transformers" in frame.filename
               for frame in frames)


def broke_off(result: TrialResult) -> bool:
    """Whether training ended by an exception rather than at its last step or the guard's: in a distributed
    trial (tuner.trial.ranks) such a rank must fail, or the others would wait for it in their next collective."""
    return result.status in (Status.CRASHED, Status.OOM) or result.reason.startswith(_SAMPLING_DIVERGED)


def _memory_estimate_mb(spec: TrialSpec, model_path: str, device: str) -> float | None:
    """tuner.trial.memory's estimate of this trial's peak, recorded beside the measured one; never fails a trial."""
    from transformers import AutoConfig

    from tuner.trial import memory

    try:
        config = AutoConfig.from_pretrained(model_path)
        ranks = int(os.environ.get("WORLD_SIZE") or 1)  # a rank's own share (tuner.trial.ranks)
        return memory.estimate_trial(spec.entry, config, spec.params, device=device, ranks=ranks).total / 2**20
    except Exception:  # noqa: BLE001 - an estimate is a figure to compare, not a reason to lose the trial
        return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


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
        f"estimated (MB):    {fmt(result.memory_estimate_mb, '.0f')}",
        f"to first step (s): {fmt(result.seconds_to_first_step, '.1f')}",
    ]
    return "\n".join(lines)
