"""The late-failure forecast (tuner.verdicts.forecast) on recorded and constructed histories.

tests/data/verdicts/late_overflow_history.json is a real trial (how it was made is in the file): SFT on the tiny
model in fp16-pure at a constant lr 1e-4, signals every 2 steps; its activations grew from step 28 and its grad norm
went NaN at step 51. tests/data/verdicts/steady_histories.json holds three real 150-step trials that stayed ok
(fp16-pure at lr 1e-5, fp32 at 1e-4, DPO in bf16-pure at 1e-4).
"""

import json
import math
import random

import pytest
from helpers import DATA

from tuner.verdicts.forecast import HEADROOM_NOW, MIN_T, evidence, forecast, horizon_steps, stalling

HERE = DATA / "verdicts"  # recorded real trials
LATE = json.loads((HERE / "late_overflow_history.json").read_text())
STEADY = json.loads((HERE / "steady_histories.json").read_text())


def _upto(history, step):
    return [row for row in history if row["step"] <= step]


def test_the_recorded_late_overflow_is_flagged_before_its_failing_step():
    failed_at = LATE["stopped_at_step"]
    assert LATE["status"] == "diverged" and failed_at == 51
    flagged = [step for step in range(10, failed_at) if forecast(_upto(LATE["history"], step), "sft", "fp16-pure",
                                                                   horizon_steps(step))]
    assert flagged and min(flagged) < failed_at - 10  # at least 10 steps of warning
    risks = forecast(_upto(LATE["history"], 40), "sft", "fp16-pure", horizon_steps(40))
    assert risks[0].signal == "headroom"
    assert "decoder layer 1" in risks[0].message and "float16's range" in risks[0].message
    assert 40 < risks[0].step <= horizon_steps(40)  # projected ahead, inside the horizon


def test_a_spike_in_the_recent_steps_is_a_risk_without_any_trend():
    risks = forecast(_upto(LATE["history"], 46), "sft", "fp16-pure", horizon_steps(46))
    spike = next(r for r in risks if r.signal == "headroom")
    assert "reached 57%" in spike.message and "step 44" in spike.message and spike.step is None


@pytest.mark.parametrize("record", STEADY, ids=lambda r: f"{r['trainer']}-{r['params']['precision']}")
def test_steady_histories_are_not_flagged_at_any_length(record):
    assert record["status"] == "ok"
    trainer, precision = record["trainer"], record["params"]["precision"]
    for step in range(10, 151, 10):
        risks = forecast(_upto(record["history"], step), trainer, precision, horizon_steps(step))
        assert not risks, (step, [str(r) for r in risks])
    assert evidence(150, [], horizon_steps(150)) == "held 150 steps; no risk signal projects a failure through step 3750"


def _noise(seed: int, steps: int = 60) -> list[dict]:
    """A flat run: every signal noisy around a constant level, nothing growing."""
    rng = random.Random(seed)
    return [{"step": s, "loss": 2 + rng.gauss(0, 0.2), "grad_norm": math.exp(rng.gauss(0, 0.5)),
             "headroom": 0.01 * math.exp(rng.gauss(0, 0.3)), "headroom_site": 1.0,
             "frac_reward_zero_std": rng.choice([0.0, 0.25, 0.5, 0.75]), "reward": 0.5 + rng.gauss(0, 0.1),
             "learning_rate": 1e-5, "update_lost": rng.uniform(0, 0.3)} for s in range(1, steps + 1)]


@pytest.mark.parametrize("steps", [20, 60, 180, 600])
def test_flat_noise_rarely_raises_a_risk_at_any_length(steps):
    # each rule needs a steady trend (t >= MIN_T): on flat noise its false alarms stay rare, and do not grow with length
    flagged = sum(bool(forecast(_noise(seed, steps), "grpo", "fp16-pure", horizon_steps(steps))) for seed in range(200))
    assert MIN_T >= 3 and flagged <= 10  # <= 5%; the t-test's own rate is ~1% a rule


