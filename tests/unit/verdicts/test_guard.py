"""The stability guard on recorded metric sequences: one test per failure in docs/failures.md and per rule."""

import math

import pytest

from tuner.config.trainers import adapter
from tuner.verdicts.guard import Guard, GuardSettings, Verdict, first_verdict

NAN = math.nan
INF = math.inf


def steps(*records: dict) -> list[dict]:
    """Number the records 1, 2, 3, ... as Trainer's global_step does."""
    return [{"step": step, **record} for step, record in enumerate(records, start=1)]


# --- the docs/failures.md table ---------------------------------------------------------------------------


def test_fp16_weights_reward_model_stops_at_first_nan_grad_norm():
    # The CPU repro at learning rate 0.3: loss 4.4 at step 2, then "loss 0.0, grad_norm nan" from step 5 on.
    history = steps(
        {"loss": 0.69, "grad_norm": 1.2, "accuracy": 0.5},
        {"loss": 4.4, "grad_norm": 9.0, "accuracy": 0.4},
        {"loss": 1.1, "grad_norm": 3.0, "accuracy": 0.5},
        {"loss": 0.8, "grad_norm": 2.0, "accuracy": 0.6},
        *[{"loss": 0.0, "grad_norm": NAN, "accuracy": 0.5}] * 6,
    )
    verdict = first_verdict(adapter("reward"), history)
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "non_finite", 5)
    # The logged 0.0 loss is shown, since Trainer's filter can hide a NaN loss behind it.
    assert verdict.reason == "grad_norm is nan at step 5 (loss logged 0.0)"


def test_loss_1e34_with_nan_grad_norm_fires_at_that_step():
    history = steps(
        {"loss": 0.69, "grad_norm": 1.2},
        {"loss": 4.4, "grad_norm": 9.0},
        {"loss": 1e34, "grad_norm": NAN},
        *[{"loss": 0.0, "grad_norm": NAN}] * 5,
    )
    verdict = first_verdict(adapter("reward"), history)
    # The non-finite grad norm outranks the loss explosion on the same step.
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "non_finite", 3)
    assert "loss logged 1e+34" in verdict.reason


def test_loss_1e34_with_finite_grad_norm_is_a_loss_explosion_before_any_nan():
    history = steps(
        {"loss": 0.69, "grad_norm": 1.2},
        {"loss": 4.4, "grad_norm": 9.0},
        {"loss": 1e34, "grad_norm": 50.0},
        {"loss": 0.0, "grad_norm": NAN},
    )
    verdict = first_verdict(adapter("reward"), history)
    # The baseline still being filled (2 of 3 steps) already guards against the blow-up.
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "loss_explosion", 3)


def test_reward_model_jump_to_4_4_that_recovers_is_tolerated():
    history = steps(
        {"loss": 0.69, "grad_norm": 1.2},
        {"loss": 4.4, "grad_norm": 9.0},
        {"loss": 0.9, "grad_norm": 2.0},
        {"loss": 0.7, "grad_norm": 1.5},
        {"loss": 0.6, "grad_norm": 1.1},
    )
    # 4.4 is about 6x the baseline, under the 20x explosion factor: noisy, not diverged.
    assert first_verdict(adapter("reward"), history) is None


def test_dpo_fp16_nan_rewards_with_zero_loss_and_grad_norm_diverges():
    healthy = {"loss": 0.69, "grad_norm": 3.0, "rewards/chosen": 0.01, "rewards/rejected": -0.01, "logps/chosen": -120.0}
    broken = {"loss": 0.0, "grad_norm": 0.0, "rewards/chosen": NAN, "rewards/rejected": NAN, "logps/chosen": -120.0}
    verdict = first_verdict(adapter("dpo"), steps(healthy, healthy, broken, broken, broken))
    # Reported as divergence at the NaN step, not as a zero-grad collapse later.
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "non_finite", 3)
    assert verdict.reason == "rewards/chosen is nan at step 3 (loss logged 0.0)"


