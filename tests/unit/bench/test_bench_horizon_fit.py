"""bench/horizon/horizon_fit.py: a classifier judged on a held-out set never saw it, and a run's features are its short
trial's alone (its long run, the label, plays no part)."""

import copy

import pytest
from helpers import BENCH_RECORDED

from bench.horizon.horizon import load
from bench.horizon.horizon_fit import counts, features, labelled, leave_one_set_out


def _made_up_set(marker: float, flipped: bool) -> tuple[list[list[float]], list[int], list[int]]:
    """40 runs: feature 0 names the set, feature 1 decides the label (failed when > 0, or < 0 where flipped)."""
    x = [[marker, (i - 19.5) / 10] for i in range(40)]
    y = [int((row[1] < 0) if flipped else (row[1] > 0)) for row in x]
    return x, y, [0] * 40


@pytest.mark.parametrize("kind", ["logistic", "boosted trees"])
def test_a_held_out_set_is_judged_by_a_fit_on_the_other_sets_alone(kind):
    # In the judged set the signal means the opposite of what it means elsewhere, and only its marker says so: a fit
    # that had seen it (the marker lets trees learn its own rule) would flag its failures; one that had not flags
    # its held runs instead.
    sets = [("judged", _made_up_set(1.0, flipped=True)), ("a", _made_up_set(0.0, flipped=False)),
            ("b", _made_up_set(0.0, flipped=False))]
    said = leave_one_set_out(sets, ["judged"], kind)
    c = counts(sets[0][1][1], said)
    assert c["failures"] == 20 and c["flags"] >= 15 and c["true"] == 0, c


def test_counts_are_recall_and_precision_of_the_flags():
    c = counts([1, 1, 0, 0, 1], [1, 0, 1, 0, 1])
    assert (c["failures"], c["flags"], c["true"]) == (3, 3, 2)
    assert c["recall"] == pytest.approx(2 / 3) and c["precision"] == pytest.approx(2 / 3)
    assert counts([0, 0], [0, 0])["recall"] is None


def test_a_runs_features_are_read_off_its_short_trial_alone():
    data = load(BENCH_RECORDED / "horizon-pretrained-seed127.json.gz")
    run = next(r for r in data["runs"] if r["long"] is not None and r["short"]["status"] == "ok")
    other = copy.deepcopy(run)
    other["long"] = {**other["long"], "status": "diverged", "stopped_at_step": 30, "history": []}
    assert features(other) == features(run)
    changed = copy.deepcopy(run)
    changed["short"]["history"][-1]["loss"] = 1e6 * (changed["short"]["history"][-1].get("loss") or 1.0)
    assert features(changed) != features(run)
    x, y, flagged = labelled(data)
    assert len(x) == len(y) == len(flagged) == sum(1 for r in data["runs"] if r["long"] is not None
                                                   and r["short"]["status"] == "ok")
    assert sum(y) == 3 and sum(flagged) == 5  # set 127: 3 failed by step 500, 5 flagged (bench/RESULTS.md)
