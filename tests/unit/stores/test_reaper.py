"""tuner.stores.reaper: the processes started after it (as by ray.init) die when its pipe closes, and also when it is sent
SIGTERM itself (a batch system signals every process of a job, the reaper included); the processes there were
before it are left alone; stopping it does not wait on processes that are only zombies."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tuner.stores import reaper


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has its SIGTERM handler in place (Linux: the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def _wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _children() -> list[int]:
    return [child.pid for child in psutil.Process().children()]


def test_sigterm_to_the_reaper_kills_what_it_watches():
    watcher = reaper.start(psutil.Process().pid, known=_children())
    watched = _sleeper()  # started after the reaper, as Ray's processes by ray.init
    try:
        assert _wait_until(lambda: _catches_sigterm(watcher.pid)), "the reaper never took SIGTERM over"
        watcher.send_signal(signal.SIGTERM)  # the job is being stopped: the reaper goes, but does its work first
        assert watcher.wait(30) == 0
        # the watched process was killed by the reaper, not left for nobody
        assert watched.wait(10) == -signal.SIGKILL
    finally:
        for process in (watched, watcher):
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()


def test_stopping_the_reaper_does_not_wait_on_zombies():
    # The watched process is this process's child, as Ray's are the driver's: killed, it stays a zombie until
    # waited for here, which happens only after reaper.stop (ray.shutdown does it in the driver).
    watcher = reaper.start(psutil.Process().pid, known=_children())
    watched = _sleeper()
    try:
        started = time.monotonic()
        reaper.stop(watcher)
        # it used to wait out its 10 s on the zombie (psutil.wait_procs counts a zombie as running)
        assert time.monotonic() - started < 5.0
        assert psutil.Process(watched.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        with contextlib.suppress(OSError):
            watched.kill()
        watched.wait()


def test_the_reaper_leaves_alone_what_ran_before_it():
    before = _sleeper()  # the trial launcher, started before Ray: it ends its trials itself, folders and all
    watcher = reaper.start(psutil.Process().pid, known=_children())
    after = _sleeper()
    try:
        reaper.stop(watcher)
        assert after.wait(10) == -signal.SIGKILL
        assert before.poll() is None
    finally:
        for process in (before, after):
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()
