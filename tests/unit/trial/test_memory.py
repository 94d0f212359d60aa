"""tuner.trial.memory: parameter counts against transformers (meta device: free), the estimate's monotonic rules and
per-rank estimates (DDP, FSDP). Counts on the tiny model against PEFT, and the estimate against a real training peak
measured on this CPU, are tests/training/trial/test_memory_training.py."""

from __future__ import annotations

import re

import pytest
from helpers import FULL_FT, QWEN_7B, close, meta_model, numel, qwen05_config, qwen05_estimate, qwen7b_config

from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.trial import memory
from tuner.trial.memory import MiB, count_parameters


def test_parameter_count_of_a_qwen25_05b_shaped_config():
    config = qwen05_config()
    assert close(count_parameters(config), numel(meta_model(config)), 0.01)
    assert close(count_parameters(config, sequence_classifier=True), numel(meta_model(config, True)), 0.01)
    untied = qwen05_config()
    untied.tie_word_embeddings = False  # a separate lm_head: 136M more
    assert close(count_parameters(untied), numel(meta_model(untied)), 0.01)


def test_bigger_work_needs_more_memory():
    base = qwen05_estimate()
    assert qwen05_estimate(params={"per_device_train_batch_size": 16}).total > base.total
    assert qwen05_estimate(max_length=2048).total > base.total
    assert qwen05_estimate(trainer_needs_reference=True).total > base.total
    assert qwen05_estimate(paired=True).activations > base.activations  # DPO: chosen and rejected together
    assert qwen05_estimate(params={"precision": "bf16-pure"}).activations < base.activations  # 2-byte activations
    assert qwen05_estimate(params={"precision": "bf16-pure"}).weights < base.weights
    assert qwen05_estimate(completion_length=256, generations=8).generation > 0 == base.generation


def test_full_fine_tuning_needs_more_than_lora_and_lora_has_no_reference_copy():
    full = qwen05_estimate(trainer_needs_reference=True)
    lora = qwen05_estimate(trainer_needs_reference=True, params={"use_peft": True, "lora_r": 16})
    assert full.total > lora.total
    assert lora.trainable < full.trainable / 50 and lora.gradients < full.gradients / 50
    assert full.reference == full.parameters * 4 and lora.reference == 0  # -mixed: an fp32 copy; LoRA: none
    assert qwen05_estimate(params={"use_peft": True, "lora_r": 64}).trainable > lora.trainable


def test_checkpointing_keeps_fewer_activations():
    on = qwen05_estimate(params={"gradient_checkpointing": True})
    off = qwen05_estimate(params={"gradient_checkpointing": False})
    assert on.activations < off.activations / 3 and on.total < off.total
    assert qwen05_estimate(params={"activation_checkpointing": False}).activations == off.activations


def test_unfused_logits_are_batch_by_sequence_by_vocabulary():
    fused, unfused = qwen05_estimate(), qwen05_estimate(fused_lm_head=False)
    assert unfused.logits >= 8 * 1024 * 151936 * 4  # the full fp32 logits: ~5 GB for a 150k vocabulary
    assert fused.logits < unfused.logits / 5
    assert qwen05_estimate(sequence_classifier=True).logits < MiB  # a reward model has no vocabulary logits


def test_estimate_trial_reads_the_trainers_defaults():
    config = qwen05_config()
    params = {"precision": "bf16-mixed"}
    sft, dpo = memory.estimate_trial(adapter("sft"), config, params), memory.estimate_trial(adapter("dpo"), config, params)
    assert dpo.reference > 0 == sft.reference and dpo.activations > sft.activations
    assert memory.estimate_trial(adapter("grpo"), config, params).reference == 0  # TRL's GRPO beta defaults to 0
    assert memory.estimate_trial(adapter("grpo"), config, {**params, "beta": 0.04}).reference > 0
    assert memory.estimate_trial(adapter("grpo"), config, params).generation > 0
    assert memory.estimate_trial(adapter("reward"), config, params).parameters == count_parameters(config, sequence_classifier=True)
    assert re.fullmatch(r"~\d+\.\d GiB: weights .* \(GiB\)", sft.describe())