def test_kto_nan_loss_stops_at_that_step():
    healthy = {"loss": 0.5, "grad_norm": 2.0, "rewards/chosen": 0.1, "kl": 0.0}
    history = steps(healthy, healthy, healthy, {"loss": NAN, "grad_norm": NAN, "rewards/chosen": 0.1, "kl": 0.0})
    verdict = first_verdict(adapter("kto"), history)
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "non_finite", 4)
    assert verdict.reason == "loss is nan at step 4"


def test_grpo_loss_exactly_zero_every_step_is_normal():
    history = steps(
        *[
            {"loss": 0.0, "grad_norm": 0.3 + 0.01 * i, "reward": 0.2 + 0.02 * i, "reward_std": 0.4, "frac_reward_zero_std": 0.25, "kl": 0.0}
            for i in range(20)
        ]
    )
    assert first_verdict(adapter("grpo"), history) is None


def test_grpo_small_negative_losses_around_a_zero_baseline_are_normal():
    losses = [0.0, 0.0, 0.0, -0.04, 0.03, -0.5, 0.8, -0.02]
    history = steps(*[{"loss": loss, "grad_norm": 0.5, "frac_reward_zero_std": 0.0} for loss in losses])
    # The loss floor keeps a zero baseline from turning every nonzero loss into an explosion.
    assert first_verdict(adapter("grpo"), history) is None


def test_grpo_loss_explodes_against_the_floor_when_the_baseline_is_zero():
    history = steps(*[{"loss": 0.0, "grad_norm": 0.5}] * 3, {"loss": -25.0, "grad_norm": 0.5})
    verdict = first_verdict(adapter("grpo"), history)
    # A negative loss explodes by magnitude, measured against the floor of 1.0.
    assert (verdict.signal, verdict.step) == ("loss_explosion", 4)


def test_fp16_mixed_calibration_skips_then_healthy_is_normal():
    calibrating = {"loss": 2.3, "grad_norm": INF, "step_skipped": 1.0, "loss_scale": 65536.0}
    healthy = {"loss": 2.2, "grad_norm": 1.5, "step_skipped": 0.0, "loss_scale": 8192.0}
    history = steps(calibrating, calibrating, calibrating, *[healthy] * 10)
    assert first_verdict(adapter("sft"), history, grad_scaler=True) is None


def test_fp16_mixed_calibration_without_step_skipped_key_is_inferred():
    history = steps(*[{"loss": 2.3, "grad_norm": INF}] * 3, *[{"loss": 2.2, "grad_norm": 1.5}] * 5)
    # Non-finite grad norms with a finite loss in the first max_skipped_steps steps read as calibration.
    assert first_verdict(adapter("sft"), history, grad_scaler=True) is None


def test_fp16_mixed_inferred_skip_ends_after_the_first_steps():
    history = steps(*[{"loss": 2.2, "grad_norm": 1.5}] * 6, {"loss": 2.2, "grad_norm": INF})
    verdict = first_verdict(adapter("sft"), history, grad_scaler=True)
    assert (verdict.signal, verdict.step) == ("non_finite", 7)


def test_inf_grad_norm_without_fp16_mixed_diverges_at_step_one():
    history = steps({"loss": 2.3, "grad_norm": INF, "step_skipped": 1.0})
    # The GradScaler exemption is only for fp16 mixed precision.
    assert first_verdict(adapter("sft"), history).signal == "non_finite"


def test_fp16_mixed_many_consecutive_skipped_steps_diverge():
    skipped = {"loss": 2.3, "grad_norm": NAN, "step_skipped": 1.0}
    verdict = first_verdict(adapter("sft"), steps(*[skipped] * 8), grad_scaler=True)
    # Five skips are tolerated, the sixth in a row fires.
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "skipped_steps", 6)


def test_fp16_mixed_skip_streak_resets_on_a_real_step():
    skipped = {"loss": 2.3, "grad_norm": INF, "step_skipped": 1.0}
    healthy = {"loss": 2.2, "grad_norm": 1.5, "step_skipped": 0.0}
    history = steps(*[skipped] * 5, healthy, *[skipped] * 5, healthy)
    assert first_verdict(adapter("sft"), history, grad_scaler=True) is None


