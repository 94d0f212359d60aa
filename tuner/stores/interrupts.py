"""Ctrl-C and SIGTERM wait for a store write to end, then interrupt as they would have; and they are answered
within seconds wherever the main thread is.

    with interrupts.deferred():
        client.log_batch(...)      # a signal that arrives here is held ...
    # ... and acted on here: KeyboardInterrupt (tuner's CLI), or whatever the handler does

A KeyboardInterrupt raised inside SQLite's executemany left the driver's own MLflow connection holding the
database's write lock: every write of the interrupted search's cleanup then found "database is locked" (CI
saw a SIGTERM'd search hang past 60 s on it). Holding the signal for the length of one write keeps stores
whole. A write takes milliseconds, so Ctrl-C still answers at once; while another search holds the same SQLite
store, one try can wait out SQLite's busy timeout first.

    with interrupts.ending():
        tracker.finish("KILLED")   # a clean-up that already ends the work: a signal meanwhile waits, then is dropped

The first signal ends a search; a second one (Ctrl-C pressed twice, a batch system signalling every process of a
job) must not cut that ending short and leave a run RUNNING or Ray up.

    with interrupts.answered(end_now):
        ...                        # the search; its `except KeyboardInterrupt` calls interrupts.taken()

A Python signal handler runs only in the main thread, between two bytecodes. A main thread inside a call into C
runs none until the call returns, and Ray's calls to its GCS wait up to 60 s when the GCS is gone (a signal to the
whole job kills it with the driver; then Ray ends the process, exit code 1). And some places drop what a handler
raises: the hooks Python runs after a fork (as Ray starts its processes: "Exception ignored in _releaseLock ...
SystemExit: 15") and finalizers. So while a search runs, a thread sees each signal arrive (signal.set_wakeup_fd:
written by the C-level handler, whatever the main thread does) and, until the main thread has taken it, raises it
again there every AGAIN_AFTER_S; one still not taken after ANSWER_WITHIN_S is answered from that thread: ``end_now``
ends what was started, and the process exits with EXIT_INTERRUPTED.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["EXIT_INTERRUPTED", "answered", "deferred", "ending", "exit_now", "signalled", "taken"]

HELD = (signal.SIGINT, signal.SIGTERM)
EXIT_INTERRUPTED = 130  # how a shell reports a command Ctrl-C ended (128 + SIGINT); tuner's for SIGTERM too
AGAIN_AFTER_S = 1.0  # a signal not taken by then is raised in the main thread again (its exception may be lost)
ANSWER_WITHIN_S = 5.0  # a signal not taken by then is answered from the watcher thread: the main thread is stuck

_taken = threading.Event()  # the main thread acts on the signal: the watcher stands down
_arrived: list[signal.Signals] = []  # signals the watcher saw arrive in the answered() block
_ending_lock = threading.RLock()  # one ending at a time: the main thread's (ending()) or the watcher's


def taken() -> None:
    """The main thread has caught the interrupt (or held its signal) and acts on it: answered() stands down."""
    _taken.set()


def signalled() -> bool:
    """Whether a SIGINT or SIGTERM arrived in the answered() block (even one whose exception was lost)."""
    return bool(_arrived)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then hand the first one held to the handler it had.

    Nests (an inner block hands its signal to the outer one). Outside the main thread, where Python runs no
    signal handler, it does nothing.
    """
    with _holding(ending=False):
        yield


@contextlib.contextmanager
def ending() -> Iterator[None]:
    """For the clean-up that ends the work however it ended (finished, failed or interrupted): like deferred(),
    but a KeyboardInterrupt that the held signal's handler raises is dropped, since there is nothing left to
    interrupt. Keep the block bounded (seconds): a signal waits for it. A handler that does something else still
    runs (the default action of SIGTERM still ends the process, after the block)."""
    with _ending_lock, _holding(ending=True):
        yield


@contextlib.contextmanager
def answered(end_now: Callable[[], None]) -> Iterator[None]:
    """Until the block ends, a SIGINT or SIGTERM that the main thread has not taken (``taken()``) is raised there
    again every AGAIN_AFTER_S, and after ANSWER_WITHIN_S ``end_now()`` is called from a watcher thread and the
    process exits with EXIT_INTERRUPTED (os._exit: Python's own exit would wait for the stuck main thread, and Ray's
    atexit for its GCS). ``end_now`` ends what the block started, quickly, from a thread other than the main one:
    runs it left RUNNING, processes, then says so. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _taken.clear()
    _arrived.clear()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        arrived_at, raised_at = 0.0, 0.0
        while not done.is_set():
            if select.select([read_end], [], [], 0.1)[0]:
                for sig in os.read(read_end, 64):
                    if sig in HELD and not _arrived:
                        _arrived.append(signal.Signals(sig))
                        arrived_at = raised_at = time.monotonic()
            if not _arrived or _taken.is_set():
                continue
            now = time.monotonic()
            if now - arrived_at >= ANSWER_WITHIN_S:
                _end_now(end_now, done)
            elif now - raised_at >= AGAIN_AFTER_S:
                raised_at = now
                _thread.interrupt_main(_arrived[0])

    watcher = threading.Thread(target=watch, name="tuner-interrupts", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        try:
            watcher.join()  # a signal it raised again just now is raised here
        finally:
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)


def _end_now(end_now: Callable[[], None], done: threading.Event) -> None:
    with _ending_lock:  # not while the main thread ends the work itself: then it has taken the signal
        if done.is_set() or _taken.is_set():
            return
        try:
            end_now()
        except BaseException as error:  # noqa: BLE001 - the process ends below whatever happened
            print(f"tuner: while ending the interrupted work: {type(error).__name__}: {error}", file=sys.stderr)
        finally:
            exit_now(EXIT_INTERRUPTED)


def exit_now(code: int) -> None:
    """End the process with ``code`` once stdout and stderr are flushed, running no atexit hook and no finalizer:
    after an interrupt that may have killed Ray's processes, Ray's own (ray.shutdown, its core worker torn down)
    wait on its GCS or crash against it (seen: SIGSEGV in Ray's GCS subscriber, after the search had ended)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def _holding(ending: bool) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[signal.Signals] = []

    def hold(signum, _frame) -> None:
        held.append(signal.Signals(signum))
        taken()  # the main thread runs Python: it acts on the signal once the block ends

    # A handler installed outside Python (getsignal: None) could not be put back: that signal is left alone.
    previous = {sig: signal.signal(sig, hold) for sig in HELD if signal.getsignal(sig) is not None}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            try:
                _deliver(held[0], previous[held[0]])
            except KeyboardInterrupt:
                if not ending:
                    raise


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action (SIGTERM: the process ends), now that the write is done
    # SIG_IGN: nothing to do
