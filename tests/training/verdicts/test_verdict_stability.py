"""Verdicts that hold on any seed: the same config on 5 seeds gets the same status (and the same "learned")
unless the training really differs. Real reward-model trials on the tiny model, the bench grid's configs."""

import pytest

from tuner.trial import TrialSpec, run_trial

SEEDS = (0, 1, 2, 3, 42)


def trial(precision: str, learning_rate: float, seed: int):
    params = {"precision": precision, "learning_rate": learning_rate, "per_device_train_batch_size": 8,
              "use_peft": False, "max_length": 64}
    return run_trial(TrialSpec(trainer="reward", params=params, max_steps=20, seed=seed))  # the default budget


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "learning_rate", "status", "learned"), [
    ("fp16-pure", 0.3, "diverged", False),  # the "half weights" case: NaN by step 3 on every seed
    ("fp16-pure", 1e-3, "diverged", False),  # fp16 weights overflow within a few steps even at 1e-3
    ("bf16-pure", 1e-3, "ok", True),
    ("fp32", 1e-3, "ok", True),
    ("fp32", 1e-4, "ok", True),
])
def test_configs_away_from_the_edge_get_one_verdict_on_every_seed(precision, learning_rate, status, learned):
    results = [trial(precision, learning_rate, seed) for seed in SEEDS]
    assert [r.status for r in results] == [status] * len(SEEDS), [(r.status, r.reason) for r in results]
    assert [r.learned for r in results] == [learned] * len(SEEDS), [r.progress for r in results]


@pytest.mark.slow
def test_an_erratic_config_is_not_judged_on_its_second_step():
    # bf16-pure at lr 0.3: step 2's grad norm is 5-800x step 1's depending on the seed. Judged against one
    # baseline value, seed 42 was "diverged at step 2" and seed 0 "ok". The explosion rules now wait for a
    # 3-step baseline and let clipping (max_grad_norm 1.0 by default) absorb single spikes.
    for seed in (0, 42):
        result = trial("bf16-pure", 0.3, seed)
        assert result.status == "ok" or result.stopped_at_step > 3, (seed, result.reason)