def test_fp16_mixed_collapsing_loss_scale_diverges():
    scales = [65536.0, 4096.0, 64.0, 2.0, 0.5]
    history = steps(*[{"loss": 2.3, "grad_norm": 1.0, "step_skipped": 0.0, "loss_scale": scale} for scale in scales])
    verdict = first_verdict(adapter("sft"), history, grad_scaler=True)
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "loss_scale_collapse", 5)
    assert "loss_scale is 0.5 at step 5" in verdict.reason


def test_fp16_mixed_nan_loss_is_divergence_even_on_a_skipped_step():
    history = steps({"loss": NAN, "grad_norm": INF, "step_skipped": 1.0})
    verdict = first_verdict(adapter("kto"), history, grad_scaler=True)
    assert (verdict.signal, verdict.step) == ("non_finite", 1)


def test_fp16_mixed_skipped_step_does_not_count_as_grad_explosion():
    history = steps(
        *[{"loss": 2.3, "grad_norm": 1.0, "step_skipped": 0.0}] * 3,
        {"loss": 2.3, "grad_norm": 1e9, "step_skipped": 1.0},
        {"loss": 2.2, "grad_norm": 1.0, "step_skipped": 0.0},
    )
    assert first_verdict(adapter("sft"), history, grad_scaler=True) is None


# --- collapse rules --------------------------------------------------------------------------------


def test_zero_grad_norm_three_steps_in_a_row_collapses():
    history = steps({"loss": 0.7, "grad_norm": 1.0}, *[{"loss": 0.7, "grad_norm": 0.0}] * 4)
    verdict = first_verdict(adapter("reward"), history)
    assert (verdict.status, verdict.signal, verdict.step) == ("collapsed", "zero_grad", 4)


def test_zero_grad_norm_streak_broken_by_a_nonzero_step_is_tolerated():
    zero, nonzero = {"loss": 0.7, "grad_norm": 0.0}, {"loss": 0.7, "grad_norm": 0.2}
    assert first_verdict(adapter("sft"), steps(zero, zero, nonzero, zero, zero, nonzero)) is None


def test_grpo_without_reward_spread_collapses_after_five_steps():
    no_signal = {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0}
    verdict = first_verdict(adapter("grpo"), steps(*[no_signal] * 6))
    # Zero grads explained by equal rewards are judged by the reward-spread rule, not zero_grad at step 3.
    assert (verdict.status, verdict.signal, verdict.step) == ("collapsed", "zero_reward_std", 5)


def test_grpo_finding_reward_spread_within_patience_is_normal():
    no_signal = {"loss": 0.0, "grad_norm": 0.0, "frac_reward_zero_std": 1.0}
    signal = {"loss": 0.0, "grad_norm": 0.4, "frac_reward_zero_std": 0.5}
    assert first_verdict(adapter("grpo"), steps(*[no_signal] * 4, *[signal] * 10)) is None


def _no_spread_streak_fires(run_steps: int, streak: int) -> int | None:
    guard = Guard(adapter("grpo"))
    guard.run_steps = run_steps
    no_signal = {"loss": 0.0, "grad_norm": 0.0, "reward": 0.2, "frac_reward_zero_std": 1.0}
    for step in range(1, streak + 1):
        verdict = guard.observe(step, no_signal)
        if verdict is not None:
            return verdict.step
    return None


def test_a_longer_run_waits_one_more_step_per_doubling_before_calling_no_spread_a_collapse():
    assert _no_spread_streak_fires(20, 12) == 5  # a search's trial: as before
    assert _no_spread_streak_fires(60, 12) == 7
    assert _no_spread_streak_fires(600, 12) == 10
    assert _no_spread_streak_fires(600, 9) is None  # 9 in a row at p <= 0.5 is luck somewhere in 600 steps


@pytest.mark.parametrize("p", [0.3, 0.45])
def test_the_no_spread_rule_does_not_fire_more_often_on_longer_healthy_runs(p):
    # Healthy GRPO: each step has no reward spread with probability p, independently; the reward holds at 0.4.
    # Per run, the rule's false alarms at 600 steps stay within those at 20 (plus the simulation's noise).
    import random

    def alarm_rate(run_steps: int, runs: int = 400) -> float:
        rng, fired = random.Random(run_steps), 0
        for _ in range(runs):
            guard = Guard(adapter("grpo"))
            guard.run_steps = run_steps
            for step in range(1, run_steps + 1):
                zero = 1.0 if rng.random() < p else 0.5
                if guard.observe(step, {"loss": 0.0, "grad_norm": 0.3, "reward": 0.4, "frac_reward_zero_std": zero}):
                    fired += 1
                    break
        return fired / runs

    short, long = alarm_rate(20), alarm_rate(600)
    assert long <= short + 0.06, (short, long)


