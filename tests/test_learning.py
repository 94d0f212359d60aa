"""The learning judgement (tuner.learning) on constructed sequences: the test's rules, not its calibration
(tests/test_learning_calibration.py measures the error rates on recorded real trials)."""

import math
import random

import pytest

from tuner.learning import ALPHA, MIN_STEPS, judge_learning, mann_kendall, theil_sen_slope


def rows(key, values):
    return [{"step": i, key: v} for i, v in enumerate(values, start=1)]


def test_effect_is_relative_loss_drop_of_the_fitted_line():
    # An exact line from 1.0 falling 0.05 a step: over 19 steps the fitted loss falls 0.95, 95% of its start.
    learning = judge_learning("dpo", rows("loss", [1.0 - 0.05 * i for i in range(20)]))
    assert learning.effect == pytest.approx(0.95)
    assert learning.learned and learning.p_value < 1e-6


def test_effect_for_grpo_is_reward_gained_not_loss():
    # GRPO's loss is ~0 every step by construction; the reward is what moves.
    history = [{"step": i, "loss": 0.0, "reward": 0.2 + 0.02 * i} for i in range(10)]
    learning = judge_learning("grpo", history)
    assert learning.metric == "reward" and learning.effect == pytest.approx(0.18)
    assert judge_learning("grpo", rows("loss", [1.0] * 10)).effect is None


def test_the_ln2_plateau_and_a_rising_loss_are_not_learning():
    assert not judge_learning("reward", rows("loss", [math.log(2)] * 20)).learned
    rising = judge_learning("sft", rows("loss", [1.0 + 0.1 * i for i in range(20)]))
    assert rising.effect < 0 and rising.p_value > 0.99 and not rising.learned


def test_non_finite_values_are_left_out_and_too_few_values_give_no_verdict():
    values = [2.0, float("nan"), 1.8, float("inf"), 1.5, 1.2, 1.0, 0.8, 0.5]
    learning = judge_learning("kto", rows("loss", values))
    assert learning.steps == 7 and learning.learned
    few = judge_learning("kto", rows("loss", [2.0, 1.0, 0.5, 0.2, 0.1]))
    assert few.steps == MIN_STEPS - 1 and few.p_value is None and not few.learned
    assert "too few" in few.describe()


def test_a_fast_learner_is_not_penalised_for_its_speed():
    # The old rule counted the fall inside each quarter as noise: a steep, clean fall looked noisy.
    fast = rows("loss", [2.0 * 0.7 ** i for i in range(20)])
    assert judge_learning("reward", fast).learned


def test_one_spike_neither_fakes_nor_hides_a_trend():
    flat = [0.69 + (0.01 if i % 2 else -0.01) for i in range(20)]
    flat[3] = 0.1  # one wild low step
    assert not judge_learning("reward", rows("loss", flat)).learned
    falling = [1.0 - 0.04 * i for i in range(20)]
    falling[7] = 9.0  # the bf16 lr 0.3 spike that recovers
    assert judge_learning("reward", rows("loss", falling)).learned


def test_wandering_reward_is_not_learning_and_a_steady_gain_is():
    wandering = [0.2, 0.4, 0.1, 0.3, 0.5, 0.2, 0.1, 0.4, 0.3, 0.2, 0.3, 0.1, 0.4, 0.2, 0.5, 0.3, 0.2, 0.4, 0.3, 0.25]
    rising = [0.2 + 0.03 * i + (0.02 if i % 2 else -0.02) for i in range(1, 21)]
    assert not judge_learning("grpo", rows("reward", wandering)).learned
    assert judge_learning("grpo", rows("reward", rising)).learned


def test_mann_kendall_false_positive_rate_on_exchangeable_noise_is_at_most_alpha():
    # 4000 sequences of pure noise, 20 steps each: the one-sided test's size must not exceed ALPHA
    # (a binomial margin of 3 standard errors keeps this from flipping on another seed).
    rng = random.Random(7)
    n = 4000
    hits = sum(mann_kendall([rng.gauss(0, 1) for _ in range(20)]) < ALPHA for _ in range(n))
    assert hits / n <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)


def test_mann_kendall_handles_ties_and_constant_sequences():
    assert mann_kendall([1.0] * 10) == 1.0
    # Rise then a tied plateau (a saturated reward) still reads as a rise.
    assert mann_kendall([0.2, 0.3, 0.5, 0.8, 1, 1, 1, 1, 1, 1, 1, 1]) < ALPHA
    assert mann_kendall([3, 2, 1, 0, -1, -2], direction=-1) < ALPHA


def test_theil_sen_slope_ignores_an_outlier():
    values = [float(i) for i in range(11)]
    values[5] = 1000.0
    assert theil_sen_slope(values) == pytest.approx(1.0)


def test_long_histories_are_binned_and_stay_fast():
    learning = judge_learning("sft", rows("loss", [5.0 - 0.001 * i for i in range(3000)]))
    assert learning.steps == 3000 and learning.learned
    assert learning.effect == pytest.approx(0.001 * 2999 / 5.0, rel=0.01)


def test_describe_speaks_the_trainers_units():
    assert judge_learning("sft", rows("loss", [1.0 - 0.02 * i for i in range(20)])).describe().startswith("loss -38.0%")
    assert judge_learning("grpo", rows("reward", [0.1 * i for i in range(8)])).describe().startswith("reward +0.7")
