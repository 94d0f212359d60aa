"""Ctrl-C and SIGTERM wait for a store write to end (tuner.stores.interrupts): on the signal handlers themselves, and on
a real MLflow SQLite store interrupted in the middle of SQLite's executemany, as a SIGTERM'd search once was. A
clean-up that ends the work drops a second signal's interrupt; a signal whose interrupt Python dropped is raised
again; one a stuck main thread cannot take is answered from the watcher thread (a process of its own, exit 130)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy

from tuner.cli import _interrupt
from tuner.stores import interrupts, mlflow_store, run_writer


@pytest.fixture
def sigterm_interrupts():  # as tuner's CLI does: SIGTERM raises KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, _interrupt)
    # SIGINT as Python sets it up in a process started in the foreground: a test runner started in the background
    # by a non-interactive shell inherits SIGINT ignored, and Python then leaves it so (Ctrl-C could not reach it)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGTERM, previous)
    signal.signal(signal.SIGINT, previous_int)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_block_interrupts_when_the_block_ends(sig, sigterm_interrupts):
    done = []
    with pytest.raises(KeyboardInterrupt):  # SIGINT: Python's own default handler raises it
        with interrupts.deferred():
            signal.raise_signal(sig)
            done.append("after the signal")
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGTERM) is _interrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_blocks_interrupt_once_at_the_outer_end(sigterm_interrupts):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            with interrupts.deferred():
                signal.raise_signal(signal.SIGTERM)
            done.append("inner ended")
            signal.raise_signal(signal.SIGTERM)
            done.append("outer ended")
    assert done == ["inner ended", "outer ended"]


def test_no_signal_no_interrupt(sigterm_interrupts):
    with interrupts.deferred():
        pass
    assert signal.getsignal(signal.SIGTERM) is _interrupt


def _signal_inside_executemany(engine, table: str) -> list[str]:
    """SIGTERM raised while SQLite's executemany inserts the second row into ``table``, once: the transaction is
    open and holds the database's write lock when KeyboardInterrupt leaves it."""
    fired: list[str] = []

    def rows_then_signal(parameters):
        for i, row in enumerate(parameters):
            if i == 1:
                signal.raise_signal(signal.SIGTERM)
            yield row

    def hook(conn, cursor, statement, parameters, context, executemany):
        if executemany and not fired and f"INSERT INTO {table}" in statement:
            fired.append(statement)
            return statement, rows_then_signal(parameters)
        return statement, parameters

    sqlalchemy.event.listen(engine, "before_cursor_execute", hook, retval=True)
    return fired


