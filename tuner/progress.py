"""What a person watching a search sees: one line per finished trial, and the results table."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable

from tuner import precision
from tuner import recommend as rec
from tuner.records import NO_STOP_STEP, Status

__all__ = ["Progress", "describe_params", "results_table", "shorten", "stopped_at"]

ALWAYS_COUNTED = (Status.OK, Status.DIVERGED, Status.CRASHED)  # shown at 0 too: the counts a watcher looks for


class Progress:
    """Counts and the one-line-per-trial progress report."""

    def __init__(self, total: int, echo: Callable[[str], None], done: list[dict[str, Any]] = ()):
        self.total, self.echo = total, echo
        self.counts: collections.Counter = collections.Counter(r["status"] for r in done)  # resumed trials
        self.running = 0
        self.best: dict[str, Any] | None = rec.recommend(list(done))
        self.started = time.perf_counter()

    def finished(self, record: dict[str, Any]) -> None:
        self.running = max(0, self.running - 1)
        self.counts[record["status"]] += 1
        # Confirmation re-runs judge a candidate; they do not compete with the search's own trials.
        best = rec.recommend([r for r in (self.best, record) if r and "confirms" not in r])
        if best is not None:
            self.best = best
        done = sum(self.counts.values())
        speed = record.get("tokens_per_second")
        speed_text = f"{speed:8.0f} tok/s" if speed else "       - tok/s"
        progress = record.get("progress")
        learned = "learned" if rec.learned(record) else "no trend"
        progress_text = f"progress {progress:+.3f} {learned:<8}" if progress is not None else "progress    -           "
        where = stopped_at(record)
        where = f" {where}" if where else ""
        counts = " ".join(f"{s} {self.counts[s]}" for s in Status if self.counts[s] or s in ALWAYS_COUNTED)
        best = (f"trial {self.best['number']} ({self.best['tokens_per_second']:.0f} tok/s, progress "
                f"{self.best['progress']:+.3f})" if self.best else "none yet")
        elapsed = time.perf_counter() - self.started
        label = f"trial {record['number']:3d}" + (f" seed {record['seed']}" if "confirms" in record else "")
        self.echo(f"[{done:3d}/{self.total}] {label} {record['status']:<9}{where:<12} {speed_text}  "
                  f"{progress_text}  {describe_params(record['params'])}")
        self.echo(f"          running {self.running} | {counts} | best: {best} | {elapsed:.0f}s")


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


def results_table(records: list[dict[str, Any]]) -> str:
    """Markdown table of every trial: the parent run's results.md and the end of `tuner search`."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    rows = ["| trial | status | stopped at | tokens/s | progress | learned | params | reason |",
            "|---:|---|---:|---:|---:|---|---|---|"]
    for r in records:
        step = r.get("stopped_at_step")
        stopped = "" if r["status"] in NO_STOP_STEP else (step if step else "-")  # "-": before step 1
        reason = shorten(r.get("reason") or "", REASON_WIDTH).replace("|", "\\|")  # a | would end the cell
        rows.append(f"| {r['number']} | {r['status']} | {stopped} | {fmt(r.get('tokens_per_second'), '.0f')} | "
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


def stopped_at(record: dict[str, Any]) -> str:
    """Where a trial that did not finish stopped: "at step 4", "before step 1", or "" (finished, or invalid)."""
    if record.get("status") in NO_STOP_STEP:
        return ""
    step = record.get("stopped_at_step")
    return f"at step {step}" if step else "before step 1"