def _fading(steps: int, reward_rising: bool) -> list[dict]:
    rng = random.Random(3)
    rows = []
    for s in range(1, steps + 1):
        zero = min(1.0, 0.3 + 0.01 * s + rng.gauss(0, 0.05))
        reward = (0.2 + 0.6 * s / steps if reward_rising else 0.5) + rng.gauss(0, 0.03)
        rows.append({"step": s, "frac_reward_zero_std": zero, "reward": reward, "grad_norm": 1 + rng.random() * 0.1})
    return rows


def test_grpo_reward_spread_fading_below_the_ceiling_is_a_collapse_ahead():
    risks = forecast(_fading(40, reward_rising=False), "grpo", "fp32", horizon_steps(40))
    assert [r.signal for r in risks] == ["reward_spread"]
    assert 40 < risks[0].step < 100 and "GRPO stops learning" in risks[0].message
    # the same fading while the reward climbs is the task being solved, not a collapse
    assert not forecast(_fading(40, reward_rising=True), "grpo", "fp32", horizon_steps(40))
    # and the rule is GRPO's own signal
    assert not forecast(_fading(40, reward_rising=False), "dpo", "fp32", horizon_steps(40))
    # ... without a KL anchor: with beta > 0 (TRL logs "kl") the share levels off below 1 (bench/horizon/anchor.py)
    anchored = [{**row, "kl": 0.01} for row in _fading(40, reward_rising=False)]
    assert not forecast(anchored, "grpo", "fp32", horizon_steps(40))


def test_half_precision_updates_that_round_away_are_a_note_for_half_weights_not_a_late_failure_risk():
    # bench/horizon/horizon.py: a bf16-pure KTO config with 81% of its sampled weights unchanged a step learned 14x more
    # over 500 steps than over 20: rounding is worth saying, but it did not foretell a failure
    rows = [{"step": s, "learning_rate": 1e-6, "update_lost": 0.8, "loss": 1.0} for s in range(1, 21)]
    assert not forecast(rows, "sft", "bf16-pure", horizon_steps(20))
    assert "bfloat16 weights: 80%" in stalling(rows, "bf16-pure")
    assert stalling(rows, "fp32") == "" and stalling(rows, "bf16-mixed") == ""  # fp32 weights under autocast
    # a schedule decaying to zero leaves late updates unchanged by design: only steps near the peak rate count
    decaying = [{**row, "learning_rate": 1e-4 * (1 - s / 20), "update_lost": 0.1 if s < 10 else 0.9}
                for s, row in enumerate(rows, 1)]
    assert stalling(decaying, "bf16-pure") == ""


def test_headroom_already_near_the_top_is_a_risk_and_says_where():
    rows = [{"step": s, "headroom": HEADROOM_NOW + 0.1, "headroom_site": -2.0} for s in (1, 5, 10)]
    (risk,) = forecast(rows, "reward", "fp16-mixed", horizon_steps(10))
    assert "the head (logits)" in risk.message and "float16" in risk.message


def test_activations_the_training_grew_to_a_hundredth_of_the_range_stay_a_risk_when_their_growth_stops():
    # bench/horizon/horizon.py, config seed 67, GRPO config 2 (fp16-pure LoRA, lr 0.011), seed 3: flagged at 20 steps
    # (overflow projected near step 45); on the 500-step schedule its activations rose to 8.6% of float16's range at
    # step 70, fell back to 5% by step 90, and it overflowed at step 251. Its risk rung (90 steps) must not clear it.
    shares = {1: 5.5e-5, 10: 1.9e-4, 20: 3.2e-3, 30: 1.3e-2, 40: 3.4e-2, 50: 5.1e-2, 60: 6.4e-2, 70: 8.6e-2,
              80: 8.1e-2, 90: 5.0e-2}
    rows = [{"step": s, "headroom": v, "headroom_site": 1.0} for s, v in shares.items()]
    (risk,) = forecast(rows, "grpo", "fp16-pure", 500)
    assert risk.step is None and "reached 9% of float16's range at step 70, 1564x their level at step 1" in risk.message
    # a model that starts there (a pretrained LLM's large activations) and stays is no risk: not the training's growth
    steady = [{"step": s, "headroom": 0.05 * (1 + 0.01 * (s % 3)), "headroom_site": 1.0} for s in range(1, 91, 5)]
    assert forecast(steady, "grpo", "fp16-pure", 500) == []
    # growth that levels off low (set 47's reward config 5: 1.2e-3 from step 55, held 500 steps) is cleared
    flat = [{"step": s, "headroom": min(5e-5 * 1.12 ** s, 1.2e-3), "headroom_site": 1.0} for s in range(1, 103, 5)]
    assert forecast(flat, "reward", "fp16-pure", 500) == []


