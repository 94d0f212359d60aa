"""A trial in its own child process: a SIGFPE, SIGSEGV, SIGKILL or timeout ends that trial as ``crashed``
with its cause, never the caller (a Ray worker, or a test).

    result = run_trial_isolated(spec, "/tmp/trial-3", timeout=600)
    result = run_trial_isolated(spec, workdir, on_rows=print)  # each new metrics.jsonl row, while it runs
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from tuner.errors import describe_exception
from tuner.records import Status, TrialResult
from tuner.trial._files import MetricsTail, death, output_tail, output_to, read_metrics
from tuner.trial._run import run_trial
from tuner.trial._spec import TrialSpec
from tuner.trial.launcher import LOG_NAME


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
        output_to(Path(workdir) / LOG_NAME)  # as the launcher's children do: a crash's last words are kept
    started = time.perf_counter()
    try:
        spec = TrialSpec(**spec_dict)
        result = run_trial(spec, workdir, metrics_path=Path(workdir) / "metrics.jsonl")
    except (Exception, SystemExit) as error:  # noqa: BLE001 - told as the trial's reason, not lost in Ray's logs
        result = TrialResult.crashed(describe_exception(error),
                             wall_seconds=time.perf_counter() - started)
    summary = result.summary()
    if result.output:  # a distributed trial's dead rank: its last words (a one-process trial's are read by the parent)
        summary["output"] = result.output
    (Path(workdir) / "result.json").write_text(json.dumps(summary, allow_nan=True))


_context = None


def process_context():
    # A forkserver with torch/transformers/trl imported once: each trial's child starts in well
    # under a second instead of paying the ~7 s import again, and still dies alone.
    global _context
    if _context is None:
        import multiprocessing

        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["tuner.trial._preload"])
    return _context


def _start(spec_dict: dict[str, Any], workdir: str):
    """The trial's child: forked by this node's launcher when a search started one (tuner.trial.launcher),
    else by this process's own forkserver."""
    from tuner.trial.launcher import LaunchedProcess

    process = LaunchedProcess.start_or_none(spec_dict, workdir)
    if process is None:
        process = process_context().Process(target=_child, args=(spec_dict, workdir, _tuner_environment()), daemon=False)
        process.start()
    return process


# How often a running trial's metrics.jsonl is read for rows to hand to ``on_rows`` (seconds); TUNER_LIVE_POLL_S
# changes it (tests use a long one: a trial whose rows all arrive after it ended, as on a fast machine).
LIVE_POLL_S = 1.0


def live_poll_seconds() -> float:
    return float(os.environ.get("TUNER_LIVE_POLL_S") or LIVE_POLL_S)


def run_trial_isolated(spec: TrialSpec, workdir: str | os.PathLike, timeout: float | None = None,
                       on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
                       poll: float | None = None, prune_after: tuple[float, str] | None = None) -> TrialResult:
    """Run the trial in a child process; a signal or hard exit becomes ``crashed`` with its cause.

    With ``on_rows``, the per-step rows the child appends to metrics.jsonl are handed over while it runs:
    every ``poll`` seconds (default ``LIVE_POLL_S``, or TUNER_LIVE_POLL_S), the rows written since the last call,
    in order, each once, and those written after the last read once it ended (a Ray trainable reports them to
    the driver). The result's history is read from the same file at the end, as without.

    ``prune_after`` (seconds, why): a trial still running that long cannot win on speed; it is stopped as
    ``pruned`` with that reason (before ``timeout``, which ends it as ``crashed``)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_path = workdir / "metrics.jsonl"
    result_path = workdir / "result.json"
    for stale in (metrics_path, result_path, workdir / LOG_NAME):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    limits = [s for s in (timeout, prune_after[0] if prune_after else None) if s is not None]
    wait = min(limits) if limits else None
    process = _start(spec.to_dict(), str(workdir))
    try:
        if on_rows is None:
            process.join(wait)
        else:
            _follow(process, MetricsTail(metrics_path), on_rows, poll or live_poll_seconds(),
                    None if wait is None else started + wait)
    except BaseException:
        # on_rows raised (or the caller was interrupted): the trial must not outlive its caller
        process.kill()
        process.join()
        raise
    timed_out = process.is_alive()
    if timed_out:
        process.kill()
        process.join()
    history = read_metrics(metrics_path)
    if timed_out and prune_after and (timeout is None or prune_after[0] < timeout):
        step = history[-1]["step"] if history else 0
        return TrialResult(status=Status.PRUNED, reason=prune_after[1], stopped_at_step=step, steps_run=len(history),
                           history=history, wall_seconds=time.perf_counter() - started)
    if result_path.exists() and process.exitcode == 0:
        result = TrialResult(**json.loads(result_path.read_text()))
        result.history = history
        return result
    result = TrialResult.crashed("", history=history, steps_run=len(history),
                         wall_seconds=time.perf_counter() - started)
    result.stopped_at_step = history[-1]["step"] if history else 0
    if timed_out:
        result.reason = f"timed out after {timeout:.0f} s (--trial-timeout)"
    else:
        result.reason = death(process.exitcode if process.exitcode is not None else 1)
    result.output = output_tail(workdir / LOG_NAME)  # its last words: MLflow keeps them with the trial (process.log)
    result.guard_signal = "process_died"
    return result


def _follow(process, tail: "MetricsTail", on_rows, poll: float, deadline: float | None) -> None:
    """Wait for ``process`` (until ``deadline``), handing ``on_rows`` the new rows every ``poll`` seconds, and
    once it has ended, the rows it wrote since the last read: every row is handed over, whatever the timing."""
    while process.is_alive():
        wait = poll if deadline is None else min(poll, deadline - time.perf_counter())
        if wait <= 0:
            break
        process.join(wait)
        rows = tail.read()
        if rows:
            on_rows(rows)
    rows = tail.read()  # also when it had ended before the first look
    if rows:
        on_rows(rows)