def test_measure_process_baseline_reads_a_childs_resident_set():
    small = memory.measure_process_baseline(("json",))  # a bare interpreter: a few MiB, not the ~0.5 GiB of torch
    assert 1 * MiB < small < 200 * MiB


# -- several ranks: data parallel, FSDP-sharded or not ----------------------------------------------

# Qwen/Qwen2.5-7B's published config.json numbers.
def test_the_7b_parameter_count_the_estimate_uses_is_the_real_models():
    config = qwen7b_config()
    real = numel(meta_model(config))
    assert 7.5e9 < real < 7.7e9
    assert memory.estimate_trial(adapter("sft"), config, FULL_FT).parameters == count_parameters(config) == real
    assert memory.estimate_trial(adapter("sft"), config, FULL_FT, ranks=4, sharding="fsdp").parameters == real


def test_one_rank_is_todays_estimate_and_ddp_adds_its_gradient_buckets():
    config = qwen7b_config()
    today = memory.estimate_trial(adapter("sft"), config, FULL_FT)
    assert memory.estimate_trial(adapter("sft"), config, FULL_FT, ranks=1, sharding=None) == today
    assert memory.estimate_trial(adapter("sft"), config, {**FULL_FT, "sharding": "none"}) == today
    assert (today.ranks, today.sharding, today.gathered, today.buckets) == (1, None, 0, 0)
    ddp = memory.estimate_trial(adapter("sft"), config, FULL_FT, ranks=4)
    # every rank holds everything, plus about one more copy of the gradients in DDP's buckets
    assert ddp.buckets == ddp.gradients == today.gradients and ddp.weights == today.weights
    assert ddp.total == today.total + today.gradients and ddp.host == today.host
    assert "per rank, 4 ranks, ddp" in ddp.describe() and "DDP buckets" in ddp.describe()


def test_fsdp_divides_the_model_state_over_the_ranks_and_gathers_one_unit():
    config = qwen7b_config()
    one = memory.estimate_trial(adapter("dpo"), config, FULL_FT)
    four = memory.estimate_trial(adapter("dpo"), config, FULL_FT, ranks=4, sharding="fsdp")
    assert one.reference > 0
    for term in ("weights", "gradients", "optimizer", "reference"):
        assert getattr(four, term) == -(-getattr(one, term) // 4), term  # a quarter each, rounded up
    for term in ("activations", "logits", "generation", "overhead"):
        assert getattr(four, term) == getattr(one, term), term  # per rank: the per-device batch is a rank's
    # The largest FSDP unit of an untied 7B: embeddings + lm_head + final norm (more than a decoder layer),
    # gathered in bf16 (the compute dtype of bf16-mixed), twice for prefetch.
    root = 2 * QWEN_7B["vocab_size"] * QWEN_7B["hidden_size"] + QWEN_7B["hidden_size"]
    assert four.gathered == 2 * root * 2 and four.buckets == 0
    assert four.host == one.host  # every rank loads the whole checkpoint on the host first
    assert re.match(r"~\d+\.\d GiB per rank, 4 ranks, fsdp: .*FSDP gathered", four.describe())
    # the search param picks it when the keyword does not; the keyword wins
    assert memory.estimate_trial(adapter("dpo"), config, {**FULL_FT, "sharding": "fsdp"}, ranks=4) == four
    assert memory.estimate_trial(adapter("dpo"), config, {**FULL_FT, "sharding": "fsdp"}, ranks=4,
                                 sharding="none").gathered == 0
    with pytest.raises(TunerError, match="sharding must be one of"):
        memory.estimate_trial(adapter("sft"), config, FULL_FT, ranks=2, sharding="zero2")