def test_params_unchanged_at_step_three_collapses():
    history = steps(*[{"loss": 0.69, "grad_norm": 0.8, "params_changed": 0.0}] * 4)
    verdict = first_verdict(adapter("sft"), history)
    # Steps 1 and 2 are given time; from no_update_steps on, unmoved parameters mean LoRA hit nothing.
    assert (verdict.status, verdict.signal, verdict.step) == ("collapsed", "no_update", 3)


def test_params_changing_by_step_three_is_normal():
    history = steps(
        {"loss": 0.69, "grad_norm": 0.8, "params_changed": 0.0},
        {"loss": 0.69, "grad_norm": 0.8, "params_changed": 0.0},
        {"loss": 0.68, "grad_norm": 0.8, "params_changed": 1.0},
        {"loss": 0.67, "grad_norm": 0.8},
    )
    assert first_verdict(adapter("sft"), history) is None


def test_reward_model_pinned_at_ln2_with_small_grads_is_not_the_guards_job():
    history = steps(*[{"loss": 0.6931, "grad_norm": 1e-6, "accuracy": 0.5, "margin": 0.0} for _ in range(20)])
    # Stable but useless is for the progress metric, not the guard.
    assert first_verdict(adapter("reward"), history) is None


def test_reward_model_pinned_at_ln2_with_exactly_zero_grads_collapses():
    history = steps(*[{"loss": 0.6931, "grad_norm": 0.0, "accuracy": 0.5} for _ in range(5)])
    assert first_verdict(adapter("reward"), history).signal == "zero_grad"


# --- explosions and ordinary noise -----------------------------------------------------------------


def test_noisy_descending_loss_is_normal():
    losses = [0.69, 0.72, 0.9, 0.65, 0.6, 0.66, 0.5, 0.55, 0.45, 0.4]
    grads = [1.0, 2.5, 0.4, 3.0, 1.2, 0.8, 5.0, 1.1, 0.9, 0.7]
    history = steps(*[{"loss": loss, "grad_norm": grad, "learning_rate": 1e-4} for loss, grad in zip(losses, grads)])
    assert first_verdict(adapter("reward"), history) is None


def test_loss_explosion_diverges():
    losses = [2.5, 2.4, 2.3, 2.2, 80.0]
    verdict = first_verdict(adapter("sft"), steps(*[{"loss": loss, "grad_norm": 1.0} for loss in losses]))
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "loss_explosion", 5)
    assert "loss is 80 at step 5" in verdict.reason


def test_grad_explosion_diverges():
    grads = [1.0, 1.2, 0.9, 1.1, 150.0]
    verdict = first_verdict(adapter("dpo"), steps(*[{"loss": 0.69, "grad_norm": grad} for grad in grads]))
    assert (verdict.status, verdict.signal, verdict.step) == ("diverged", "grad_explosion", 5)
    assert "grad_norm is 150 at step 5" in verdict.reason


def test_zero_grad_norms_stay_out_of_the_grad_baseline():
    grads = [0.0, 0.0, 0.5, 0.6, 0.4]
    # A zero median would make the first real gradient an "explosion".
    assert first_verdict(adapter("grpo"), steps(*[{"loss": 0.0, "grad_norm": grad} for grad in grads])) is None


@pytest.mark.parametrize(
    "key",
    ["reward", "reward_std", "rewards/accuracy_reward/mean", "logps/rejected", "logits/chosen", "margin", "accuracy", "mean_reward", "kl", "entropy"],
)
def test_non_finite_output_metric_diverges(key):
    history = steps({"loss": 0.5, "grad_norm": 1.0}, {"loss": 0.5, "grad_norm": 1.0, key: -INF})
    verdict = first_verdict(adapter("grpo"), history)
    assert (verdict.signal, verdict.step) == ("non_finite", 2)
    assert verdict.reason == f"{key} is -inf at step 2 (loss logged 0.5)"


