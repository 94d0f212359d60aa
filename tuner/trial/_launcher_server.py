"""The node's trial launcher itself (tuner/trial/launcher.py starts it and asks it for trials): it imports torch,
transformers and TRL once, then forks one child per trial asked for, and kills them when asked, when the asker's
socket closes, or when its own stdin closes (the driver stopped it or died).

    python -m tuner.trial._launcher_server SOCKET     # started by tuner.trial.launcher.start()
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any, NamedTuple

from tuner.trial.launcher import LOG_NAME


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
        from tuner.trial._isolation import _child as run

        run(request["spec"], str(workdir), None)
        code = 0
    except BaseException:  # noqa: BLE001 - the exit code says it; result.json is missing, so the trial is crashed
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Child(NamedTuple):
    conn: socket.socket  # the Ray worker's connection that asked for it
    workdir: str  # its trial's folder


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)  # workers may connect while the imports below run: they wait in the backlog
    import tuner.trial._preload  # noqa: F401 - the point of this process

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # killed politely: its trials go first (finally, below)
    children: dict[int, Child] = {}  # child pid -> the worker's connection and the trial's folder
    orphans: set[int] = set()  # children whose asker is gone: nobody else will read or remove their folders
    stdin = sys.stdin.fileno()
    try:
        while True:
            conns = {child.conn.fileno(): pid for pid, child in children.items()}
            ready, _, _ = select.select([listener, wake_r, stdin, *conns], [], [], 5.0)
            if stdin in ready and not os.read(stdin, 4096):
                return  # the driver stopped us, or died
            if wake_r in ready:
                os.read(wake_r, 4096)
            if listener in ready:
                conn, _ = listener.accept()
                _fork(conn, children, {listener.fileno(), wake_r, wake_w, *conns})
            for fd, pid in conns.items():
                if fd in ready and pid in children:  # "kill", or the worker's end closed: the trial goes
                    if _closed(children[pid].conn):
                        orphans.add(pid)
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            _reap(children, orphans)
    finally:
        orphans.update(children)  # the search ended or its driver died: the trials still running go, folders too
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap(children, orphans, block=True)
        listener.close()
        Path(path).unlink(missing_ok=True)


def _closed(conn: socket.socket) -> bool:
    """Whether the worker closed its end (it died, or Ray killed it), rather than asked for a kill."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _fork(conn: socket.socket, children: dict[int, Child], close_fds: set[int]) -> None:
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
    children[pid] = Child(conn, str(request["workdir"]))


def _reap(children: dict[int, Child], orphans: set[int], block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is None:
            continue
        if pid in orphans:
            orphans.discard(pid)
            shutil.rmtree(child.workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            child.conn.sendall(json.dumps({"exitcode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        child.conn.close()


if __name__ == "__main__":
    try:
        serve(sys.argv[1])
    except SystemExit:  # SIGTERM (tuner.trial.launcher.stop sends it): serve's finally reaped its trials
        pass
    os._exit(0)  # its trials are reaped: skip the interpreter's slow teardown of torch and friends (seconds)
