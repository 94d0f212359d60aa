"""The report's plots, as matplotlib Figures (Agg, no pyplot: nothing global, no display needed).

    stability_map(records)                    learning rate (log) x precision, one marker per trial and status
    speed_vs_progress(records, front, best)   tokens/s vs progress, the stable Pareto front, the recommended trial
    curves(records, histories)                loss and grad norm per step, each trial's stop marked with an x
    save_all(report, histories, "rep/plots")  all three as PNG files

A trial's colour and marker say its outcome (tuner.report._analysis.outcome): its status, with ok
trials split into learned and not learning.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config import precision
from tuner.records import Status, TrialRecord
from tuner.report._analysis import LEARNED, NOT_LEARNING, finite_number, outcome
from tuner.verdicts.learning import MIN_EFFECT as MIN_PROGRESS

if TYPE_CHECKING:
    from tuner.report._render import Report

# outcome -> (colour, marker): failures loud, stable-but-useless muted, learned green.
STYLE = {
    LEARNED: ("#2a9d3a", "o"),
    NOT_LEARNING: ("#9a9a3a", "o"),
    Status.DIVERGED: ("#d62728", "X"),
    Status.COLLAPSED: ("#ff7f0e", "v"),
    Status.CRASHED: ("#222222", "s"),
    Status.OOM: ("#9467bd", "D"),
    Status.INVALID: ("#aaaaaa", "P"),
    Status.TOO_BIG: ("#c5b0d5", "d"),
    Status.PRUNED: ("#8fb3d9", "."),
}
MAX_LABELLED = 20  # past this many trials, per-line trial numbers are clutter


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def stability_map(records: list[TrialRecord]):
    """Learning rate (log x) against precision (categorical y); one marker per trial, coloured by outcome.

    Trials sharing a cell are spread vertically so none hides another; trials without a
    learning_rate are left out and the title says how many.
    """
    fig = _figure(7, 1.6 + 0.5 * len({r["params"].get("precision", precision.DEFAULT) for r in records}))
    ax = fig.add_subplot()
    shown = [r for r in records if _positive(r["params"].get("learning_rate"))]
    precisions = sorted({r["params"].get("precision", precision.DEFAULT) for r in shown},
                        key=precision.order)
    cells: dict[tuple, int] = {}
    by_outcome: dict[str, list[tuple[float, float]]] = {}
    for r in shown:
        key = (r["params"].get("precision", precision.DEFAULT), r["params"]["learning_rate"])
        nth = cells[key] = cells.get(key, -1) + 1
        y = precisions.index(key[0]) + _spread(nth)
        by_outcome.setdefault(outcome(r), []).append((key[1], y))
    for name, (colour, marker) in STYLE.items():
        if name in by_outcome:
            xs, ys = zip(*by_outcome[name])
            ax.scatter(xs, ys, c=colour, marker=marker, s=60, label=f"{name} ({len(xs)})", alpha=0.85,
                       edgecolors="white", linewidths=0.5)
    ax.set_xscale("log")
    ax.set_yticks(range(len(precisions)), precisions)
    ax.set_ylim(-0.6, len(precisions) - 0.4)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("precision")
    missing = len(records) - len(shown)
    ax.set_title("Stability map" + (f" ({missing} trials without learning_rate not shown)" if missing else ""))
    ax.grid(True, axis="x", which="major", alpha=0.3)
    if by_outcome:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    return fig


def _spread(nth: int) -> float:
    # 0, +0.12, -0.12, +0.24, ... within a cell; stays inside the +-0.4 band of its precision row
    offset = 0.12 * ((nth + 1) // 2)
    return min(offset, 0.36) * (1 if nth % 2 else -1)


def _positive(value: Any) -> bool:
    return finite_number(value) and value > 0


def speed_vs_progress(records: list[TrialRecord], front: list[TrialRecord], recommended: TrialRecord | None):
    """Tokens/s (y) against progress (x) for every trial that measured both; the stable front as a line."""
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    measured = [r for r in records if finite_number(r.get("progress")) and finite_number(r.get("tokens_per_second"))]
    for name, (colour, marker) in STYLE.items():
        group = [r for r in measured if outcome(r) == name]
        if group:
            ax.scatter([r["progress"] for r in group], [r["tokens_per_second"] for r in group], c=colour,
                       marker=marker, s=50, alpha=0.8, label=f"{name} ({len(group)})")
            for r in group:
                ax.annotate(str(r["number"]), (r["progress"], r["tokens_per_second"]), fontsize=7,
                            xytext=(4, 3), textcoords="offset points", color="#555555")
    if front:
        steps = sorted(front, key=lambda r: r.get("progress") or 0.0)  # the front: each has its progress
        ax.plot([r["progress"] for r in steps], [r["tokens_per_second"] for r in steps], drawstyle="steps-post",
                color="#2a9d3a", linewidth=1.2, alpha=0.7, label="stable Pareto front")
    if recommended and finite_number(recommended.get("progress")) and finite_number(recommended.get("tokens_per_second")):
        ax.scatter([recommended["progress"]], [recommended["tokens_per_second"]], marker="*", s=320,
                   facecolors="none", edgecolors="#1f4e9c", linewidths=1.5,
                   label=f"recommended (trial {recommended['number']})")
    ax.axvline(MIN_PROGRESS, color="#999999", linestyle=":", linewidth=1, label=f"smallest progress that counts: {MIN_PROGRESS}")
    ax.set_xlabel("progress (higher learned more)")
    ax.set_ylabel("tokens/s")
    missing = len(records) - len(measured)
    ax.set_title("Speed vs learning" + (f" ({missing} trials without both measures not shown)" if missing else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    return fig


def curves(records: list[TrialRecord], histories: dict[int, list[dict[str, Any]]]):
    """Loss (symlog y when something blew up) and grad norm (log y) per step, one line per trial coloured by outcome.

    Each trial's stop step is an x on its last plotted point; a non-finite value is drawn as a
    hollow triangle pinned to the top edge at its step, since it has no place on the axis.
    """
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    fig = _figure(8, 6)
    loss_ax, grad_ax = fig.subplots(2, 1, sharex=True)
    for ax, key in ((loss_ax, "loss"), (grad_ax, "grad_norm")):
        pinned = blended_transform_factory(ax.transData, ax.transAxes)
        for r in records:
            rows = [row for row in histories.get(r["number"], []) if isinstance(row.get(key), (int, float))]
            if not rows:
                continue
            colour = STYLE.get(outcome(r), STYLE[Status.CRASHED])[0]
            finite = [(row["step"], row[key]) for row in rows if math.isfinite(row[key])
                      and (key != "grad_norm" or row[key] > 0)]
            bad = [row["step"] for row in rows if not math.isfinite(row[key])]
            if finite:
                ax.plot(*zip(*finite), color=colour, linewidth=1, alpha=0.75)
            if bad:
                ax.scatter(bad, [0.97] * len(bad), transform=pinned, marker="^", facecolors="none",
                           edgecolors=colour, s=110, clip_on=False)
            if finite and len(records) <= MAX_LABELLED:
                ax.annotate(str(r["number"]), finite[-1], fontsize=7, xytext=(3, 0), textcoords="offset points",
                            color=colour)
            stop = r.get("stopped_at_step")
            if r.get("status") != Status.OK and stop is not None:
                at = [row[key] for row in rows if row["step"] == stop]
                if at and math.isfinite(at[0]) and (key != "grad_norm" or at[0] > 0):
                    ax.scatter([stop], [at[0]], marker="x", color=colour, s=60, linewidths=2, zorder=3)
                else:  # non-finite (or missing) at the stop: top edge; a zero grad norm has no log: bottom edge
                    edge = 0.03 if at and at[0] == 0.0 else 0.97
                    ax.scatter([stop], [edge], transform=pinned, marker="x", color=colour, s=60, linewidths=2,
                               clip_on=False, zorder=3)
        ax.grid(True, alpha=0.3)
    losses = [abs(row["loss"]) for h in histories.values() for row in h
              if isinstance(row.get("loss"), (int, float)) and math.isfinite(row["loss"])]
    if losses and max(losses) > 10 * max(1.0, statistics.median(losses)):
        loss_ax.set_yscale("symlog", linthresh=1.0)  # linear near the usual losses, log for 1e+34 blow-ups
    grad_ax.set_yscale("log")
    loss_ax.set_ylabel("loss")
    grad_ax.set_ylabel("grad norm (log)")
    grad_ax.set_xlabel("optimizer step")
    loss_ax.set_title("Per-trial curves (x: guard stopped the trial; ^ at the top: NaN/inf that step)")
    present = [name for name in STYLE if any(outcome(r) == name for r in records)]
    handles = [Line2D([], [], color=STYLE[name][0], label=name) for name in present]
    handles.append(Line2D([], [], color="#555555", marker="x", linestyle="", label="stopped here"))
    handles.append(Line2D([], [], color="#555555", marker="^", markerfacecolor="none", linestyle="",
                          label="non-finite"))
    loss_ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.0), fontsize=8, frameon=False)
    return fig


def save_all(report: Report, histories: dict[int, list[dict[str, Any]]], folder: str | Path) -> list[Path]:
    """Render the three plots as PNG files in ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    figures = {
        "stability_map.png": stability_map(report.records),
        "speed_vs_progress.png": speed_vs_progress(report.records, report.front, report.recommended),
        "curves.png": curves(report.records, histories),
    }
    paths = []
    for name, fig in figures.items():
        fig.savefig(folder / name)
        paths.append(folder / name)
    return paths
