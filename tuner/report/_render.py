"""A search's report laid out for people: aligned tables for the terminal, the same in markdown for report.md.

    report.text()                                  # what `tuner report` prints
    report.markdown(["plots/stability_map.png"])   # report.md, plots linked below the tables

``Report`` holds every computed part (``tuner.report.document.build_report`` fills it from a search.json);
this module only formats them. The numbers and sentences come from ``tuner.report._analysis``.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.records import Status, TrialRecord
from tuner.report._analysis import (
    FAILED,
    LEARNED,
    MIN_HINT_TRIALS,
    NOT_LEARNING,
    VERBS,
    BreakdownRow,
    Importance,
    breakdown_lines,
    outcome,
    step_text,
)
from tuner.report.progress import describe_params
from tuner.verdicts import recommend


@dataclass
class Report:
    """Every computed part of a search's report (tuner.report.document.build_report), and its two layouts."""

    title: str
    records: list[TrialRecord]
    recommended: TrialRecord | None
    breakdown: list[BreakdownRow]
    importances: list[Importance]
    hints: list[str]
    front: list[TrialRecord]
    min_count: int = MIN_HINT_TRIALS
    crashes: list[tuple[int, str, str]] = field(default_factory=list)  # crash_reasons()

    def text(self) -> str:
        """The terminal version: aligned tables."""
        return "\n".join(self._sections(fenced=False)) + "\n"

    def markdown(self, plots: Sequence[str] = ()) -> str:
        """report.md: the same tables in code blocks, plus the plots."""
        lines = self._sections(fenced=True)
        if plots:
            lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
        return "\n".join(lines) + "\n"

    def _sections(self, fenced: bool) -> list[str]:
        def heading(text: str) -> list[str]:
            return ["", f"## {text}", ""] if fenced else ["", text, "-" * len(text)]

        def block(lines: list[str]) -> list[str]:
            return ["```", *lines, "```"] if fenced else lines

        counts = collections.Counter(outcome(r) for r in self.records)
        order = (LEARNED, NOT_LEARNING, Status.PRUNED, *FAILED, Status.INVALID)
        out = [f"# {self.title}" if fenced else self.title,
               "", f"{len(self.records)} trials: " + ", ".join(f"{counts[o]} {o}" for o in order if counts[o])]
        if self.recommended:
            best = self.recommended
            out.append(f"recommended: trial {best['number']} ({best['tokens_per_second']:.0f} tokens/s, "
                       f"progress {best['progress']:+.3f})")
            out.append(recommend.horizon(best))
        else:
            out.append("recommended: none (no trial was stable and learned)")

        out += heading("Failures by dimension value")
        if self.breakdown:
            out += block(_breakdown_table(self.breakdown))
            out += [""] + [f"- {line}" for line in breakdown_lines(self.breakdown)]
        else:
            out.append("every trial had the same values: nothing to break down")

        out += heading("Crash reasons")
        if self.crashes:
            out += [f"- {n} {'trial' if n == 1 else 'trials'} {VERBS[status]}: {reason}"
                    for n, status, reason in self.crashes]
        else:
            out.append("no trial crashed or ran out of memory")

        out += heading("What drives stability and speed (parameter importance)")
        for imp in self.importances:
            if imp.values:
                width = max(len(name) for name in imp.values)
                rows = [f"{name:<{width}}  {score:5.2f}  {'#' * round(score * 20)}".rstrip()
                        for name, score in imp.values.items()]
                out += [f"{imp.target} ({imp.note}):"] + block(rows)
            else:
                out.append(f"{imp.target}: {imp.note}")

        out += heading("Stable Pareto front (tokens/s vs progress)")
        if self.front:
            out += block(_front_table(self.front, self.recommended))
        else:
            out.append("no stable trial with tokens/s and progress")

        out += heading("Hints")
        if self.hints:
            out += [f"- {hint}" for hint in self.hints]
        else:
            out.append(f"none the trials support (a hint needs {self.min_count}+ trials on each side of a comparison "
                       "and a clear gap)")
        return out


def _align(header: list[str], rows: list[list[Any]], right: set[int]) -> list[str]:
    """Columns padded to their widest cell (each cell as ``str`` shows it), right-aligned where ``right`` says."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]

    def fmt(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [fmt(header), *(fmt(r) for r in rows)]


def _breakdown_table(rows: list[BreakdownRow]) -> list[str]:
    # diverged, collapsed and crashed always have a column; oom and invalid only when a trial ended so
    shown = [Status.DIVERGED, Status.COLLAPSED, Status.CRASHED,
             *(s for s in (Status.OOM, Status.TOO_BIG, Status.INVALID) if any(r.statuses.get(s) for r in rows))]
    header = ["dimension", "value", "trials", Status.OK, LEARNED, *shown, "median fail step"]
    table, last = [], None
    for r in rows:
        name = r.dimension if r.dimension != last else ""
        last = r.dimension
        table.append([name, r.value, r.trials, r.ok, r.learned, *(r.statuses.get(s, 0) for s in shown),
                      step_text(r.median_failed_step)])
    return _align(header, table, right=set(range(2, len(header))))


def _front_table(front: list[TrialRecord], recommended: TrialRecord | None) -> list[str]:
    rows = [[r["number"], f"{r['tokens_per_second']:.0f}", f"{r['progress']:+.3f}",
             "recommended" if recommended and r["number"] == recommended["number"] else "",
             describe_params(r["params"])] for r in front]
    return _align(["trial", "tokens/s", "progress", "", "params"], rows, right={0, 1, 2})
