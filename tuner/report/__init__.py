"""What people read: the live progress of a search, its report (analysis, tables, plots), and the export.

    progress.py   one line per finished trial, the running trials' latest steps, the results table
    summary.py    what a search prints when it ends: the recommendation or why none, what to run next
    document.py   ``tuner report``: the report put together (_analysis, _render, _plots, _store)
    export.py     ``tuner export``: the recommended config as the user will run it

May import: tuner.verdicts, tuner.inputs, tuner.config, tuner.stores, tuner.errors, tuner.records.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.report.document import build_report as build_report
    from tuner.report.document import report_search as report_search
    from tuner.report.export import render_export as render_export
    from tuner.report.progress import Progress as Progress
    from tuner.report.progress import results_table as results_table
    from tuner.report.summary import summary_text as summary_text

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "Progress": "tuner.report.progress",
    "build_report": "tuner.report.document",
    "render_export": "tuner.report.export",
    "report_search": "tuner.report.document",
    "results_table": "tuner.report.progress",
    "summary_text": "tuner.report.summary",
})
