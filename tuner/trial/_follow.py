"""What a person watching one long run sees (``tuner verify``, ``tuner trial``): a line per tenth of the run and
one at least every EVERY seconds, each with the steps done, steps per second and the time left; after the first
steps, an estimate of the whole run that says plainly when it takes more than LONG_RUN seconds.

    result = run_followed(spec, echo=print, shorter="pass --steps N for a shorter check")   # the trial, followed

    progress = RunProgress(total=500, started=clock())   # the logic alone, on any clock: what run_followed drives
    progress.add(rows, now)    # rows of the metrics file as they arrive -> the lines now due
    progress.tick(now)         # between rows -> the line due by the clock, if any
    progress.end(now)          # the run ended -> its last part of a tenth

The pace is read from the rows' ``train_seconds`` (when the monitor stamped the step's end: tuner.trial._monitor),
from the end of the first step on, so neither loading the model nor the first step's warm-up counts; rows without
it are timed by when they arrived. run_followed runs the trial on the CPU threads a search's trial has: one,
unless OMP_NUM_THREADS says otherwise.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tuner.records import TrialResult
from tuner.trial._spec import TrialSpec

__all__ = ["BLOCKS", "EVERY", "LONG_RUN", "RunProgress", "block_line", "duration", "run_followed"]

BLOCKS = 10  # the run is reported in this many blocks of steps: enough to see a trend, short enough to read
EVERY = 30.0  # seconds without a line before one is printed anyway: a slow tenth still shows it is moving
LONG_RUN = 600.0  # seconds: a run estimated longer than this is said to be long, with how to stop it
ESTIMATE_AFTER = 3  # steps timed before the estimate: two steps' pace after the first step's warm-up

Row = dict[str, Any]


class RunProgress:
    """The lines for one run of ``total`` steps, from its rows and a clock (``started``: when the run began on it).
    ``describe``: a block of rows in words (block_line), else the steps alone; ``shorter``: how to ask for a shorter
    run, said when the estimate is long."""

    def __init__(self, total: int, started: float, describe: Callable[[list[Row]], str] | None = None,
                 shorter: str = ""):
        self.total, self.started, self.shorter = total, started, shorter
        self.describe = describe or _steps_of
        self.block = max(1, math.ceil(total / BLOCKS))
        self.rows: list[Row] = []
        self.reported = 0  # rows already in a block line
        self.stamps: list[tuple[int, float]] = []  # (step, when it ended): the pace
        self.last_line = started  # when the last line was due: the next timed one is EVERY s after it
        self.estimated = False

    @property
    def done(self) -> int:
        """Steps done: the latest row's step."""
        step = self.rows[-1].get("step") if self.rows else 0
        return int(step) if isinstance(step, (int, float)) else len(self.rows)

    def seconds_per_step(self) -> float | None:
        """The pace from the end of the first step timed to the latest; None before two steps."""
        if len(self.stamps) < 2:
            return None
        (first, start), (last, end) = self.stamps[0], self.stamps[-1]
        return (end - start) / (last - first) if last > first and end >= start else None

    def add(self, rows: list[Row], now: float) -> list[str]:
        """``rows`` arrived at ``now``: a line per finished block, and the estimate once it is due."""
        lines = []
        for row in rows:
            self.rows.append(row)
            step, at = row.get("step"), row.get("train_seconds")
            if isinstance(step, (int, float)):
                self.stamps.append((int(step), float(at) if isinstance(at, (int, float)) else now - self.started))
            if not self.estimated and len(self.stamps) >= ESTIMATE_AFTER and self.done < self.total:
                lines.append(self.estimate())
                self.estimated = True
            if len(self.rows) - self.reported >= self.block:
                lines.append(self._block(self.rows[self.reported:self.reported + self.block]))
                self.reported += self.block
        if lines:
            self.last_line = now
        return lines

    def tick(self, now: float) -> list[str]:
        """The line due by the clock: EVERY seconds after the last line, with where the run is."""
        if now - self.last_line < EVERY:
            return []
        self.last_line = now
        since = duration(now - self.started)
        if not self.rows:
            return [f"  waiting for step 1 of {self.total} ({since} since the start)"]
        return [f"  step {self.done}/{self.total}: {self._pace()} ({since} since the start)"]

    def end(self, now: float) -> list[str]:
        """The rows not yet in a block line, as the last block."""
        if len(self.rows) <= self.reported:
            return []
        lines = [self._block(self.rows[self.reported:])]
        self.reported, self.last_line = len(self.rows), now
        return lines

    def estimate(self) -> str:
        """``estimate: ~3 h 10 min for 500 steps at 22.8 s a step (more than 10 minutes); stop with Ctrl-C and ...``"""
        pace = self.seconds_per_step()
        if pace is None:
            return f"estimate: none yet for {self.total} steps"
        whole = pace * self.total
        text = f"estimate: ~{duration(whole)} for {self.total} steps at {_seconds(pace)} a step"
        if whole > LONG_RUN:
            text += (f" (more than {LONG_RUN / 60:g} minutes); stop with Ctrl-C"
                     + (f" and {self.shorter}" if self.shorter else ""))
        return text

    def _block(self, rows: list[Row]) -> str:
        return f"{self.describe(rows)} | {self.done}/{self.total} steps" + (
            f", {self._pace()}" if self.seconds_per_step() is not None else "")

    def _pace(self) -> str:
        pace = self.seconds_per_step()
        if pace is None:
            return "no pace yet"
        rate = f"{1 / pace:.3g} steps/s" if pace > 0 else "- steps/s"
        left = self.total - self.done
        return f"{rate}, ~{duration(left * pace)} left" if left > 0 else rate


