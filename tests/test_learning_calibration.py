"""The learning judgement's error rates, measured on recorded real trials (tests/calibration/histories.json,
written by `python -m tests.calibration.record`: the embedded tiny model, every trainer, 40 seeds each).

- A trial that cannot learn (learning rate 1e-7) must be called "learned" in at most 5% of seeds.
- A trial that clearly learns must be called "learned" in at least 95% of seeds.

Both rates are printed (`pytest -s tests/test_learning_calibration.py`) and asserted per trainer and overall.
"""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tuner.learning import judge_learning

RECORDED = json.loads((Path(__file__).parent / "calibration" / "histories.json").read_text())
TRAINERS = sorted({t["trainer"] for t in RECORDED["trials"]})


def rates() -> dict[tuple[str, str], tuple[int, int]]:
    """(trainer, kind) -> (trials judged learned, trials)."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for trial in RECORDED["trials"]:
        learned = judge_learning(trial["trainer"], trial["history"]).learned
        for key in ((trial["trainer"], trial["kind"]), ("all", trial["kind"])):
            counts[key][0] += learned
            counts[key][1] += 1
    return {key: (hits, n) for key, (hits, n) in counts.items()}


def test_recording_covers_every_trainer_with_enough_seeds():
    from tuner.trainers import ADAPTERS

    assert set(TRAINERS) == set(ADAPTERS)
    measured = rates()
    # 40 seeds: one false "learned" moves the rate by 2.5%, so the 5% bound is measured, not rounded to it.
    assert all(n >= 40 for (_, _), (_, n) in measured.items())
    # Every recorded trial ran its full length: the guard stopped none of them, so the judgement saw all steps.
    assert all(t["status"] == "ok" and len(t["history"]) == RECORDED["max_steps"] for t in RECORDED["trials"])


@pytest.mark.parametrize("trainer", [*TRAINERS, "all"])
def test_a_trial_that_cannot_learn_is_rarely_called_learned(trainer):
    hits, n = rates()[(trainer, "cannot_learn")]
    print(f"\n{trainer}: cannot learn (lr 1e-7) judged learned in {hits}/{n} = {hits / n:.1%} of seeds")
    assert hits / n <= 0.05


@pytest.mark.parametrize("trainer", [*TRAINERS, "all"])
def test_a_trial_that_clearly_learns_is_almost_always_called_learned(trainer):
    hits, n = rates()[(trainer, "learns")]
    print(f"\n{trainer}: clearly learning judged learned in {hits}/{n} = {hits / n:.1%} of seeds")
    assert hits / n >= 0.95
