"""What a search prints when it ends: how many trials, the rule, the recommendation or why there is none, the
changes to a --from config, and what to run next::

    print(summary_text(outcome))             # outcome: the search's SearchOutcome (tuner.search.driver)
    for line in describe_candidates(verdicts): echo(line)   # each confirmation verdict in one line
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from tuner.records import Confirmation, SearchSummary, TrialRecord
from tuner.report.progress import describe_params
from tuner.verdicts import recommend as rec

__all__ = ["FinishedSearch", "describe_candidates", "summary_text"]


class FinishedSearch(Protocol):
    """What the summary reads of a finished search: ``tuner.search.driver.SearchOutcome`` (the search sits above
    the report, so the report names the shape, not the class)."""

    experiment: str
    parent_run_id: str
    records: list[TrialRecord]
    recommended: TrialRecord | None
    wall_seconds: float
    candidates: list[Confirmation]  # confirmation verdicts (tuner.search._confirm.judge)
    search: SearchSummary
    stopped_because: str | None


def describe_candidates(verdicts: Sequence[Confirmation]) -> list[str]:
    """One line per confirmation verdict (tuner.search._confirm.judge) for the terminal."""
    lines = []
    for v in verdicts:
        speed, progress = v.tokens_per_second, v.progress
        spread = (f"tokens/s {speed.min:.0f}..{speed.max:.0f}" if speed else "tokens/s -") + (
            f", progress {progress.min:+.3f}..{progress.max:+.3f}" if progress else "")
        if v.confirmed:
            lines.append(f"  trial {v.number}: confirmed on seeds {v.seeds} ({spread})")
        else:
            lines.append(f"  trial {v.number}: DEMOTED: {v.demoted_because}")
    return lines


def summary_text(outcome: FinishedSearch) -> str:
    lines = [f"\n{len(outcome.records)} trials in {outcome.wall_seconds:.0f}s (experiment {outcome.experiment!r}, "
             f"run {outcome.parent_run_id})", f"rule: {rec.RULE}"]
    if outcome.recommended is None and outcome.candidates:
        lines.append("Nothing recommended: no candidate stayed stable and learning on its confirmation seeds:")
        lines += describe_candidates(outcome.candidates)
    elif outcome.recommended is None and outcome.stopped_because:
        lines.append(f"Stopped after {len(outcome.records)} trials: {outcome.stopped_because}")
    elif outcome.recommended is None:
        lines.append(rec.failure_summary(outcome.records, longer=outcome.search.get("extensions") or []))
    else:
        best = outcome.recommended
        lines.append(f"recommended: trial {best['number']}: {best['tokens_per_second']:.0f} tokens/s, progress "
                     f"{best['progress']:+.3f}, {best.get('max_steps')} steps, {describe_params(best['params'])}")
        lines.append(json.dumps(best["params"], sort_keys=True))
        if best.get("confirmation"):
            lines += describe_candidates([Confirmation.from_dict(best["confirmation"])])
        lines.append(rec.horizon(best))
    fixed = outcome.search.get("fix")
    if fixed:
        from tuner.report import fix as fixes

        lines += ["", *fixes.diff_lines(fixes.Fix.from_dict(fixed))]
    lines.append("review:  tuner ui          (MLflow UI on http://127.0.0.1:5000)")
    if outcome.recommended is not None:  # with nothing recommended, tuner export has nothing to write
        lines.append(f"export:  tuner export --experiment {outcome.experiment} -o recommended.yaml")
    return "\n".join(lines)
