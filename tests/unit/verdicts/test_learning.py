"""The learning judgement (tuner.verdicts.learning) on constructed sequences: the test's rules, not its calibration
(tests/unit/verdicts/test_learning_calibration.py measures the error rates on recorded real trials)."""

import math
import random

import pytest

from tuner.config.trainers import adapter
from tuner.verdicts.learning import ALPHA, MIN_STEPS, judge_learning, step_noise


def rows(key, values):
    return [{"step": i, key: v} for i, v in enumerate(values, start=1)]


def grpo_rows(means, spread=0.15, groups=4):
    return [{"step": i, "loss": 0.0, "reward": m, "reward_std": spread if m < 1.0 else 0.0, "reward_groups": groups}
            for i, m in enumerate(means, start=1)]


def ceiling_at(step, start=0.3, steps=20, rng=None):
    """A reward that rises in a straight line from ``start`` to 1.0 at ``step`` and stays there (TRL's rows of a
    solved tiny task: every completion of every group gets the top reward)."""
    rng = rng or random.Random(0)
    out = []
    for i in range(1, steps + 1):
        level = 1.0 if i >= step else start + (1.0 - start) * (i - 1) / (step - 1)
        out.append(1.0 if level >= 1.0 else min(0.99, level + rng.gauss(0, 0.03)))
    return out


def test_effect_is_the_mean_relative_loss_drop_below_the_start():
    # Loss 1.0 falling 0.05 a step: start = mean(1.0, 0.95); after it the loss sits on average 0.5 below it.
    learning = judge_learning(adapter("dpo"), rows("loss", [1.0 - 0.05 * i for i in range(20)]))
    assert learning.start == pytest.approx(0.975)
    assert learning.effect == pytest.approx(0.5 / 0.975)
    assert learning.learned and learning.p_value < 1e-6


def test_effect_for_grpo_is_reward_above_the_start_not_loss():
    # GRPO's loss is ~0 every step by construction; the reward is what moves.
    history = [{"step": i, "loss": 0.0, "reward": 0.2 + 0.02 * i} for i in range(10)]
    learning = judge_learning(adapter("grpo"), history)
    assert learning.metric == "reward" and learning.effect == pytest.approx(0.02 * 5.5 - 0.01)
    assert judge_learning(adapter("grpo"), rows("loss", [1.0] * 10)).effect is None


@pytest.mark.parametrize("seed", range(5))
def test_the_sooner_a_trial_reaches_the_ceiling_the_higher_it_scores(seed):
    # The inverted ranking of the old statistic: a reward at the ceiling from step 5 scored 0 (median slope 0).
    rng = random.Random(seed)
    fast, slow = ceiling_at(5, rng=rng), ceiling_at(15, rng=rng)
    never = [min(0.99, 0.3 + 0.02 * i + rng.gauss(0, 0.03)) for i in range(20)]
    judged = [judge_learning(adapter("grpo"), grpo_rows(values)) for values in (fast, slow, never)]
    assert all(learning.learned for learning in judged[:2])
    assert judged[0].effect > judged[1].effect > judged[2].effect > 0
    assert judged[0].effect > 0.5  # 0.7 above the start for 16 of 18 steps


def test_a_reward_tied_at_the_ceiling_is_significant_with_the_steps_spread():
    # 0.3 -> 1.0 by step 3, then 18 ties at 1.0: a rank test's tie correction left p ~ 0.014 here.
    learning = judge_learning(adapter("grpo"), grpo_rows([0.3, 0.6] + [1.0] * 18))
    assert learning.learned and learning.p_value < 1e-4 and learning.gain == pytest.approx(0.55)


def test_a_wide_reward_spread_over_few_groups_needs_a_bigger_gain():
    # Step means that happen to move little (small differences) but each from 1 group with spread 0.4:
    # a gain of 0.1 is within what one group's completions give by chance.
    means = [0.30, 0.32] + [0.34, 0.36, 0.38, 0.40] * 4 + [0.40, 0.42]
    steady = judge_learning(adapter("grpo"), [{"step": i, "reward": m} for i, m in enumerate(means, 1)])
    noisy = judge_learning(adapter("grpo"), grpo_rows(means, spread=0.4, groups=1))
    assert steady.learned and not noisy.learned and noisy.p_value > steady.p_value


def test_the_ln2_plateau_and_a_rising_loss_are_not_learning():
    assert not judge_learning(adapter("reward"), rows("loss", [math.log(2)] * 20)).learned
    rising = judge_learning(adapter("sft"), rows("loss", [1.0 + 0.1 * i for i in range(20)]))
    assert rising.effect < 0 and rising.p_value > 0.99 and not rising.learned


