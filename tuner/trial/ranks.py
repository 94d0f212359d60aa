"""A trial that spans several processes: one data-parallel training job, one rank per GPU (on a CPU, gloo
processes), started by torch's elastic launcher, the engine behind ``torchrun``.

    result = run_ranks(TrialSpec(trainer="grpo", params={...}, ranks=2), workdir)   # in the trial's process

The trial's own process (forked by the node's launcher, as for a one-process trial) becomes the job's agent:
``torch.distributed.launcher.elastic_launch`` starts ``ranks`` workers (``python -m tuner.trial.ranks``) on this
node, with a rendezvous on a free port of 127.0.0.1 (port 0: no two trials share a MASTER_PORT) and no
restarts. Each rank trains the same TrialSpec under HF Trainer's DDP (FSDP with ``sharding: fsdp``); Trainer
all-reduces what it logs (the loss is averaged over ranks, DDP's gradients are all-reduced, GRPO's rewards
gathered), so every rank's guard sees the same rows and stops at the same step. Rank 0 writes metrics.jsonl,
as a one-process trial does, so the live view, MLflow and the verdicts read it unchanged; every rank writes
``rank<R>.json`` (its result) and ``rank<R>.log`` (its output); a rank is ``python -m tuner.trial._rank``.

A rank that dies (SIGFPE, SIGSEGV, the OOM killer) or raises ends the job: the agent sees it within
MONITOR_S, stops the other ranks, and the trial is ``crashed`` (``oom``) with that rank's number and last
output. A rank never outlives its agent: each asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG), so a stopped, timed-out or orphaned trial, or a killed driver, leaves no rank running.

Why not Ray Train: a Ray Train worker is a Ray actor, so a SIGFPE in one is an actor failure inside Ray
rather than a process tuner owns and reads; the launcher, the guard's metrics file, the process log and the kill
path every one-process trial uses would each need a second form. Here a distributed trial is the same trial
process with children, under the same kill and the same files.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import uuid
from pathlib import Path

from tuner.errors import describe_exception
from tuner.records import Status, TrialResult
from tuner.trial._files import death, output_tail, read_metrics
from tuner.trial._spec import TrialSpec

MONITOR_S = 0.5  # how often the agent checks its ranks: a dead rank ends the job within this
SPEC_NAME = "ranks-spec.json"


def rank_log(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.log"


def rank_result(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.json"


def run_ranks(spec: TrialSpec, workdir: str | os.PathLike, metrics_path: str | os.PathLike | None = None) -> TrialResult:
    """Run ``spec`` as ``spec.ranks`` processes on this node and return rank 0's result, or the first failed
    rank's as ``crashed`` / ``oom``. ``metrics_path`` (default: metrics.jsonl in ``workdir``) gets rank 0's rows
    while it runs."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for rank in range(spec.ranks):
        rank_result(workdir, rank).unlink(missing_ok=True)
    metrics_path = Path(metrics_path or workdir / "metrics.jsonl")
    (workdir / SPEC_NAME).write_text(json.dumps({"spec": spec.to_dict(), "metrics": str(metrics_path)}))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=spec.ranks, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", rdzv_configs={"is_host": True},
                          max_restarts=0, monitor_interval=MONITOR_S, local_addr="127.0.0.1")
    started = time.perf_counter()
    threads = _threads_per_rank(spec.ranks)
    previous = {key: os.environ.get(key) for key in ("OMP_NUM_THREADS", "MASTER_ADDR")}
    os.environ.update({"OMP_NUM_THREADS": str(threads), "MASTER_ADDR": "127.0.0.1"})
    try:
        elastic_launch(config, sys.executable)("-m", "tuner.trial._rank", str(workdir))
    except ChildFailedError as error:
        return _failed(spec, workdir, metrics_path, error, started)
    except Exception as error:  # noqa: BLE001 - the rendezvous or the launch itself failed: this trial's crash
        return TrialResult.crashed(f"starting {spec.ranks} ranks failed: {describe_exception(error)}",
                                   wall_seconds=time.perf_counter() - started)
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    written, _ = _ended(workdir, 0)
    if written is None:
        return TrialResult.crashed("rank 0 ended without a result", wall_seconds=time.perf_counter() - started)
    result = TrialResult(**written)
    result.history = read_metrics(metrics_path)
    return result


def _threads_per_rank(ranks: int) -> int:
    """The trial's CPU threads (Ray's OMP_NUM_THREADS for its slot, else this machine's) shared by its ranks."""
    total = os.environ.get("OMP_NUM_THREADS", "")
    total_threads = int(total) if total.isdigit() and int(total) > 0 else (os.cpu_count() or 1)
    return max(1, total_threads // ranks)


# What the agent sends the ranks it stops once one has failed: a rank ended by one of these is not the cause.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _ended(workdir: Path, rank: int) -> tuple[dict | None, float]:
    """A rank's result and when it wrote it (None, inf: it wrote none: it died)."""
    try:
        written = json.loads(rank_result(workdir, rank).read_text())
    except (OSError, ValueError):
        return None, math.inf
    return written["result"], written["ended_at"]


def _cause(failures: dict, workdir: Path) -> int:
    """Which failed rank started it: one killed by a signal the agent does not send (SIGFPE, SIGSEGV, the OOM
    killer's SIGKILL), else the first to end with a result (it raised: an OOM; the others' gloo errors came
    after), else the lowest."""
    def order(rank: int):
        exitcode = failures[rank].exitcode
        killed = exitcode < 0 and signal.Signals(-exitcode) not in _STOP_SIGNALS
        return (not killed, _ended(workdir, rank)[1], rank)

    return min(failures, key=order)


def _failed(spec: TrialSpec, workdir: Path, metrics_path: Path, error, started: float) -> TrialResult:
    """The trial's result when a rank failed: that rank's own result if it got to write one (it raised: an
    OOM, a bad config), else how it died, with its last output."""
    rank = _cause(error.failures, workdir)
    failure = error.failures[rank]
    history = read_metrics(metrics_path)
    written, _ = _ended(workdir, rank)
    if written is not None:
        result = TrialResult(**written)
        if result.status != Status.OK:
            result.reason = f"rank {rank}: {result.reason}"
            result.history = history or result.history
            return result
    result = TrialResult.crashed("", history=history, steps_run=len(history),
                                 wall_seconds=time.perf_counter() - started)
    result.stopped_at_step = history[-1]["step"] if history else 0
    result.reason = f"rank {rank} of {spec.ranks}: {death(failure.exitcode)}"
    result.output = output_tail(rank_log(workdir, rank))
    result.guard_signal = "process_died"
    return result
