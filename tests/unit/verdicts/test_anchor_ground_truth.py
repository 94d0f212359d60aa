"""GRPO's KL anchor on its recorded ground truth (bench/horizon/anchor.py, bench/recorded/anchor.json.gz): the tiny pretrained model's
GRPO pick of default search seed 1 (fp32, dapo, lr 7.6e-5, 60 steps) run to 1,500 steps on 4 fresh seeds with beta 0
as picked and with beta 0.04, nothing else changed. The figures docs/horizon.md and bench/RESULTS.md state are
asserted here, so a re-recording that changes them fails until the text follows."""

from pathlib import Path

import pytest
from helpers import BENCH_RECORDED

from bench.horizon.anchor import TITLE, _replayed, lines, spread
from bench.horizon.horizon import FAILED, load
from tuner.verdicts.forecast import forecast

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def recorded():
    return load(BENCH_RECORDED / "anchor.json.gz")


def test_with_beta_0_every_run_lost_its_spread_and_collapsed_and_with_beta_004_every_run_held(recorded):
    assert (recorded["short"], recorded["long"], recorded["seeds"]) == (60, 1500, [4, 5, 6, 7])
    runs = {(row["params"]["beta"], row["seed"]): row for row in recorded["runs"]}
    assert sorted(runs) == [(b, s) for b in (0.0, 0.04) for s in (4, 5, 6, 7)]
    for (beta, seed), row in runs.items():
        assert row["short"]["status"] == "ok"
        assert row["short"]["learned"] == (seed in (4, 5))  # at 60 steps, seeds 6 and 7 not yet significantly
        long = row["long"]
        share, reward = spread(long["history"])
        if beta == 0.0:
            assert row["outcome"] in FAILED and long["status"] == "collapsed"
            assert 500 < long["stopped_at_step"] < 1500 and "frac_reward_zero_std is 1.0" in long["reason"]
        else:
            assert row["outcome"] == "held" and long["steps_run"] == 1500 and long["learned"]
            # the share of groups without spread levelled off below 1, the reward above where beta 0 stopped
            assert 0.8 <= share <= 0.9 and reward >= 0.69
            # and the guard's exemption for anchored runs played no part over 1,500 steps: it held without it too
            assert _replayed(long["history"], recorded["long"], keep_kl=False) == "ok through 1500"
        assert any("kl" in r for r in long["history"]) == (beta > 0)  # TRL logs kl only with a KL penalty
    # per step the anchored config learned no slower at 60 steps, on every seed
    assert all(runs[(0.04, s)]["short"]["progress"] >= runs[(0.0, s)]["short"]["progress"] for s in (4, 5, 6, 7))


def test_the_forecast_flags_every_beta_0_run_and_no_anchored_one_where_without_the_exemption_it_flagged_all(recorded):
    for row in recorded["runs"]:
        history, precision = row["short"]["history"], row["params"]["precision"]
        now = forecast(history, "grpo", precision, recorded["long"])
        bare = forecast([{k: v for k, v in r.items() if k != "kl"} for r in history], "grpo", precision,
                        recorded["long"])
        assert [r.signal for r in bare] == ["reward_spread"]  # the fitted rise cannot tell beta 0 from 0.04
        assert [r.signal for r in now] == (["reward_spread"] if row["params"]["beta"] == 0 else [])
        assert bool(row["short"]["risk"]) == bool(now)  # as the trial itself recorded it


def test_results_md_carries_this_recording_s_rendering(recorded):
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    body = text.partition(TITLE)[2]
    assert body and all(line in body for line in lines(recorded))
