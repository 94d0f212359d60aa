"""What people read: the live progress of a search, its report (analysis, tables, plots), and the export.

    progress.py   one line per finished trial, the running trials' latest steps, the results table
    summary.py    what a search prints when it ends: the recommendation or why none, what to run next
    document.py   ``tuner report``: the report put together (_analysis, _render, _plots, _store)
    export.py     ``tuner export``: the recommended config as the user will run it

May import: tuner.verdicts, tuner.inputs, tuner.config, tuner.stores, tuner.errors, tuner.records.
"""

from tuner._exports import lazy_exports

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "Progress": "tuner.report.progress",
    "build_report": "tuner.report.document",
    "render_export": "tuner.report.export",
    "report_search": "tuner.report.document",
    "results_table": "tuner.report.progress",
    "summary_text": "tuner.report.summary",
})
