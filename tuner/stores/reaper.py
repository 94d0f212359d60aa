"""Ray's processes die with the driver that started them, however the driver ends.

``ray.init()`` without a cluster address starts Ray on this machine as children of the driver: the GCS, the
raylet, the dashboard head, the log monitor and the autoscaler monitor; the raylet then starts a dashboard agent,
a runtime-env agent and the workers (whose trial processes are theirs). ``ray.shutdown()`` stops all of them. A
driver killed by SIGKILL (the kernel's OOM killer, ``kill -9``) never calls it: the GCS and raylet die with it
(Ray ties them to their parent), the workers follow the raylet, but the two agents are re-parented to init and
keep running, and so would anything else that missed the raylet's death.

So the driver starts this reaper in its own session (a kill of the driver's process group does not reach it)
with a pipe on its stdin, just before ``ray.init``. While the pipe is open it records every process the driver
starts from then on (the children it did not have when the reaper started: Ray's, also of a ``ray.init`` that
never returned, and all their descendants, polled); when the pipe closes, because the driver called ``stop()``
after ``ray.shutdown()`` or because the driver died, it kills every recorded process still alive (checked by PID
and start time, so a reused PID is never hit) and exits. A SIGTERM does the same first: a batch system (Slurm's
scancel, systemd, a container stop) signals every process of the job, this one included, and the reaper must
still do its work (Ray's GCS and autoscaler monitor were seen alive 40 s after such a signal).

    python -m tuner.stores.reaper PARENT_PID KNOWN_PID...   # started by tuner.search._execution.init_ray; stops at end of stdin
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

POLL_SECONDS = 0.5


def start(parent: int, known: list[int]) -> subprocess.Popen:
    """Start a reaper for the children ``parent`` starts from now on (any but ``known``, its children now) and their
    descendants; ``stop()`` it after ray.shutdown()."""
    return subprocess.Popen([sys.executable, "-m", "tuner.stores.reaper", str(parent), *map(str, known)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(reaper: subprocess.Popen, timeout: float = 30.0) -> None:
    """Close the reaper's pipe: it kills what is left of the recorded processes, and exits."""
    if reaper.stdin is not None:
        reaper.stdin.close()
    try:
        reaper.wait(timeout)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


def _collect(parent: int, known: set[int], seen: dict[int, float]) -> None:
    """Record the children ``parent`` started (but ``known``) and every descendant of a recorded process, each by
    PID and start time. One pass over the process table per call: psutil's ``children()`` reads the whole table
    on every call, and this ran it once per recorded process (Ray's dozen or two), twice a second, for the whole
    search."""
    import psutil

    table: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, start time)
    for process in psutil.process_iter(["ppid", "create_time"]):
        ppid, started = process.info["ppid"], process.info["create_time"]
        if ppid is not None and started is not None:
            table[process.pid] = (ppid, started)
    below: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        if pid != ppid:
            below.setdefault(ppid, []).append(pid)
    for pid in below.get(parent, []):
        if pid not in known and pid != os.getpid():
            seen.setdefault(pid, table[pid][1])
    # The descendants of each recorded process that is still the one recorded (a reused PID is not ours).
    stack = [pid for pid, started in seen.items() if pid in table and table[pid][1] == started]
    visited = set(stack)
    while stack:
        for child in below.get(stack.pop(), []):
            seen.setdefault(child, table[child][1])
            if child not in visited:
                visited.add(child)
                stack.append(child)


def _kill(seen: dict[int, float], timeout: float = 10.0) -> None:
    import psutil

    alive = []
    for pid, started in seen.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.kill()
                alive.append(process)
        except psutil.Error:
            continue
    # Until each is gone or a zombie: a process the living driver started stays a zombie until the driver reaps it
    # (ray.shutdown does, after this), and psutil.wait_procs would wait out its timeout on it.
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.05)


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _read_to_end(fd: int) -> None:
    # os.read, not sys.stdin.buffer.read: after a SIGTERM this thread is still reading when the process exits, and
    # the buffered reader's lock held then makes Python abort ("could not acquire lock ... at interpreter shutdown")
    while os.read(fd, 4096):
        pass


def main(argv: list[str]) -> int:
    parent, *known = (int(a) for a in argv)
    seen: dict[int, float] = {}
    closed = threading.Event()

    def read_then_close() -> None:
        _read_to_end(sys.stdin.fileno())
        closed.set()

    threading.Thread(target=read_then_close, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):  # asked to go: first kill what it watches
        signal.signal(sig, lambda *_: closed.set())
    while True:
        _collect(parent, set(known), seen)
        if closed.wait(POLL_SECONDS):
            break
    _collect(parent, set(known), seen)  # anything started since the last poll by a process that is still alive
    _kill(seen)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
