"""The forecast (tuner.verdicts.forecast) on the recorded ground truth of bench/horizon.py: configs from the shipped
spaces run 20 steps and 500, their per-step histories kept (bench/horizon-seed*.json.gz). The forecast is re-run
offline on each 20-step history, as the search would see it."""

from pathlib import Path

import pytest

from bench.horizon import FAILED, forecast_again, load, with_fp16_share
from tuner.verdicts.forecast import forecast, horizon_steps

SETS = sorted((Path(__file__).resolve().parents[2] / "bench").glob("horizon-seed*.json.gz"))


@pytest.fixture(scope="module", params=SETS, ids=lambda p: p.name)
def recorded(request):
    return load(request.param)


def test_the_recorded_sets_are_there_and_whole():
    assert len(SETS) >= 3
    for path in SETS:
        data = load(path)
        assert data["long"] == 25 * data["short"] and data["runs"]
        assert all(r["long"] is None or r["long"]["steps_run"] > 0 for r in data["runs"])


def test_every_run_flagged_at_risk_failed_in_its_long_run(recorded):
    # precision: an `at risk` flag costs the search a longer rung and can move the recommendation; on the recorded
    # runs every flag came true
    for run in recorded["runs"]:
        if run["long"] is None:
            continue
        short = run["short"]
        risks = forecast(with_fp16_share(short["history"], run["params"]), run["trainer"], run["params"].get("precision", "fp32"),
                         horizon_steps(short["steps_run"]))
        if risks:
            assert run["outcome"] in FAILED, (run["trainer"], run["config"], str(risks[0]), run["outcome"])


def test_the_summary_counts_what_the_runs_say(recorded):
    summary = forecast_again(recorded)["all"]
    ok = [r for r in recorded["runs"] if r["long"] is not None]
    assert summary["ok_at_trial_length"] == len(ok)
    assert summary["late_failures"] == sum(r["outcome"] in FAILED for r in ok)
    assert summary["flagged_and_failed"] <= min(summary["flagged"], summary["late_failures"])
