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

    python -m tuner.trial.launcher SOCKET     # started by start(); serves until stdin closes
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
SWITCH = "TUNER_TRIAL_LAUNCHER"  # "off": every Ray worker forks its trials itself (bench/slots.py compares)
LOG_NAME = "process.log"  # the child's stdout and stderr, in its trial's workdir


# -- the driver's side --------------------------------------------------------------------------------------


def wanted() -> bool:
    return os.environ.get(SWITCH, "on").lower() not in ("off", "0", "false", "no")


def start(timeout: float = 30.0) -> subprocess.Popen | None:
    """Start this node's launcher and name its socket in TUNER_LAUNCHER (inherited by a local Ray started after).

    Returns once it listens (its imports go on after: a trial asked for meanwhile waits for them); None if it
    could not start, and then each Ray worker starts its trials' processes itself, as on other nodes."""
    folder = tempfile.mkdtemp(prefix="tuner-launch-")
    path = os.path.join(folder, "socket")
    env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # an import asking for GPUs must not start CUDA
    process = subprocess.Popen([sys.executable, "-m", "tuner.trial.launcher", path], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    process.socket_path = path
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            return None
        time.sleep(0.02)
    os.environ[ENV] = path
    return process


def stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """Close its stdin: it kills the trials it forked and exits. TUNER_LAUNCHER is unset."""
    if os.environ.get(ENV) == process.socket_path:
        del os.environ[ENV]
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    Path(process.socket_path).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(process.socket_path).parent.rmdir()


# -- a Ray worker's side ------------------------------------------------------------------------------------


class LaunchedProcess:
    """A trial's child forked by the node's launcher, with the parts of multiprocessing.Process that
    tuner.trial.isolation uses: is_alive, join, kill, exitcode."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid, self.exitcode = sock, pid, None
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
            try:
                self.sock.sendall(b'"kill"\n')
            except OSError:
                pass


# -- the launcher itself ------------------------------------------------------------------------------------


def _child(conn: socket.socket, request: dict[str, Any], close_fds: set[int]) -> None:
    """In the forked child: the worker's environment, output to the workdir, then the trial; never returns."""
    code = 1
    try:
        for fd in close_fds:
            os.close(fd)
        conn.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        workdir = Path(request["workdir"])
        workdir.mkdir(parents=True, exist_ok=True)
        log = os.open(workdir / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # torch was imported under the launcher's environment
            import torch

            torch.set_num_threads(int(threads))
        from tuner.trial.isolation import _child as run

        run(request["spec"], str(workdir), None)
        code = 0
    except BaseException:  # noqa: BLE001 - the exit code says it; result.json is missing, so the trial is crashed
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)  # workers may connect while the imports below run: they wait in the backlog
    import tuner._preload  # noqa: F401 - the point of this process

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # killed politely: its trials go first (finally, below)
    children: dict[int, socket.socket] = {}  # child pid -> the worker's connection
    stdin = sys.stdin.fileno()
    try:
        while True:
            conns = {conn.fileno(): pid for pid, conn in children.items()}
            ready, _, _ = select.select([listener, wake_r, stdin, *conns], [], [], 5.0)
            if stdin in ready and not os.read(stdin, 4096):
                return  # the driver stopped us, or died
            if wake_r in ready:
                os.read(wake_r, 4096)
            if listener in ready:
                conn, _ = listener.accept()
                _fork(conn, children, {listener.fileno(), wake_r, wake_w,
                                       *[c.fileno() for c in children.values()]})
            for fd, pid in conns.items():
                if fd in ready and pid in children:  # "kill", or the worker's end closed: the trial goes
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            _reap(children)
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap(children, block=True)
        listener.close()
        Path(path).unlink(missing_ok=True)


def _fork(conn: socket.socket, children: dict[int, socket.socket], close_fds: set[int]) -> None:
    try:
        conn.settimeout(30)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                raise OSError("the worker went away before asking")
            data += chunk
        request = json.loads(data)
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(conn, request, close_fds)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    children[pid] = conn


def _reap(children: dict[int, socket.socket], block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exitcode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
    os._exit(0)  # its trials are reaped: skip the interpreter's slow teardown of torch and friends