def _steps_of(rows: list[Row]) -> str:
    first, last = rows[0].get("step", "?"), rows[-1].get("step", "?")
    return f"  step {first}" if first == last else f"  steps {first}-{last}"


def _seconds(value: float) -> str:
    """A step's time: "22.8 s", "0.31 s"."""
    return f"{value:.1f} s" if value >= 10 else f"{value:.2g} s"


def duration(seconds: float) -> str:
    """"35 s", "4 min 20 s", "25 min", "3 h 10 min": as precise as a person waiting needs."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 10:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def block_line(spec: TrialSpec, rows: list[Row]) -> str:
    """``  steps 61-120: reward 0.512, grad_norm 0.84`` (means of the finite values; "nan" when none was)."""
    from tuner.verdicts.learning import progress_metric

    metric, _ = progress_metric(spec.entry)

    def mean(key: str) -> str:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        finite = [v for v in values if math.isfinite(v)]
        if not values:
            return "-"
        return f"{sum(finite) / len(finite):.4g}" if len(finite) == len(values) else "nan"

    return f"{_steps_of(rows)}: {metric} {mean(metric)}, grad_norm {mean('grad_norm')}"


def run_followed(spec: TrialSpec, echo: Callable[[str], None] = print, shorter: str = "") -> TrialResult:
    """The trial, run in this process on the CPU threads a search's trial has, with RunProgress's lines echoed while
    it runs (from a thread that follows its metrics file)."""
    from tuner.trial._files import MetricsTail
    from tuner.trial._run import run_trial

    with tempfile.TemporaryDirectory(prefix="tuner-run-") as scratch, _trial_threads(spec):
        metrics = Path(scratch) / "metrics.jsonl"
        metrics.touch()
        progress = RunProgress(spec.max_steps, time.perf_counter(), lambda rows: block_line(spec, rows), shorter)
        done = threading.Event()
        follower = threading.Thread(target=_follow, args=(MetricsTail(metrics), progress, done, echo), daemon=True)
        follower.start()
        try:
            result = run_trial(spec, workdir=Path(scratch) / "trial", metrics_path=metrics)
        finally:
            done.set()
            follower.join(timeout=5)
    return result


@contextlib.contextmanager
def _trial_threads(spec: TrialSpec):
    """One CPU thread, as a search's trial has (Ray's OMP_NUM_THREADS for its 1-CPU slot), where nothing set
    OMP_NUM_THREADS and the run is one process on a CPU; torch's own choice is back afterwards. On the tiny model
    on a 2-core CPU, with the other core busy, torch's two threads ran a GRPO step of the default search's pick 15x
    slower (2.8 s against 0.11 s); on SmolLM2-135M-Instruct two threads per process ran 2-4x slower in wall time
    than one (docs/inputs.md)."""
    import os

    import torch

    if "OMP_NUM_THREADS" in os.environ or spec.ranks > 1 or torch.cuda.is_available():
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _follow(tail, progress: RunProgress, done: threading.Event, echo: Callable[[str], None]) -> None:
    """Echo the progress's lines until the trial ends, then its last block."""
    while True:
        ended = done.is_set()  # read once more after the end: the last rows are in the file by then
        now = time.perf_counter()
        for line in progress.add(tail.read(), now) + progress.tick(now):
            echo(line)
        if ended:
            break
        done.wait(0.2)
    for line in progress.end(time.perf_counter()):
        echo(line)
