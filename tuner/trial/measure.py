"""What a trial measures besides its metrics: throughput after warm-up, peak memory, out-of-memory errors.

    throughput(history, step_times, warmup=2, samples_per_step=8)   # (tokens/s, samples/s)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.config.trainers import Adapter


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


def peak_memory_mb() -> float:
    import resource

    import torch

    if torch.cuda.is_available() and torch.cuda.max_memory_allocated() > 0:
        return torch.cuda.max_memory_allocated() / 2**20
    try:  # the peak since reset_peak_memory(): ru_maxrss keeps the forking parent's peak, even across exec
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # KiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def reset_peak_memory() -> None:
    """Start this process's peak resident set afresh (Linux: VmHWM, by /proc/self/clear_refs), so a trial run in a
    process that was larger before (a test runner, a forked launcher) reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower()




def samples_per_step(params: dict[str, Any]) -> int:
    """Samples one optimizer step consumes on one device: batch size x gradient accumulation."""
    return int(params.get("per_device_train_batch_size", 8)) * int(params.get("gradient_accumulation_steps", 1))


def so_far(entry: Adapter, rows: list[dict[str, Any]], params: dict[str, Any], warmup: int) -> dict[str, Any]:
    """A running trial's figures from its metric rows so far (each with ``train_seconds``, tuner.trial._monitor):
    steps, tokens/s and learning progress, as its result would give them were it to end now."""
    from tuner.verdicts.learning import judge_learning

    times = [(int(r["step"]), float(r["train_seconds"])) for r in rows if r.get("train_seconds") is not None]
    tokens_per_second, samples = throughput(rows, times, warmup, samples_per_step(params))
    learning = judge_learning(entry, rows)
    return {"steps_run": int(rows[-1]["step"]) if rows else 0, "tokens_per_second": tokens_per_second,
            "samples_per_second": samples, "progress": learning.effect, "progress_p_value": learning.p_value,
            "learned": learning.learned}
