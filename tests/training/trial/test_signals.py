"""The early-warning readings (tuner.trial.signals) from real forward hooks on the tiny model, and in a real trial."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from tuner.config.precision import PRECISIONS
from tuner.inputs import models
from tuner.trial import TrialSpec, run_trial
from tuner.trial.signals import Signals
from tuner.verdicts.forecast import FINAL_NORM, HEAD


def _model(kind=AutoModelForCausalLM, dtype=torch.float32):
    return kind.from_pretrained(models.resolve_model("tiny"), dtype=dtype, **(
        {"num_labels": 1} if kind is AutoModelForSequenceClassification else {}))


def _largest_outputs(model, batch) -> dict[str, float]:
    """What the hooks should see, measured independently: each hooked module's output, by hand."""
    seen = {}
    layers = model.model.layers
    handles = [m.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(
        name, (o[0] if isinstance(o, tuple) else o).detach().abs().max().float().item()))
        for name, m in [*((str(i), layer) for i, layer in enumerate(layers)), ("norm", model.model.norm)]]
    with torch.enable_grad():
        model(**batch)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-pure", "fp16-pure"])  # fp16-mixed needs CUDA
def test_headroom_is_the_largest_output_over_the_compute_dtypes_range(precision):
    mode = PRECISIONS[precision]
    model = _model(dtype=getattr(torch, mode.weight_dtype))
    batch = {"input_ids": torch.tensor([[3, 17, 42, 7, 9, 11]])}
    signals = Signals(precision, every=1)
    assert signals.attach(model) == len(model.model.layers) + 2  # every layer, the final norm, the head
    autocast = (torch.autocast("cpu", dtype=getattr(torch, mode.autocast_dtype)) if mode.autocast_dtype
                else torch.autocast("cpu", enabled=False))
    signals.begin_step(1, model)
    with autocast:
        model(**batch).logits.float().sum().backward()
    readings = signals.end_step(1, model)
    signals.detach()
    with autocast:
        by_hand = _largest_outputs(model, batch)
    logits_max = by_hand.pop("norm")  # the final norm's own output, compared below with the largest of all
    top = max([*by_hand.values(), logits_max])
    dtype_max = torch.finfo(getattr(torch, mode.compute_dtype)).max
    assert 0 < readings["headroom"] <= 1
    # the headroom is at least every hooked layer's largest output, over the range of the dtype it computes in
    assert readings["headroom"] * dtype_max >= top * 0.999
    assert readings["headroom_site"] in (*range(len(model.model.layers)), FINAL_NORM, HEAD)
    assert readings["headroom_logits"] > 0  # a plain forward pass calls the head
    assert readings["weight_norm"] > 0 and readings["update_ratio"] == 0  # no optimizer step: nothing changed
    assert readings["update_lost"] == 1.0


def test_unsampled_steps_and_no_grad_passes_read_nothing():
    model = _model()
    signals = Signals("fp32", every=5)
    signals.attach(model)
    assert [s for s in range(1, 12) if signals.sampled(s)] == [1, 5, 10]
    signals.begin_step(2, model)
    model(input_ids=torch.tensor([[3, 4, 5]]))
    assert signals.end_step(2, model) == {}
    signals.begin_step(5, model)
    with torch.no_grad():  # GRPO's sampling and reference passes
        model(input_ids=torch.tensor([[3, 4, 5]]))
    readings = signals.end_step(5, model)
    assert "headroom" not in readings and "weight_norm" in readings


def test_a_reward_models_score_head_is_read():
    model = _model(AutoModelForSequenceClassification)
    signals = Signals("fp32", every=1)
    signals.attach(model)
    signals.begin_step(1, model)
    model(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
    assert signals.end_step(1, model)["headroom_logits"] > 0


def test_a_trial_logs_the_readings_on_its_sampled_steps_and_an_off_switch():
    spec = TrialSpec(trainer="sft", params={"learning_rate": 1e-3, "precision": "bf16-pure"}, max_steps=5,
                     signals_every=2)
    result = run_trial(spec)
    assert result.status == "ok"
    read = [row["step"] for row in result.history if "weight_norm" in row]
    assert read == [1, 2, 4]
    moved = [row["update_ratio"] for row in result.history if "update_ratio" in row]
    assert all(0 < r < 1 for r in moved)  # an optimizer step at lr 1e-3 moves the weights a small share
    off = run_trial(TrialSpec(**{**spec.to_dict(), "signals_every": 0}))
    assert off.status == "ok" and not any("weight_norm" in row for row in off.history)


@pytest.mark.parametrize("use_peft, share", [(False, 1.0), (True, 0.0)])
def test_the_share_of_float16_trainable_weights_is_read_from_the_model(use_peft, share):
    # fp16-pure loads the model in float16; PEFT keeps its adapters in float32 on it (the forecast's fp16_weights)
    model = _model(dtype=torch.float16)
    if use_peft:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    signals = Signals("fp16-pure", every=1)
    signals.begin_step(1, model)
    readings = signals.end_step(1, model)
    assert readings["weights_fp16"] == share
