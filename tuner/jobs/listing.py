"""The cluster's searches as a team sees them: a line per job, a job's log, a job stopped.

    print(jobs_table(client))                 # JOB  USER  SEARCH  STATUS  TRIALS  BEST  EXPERIMENT
    follow(client, job_id, print)             # the log, and what comes until the job ends
    stop(client, job_id)                      # SIGTERM: the search marks its runs KILLED, resumable

What each job is comes from the job server (its status and the metadata tuner submit gave it); how far its search
is comes from the search's own progress lines in the job's log ("[ 3/12] trial 2 ok ...", "best: trial 1 ..."),
so that a submitter needs only the cluster's address, not its MLflow store.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
from typing import TYPE_CHECKING, Callable

from tuner.errors import TunerError
from tuner.jobs.cluster import TERMINAL, job
from tuner.jobs.send import METADATA_PREFIX, NO_TUNER_EXIT

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

__all__ = ["follow", "jobs_table", "progress_of", "status_of", "stop"]

_DONE = re.compile(r"^\[\s*(\d+)/(\d+)\] ", re.MULTILINE)
_BEST = re.compile(r"\| best: (trial \d+ \([^)]*\)|none yet) \|")
_EXIT = re.compile(r"^tuner: exit code (\d+)$", re.MULTILINE)
# What tuner's exit codes mean (tuner.cli), for a job whose search ended.
EXIT_INTERRUPTED = 130
EXIT_MEANING = {0: "recommended", 2: "bad input", 3: "nothing recommended", 4: "no trial ok",
                EXIT_INTERRUPTED: "interrupted", NO_TUNER_EXIT: "no tuner on the head node: see tuner logs"}


def progress_of(log: str) -> tuple[str, str, int | None]:
    """(trials done "3/12" or "-", the best so far or "-", the search's exit code or None) read from its log."""
    done = _DONE.findall(log)
    best = _BEST.findall(log)
    code = _EXIT.findall(log)
    return (f"{done[-1][0]}/{done[-1][1]}" if done else "-", best[-1] if best else "-",
            int(code[-1]) if code else None)


def _meta(details: JobDetails) -> dict[str, str]:
    return {k.removeprefix(METADATA_PREFIX): v for k, v in (details.metadata or {}).items()
            if k.startswith(METADATA_PREFIX)}


def status_of(details: JobDetails) -> str:
    """The job's status as Ray names it: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED."""
    return str(getattr(details.status, "value", details.status))


def _status(details: JobDetails, code: int | None) -> str:
    status = status_of(details)
    if code is None:
        code = details.driver_exit_code if status in TERMINAL else None
    if status in ("SUCCEEDED", "FAILED") and code is not None:
        return f"{status} ({EXIT_MEANING.get(code, f'exit {code}')})"
    if status == "STOPPED" and code == EXIT_INTERRUPTED:
        return "STOPPED (resumable)"
    return status


def jobs_table(client: JobSubmissionClient) -> str:
    """Every search tuner submitted to the cluster, newest first, one line each."""
    rows = []
    for details in sorted(client.list_jobs(), key=lambda d: d.start_time or 0, reverse=True):
        meta = _meta(details)
        if "experiment" not in meta or not details.submission_id:
            continue  # a job that is not a tuner search
        try:
            log = client.get_job_logs(details.submission_id)
        except RuntimeError:
            log = ""
        done, best, code = progress_of(log)
        search = " on ".join(part for part in (meta.get("trainer"), meta.get("model")) if part) or "-"
        if meta.get("resumes"):
            search += f" (resumes {meta['resumes']})"
        started = (dt.datetime.fromtimestamp(details.start_time / 1000).strftime("%m-%d %H:%M")
                   if details.start_time else "-")
        rows.append([details.submission_id, meta.get("user", "-"), search, _status(details, code), done, best,
                     meta["experiment"], started])
    if not rows:
        return "no tuner searches on this cluster yet (tuner submit sends one)"
    header = ["JOB", "USER", "SEARCH", "STATUS", "TRIALS", "BEST SO FAR", "EXPERIMENT", "STARTED"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [header, *rows])


def follow(client: JobSubmissionClient, job_id: str, echo: Callable[[str], None], keep_following: bool) -> str:
    """Echo the job's log (and with ``keep_following``, what it writes until it ends); returns its status."""
    details = job(client, job_id)
    if not keep_following:
        text = client.get_job_logs(job_id)
        if text:
            echo(text.rstrip("\n"))
        return status_of(details)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            if chunk:
                echo(chunk.rstrip("\n"))

    asyncio.run(tail())
    return status_of(job(client, job_id))


def stop(client: JobSubmissionClient, job_id: str, wait: float = 120.0) -> str:
    """Ask Ray to stop the job (SIGTERM to the search, which ends its trials and marks its runs KILLED) and wait
    for it to end; returns the job's last status."""
    details = job(client, job_id)
    status = status_of(details)
    if status in TERMINAL:
        raise TunerError(f"job {job_id} already ended ({status}); nothing to stop")
    client.stop_job(job_id)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        status = status_of(job(client, job_id))
        if status in TERMINAL:
            return status
        time.sleep(1.0)
    return status
