"""Ctrl-C and SIGTERM wait for a store write to end, then interrupt as they would have.

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

    with interrupts.repeated() as noted:
        ray.init()                 # a signal's exception can be lost in here: it is raised again until one gets out
    if noted: ...                  # the block ended anyway: the signal is still to be acted on
"""

from __future__ import annotations

import _thread
import contextlib
import os
import select
import signal
import threading
from collections.abc import Iterator

__all__ = ["deferred", "ending", "repeated"]

HELD = (signal.SIGINT, signal.SIGTERM)


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
    with _holding(ending=True):
        yield


@contextlib.contextmanager
def _holding(ending: bool) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    # A handler installed outside Python (getsignal: None) could not be put back: that signal is left alone.
    previous = {sig: signal.signal(sig, lambda signum, _frame: held.append(signum))
                for sig in HELD if signal.getsignal(sig) is not None}
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


AGAIN_AFTER_S = 1.0  # how long a signal's first exception has to leave a repeated() block before it is raised again


@contextlib.contextmanager
def repeated() -> Iterator[list[int]]:
    """Until the block ends, a SIGINT or SIGTERM that arrives is handed to its handler again every AGAIN_AFTER_S.
    Yields the list of those that arrived (empty: none).

    A Python signal handler runs wherever the main thread is, and some places drop what it raises: the hooks Python
    runs after a fork (a subprocess with a preexec_fn, as Ray starts its processes) print "Exception ignored in
    _releaseLock ... SystemExit: 15" and go on; so do finalizers. A SIGTERM while Ray started was lost so, and the
    search went on. The C-level handler notes every signal on a pipe (signal.set_wakeup_fd) whatever the Python one
    does, and a thread reads it and raises the signal again in the main thread (``_thread.interrupt_main``) until
    the block is left. Outside the main thread it does nothing.
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if select.select([read_end], [], [], 0.1)[0]:
                noted.extend(sig for sig in os.read(read_end, 64) if sig in HELD and sig not in noted)
            if noted and not done.wait(AGAIN_AFTER_S):
                _thread.interrupt_main(noted[0])

    watcher = threading.Thread(target=watch, name="tuner-interrupts", daemon=True)
    watcher.start()
    try:
        yield noted
    finally:
        done.set()
        try:
            watcher.join()  # a signal it raised again just now is raised here
        finally:
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action (SIGTERM: the process ends), now that the write is done
    # SIG_IGN: nothing to do
