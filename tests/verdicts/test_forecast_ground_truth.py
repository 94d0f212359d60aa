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


def _risks(run):
    short = run["short"]
    return forecast(with_fp16_share(short["history"], run["params"]), run["trainer"],
                    run["params"].get("precision", "fp32"), horizon_steps(short["steps_run"]))


def test_every_flag_on_a_candidate_and_every_level_flag_came_true(recorded):
    # precision where it moves a recommendation: an `at risk` flag on a config that learned at the trial length (a
    # candidate) costs the search a longer rung and can change its pick; on the recorded runs every one came true.
    # The level rules (float16 weights, activations near float16's top) came true on every config, learning or not.
    for run in recorded["runs"]:
        if run["long"] is None:
            continue
        risks = _risks(run)
        level = [r for r in risks if r.signal in ("fp16_weights", "headroom")]
        if (risks and run["short"].get("learned")) or level:
            assert run["outcome"] in FAILED, (run["trainer"], run["config"], str(risks[0]), run["outcome"])


def test_the_held_out_recall_and_the_candidates_precision_reach_the_target():
    # the sets recorded after the rules were frozen (their "held_out" key); the target is 0.8 for both.
    # Measured: recall 6 of 7 over every config ok at 20 steps; precision 3 of 3 on candidates (6 of 8 on every
    # config: 2 SFT configs that did not learn, flagged by the grad-norm level rule, held 500 steps on 2 seeds)
    held_out = [load(path) for path in SETS if load(path).get("held_out")]
    assert len(held_out) >= 2
    runs = [r for data in held_out for r in data["runs"] if r["long"] is not None]
    failed = [r for r in runs if r["outcome"] in FAILED]
    assert len(failed) >= 5 and sum(bool(_risks(r)) for r in failed) / len(failed) >= 0.8
    flagged = [r for r in runs if r["short"].get("learned") and _risks(r)]
    assert flagged and sum(r["outcome"] in FAILED for r in flagged) / len(flagged) >= 0.8


def test_the_summary_counts_what_the_runs_say(recorded):
    summary = forecast_again(recorded)["all"]
    ok = [r for r in recorded["runs"] if r["long"] is not None]
    assert summary["ok_at_trial_length"] == len(ok)
    assert summary["late_failures"] == sum(r["outcome"] in FAILED for r in ok)
    assert summary["flagged_and_failed"] <= min(summary["flagged"], summary["late_failures"])