def test_non_finite_unwatched_metric_is_ignored():
    history = steps({"loss": 0.5, "grad_norm": 1.0, "completions/mean_length": NAN, "learning_rate": 0.0})
    # Only model outputs, loss and grad norm say the numerics broke; a length statistic does not.
    assert first_verdict(adapter("grpo"), history) is None


def test_missing_keys_are_not_failures():
    history = steps({"learning_rate": 1e-4}, {}, {"loss": 0.7}, {"grad_norm": 1.0}, {"loss": 0.6, "grad_norm": 0.9})
    assert first_verdict(adapter("sft"), history) is None


# --- the Guard object and its settings -------------------------------------------------------------


def test_guard_keeps_returning_the_same_verdict_after_firing():
    guard = Guard(adapter("kto"))
    assert guard.observe(1, {"loss": 0.5, "grad_norm": 1.0}) is None
    verdict = guard.observe(2, {"loss": NAN, "grad_norm": 1.0})
    assert isinstance(verdict, Verdict)
    # Healthy or different failures later do not replace the first verdict.
    assert guard.observe(3, {"loss": 0.5, "grad_norm": 1.0}) is verdict
    assert guard.observe(4, {"loss": 0.5, "grad_norm": 0.0, "params_changed": 0.0}) is verdict


def test_custom_settings_change_patience():
    history = steps(*[{"loss": 0.7, "grad_norm": 0.0}] * 5)
    verdict = first_verdict(adapter("sft"), history, settings=GuardSettings(zero_grad_steps=5))
    assert verdict.step == 5


def test_an_unknown_trainer_is_refused_before_a_guard_exists():
    from tuner.errors import TunerError

    # a Guard takes the trainer's entry; the name is checked where it is turned into one
    with pytest.raises(TunerError, match="unknown trainer 'ppo'; choose one of grpo, dpo, kto, reward, sft"):
        Guard(adapter("ppo"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("baseline_steps", 0),
        ("loss_explosion_factor", 1.0),
        ("loss_baseline_floor", 0.0),
        ("grad_explosion_factor", NAN),
        ("zero_grad_steps", 0),
        ("zero_reward_std_steps", -1),
        ("max_skipped_steps", -1),
        ("min_loss_scale", -1.0),
        ("no_update_steps", 0),
    ],
)
def test_settings_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be .*, but got {field}="):
        GuardSettings(**{field: value})


# --- one patience per cause, on the rows the monitor really writes --------------------------------------

import json  # noqa: E402

from helpers import DATA  # noqa: E402

# A real tiny-model GRPO trial (lr 3e-2, seed 0) as StepMonitor wrote it, every key included: its reward
# climbs from ~0.27 to 1.0, where every completion of every group gets the top reward.
SATURATING = json.loads((DATA / "verdicts" / "calibration" / "grpo_saturating_rows.json").read_text())["rows"]


def test_real_grpo_rows_whose_reward_saturates_are_ok_and_say_so():
    guard = Guard(adapter("grpo"))
    assert all(guard.observe(row["step"], row) is None for row in SATURATING)
    # frac_reward_zero_std = 1 at the reward's ceiling is a solved task, noted, not a collapse.
    assert len(guard.notes) == 1 and guard.notes[0].startswith("reward saturated: 1 (from 0.27")


def test_saturated_rewards_with_one_group_held_a_little_lower_are_still_solved():
    # Recorded in the calibration runs: at the ceiling, one step's groups each agree but one of them on a lower
    # reward (mean 0.9167), below the best step with spread (0.99). That is the task solved, not a collapse.
    rows = [dict(row) for row in SATURATING]
    rows[15]["reward"] = 11 / 12
    guard = Guard(adapter("grpo"))
    assert all(guard.observe(row["step"], row) is None for row in rows)
    assert len(guard.notes) == 1 and guard.notes[0].startswith("reward saturated")


