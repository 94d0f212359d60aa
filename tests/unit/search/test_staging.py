"""Speed knobs first, then learning knobs on the fastest stable system configs (tuner.search._staging), through the real
Optuna study the searcher uses (tuner.search._sampling.Proposer); outcomes come from a rule, no training."""

from __future__ import annotations

import math

import pytest

from tuner.config.space import load_space
from tuner.records import Status, new_record
from tuner.search import _sampling as sampling
from tuner.search import _staging as staging


def test_the_shipped_grpo_space_splits_into_speed_and_learning_knobs():
    space = load_space(None, "grpo")
    stages = staging.Stages.for_space(space, 12)
    assert {"precision", "per_device_train_batch_size", "gradient_accumulation_steps", "use_peft", "lora_r",
            "activation_checkpointing"} <= set(stages.speed_names)
    assert {"learning_rate", "max_grad_norm", "loss_type", "lora_alpha"} <= set(stages.learning_pins)
    assert "beta" in stages.speed_names  # GRPO's beta 0 runs no reference model: a speed knob here
    assert not set(stages.learning_pins) & staging.SPEED_PARAMS
    dpo = staging.Stages.for_space(load_space(None, "dpo"), 12)
    assert "beta" in dpo.learning_pins  # DPO's beta scales the loss; the reference runs either way
    assert stages.speed_trials == round(0.4 * 12)
    lr = space.params["learning_rate"]
    # TRL's GRPO default (1e-6) is outside the tiny model's range: the geometric middle instead
    assert stages.learning_pins["learning_rate"] == pytest.approx(math.sqrt(lr.low * lr.high))
    assert stages.learning_pins["max_grad_norm"] == 1.0  # TRL's default, one of the choices
    assert stages.learning_pins["lora_alpha"] == 32


def test_a_pretrained_model_measures_speed_at_trls_default_learning_rate():
    stages = staging.Stages.for_space(load_space(None, "grpo").for_model(pretrained=True), 12)
    assert stages.learning_pins["learning_rate"] == 1e-6  # GRPOConfig's default, inside the pretrained range


def test_a_list_default_of_trl_is_pinned_where_the_space_offers_it():
    # DPOConfig's loss_type default, ["sigmoid"], comes from a default_factory; the shipped DPO space's middle choice
    # is ["ipo"], which the first trials ran while the default went unread
    dpo = staging.Stages.for_space(load_space(None, "dpo").for_model(pretrained=True), 12)
    assert dpo.learning_pins["loss_type"] == ["sigmoid"]
    assert dpo.learning_pins["learning_rate"] == 1e-6 and dpo.learning_pins["beta"] == 0.1  # DPOConfig's own


def test_random_and_grid_searches_are_not_staged():
    space = load_space(None, "reward")
    for sampler in ("random", "grid"):
        assert sampling.Proposer(sampling.make_study(sampler, 0, 12, None, sampler), space, sampler, 12).stages is None


def measured(params: dict) -> dict:
    """A rule standing in for training: tokens/s from the system config, fp16-pure unstable, learning from lr."""
    speed = {"fp32": 1000, "bf16-mixed": 1500, "fp16-mixed": 1600, "bf16-pure": 2500, "fp16-pure": 4000}
    tokens = speed[params["precision"]] * params["per_device_train_batch_size"] / (2 if params.get("use_peft") else 1)
    if params["precision"] == "fp16-pure":
        return {"status": Status.DIVERGED, "stopped_at_step": 3, "tokens_per_second": tokens}
    learned = 1e-3 <= params["learning_rate"] <= 0.1
    return {"status": Status.OK, "tokens_per_second": tokens, "progress": 0.5 if learned else 0.0,
            "progress_p_value": 0.001 if learned else 0.5, "learned": learned}


def test_the_learning_stage_searches_learning_knobs_on_the_fastest_stable_systems():
    space = load_space(None, "reward")
    n = 15
    proposer = sampling.Proposer(sampling.make_study("tpe", 3, n, None, "staged"), space, "tpe", n)
    stages = proposer.stages
    trials = []
    for _ in range(n):
        trial, params = proposer.ask()
        record = new_record(measured(params), number=trial.number, params=params, max_steps=20, seed=0)
        proposer.tell(trial, record)
        trials.append((trial.user_attrs["tuner.stage"], params, record))
    speed_stage = [p for stage, p, _ in trials if stage == "speed"]
    assert len(speed_stage) == stages.speed_trials
    for params in speed_stage:
        assert {k: params[k] for k in stages.learning_pins if k in params} == \
               {k: v for k, v in stages.learning_pins.items() if k in params}
    top = stages.systems([r for s, _, r in trials if s == "speed"])
    assert top and all(system["precision"] != "fp16-pure" for system in top)  # the fastest, but it diverges
    learning_stage = [p for stage, p, _ in trials if stage == "learning"]
    for params in learning_stage:
        system = {k: params[k] for k in stages.speed_names if k in params}
        assert any(system == {k: v for k, v in t.items() if k in system} for t in top), system
        assert params["precision"] != "fp16-pure"  # diverged systems are never built on
    assert len({p["learning_rate"] for p in learning_stage}) == len(learning_stage)  # the learning knobs move


