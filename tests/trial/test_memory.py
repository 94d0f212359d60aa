"""tuner.trial.memory: parameter counts against transformers and PEFT (meta device: free), the estimate's monotonic
rules, per-rank estimates (DDP, FSDP), and one estimate against a real training peak measured on this CPU."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import FULL_FT, QWEN_7B, qwen05_config, qwen05_estimate, qwen7b_config

from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.trial import memory
from tuner.trial.memory import MiB, count_parameters, estimate, lora_parameters


def meta_model(config, sequence_classifier=False):
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    with torch.device("meta"):
        if sequence_classifier:
            config = copy.deepcopy(config)
            config.num_labels = 1
            return AutoModelForSequenceClassification.from_config(config)
        return AutoModelForCausalLM.from_config(config)


def numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def close(estimated, real, tolerance):
    return abs(estimated - real) <= tolerance * real


def test_parameter_count_of_a_qwen25_05b_shaped_config():
    config = qwen05_config()
    assert close(count_parameters(config), numel(meta_model(config)), 0.01)
    assert close(count_parameters(config, sequence_classifier=True), numel(meta_model(config, True)), 0.01)
    untied = qwen05_config()
    untied.tie_word_embeddings = False  # a separate lm_head: 136M more
    assert close(count_parameters(untied), numel(meta_model(untied)), 0.01)


def test_parameter_count_of_the_tiny_model_and_other_families(tiny_model):
    from transformers import AutoConfig, LlamaConfig, Qwen3Config

    configs = [
        AutoConfig.from_pretrained(tiny_model),
        LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=688, vocab_size=32000),
        Qwen3Config(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=688, vocab_size=32000, head_dim=64),  # q/k norms, head_dim x heads != hidden
    ]
    for config in configs:
        assert close(count_parameters(config), numel(meta_model(config)), 0.01), config.model_type


def test_lora_trainable_count_matches_peft(tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig

    def peft_count(config, task, sequence_classifier=False, **lora):
        model = get_peft_model(meta_model(config, sequence_classifier), LoraConfig(task_type=task, **lora))
        return model.get_nb_trainable_parameters()[0]

    qwen, tiny = qwen05_config(), AutoConfig.from_pretrained(tiny_model)
    assert close(lora_parameters(qwen, r=16), peft_count(qwen, "CAUSAL_LM", r=16, target_modules="all-linear"), 0.05)
    assert close(lora_parameters(tiny, r=8, target_modules=["q_proj", "v_proj"]),
                 peft_count(tiny, "CAUSAL_LM", r=8, target_modules=["q_proj", "v_proj"]), 0.05)
    assert close(lora_parameters(tiny, r=4, target_modules=r".*mlp\.(up|down)_proj"),
                 peft_count(tiny, "CAUSAL_LM", r=4, target_modules=r".*mlp\.(up|down)_proj"), 0.05)
    # a reward model: the score head is trained in full beside the adapters
    assert close(lora_parameters(tiny, r=16, sequence_classifier=True),
                 peft_count(tiny, "SEQ_CLS", True, r=16, target_modules="all-linear"), 0.05)


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


def _widened_tiny_model(tiny_model, folder):
    """The tiny model's tokenizer and data with a wider body (512 x 4 layers, 11M parameters): the tiny model's
    own tensors are under 1 MB, so beside the ~0.5 GB process they would test the baseline alone."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 512, 1408, 4
    config.num_attention_heads, config.num_key_value_heads = 8, 2
    config.layer_types = ["full_attention"] * 4
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(folder)
    return config


def test_measure_process_baseline_reads_a_childs_resident_set():
    small = memory.measure_process_baseline(("json",))  # a bare interpreter: a few MiB, not the ~0.5 GiB of torch
    assert 1 * MiB < small < 200 * MiB


# The child: what every trial imports, its resident set then (the baseline, measured here rather than guessed),
# then `tuner trial --config trial.yaml` in the same process, which prints its peak (ru_maxrss).
_CHILD = memory._PEAK_RSS_CODE + """
import sys
import torch, transformers, trl, peft, datasets
print("baseline (bytes):", peak_rss(), flush=True)
from tuner.cli import main
code = main(["trial", "--config", "trial.yaml"])
print("process peak (bytes):", peak_rss())
sys.exit(code)
"""


@pytest.mark.slow
def test_estimate_is_within_a_factor_of_3_of_a_measured_training_peak(tiny_model, tmp_path):
    config = _widened_tiny_model(tiny_model, tmp_path / "model")
    params = {"precision": "fp32", "learning_rate": 1e-3, "per_device_train_batch_size": 4, "max_length": 64}
    (tmp_path / "trial.yaml").write_text(
        f"trainer: sft\nmodel: {tmp_path / 'model'}\nmax_steps: 2\nparams: {params}\n".replace("'", ""))
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    baseline = int(re.search(r"baseline \(bytes\): (\d+)", output).group(1))
    peak = float(re.search(r"peak memory \(MB\):\s+([\d.]+)", output).group(1)) * MiB  # the trial's own figure
    process_peak = int(re.search(r"process peak \(bytes\): (\d+)", output).group(1))
    assert 0.8 * process_peak <= peak <= 1.25 * process_peak  # ru_maxrss and VmHWM agree: not this test's parent

    # The constant matches today's measurement of what every trial process imports.
    assert 0.5 * baseline < memory.CPU_PROCESS_BASELINE < 2 * baseline
    need = estimate(config, trainer_needs_reference=False, sequence_classifier=False, params=params, max_length=64,
                    device="cpu", overhead=baseline + memory.CPU_TRAINER_RUNTIME)
    print(f"estimate {need.total / MiB:.0f} MiB ({need.describe()}), measured peak {peak / MiB:.0f} MiB, "
          f"(VmHWM {process_peak / MiB:.0f} MiB), baseline {baseline / MiB:.0f} MiB")
    assert need.allocated > 0.2 * need.total  # the model's own terms are a real share of it
    assert 0.3 * peak < need.total < 3 * peak


def test_every_trial_records_its_estimate_beside_its_measured_peak(tiny_model, tmp_path):
    from tuner.trial import TrialSpec, run_trial

    spec = TrialSpec(trainer="sft", params={"precision": "fp32", "learning_rate": 1e-3,
                                            "per_device_train_batch_size": 4}, max_steps=3)
    result = run_trial(spec, workdir=tmp_path)
    assert result.status == "ok", result.reason
    assert result.memory_estimate_mb is not None and result.peak_memory_mb is not None
    assert 0.3 < result.memory_estimate_mb / result.peak_memory_mb < 3.0  # a rule with margins, not a figure


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
