"""The search loop's home for a new phase (tuner.search.loop): a toy phase, added where the phases are listed
(``loop.phases_of``), runs in a real search on the tiny model, and its run lands in the ledger, the search's MLflow
runs and the pick's verdict like any confirmation."""

from __future__ import annotations

import pytest
from helpers import CONFIRM_SPACE, run_search_in, runs_of

from tuner.records import TrialJob
from tuner.search import loop
from tuner.search.ledger import Ledger
from tuner.stores.tags import CONFIRMS_TAG, RUN_NAME_TAG
from tuner.trial import TrialSpec
from tuner.verdicts import recommend


class OnceMoreOnSeed9:
    """The toy phase: once every search trial and confirmation is done, the best run once more, on seed 9."""

    most_runs = 1

    def __init__(self, base_spec: TrialSpec) -> None:
        self.base_spec, self.handed = base_spec, False

    def next(self, ledger: Ledger, final: bool) -> TrialJob | None:
        best = recommend.recommend(ledger.contenders()) if final and not self.handed else None
        if best is None:
            return None
        self.handed = True
        return TrialJob(spec=self.base_spec.job_spec(params=best["params"], seed=9), number=best["number"],
                        timeout=600, extra={"confirms": best["number"]},
                        tags={CONFIRMS_TAG: str(best["number"]), RUN_NAME_TAG: f"seed9-{best['number']:03d}"})


@pytest.mark.slow
def test_a_new_phase_has_one_place_to_go_and_runs_end_to_end(tmp_path, tiny_model, monkeypatch):
    listed = loop.phases_of

    def with_toy(prepared, tracker, proposer, ledger, base_spec, progress):
        ahead, phases = listed(prepared, tracker, proposer, ledger, base_spec, progress)
        return ahead, [*phases, OnceMoreOnSeed9(base_spec)]  # the one line a new phase needs

    monkeypatch.setattr(loop, "phases_of", with_toy)
    finished = run_search_in(tmp_path, CONFIRM_SPACE, sampler="grid", max_steps=12, seed=0, confirm_seeds=1,
                             confirm_top=1)
    best = finished.outcome.recommended
    assert best is not None
    # after confirmation's seed 1, the toy's seed 9: one more verdict seed, and one more MLflow run of the pick
    assert best["confirmation"]["seeds"] == [0, 1, 9]
    seeds = sorted(r["seed"] for r in finished.outcome.search["confirmations"] if r["confirms"] == best["number"])
    assert seeds == [1, 9]
    names = {run.data.tags.get(RUN_NAME_TAG) for run in runs_of(finished, "trial")}
    assert f"seed9-{best['number']:03d}" in names
    assert [r["number"] for r in finished.outcome.records] == [0, 1]  # the search's own trials, numbered as ever