def test_no_reward_spread_and_no_gain_is_still_a_collapse():
    flat = {"loss": 0.0, "grad_norm": 0.0, "reward": 0.3, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "params_changed": 1.0}
    start = {"loss": 0.0, "grad_norm": 0.5, "reward": 0.3, "reward_std": 0.2, "frac_reward_zero_std": 0.0}
    verdict = first_verdict(adapter("grpo"), steps(start, start, start, *[flat] * 6))
    assert (verdict.status, verdict.signal, verdict.step) == ("collapsed", "zero_reward_std", 8)
    assert "has not risen" in verdict.reason


def test_no_reward_spread_after_the_reward_rose_says_it_rose_and_fell_short_of_its_best():
    # The seeds 11-13 case of a long GRPO run: the reward rose from 0.13 to about 0.5 (below its best 0.9), then
    # every group's completions agreed. Still no learning signal, but "has not risen" would be false.
    start = {"loss": 0.0, "grad_norm": 0.5, "reward": 0.13, "reward_std": 0.2, "frac_reward_zero_std": 0.0}
    best = {**start, "reward": 0.9}
    flat = {"loss": 0.0, "grad_norm": 0.0, "reward": 0.5, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "params_changed": 1.0}
    verdict = first_verdict(adapter("grpo"), steps(start, start, start, best, *[flat] * 6))
    assert (verdict.status, verdict.signal) == ("collapsed", "zero_reward_std")
    assert "has not risen" not in verdict.reason
    assert "with the reward at 0.5, up from 0.13 at the start but below its best 0.9" in verdict.reason


def test_an_anchored_run_whose_reward_rose_goes_on_through_a_no_spread_streak_and_says_so():
    # GRPO with beta > 0 (TRL logs "kl" only then): the KL penalty keeps pulling a deterministic policy back toward
    # the reference's spread, so a streak there is a thin signal, not the end of learning (bench/horizon/anchor.py). The same
    # rows without "kl" (beta 0: zero advantages, zero gradient) are the collapse they were.
    start = {"loss": 0.0, "grad_norm": 0.5, "reward": 0.13, "reward_std": 0.2, "frac_reward_zero_std": 0.0, "kl": 0.0}
    best = {**start, "reward": 0.9}
    flat = {"loss": 0.0, "grad_norm": 0.05, "reward": 0.5, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "params_changed": 1.0, "kl": 0.02}
    rows = steps(start, start, start, best, *[flat] * 12, start)
    guard = Guard(adapter("grpo"))
    assert all(guard.observe(row["step"], row) is None for row in rows)
    assert len(guard.notes) == 1 and guard.notes[0].startswith("reward spread thin: no group had any for 5 steps")
    assert "from step 5" in guard.notes[0] and "beta > 0" in guard.notes[0]
    unanchored = [{k: v for k, v in row.items() if k != "kl"} for row in rows]
    verdict = first_verdict(adapter("grpo"), unanchored)
    assert (verdict.status, verdict.signal, verdict.step) == ("collapsed", "zero_reward_std", 9)


def test_an_anchored_run_whose_reward_never_rose_still_collapses():
    start = {"loss": 0.0, "grad_norm": 0.5, "reward": 0.3, "reward_std": 0.2, "frac_reward_zero_std": 0.0, "kl": 0.0}
    flat = {"loss": 0.0, "grad_norm": 0.05, "reward": 0.3, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "params_changed": 1.0, "kl": 0.01}
    verdict = first_verdict(adapter("grpo"), steps(start, start, start, *[flat] * 6))
    assert (verdict.status, verdict.signal, verdict.step) == ("collapsed", "zero_reward_std", 8)
    assert "has not risen" in verdict.reason


def test_grpo_equal_rewards_for_the_first_steps_do_not_trip_the_no_update_rule():
    # The first 3 steps as the monitor writes them when every group's completions got equal rewards: zero
    # advantages, zero gradient, weights unmoved. Then spread appears and the weights move.
    no_spread = {**SATURATING[0], "reward_std": 0.0, "frac_reward_zero_std": 1.0, "grad_norm": 0.0,
                 "params_changed": 0.0}
    rows = [{**no_spread, "step": step} for step in (1, 2, 3, 4)]
    rows += [{**row, "step": row["step"] + 4} for row in SATURATING]
    rows[4]["params_changed"] = 1.0
    assert first_verdict(adapter("grpo"), rows) is None