def test_a_sigterm_inside_sqlites_executemany_leaves_the_trial_run_whole_and_the_store_writable(
        tmp_path, sigterm_interrupts):
    store = tmp_path / "mlflow"
    tracker = run_writer.SearchTracker(mlflow_store.default_tracking_uri(store), "stop", store)
    tracker.start("search-stop", {"trials": 1}, {"tuner.study": "search-stop"})
    spec = {"trainer": "sft", "params": {"learning_rate": 1e-4}, "max_steps": 4, "seed": 0, "model": "tiny"}
    run_id = tracker.start_trial("key-0", 0, spec)
    fired = _signal_inside_executemany(tracker.client._tracking_client.store.engine, "metrics")
    history = [{"step": s, "loss": 1.0 / s} for s in range(1, 5)]
    with pytest.raises(KeyboardInterrupt) as interrupted:
        tracker.finish_trial("key-0", spec, {"status": "ok", "reason": "", "stopped_at_step": 4, "steps_run": 4},
                             history)
    assert fired, "the signal was not raised inside a metrics insert"
    run = tracker.client.get_run(run_id)  # the trial's end was written whole before the interrupt
    assert run.info.status == "FINISHED" and run.data.tags["tuner.status"] == "ok"
    assert [m.step for m in tracker.client.get_metric_history(run_id, "loss")] == [1, 2, 3, 4]
    result = json.loads(Path(tracker.client.download_artifacts(run_id, "result.json", str(tmp_path))).read_text())
    assert len(result["history"]) == 4
    # The interrupted search's own cleanup writes next, with the KeyboardInterrupt (and its traceback's frames)
    # still alive, as in tuner.search.driver: without the deferral, SQLite's lock was still held and this write waited
    # out the busy timeout and failed with "database is locked".
    with contextlib.closing(sqlite3.connect(store / "mlflow.db", timeout=2, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # "database is locked" after 2 s if a write lock is still held
        other.execute("ROLLBACK")
    started = time.monotonic()
    tracker.finish("KILLED")
    assert time.monotonic() - started < 10.0 and interrupted.value is not None
    assert tracker.client.get_run(tracker.parent_id).info.status == "KILLED"


def test_the_default_action_runs_after_the_block(tmp_path):
    """SIGTERM with no Python handler: the process ends as it would have, once the block's write is done."""
    code = ("import signal, sys; from tuner.stores import interrupts\n"
            "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
            "with interrupts.deferred():\n"
            "    signal.raise_signal(signal.SIGTERM)\n"
            "    open(sys.argv[1], 'w').write('written')\n"
            "print('not reached')\n")
    done = tmp_path / "done"
    run = subprocess.run([sys.executable, "-c", code, str(done)], capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGTERM and done.read_text() == "written", (run.returncode, run.stderr)
    assert "not reached" not in run.stdout


def test_ending_drops_the_interrupt_of_a_signal_held_in_its_block(sigterm_interrupts):
    done = []
    with interrupts.ending():  # a clean-up that ends the work: a signal waits for it, then has nothing to interrupt
        signal.raise_signal(signal.SIGTERM)
        done.append("cleaned up")
    assert done == ["cleaned up"]
    assert signal.getsignal(signal.SIGTERM) is _interrupt


def test_ending_lets_the_blocks_own_error_through(sigterm_interrupts):
    # the held signal's KeyboardInterrupt must not replace (and so hide) what went wrong in the clean-up
    with pytest.raises(ValueError, match="the clean-up failed"):
        with interrupts.ending():
            signal.raise_signal(signal.SIGTERM)
            raise ValueError("the clean-up failed")


class _DropsWhatItRaises:
    """A finalizer: Python prints what one raises ("Exception ignored in ...") and goes on, as it does in the hooks
    it runs after a fork, where a SIGTERM's exception was lost while Ray started its processes."""

    def __del__(self):
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # what __del__ raised, dropped
def test_answered_raises_again_a_signal_whose_exception_was_lost(sigterm_interrupts):
    started, went_on, caught_after = time.monotonic(), [], None
    with interrupts.answered(lambda: None):
        try:
            _DropsWhatItRaises()  # the signal's KeyboardInterrupt is raised, and dropped, in its __del__
            went_on.append("past the lost interrupt")
            while time.monotonic() - started < 30:  # the work goes on as if no signal had come
                time.sleep(0.05)
        except KeyboardInterrupt:
            interrupts.taken()
            caught_after = time.monotonic() - started
    assert went_on == ["past the lost interrupt"] and interrupts.signalled()
    # raised again by the watcher after AGAIN_AFTER_S, long before the work would have ended
    assert caught_after is not None and caught_after < interrupts.AGAIN_AFTER_S + 10, caught_after
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd it used is given back


STUCK = """
import os, signal, sys
from tuner.stores import interrupts
from tuner.cli import _interrupt

signal.signal(signal.SIGTERM, _interrupt)  # as tuner's CLI does
interrupts.ANSWER_WITHIN_S = float(sys.argv[1])
with interrupts.answered(lambda: print("ended by the watcher", flush=True)):
    try:
        print("working", flush=True)
        # C's system() waits for its child through any signal, as a Ray call waits for a GCS that is gone: the main
        # thread runs no handler meanwhile. sys.argv[2] == "take": a handler ran and the interrupt was taken.
        os.system("sleep 60" if sys.argv[2] == "stuck" else "true")
        signal.raise_signal(signal.SIGTERM)
    except KeyboardInterrupt:
        interrupts.taken()
        import time
        time.sleep(2 * interrupts.ANSWER_WITHIN_S)  # a slow ending of its own: the watcher leaves it alone
        print("ended by the main thread", flush=True)
"""


def _run_stuck(tmp_path, how: str, answer_within_s: float) -> tuple[int, str, float]:
    out = tmp_path / "out.txt"
    with out.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-c", STUCK, str(answer_within_s), how], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while b"working" not in out.read_bytes():
            assert process.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        time.sleep(0.2)  # into os.system
        if how == "stuck":
            process.send_signal(signal.SIGTERM)  # the process only: its `sleep` child would end the wait
        signalled = time.monotonic()
        code = process.wait(60)
        return code, out.read_text(), time.monotonic() - signalled
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the orphaned `sleep`


def test_answered_ends_the_work_when_the_main_thread_is_stuck(tmp_path):
    code, out, took = _run_stuck(tmp_path, "stuck", 2.0)
    # the watcher ended it: end_now ran, exit 130, after ANSWER_WITHIN_S, not after the 60 s the call would take
    assert code == interrupts.EXIT_INTERRUPTED and "ended by the watcher" in out, (code, out)
    assert "ended by the main thread" not in out
    assert took < 30, took


def test_answered_leaves_a_taken_interrupt_to_the_main_thread(tmp_path):
    code, out, _ = _run_stuck(tmp_path, "take", 0.5)
    assert code == 0 and out.splitlines()[-1] == "ended by the main thread", (code, out)
    assert "ended by the watcher" not in out


def test_answered_without_a_signal_changes_nothing(sigterm_interrupts):
    with interrupts.answered(lambda: pytest.fail("nothing to end")):
        time.sleep(0.3)
    assert not interrupts.signalled()
    assert signal.set_wakeup_fd(-1) == -1 and signal.getsignal(signal.SIGTERM) is _interrupt
