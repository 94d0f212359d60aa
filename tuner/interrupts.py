"""Ctrl-C and SIGTERM wait for a store write to end, then interrupt as they would have.

    with interrupts.deferred():
        client.log_batch(...)      # a signal that arrives here is held ...
    # ... and acted on here: KeyboardInterrupt (tuner's CLI), or whatever the handler does

A KeyboardInterrupt raised inside SQLite's executemany left the driver's own MLflow connection holding the
database's write lock: every write of the interrupted search's cleanup then found "database is locked" (CI
saw a SIGTERM'd search hang past 60 s on it). Holding the signal for the length of one write keeps stores
whole. A write takes milliseconds, so Ctrl-C still answers at once; while another search holds the same SQLite
store, one try can wait out SQLite's busy timeout first.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["deferred"]

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then hand the first one held to the handler it had.

    Nests (an inner block hands its signal to the outer one). Outside the main thread, where Python runs no
    signal handler, it does nothing.
    """
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
            _deliver(held[0], previous[held[0]])


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action (SIGTERM: the process ends), now that the write is done
    # SIG_IGN: nothing to do