def test_fp16_mixed_gradscaler_skips_do_not_trip_the_no_update_rule():
    # GradScaler calibrating: the monitor marks each skipped step and the weights stay put, as they should.
    skipped = {"loss": 2.3, "grad_norm": INF, "learning_rate": 1e-4, "step_skipped": 1.0, "loss_scale": 65536.0,
               "params_changed": 0.0}
    moved = {"loss": 2.2, "grad_norm": 1.5, "learning_rate": 1e-4, "step_skipped": 0.0, "loss_scale": 4096.0,
             "params_changed": 1.0}
    after = {key: value for key, value in moved.items() if key != "params_changed"}  # moved once: no longer checked
    history = steps(*[skipped] * 5, moved, after, after)
    assert first_verdict(adapter("sft"), history, grad_scaler=True) is None


def test_warmup_steps_at_learning_rate_zero_do_not_use_up_the_no_update_patience():
    idle = {"loss": 0.69, "grad_norm": 0.8, "learning_rate": 0.0, "params_changed": 0.0}
    busy = {"loss": 0.69, "grad_norm": 0.8, "learning_rate": 1e-5, "params_changed": 0.0}
    # Steps 1-3 at lr 0 and step 4 (which used lr 0: the logged lr is the next step's) do not count.
    verdict = first_verdict(adapter("reward"), steps(idle, idle, idle, busy, busy, busy, busy))
    assert (verdict.signal, verdict.step) == ("no_update", 7)
    assert "bf16/fp16 weights" in verdict.reason and "LoRA" in verdict.reason


def test_grad_spike_at_step_two_is_not_judged_against_one_step():
    # bf16-pure lr 0.3 on the reward grid: step 1's grad norm is small, step 2's large, then training settles.
    grads = [0.4, 60.0, 5.0, 2.0, 1.5, 1.0]
    history = steps(*[{"loss": 0.7, "grad_norm": g} for g in grads])
    assert first_verdict(adapter("reward"), history) is None


def test_a_clipped_grad_spike_is_tolerated_but_a_sustained_one_diverges():
    base = [{"loss": 0.7, "grad_norm": 1.0}] * 3
    spike = {"loss": 0.7, "grad_norm": 500.0}
    # max_grad_norm 1.0 clips the spike to 1.0: the update is bounded, so one spike is what clipping is for.
    assert first_verdict(adapter("dpo"), steps(*base, spike, *base), max_grad_norm=1.0) is None
    verdict = first_verdict(adapter("dpo"), steps(*base, spike, spike, spike), max_grad_norm=1.0)
    assert (verdict.signal, verdict.step) == ("grad_explosion", 6)
    assert "3 steps in a row" in verdict.reason and "clipped to 1" in verdict.reason
    # Without clipping the first spike already moved the weights by that much.
    assert first_verdict(adapter("dpo"), steps(*base, spike)).step == 4


def test_catastrophic_loss_is_caught_while_the_baseline_is_still_filling():
    verdict = first_verdict(adapter("reward"), steps({"loss": 0.69, "grad_norm": 1.0}, {"loss": 1e34, "grad_norm": 5.0}))
    assert (verdict.signal, verdict.step) == ("loss_explosion", 2)


def test_a_loss_driven_to_zero_with_vanishing_gradients_is_solved_not_collapsed():
    # A reward model that separates its pairs perfectly: loss -> ~0, and in low precision the gradient underflows.
    falling = [{"loss": loss, "grad_norm": 1.0} for loss in (0.69, 0.5, 0.2, 0.05, 0.01)]
    solved = {"loss": 1e-4, "grad_norm": 0.0}
    guard = Guard(adapter("reward"))
    rows = steps(*falling, *[solved] * 5)
    assert all(guard.observe(row["step"], row) is None for row in rows)
    assert guard.notes and guard.notes[0].startswith("loss reached 0.0001 (from 0.69)")
    # The same zero gradients at a loss that never moved are a collapse.
    assert first_verdict(adapter("reward"), steps(*[{"loss": 0.69, "grad_norm": 0.0}] * 4)).signal == "zero_grad"