def test_speeds_an_earlier_search_measured_here_replace_the_speed_stage():
    space = load_space(None, "reward")
    n = 6
    # an earlier search's trials (a warm start's priors): their speed-stage measurements, fp16-pure fastest but unstable
    first = sampling.Proposer(sampling.make_study("tpe", 3, 12, None, "first"), space, "tpe", 12)
    known = []
    for _ in range(first.stages.speed_trials):
        trial, params = first.ask()
        record = new_record(measured(params), number=trial.number, params=params, max_steps=20, seed=0)
        first.tell(trial, record)
        known.append(record)
    assert staging.speed_known(known) and not staging.speed_known(known[:2])
    proposer = sampling.Proposer(sampling.make_study("tpe", 4, n, None, "warm"), space, "tpe", n, asking=sampling.Asking(known=known))
    assert proposer.stages.speed_trials == 0 and proposer.stages.first_systems == ()
    top = proposer.stages.systems([])  # ranked from the earlier trials alone before this search ran any
    assert top == first.stages.systems(known)
    for _ in range(n):
        trial, params = proposer.ask()
        assert trial.user_attrs["tuner.stage"] == "learning"
        system = {k: params[k] for k in proposer.stages.speed_names if k in params}
        assert any(system == {k: v for k, v in t.items() if k in system} for t in top), system
        proposer.tell(trial, new_record(measured(params), number=trial.number, params=params, max_steps=20, seed=0))
    # too few earlier speeds: the search measures its own
    assert sampling.Proposer(sampling.make_study("tpe", 4, n, None, "few"), space, "tpe", n,
                             asking=sampling.Asking(known=known[:2])).stages.speed_trials == staging.MIN_SPEED_TRIALS


@pytest.mark.parametrize("trainer", ["reward", "grpo", "dpo", "sft"])
def test_the_first_trials_run_the_system_config_expected_fastest_on_its_device_with_lora_off_and_on(trainer):
    space = load_space(None, trainer)
    for device, precision in (("cpu", "fp32"), ("cuda", "bf16-pure")):
        n = 8
        proposer = sampling.Proposer(sampling.make_study("tpe", 0, n, None, trainer), space, "tpe", n, asking=sampling.Asking(device=device))
        first, second = (proposer.ask()[1] for _ in range(2))
        for params in (first, second):
            assert params["precision"] == precision
            assert params["activation_checkpointing"] is False  # recomputing activations trades time for memory
            for knob in ("per_device_train_batch_size", "gradient_accumulation_steps"):
                assert params[knob] == max(space.params[knob].choices)
            if "beta" in proposer.stages.speed_names:
                assert params["beta"] == 0  # GRPO without a reference model
            for name, value in proposer.stages.learning_pins.items():
                assert params.get(name, value) == value  # speed-stage trials: learning knobs at safe values
        # LoRA is faster on a large model and slower on a tiny one: both are measured, at the same system
        assert (first["use_peft"], second["use_peft"]) == (False, True)
        assert len(proposer.stages.first_systems) == 2 and not proposer.stages.starts_here(2)


def test_a_gpu_without_bfloat16_starts_from_the_next_fast_precision():
    space = load_space(None, "reward").without_precisions(["bf16-mixed", "bf16-pure"])
    assert staging.expected_fastest(space, "cuda")["precision"] == "fp16-mixed"
    assert staging.expected_fastest(space, "cpu")["precision"] == "fp32"


def test_an_expected_fastest_config_that_does_not_fit_is_drawn_again_without_it():
    space = load_space(None, "reward")
    too_big = {8: "not run: estimated 30 GiB over 10 GiB"}

    def fits(params):
        return too_big.get(params["per_device_train_batch_size"]) if not params["activation_checkpointing"] else None

    proposer = sampling.Proposer(sampling.make_study("tpe", 0, 8, None, "fits"), space, "tpe", 8, asking=sampling.Asking(fits=fits))
    trial, params = proposer.ask()
    skipped = [t for t in proposer.study.trials if "tuner.skipped" in t.user_attrs]
    assert len(skipped) == 1 and "30 GiB" in skipped[0].user_attrs["tuner.skipped"]
    assert skipped[0].params["per_device_train_batch_size"] == 8 and trial.number > skipped[0].number
    assert trial.user_attrs["tuner.stage"] == "speed"
    assert all(params.get(k, v) == v for k, v in proposer.stages.learning_pins.items())