def test_learning_that_falls_back_to_the_start_is_not_learned():
    # Up to 0.8 by step 8, back to the start by the last third: the end is no better than the start.
    rng = random.Random(3)
    up_down = [0.3 + 0.07 * i for i in range(8)] + [0.8 - 0.07 * i for i in range(8)] + [0.3] * 4
    values = [v + rng.gauss(0, 0.02) for v in up_down]
    learning = judge_learning(adapter("grpo"), grpo_rows(values))
    assert learning.effect > 0.1 and not learning.learned


def test_non_finite_values_are_left_out_and_too_few_values_give_no_verdict():
    values = [2.0, float("nan"), 1.8, float("inf"), 1.5, 1.2, 1.0, 0.8, 0.5]
    learning = judge_learning(adapter("kto"), rows("loss", values))
    assert learning.steps == 7 and learning.learned
    few = judge_learning(adapter("kto"), rows("loss", [2.0, 1.0, 0.5, 0.2, 0.1]))
    assert few.steps == MIN_STEPS - 1 and few.p_value is None and not few.learned
    assert "too few" in few.describe()


def test_a_fast_learner_is_not_penalised_for_its_speed():
    fast = judge_learning(adapter("reward"), rows("loss", [2.0 * 0.7 ** i for i in range(20)]))
    slow = judge_learning(adapter("reward"), rows("loss", [2.0 * 0.97 ** i for i in range(20)]))
    assert fast.learned and slow.learned and fast.effect > slow.effect


def test_one_spike_neither_fakes_nor_hides_a_trend():
    flat = [0.69 + (0.01 if i % 2 else -0.01) for i in range(20)]
    flat[3] = 0.1  # one wild low step
    assert not judge_learning(adapter("reward"), rows("loss", flat)).learned
    falling = [1.0 - 0.04 * i for i in range(20)]
    falling[7] = 9.0  # the bf16 lr 0.3 spike that recovers
    assert judge_learning(adapter("reward"), rows("loss", falling)).learned


def test_step_noise_ignores_a_steady_trend_and_sees_the_noise():
    assert step_noise([1.0 - 0.05 * i for i in range(20)]) == 0.0
    rng = random.Random(5)
    noise = [step_noise([rng.gauss(0, 0.1) for _ in range(200)]) for _ in range(20)]
    assert 0.08 < sum(noise) / len(noise) < 0.12


def test_wandering_reward_is_not_learning_and_a_steady_gain_is():
    wandering = [0.2, 0.4, 0.1, 0.3, 0.5, 0.2, 0.1, 0.4, 0.3, 0.2, 0.3, 0.1, 0.4, 0.2, 0.5, 0.3, 0.2, 0.4, 0.3, 0.25]
    rising = [0.2 + 0.03 * i + (0.02 if i % 2 else -0.02) for i in range(1, 21)]
    assert not judge_learning(adapter("grpo"), rows("reward", wandering)).learned
    assert judge_learning(adapter("grpo"), rows("reward", rising)).learned


@pytest.mark.parametrize("steps", [6, 10, 20, 40, 60, 180])
@pytest.mark.parametrize("tails", ["gaussian", "heavy"])
def test_false_alarm_rate_on_exchangeable_noise(steps, tails):
    # 4000 sequences of pure noise: the size must stay at ALPHA on Gaussian noise and below 2.5x ALPHA on noise
    # with Student-t(3) tails (plus a binomial margin of 3 standard errors, so another seed cannot flip it).
    rng = random.Random(7 + steps)

    def draw():
        z = rng.gauss(0, 1)
        return z if tails == "gaussian" else z / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)

    n, bound = 4000, ALPHA if tails == "gaussian" else 2.5 * ALPHA
    hits = sum(judge_learning(adapter("sft"), rows("loss", [10 + draw() for _ in range(steps)])).learned for _ in range(n))
    assert hits / n <= bound + 3 * math.sqrt(bound * (1 - bound) / n)


def test_a_long_run_at_the_ceiling_reads_as_much_progress_as_its_first_twenty_steps():
    # A GRPO config at the reward ceiling from step 7, run on: a long run's start is the untouched model's (its
    # first 2 steps), not its first tenth (which would already sit at the ceiling and read no progress).
    from tuner.verdicts.learning import LONG_RUN

    rng = random.Random(0)
    curve = [min(1.0, 0.3 + 0.12 * step) for step in range(1, 501)]
    rows = [{"step": s, "reward": min(1.0, v + rng.gauss(0, 0.03))} for s, v in enumerate(curve, 1)]
    short = judge_learning(adapter("grpo"), rows[:20])
    long = judge_learning(adapter("grpo"), rows)
    assert LONG_RUN < 500 and short.learned and long.learned
    assert long.effect == pytest.approx(short.effect, rel=0.35) and long.effect > 0.3
    assert long.effect > judge_learning(adapter("grpo"), rows[:LONG_RUN]).effect  # the 180-step rung's first tenth
