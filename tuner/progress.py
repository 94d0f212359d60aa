"""What a person watching a search sees: one line per finished trial, and the results table."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable

from tuner import recommend as rec
from tuner.trial import STABLE

__all__ = ["Progress", "describe_params", "results_table"]


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
        best = rec.recommend([r for r in (self.best, record) if r])
        if best is not None:
            self.best = best
        done = sum(self.counts.values())
        speed = record.get("tokens_per_second")
        speed_text = f"{speed:8.0f} tok/s" if speed else "       - tok/s"
        progress = record.get("progress")
        learned = "learned" if rec.learned(record) else "no trend"
        progress_text = f"progress {progress:+.3f} {learned:<8}" if progress is not None else "progress    -           "
        where = f" at step {record['stopped_at_step']}" if record["status"] not in (STABLE, "invalid") else ""
        counts = " ".join(f"{s} {self.counts[s]}" for s in ("ok", "diverged", "collapsed", "crashed", "oom", "invalid")
                          if self.counts[s] or s in ("ok", "diverged", "crashed"))
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
    parts = [str(params.get("precision", "fp32"))]
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
        stopped = r.get("stopped_at_step") if r["status"] != STABLE else ""
        rows.append(f"| {r['number']} | {r['status']} | {stopped} | {fmt(r.get('tokens_per_second'), '.0f')} | "
                    f"{fmt(r.get('progress'), '+.3f')} | {'yes' if rec.learned(r) else 'no'} | {describe_params(r['params'])} | "
                    f"{(r.get('reason') or '')[:80]} |")
    return "\n".join(rows) + "\n"