def _grown(loss_at: float) -> list[dict]:
    # set 89's reward config 3, seed 3 (fp16-pure LoRA, lr 0.028 constant): activations 5.7e-5 -> 1.4e-2 of
    # float16's range over 20 steps (240x, growing ~30% a step), its loss 0.69 -> 1.3e-5 (it held 500 steps)
    rows = []
    for s in range(1, 21):
        loss = 0.69 * (loss_at / 0.69) ** ((s - 1) / 19)
        rows.append({"step": s, "loss": loss, **({"headroom": 5.7e-5 * 1.34 ** (s - 1), "headroom_site": 1.0}
                                                 if s == 1 or s % 5 == 0 else {})})
    return rows


def test_grown_activations_of_a_margin_loss_that_has_separated_its_pairs_are_no_risk():
    saturated, learning = _grown(1.3e-5), _grown(0.5)
    assert forecast(saturated, "reward", "fp16-pure", 500) == []
    assert forecast(saturated, "dpo", "fp16-pure", 500) == [] and forecast(saturated, "kto", "fp16-pure", 500) == []
    # the same activations on a loss still at 0.7x its start (every late failure of these trainers had >= 0.37x)
    (risk,) = forecast(learning, "reward", "fp16-pure", 500)
    assert risk.signal == "headroom" and "their level at step 1" in risk.message
    # GRPO's and SFT's losses do not fall to 0 with their gradient: no exemption there
    assert [r.signal for r in forecast(saturated, "grpo", "fp16-pure", 500)] == ["headroom"]
    assert [r.signal for r in forecast(saturated, "sft", "fp16-pure", 500)] == ["headroom"]
    # a reading near the top is a risk whatever the loss
    near = [{**row, "headroom": HEADROOM_NOW + 0.1} if "headroom" in row else row for row in saturated]
    assert [r.signal for r in forecast(near, "reward", "fp16-pure", 500)] == ["headroom"]
    # one low reading is not a saturated loss: the median of the last quarter is read
    lucky = [{**row, "loss": 1e-6 if row["step"] == 20 else 0.5} for row in learning]
    assert [r.signal for r in forecast(lucky, "reward", "fp16-pure", 500)] == ["headroom"]


def test_float16_trainable_weights_are_a_risk_and_float32_adapters_are_not():
    # bench/horizon/horizon.py: every fp16-pure full fine-tune ok at 20 steps failed by step 500 (5 of 5)
    rows = [{"step": s, "loss": 1.0, "grad_norm": 1.0, **({"weights_fp16": 1.0} if s % 5 == 0 else {})}
            for s in range(1, 21)]
    (risk,) = forecast(rows, "reward", "fp16-pure", horizon_steps(20))
    assert risk.signal == "fp16_weights" and "100% of the trainable weights are float16" in risk.message
    # a LoRA adapter on a float16 model: PEFT keeps it in float32 (a reward model's score head is 0.2% float16)
    adapters = [{**row, "weights_fp16": 0.002} if "weights_fp16" in row else row for row in rows]
    assert not forecast(adapters, "reward", "fp16-pure", horizon_steps(20))


def test_grpo_reward_spread_fading_at_the_rewards_best_is_the_task_solved():
    # bench/horizon/horizon.py (config seed 37): rewards 0.25 -> 0.9 of a 1.0 ceiling, groups losing their spread because
    # every completion is right; it held 500 steps. The same fading below the reward's best stays a risk.
    rows = _fading(40, reward_rising=False)
    solved = [{**row, "reward": min(1.0, 0.25 + 0.05 * row["step"]) - 0.02 * (row["step"] % 2)} for row in rows]
    assert not forecast(solved, "grpo", "fp32", horizon_steps(40))
    assert forecast(rows, "grpo", "fp32", horizon_steps(40))
