"""What a finished search says: where trials failed, what drives stability and speed, and hints.

    tuner report --experiment reward-tiny            # latest search: print it, log report.md + plots/
    tuner report --experiment reward-tiny --out rep  # also keep report.md and plots/*.png in ./rep

    build_report(search).text()                      # the same from a search.json mapping, without MLflow

Its parts, one idea each: ``tuner.report._analysis`` computes everything from the trial records
(pure functions), ``tuner.report._render`` lays it out as text and markdown, ``tuner.report._plots`` draws
the figures and ``tuner.report._store`` reads the search from MLflow and logs the report back.
This module puts them together; the analysis functions are importable from here as well.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.records import SearchSummary
from tuner.report import _plots as plots
from tuner.report import _store as report_store
from tuner.report._analysis import (
    MIN_HINT_TRIALS,
    BreakdownRow,
    Importance,
    breakdown,
    breakdown_lines,
    crash_reasons,
    dimensions,
    hints,
    importances,
    lr_band,
    outcome,
    pareto_front,
)
from tuner.report._render import Report

__all__ = ["Rendered", "Report", "build_report", "report_search",
           # the analysis (tuner.report._analysis), for callers of the report:
           "BreakdownRow", "Importance", "breakdown", "breakdown_lines", "crash_reasons", "dimensions", "hints",
           "importances", "lr_band", "outcome", "pareto_front"]


@dataclass
class Rendered:
    report: Report
    run_id: str
    folder: Path  # holds report.md and plots/*.png
    plots: list[Path]


def build_report(search: SearchSummary, title: str = "", min_count: int = MIN_HINT_TRIALS) -> Report:
    """Every computed part of the report, from a search.json mapping (its "trials" and "recommended")."""
    records = list(search.get("trials") or [])
    title = title or f"tuner report: {search.get('trainer', '?')} on {search.get('model', '?')}"
    return Report(title, records, search.get("recommended"), breakdown(records),
                  [importances(records, "is stable"), importances(records, "tokens/s")],
                  hints(records, min_count), pareto_front(records), min_count, crash_reasons(records))


def report_search(uri: str, experiment: str, run_id: str | None = None, out: str | Path | None = None,
                  min_count: int = MIN_HINT_TRIALS) -> Rendered:
    """Load a search from MLflow, build its report and plots, write them to ``out`` (or a temp
    folder) and log them on the search's parent run as report.md and plots/*.png."""
    stored = report_store.load_search(uri, experiment, run_id)
    search, params = stored.search, stored.params
    title = (f"tuner report: {search.get('trainer')} on {search.get('model')}, search {stored.run_name} "
             f"(run {stored.run_id}), {params.get('sampler', '?')} sampler, {params.get('max_steps', '?')} steps "
             "per trial")
    report = build_report(search, title, min_count)
    histories = report_store.load_histories(uri, report.records)

    folder = Path(out) if out else Path(tempfile.mkdtemp(prefix="tuner-report-"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.md").touch()
    except OSError as e:
        raise TunerError(f"--out {out}: cannot write there ({e.strerror or e}); pass a writable folder") from None
    written = plots.save_all(report, histories, folder / "plots")
    (folder / "report.md").write_text(report.markdown([f"plots/{p.name}" for p in written]))
    report_store.log_report(uri, stored.run_id, folder / "report.md", written)
    return Rendered(report, stored.run_id, folder, written)
