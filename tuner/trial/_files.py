"""A trial process's files, read by whoever waits for it: its metrics.jsonl rows (while it runs and after), the
end of its output, and the redirection of a process's output into its log.

    tail = MetricsTail(workdir / "metrics.jsonl"); tail.read()   # the rows appended since the last read
    read_metrics(workdir / "metrics.jsonl")                        # all of them, a cut-short last line dropped
    output_tail(workdir / "process.log")                           # its last lines: a crash's last words
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


def output_to(log: Path) -> None:
    """This process's stdout and stderr (its C libraries' too: file descriptors 1 and 2) appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def death(exitcode: int) -> str:
    """How a process that reported no result ended, in words (``exitcode`` < 0: killed by that signal)."""
    if exitcode >= 0:
        return f"process exited with code {exitcode} before reporting a result"
    sig = signal.Signals(-exitcode)
    said = f"process killed by {sig.name} ({signal.strsignal(sig)})"
    return said + ("; the kernel's out-of-memory killer sends this" if sig == signal.SIGKILL else "")


# What is kept of a dead process's output: its last lines, enough for a traceback or a CUDA error's context.
OUTPUT_TAIL_LINES = 60
OUTPUT_TAIL_CHARS = 8000


def output_tail(log: Path) -> str:
    """The end of a trial process's output (``LOG_NAME`` in its workdir): its last lines, "" when it printed none."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * OUTPUT_TAIL_CHARS))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-OUTPUT_TAIL_LINES:])[-OUTPUT_TAIL_CHARS:]


class MetricsTail:
    """The rows appended to a metrics.jsonl since the last ``read()``: whole lines only (a line the child is
    still writing waits for the next read), each row once."""

    def __init__(self, path: Path):
        self.path, self.offset = Path(path), 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        rows = []
        for line in data[:end].splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # cannot happen for whole lines the monitor wrote; never hand on a bad row
        self.offset += end
        return rows


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
