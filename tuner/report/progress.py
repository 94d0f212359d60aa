"""What a person watching a search sees: one line per finished trial, the running trials' latest steps,
and the results table.

    progress = Progress(12, print)
    progress.started("a1", 3, max_steps=20)          # trial 3 started (a Ray trial id names it)
    progress.live("a1", {"step": 5, "loss": 1.23})   # its latest row: shown in the status line
    progress.tick()                                  # the status line, when one is due
    progress.finished(record, "a1")                  # its one line, and the counts

On a terminal the status line (``live: trial 3 step 5/20 loss 1.23 (2.1 steps/s) | ...``) is one line redrawn in place;
otherwise (a log file, a CI job) it is printed as its own line at most every ``Progress.live_every`` seconds.
"""

from __future__ import annotations

import collections
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable

from tuner.config import precision
from tuner.records import NO_STOP_STEP, Status, TrialRecord
from tuner.verdicts import recommend as rec
from tuner.verdicts.forecast import said

__all__ = ["Progress", "SearchInterrupted", "describe_params", "results_table", "resume_command", "shorten",
           "stopped_at"]

ALWAYS_COUNTED = (Status.OK, Status.DIVERGED, Status.CRASHED)  # shown at 0 too: the counts a watcher looks for


class Progress:
    """Counts, the one-line-per-trial progress report, and the status line of the running trials."""

    live_every = 30.0  # seconds between status lines when the output is not a terminal
    tty_every = 1.0  # seconds between redraws of the status line on a terminal

    def __init__(self, total: int, echo: Callable[[str], None], done: Sequence[TrialRecord] = (),
                 tty: bool | None = None, stream=None):
        self.total, self.echo = total, echo
        self.counts: collections.Counter = collections.Counter(r["status"] for r in done)  # resumed trials
        self.running = 0
        self.best: TrialRecord | None = rec.recommend(list(done))
        self.started_at = time.perf_counter()
        # A status line redrawn in place only where print writes to a terminal; else whole lines.
        self._stream = stream  # None: sys.stdout when drawn (not kept: Ray Tune pickles its callbacks)
        self.tty = (echo is print and _isatty(self.stream)) if tty is None else tty
        self.trials: dict[Any, dict[str, Any]] = {}  # running trials by key: label, max_steps, metric, latest row
        self.last_status = self.started_at  # when the last status line was shown
        self.on_screen = False  # a redrawn status line is on the terminal now

    @property
    def stream(self):
        return self._stream or sys.stdout

    def started(self, key: Any, number: int, max_steps: int | None = None, seed: int | None = None,
                metric: str = "loss") -> None:
        """Trial ``number`` (``key``: what names it in live(); a confirmation re-run has its seed) started;
        ``metric``: what its learning is judged on (the trainer entry's progress_metric), shown beside the loss."""
        self.running += 1
        label = f"trial {number}" + (f" seed {seed}" if seed is not None else "")
        self.trials[key] = {"number": number, "label": label, "max_steps": max_steps, "metric": metric, "row": None}

    def live(self, key: Any, row: dict[str, Any]) -> None:
        """The latest per-step row of a running trial (``key`` as given to started(), or its number)."""
        trial = self.trials.setdefault(key, {"number": key if isinstance(key, int) else -1, "label": f"trial {key}",
                                             "max_steps": None, "metric": "loss"})
        trial["row"] = row
        self.tick()

    def status_line(self) -> str | None:
        """``live: trial 3 step 5/20 loss 1.23 (2.1 steps/s) | trial 4 starting | 1/12 done, 45s``; None with nothing
        running."""
        if not self.trials:
            return None
        parts = []
        for trial in sorted(self.trials.values(), key=lambda t: (t["number"], t["label"])):
            row = trial["row"]
            if row is None:
                parts.append(f"{trial['label']} starting")
                continue
            of = f"/{trial['max_steps']}" if trial["max_steps"] else ""
            text = f"{trial['label']} step {row.get('step', '?')}{of}"
            for name in dict.fromkeys(("loss", trial["metric"])):
                if isinstance(row.get(name), (int, float)):
                    text += f" {name} {_number(row[name])}"
            step, seconds = row.get("step"), row.get("train_seconds")  # when the step ended (tuner.trial._monitor)
            if isinstance(step, (int, float)) and isinstance(seconds, (int, float)) and seconds > 0:
                text += f" ({step / seconds:.3g} steps/s)"
            parts.append(text)
        done = sum(self.counts.values())
        elapsed = time.perf_counter() - self.started_at
        return f"live: {' | '.join(parts)} | {done}/{self.total} done, {elapsed:.0f}s"

    def tick(self, now: float | None = None) -> None:
        """Show the status line if one is due: every tty_every s on a terminal, every live_every s otherwise."""
        now = time.perf_counter() if now is None else now
        if now - self.last_status < (self.tty_every if self.tty else self.live_every):
            return
        line = self.status_line()
        if line is None:
            self.clear()
            return
        self.last_status = now
        if self.tty:
            width = _columns()
            self.stream.write("\r\033[K" + (line if len(line) < width else line[:width - 2] + "…"))
            self.stream.flush()
            self.on_screen = True
        else:
            self.echo(line)

    def say(self, text: str) -> None:
        """Echo a line of its own (the status line, if on screen, is cleared first and redrawn later)."""
        self.clear()
        self.echo(text)

    def clear(self) -> None:
        """Take the status line off the terminal (before a line of its own, and when the search ends)."""
        if self.on_screen:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.on_screen = False

    def finished(self, record: TrialRecord, key: Any = None) -> None:
        """Trial ``record`` ended (``key``: as given to started())."""
        self.running = max(0, self.running - 1)
        self.trials.pop(key if key is not None else record["number"], None)
        self.counts[record["status"]] += 1
        # Confirmation and speed re-runs judge a trial; they do not compete with the search's own trials.
        best = rec.recommend([r for r in (self.best, record) if r and "confirms" not in r and "remeasures" not in r])
        if best is not None:
            self.best = best
        done = sum(self.counts.values())
        speed = record.get("tokens_per_second")
        speed_text = f"{speed:8.0f} tok/s" if speed else "       - tok/s"
        progress = record.get("progress")
        learned = "learned" if rec.learned(record) else "not learned"
        progress_text = f"progress {progress:+.3f} {learned:<11}" if progress is not None else "progress    -              "
        where = stopped_at(record)
        where = f" {where}" if where else ""
        counts = " ".join(f"{s} {self.counts[s]}" for s in Status if self.counts[s] or s in ALWAYS_COUNTED)
        best_text = (f"trial {self.best['number']} ({self.best['tokens_per_second']:.0f} tok/s, progress "
                     f"{self.best['progress']:+.3f})" if self.best else "none yet")
        elapsed = time.perf_counter() - self.started_at
        label = (f"trial {record['number']:3d}" + (f" seed {record['seed']}" if "confirms" in record else "")
                 + (f" x{record['max_steps']} steps" if "extends" in record else "")
                 + (f" (trial {record['anchors']} with beta {record['params'].get('beta')})" if "anchors" in record
                    else "")
                 + (f" of {record['schedule_steps']}" if record.get("schedule_steps") else "")
                 + (f" speed pair {record['pair']}" if "remeasures" in record else ""))
        self.say(f"[{done:3d}/{self.total}] {label} {record['status']:<9}{where:<12} {speed_text}  "
                 f"{progress_text}  {describe_params(record['params'])}")
        if record.get("risk"):
            self.say(f"          {said(record['risk'])}")
        self.say(f"          running {self.running} | {counts} | best: {best_text} | {elapsed:.0f}s")


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a search whose MLflow run exists: says what is kept and how to go on."""

    def __init__(self, kept: int, total: int, experiment: str, resume: str):
        super().__init__(f"interrupted; {kept} of {total} trials are kept. Resume with: {resume}")
        self.kept, self.total, self.experiment, self.resume = kept, total, experiment, resume


def resume_command(experiment: str, store: str | None = None, tracking_uri: str | None = None) -> str:
    """``tuner search --resume EXPERIMENT``, with --store / --tracking-uri when the search did not use the defaults;
    for a search sent to a cluster (tuner submit), ``tuner submit --resume JOB --cluster URL``."""
    import os
    import shlex
    from pathlib import Path

    from tuner.config.options import CLUSTER_ENV, SUBMITTED_JOB_ENV

    job = os.environ.get(SUBMITTED_JOB_ENV)
    if job:
        cluster = os.environ.get(CLUSTER_ENV)
        return shlex.join(["tuner", "submit", "--resume", job, *(["--cluster", cluster] if cluster else [])])
    words = ["tuner", "search", "--resume", experiment]
    if store and Path(store).resolve() != Path("mlflow").resolve():
        words += ["--store", str(store)]
    if tracking_uri:
        words += ["--tracking-uri", tracking_uri]
    return " ".join(shlex.quote(w) for w in words)


def _number(value: float) -> str:
    return format(value, ".4g") if math.isfinite(value) else str(value)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _columns() -> int:
    import shutil

    return shutil.get_terminal_size().columns


def describe_params(params: dict[str, Any]) -> str:
    short = {"learning_rate": "lr", "gradient_accumulation_steps": "ga", "per_device_train_batch_size": "bs",
             "max_grad_norm": "clip"}
    parts = [str(params.get("precision", precision.DEFAULT))]
    for key, label in short.items():
        if key in params:
            value = params[key]
            parts.append(f"{label}={value:.2g}" if isinstance(value, float) else f"{label}={value}")
    parts.append(f"lora=r{params.get('lora_r', 16)}" if params.get("use_peft") else "lora=off")
    return " ".join(parts)


def results_table(records: list[TrialRecord]) -> str:
    """Markdown table of every trial: the parent run's results.md and the end of `tuner search`."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    rows = ["| trial | status | stopped at | of steps | tokens/s | progress | learned | params | reason |",
            "|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in records:
        step = r.get("stopped_at_step")
        stopped = "" if r["status"] in NO_STOP_STEP else (step if step else "-")  # "-": before step 1
        reason = "; ".join(filter(None, (r.get("reason"), said(r.get("risk") or ""))))  # the forecast's, if any
        reason = shorten(reason, REASON_WIDTH).replace("|", "\\|")  # a | would end the cell
        rows.append(f"| {r['number']} | {r['status']} | {stopped} | {r.get('max_steps') or '-'} | {fmt(r.get('tokens_per_second'), '.0f')} | "
                    f"{fmt(r.get('progress'), '+.3f')} | {'yes' if rec.learned(r) else 'no'} | {describe_params(r['params'])} | "
                    f"{reason} |")
    return "\n".join(rows) + "\n"


REASON_WIDTH = 80  # characters of a trial's reason in the results table


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at a word boundary and marked with "…" when cut."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width)  # the last space that leaves room for the "…"
    head = text[:cut] if cut > 0 else text[:width - 1]
    return head.rstrip(" ,;:-(") + "…"


def stopped_at(record: TrialRecord) -> str:
    """Where a trial that did not finish stopped: "at step 4", "before step 1", or "" (finished, or invalid)."""
    if record.get("status") in NO_STOP_STEP:
        return ""
    step = record.get("stopped_at_step")
    return f"at step {step}" if step else "before step 1"
