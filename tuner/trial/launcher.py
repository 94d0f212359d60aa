"""One trial launcher per node: torch, transformers and TRL imported once, then a child forked per trial.

Without it every Ray worker that runs trials starts its own forkserver and imports them again (~7 s of CPU
each, more under load) before its first trial, and does so again whenever Ray Tune replaces an idle worker.
The search starts the launcher before Ray, so the import overlaps Ray's own start-up; every trial on this node
is then forked from it in well under a second, and still dies alone (a SIGFPE is its child's, not the
launcher's, nor the Ray worker's).

    launcher = start()                  # the driver, before ray.init: TUNER_LAUNCHER names its socket
    process = LaunchedProcess.start_or_none(spec_dict, workdir)   # a Ray worker on the node
    process.join(1.0); process.is_alive(); process.kill(); process.exitcode
    stop(launcher)                      # its trials are killed; it also exits when the driver dies

The protocol is a line of JSON each way on a Unix socket: the request (the trial, its workdir and the whole
environment of the worker that asks, so the child sees what a child of that worker would: Ray's
CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS for its slot, TUNER_FAULT, ...), then ``{"pid": N}``, then
``{"exitcode": C}`` when the child ends (C < 0: killed by signal -C, as multiprocessing reports it). A ``kill``
line from the worker, or the worker's end of the socket closing (the worker died), kills the child. The
launcher exits, killing what it forked, when its stdin closes: when the driver stops it or dies.

The launcher itself is tuner/trial/_launcher_server.py (``python -m tuner.trial._launcher_server SOCKET``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV = "TUNER_LAUNCHER"  # the socket of this node's launcher, in the environment Ray's local workers inherit
SWITCH = "TUNER_TRIAL_LAUNCHER"  # "off": every Ray worker forks its trials itself (bench/studies/slots.py compares)
LOG_NAME = "process.log"  # the child's stdout and stderr, in its trial's workdir


# -- the driver's side --------------------------------------------------------------------------------------


def wanted() -> bool:
    return os.environ.get(SWITCH, "on").lower() not in ("off", "0", "false", "no")


class Launcher(subprocess.Popen):
    """This node's launcher process, and the socket it listens on."""

    socket_path: str


def start(timeout: float = 30.0) -> Launcher | None:
    """Start this node's launcher and name its socket in TUNER_LAUNCHER (inherited by a local Ray started after).

    Returns once it listens (its imports go on after: a trial asked for meanwhile waits for them); None if it
    could not start, and then each Ray worker starts its trials' processes itself, as on other nodes."""
    folder = tempfile.mkdtemp(prefix="tuner-launch-")
    path = os.path.join(folder, "socket")
    env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # an import asking for GPUs must not start CUDA
    process = Launcher([sys.executable, "-m", "tuner.trial._launcher_server", path], stdin=subprocess.PIPE,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    process.socket_path = path
    deadline = time.monotonic() + timeout
    try:
        while not os.path.exists(path):
            if process.poll() is not None or time.monotonic() > deadline:
                stop(process)
                return None
            time.sleep(0.02)
    except BaseException:  # interrupted before the caller has it to stop: it would live on until its imports end
        stop(process)
        raise
    os.environ[ENV] = path
    return process


def stop(process: Launcher, timeout: float = 30.0) -> None:
    """Close its stdin and SIGTERM it: it kills the trials it forked and exits. TUNER_LAUNCHER is unset.

    SIGTERM as well: while it still imports torch (seconds, more under load) it reads no stdin, and the search
    would wait for the imports to end; it has forked nothing yet then, and the signal's default action ends it."""
    from tuner.stores import reaper

    if os.environ.get(ENV) == process.socket_path:
        del os.environ[ENV]
    with contextlib.suppress(OSError):
        process.terminate()  # nothing if it has ended (and been waited for)
    reaper.stop(process, timeout)  # the same end as the reaper's: stdin closed, then a kill if it lingers
    Path(process.socket_path).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(process.socket_path).parent.rmdir()


# -- a Ray worker's side ------------------------------------------------------------------------------------


class LaunchedProcess:
    """A trial's child forked by the node's launcher, with the parts of multiprocessing.Process that
    tuner.trial._isolation uses: is_alive, join, kill, exitcode."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid = sock, pid
        self.exitcode: int | None = None
        self.buffer = b""

    @classmethod
    def start_or_none(cls, spec_dict: dict[str, Any], workdir: str, connect_timeout: float = 5.0,
                      ready_timeout: float = 300.0) -> "LaunchedProcess | None":
        """The trial started by this node's launcher, or None when there is none (TUNER_LAUNCHER unset, no such
        socket on this node, or it went away before forking): the caller then starts the child itself."""
        path = os.environ.get(ENV)
        if not path or not os.path.exists(path):
            return None
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.settimeout(connect_timeout)
            sock.connect(path)
            request = {"spec": spec_dict, "workdir": str(workdir), "env": dict(os.environ)}
            sock.sendall(json.dumps(request).encode() + b"\n")
            # the launcher may still be importing torch: the pid comes once it has, and forked the child
            sock.settimeout(ready_timeout)
            process = cls(sock, 0)
            reply = process._line()
            if reply is None or "pid" not in reply:
                raise OSError(f"launcher answered {reply!r}")
            process.pid = reply["pid"]
            sock.settimeout(None)
            return process
        except OSError:
            sock.close()
            return None

    def _line(self) -> dict[str, Any] | None:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is not None:
            return
        if b"\n" not in self.buffer and not select.select([self.sock], [], [], timeout)[0]:
            return
        reply = self._line()
        # the launcher itself gone (killed with the driver): the child went with it
        self.exitcode = reply["exitcode"] if reply and "exitcode" in reply else -signal.SIGKILL
        self.sock.close()

    def is_alive(self) -> bool:
        self.join(0)
        return self.exitcode is None

    def kill(self) -> None:
        if self.exitcode is None:
            with contextlib.suppress(OSError):  # the launcher is gone: so is the child
                self.sock.sendall(b'"kill"\n')
