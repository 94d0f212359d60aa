"""The memory plan applied to a search: how many trials at once, what each asks of Ray, and configs that cannot
fit recorded as ``too_big`` without being run. Model shapes are real configs (Qwen2.5's published numbers)
written as config.json only: planning reads the config, never the weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config.space import load_space, parse_space
from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.records import Status
from tuner.search import _placement as placement
from tuner.trial.memory import GiB

# Qwen/Qwen2.5-0.5B's and Qwen/Qwen2.5-7B's config.json numbers.
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)

H100 = placement.Cluster(gpus=1, gpu_memory_bytes=80 * GiB, host_memory_bytes=256 * GiB, cpus=16)
LAPTOP = placement.Cluster(gpus=0, gpu_memory_bytes=0, host_memory_bytes=24 * GiB, cpus=2)


def config_dir(tmp_path: Path, name: str, numbers: dict) -> str:
    from transformers import AutoConfig

    folder = tmp_path / name
    AutoConfig.for_model("qwen2", **numbers).save_pretrained(folder)
    return str(folder)


def test_corners_cover_every_memory_value_of_the_space():
    space = load_space(None, "grpo")
    corners = placement.memory_corners(space)
    for name in ("precision", "use_peft", "per_device_train_batch_size", "lora_r", "activation_checkpointing"):
        assert {repr(c[name]) for c in corners} == {repr(v) for v in space.params[name].choices}, name
    assert all(c["max_completion_length"] == space.fixed["max_completion_length"] for c in corners)
    assert "learning_rate" not in corners[0]  # a learning rate changes no memory


def test_a_half_billion_model_packs_several_grpo_trials_on_one_gpu(tmp_path):
    model = config_dir(tmp_path, "qwen05b", QWEN_05B)
    plan = placement.place(adapter("grpo"), model, load_space(None, "grpo"), H100, cpus_per_trial=1, gpus_per_trial=None,
                           concurrency=None)
    assert plan.device == "cuda"
    assert 1 < plan.concurrency <= 16 and plan.resources["gpu"] < 1
    assert plan.resources["gpu"] * plan.concurrency <= 1  # never more than the GPU
    # the share holds the largest corner: every config of the space fits
    assert plan.budget_bytes >= plan.largest_bytes()
    fp32_full = {"precision": "fp32", "use_peft": False, "per_device_train_batch_size": 8}
    assert plan.check(fp32_full) is None
    assert plan.summary()["concurrent"] == plan.concurrency


def test_a_7b_full_fine_tune_with_a_reference_does_not_fit_and_says_why(tmp_path):
    model = config_dir(tmp_path, "qwen7b", QWEN_7B)
    space = parse_space({"trainer": "dpo", "fixed": {"max_length": 1024, "per_device_train_batch_size": 8},
                         "params": {"use_peft": {"type": "categorical", "choices": [True, False]},
                                    "precision": {"type": "categorical", "choices": ["bf16-mixed", "bf16-pure"]}}})
    plan = placement.place(adapter("dpo"), model, space, H100, cpus_per_trial=1, gpus_per_trial=None, concurrency=None)
    reason = plan.check({"use_peft": False, "precision": "bf16-mixed"})
    assert reason is not None and reason.startswith("not run:") and "GiB" in reason and "LoRA" in reason
    assert plan.check({"use_peft": True, "precision": "bf16-pure"}) is None
    # a user's explicit share is kept, and still checked against memory
    whole = placement.place(adapter("dpo"), model, space, H100, cpus_per_trial=1, gpus_per_trial=1.0, concurrency=None)
    assert whole.resources["gpu"] == 1.0 and whole.concurrency == 1
    assert whole.check({"use_peft": False, "precision": "bf16-mixed"}) is not None


def test_a_space_where_nothing_fits_is_refused_before_any_trial(tmp_path):
    model = config_dir(tmp_path, "qwen7b", QWEN_7B)
    space = parse_space({"trainer": "sft", "fixed": {"use_peft": False, "precision": "fp32"},
                         "params": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4}}})
    with pytest.raises(TunerError, match="no config of the space fits"):
        placement.place(adapter("sft"), model, space, LAPTOP, cpus_per_trial=1, gpus_per_trial=None, concurrency=None)


def test_cpu_trials_are_bounded_by_cpus_and_host_memory(tmp_path, tiny_model):
    tiny = placement.place(adapter("sft"), tiny_model, load_space(None, "sft"), LAPTOP, cpus_per_trial=1,
                           gpus_per_trial=None, concurrency=None)
    assert (tiny.device, tiny.concurrency, tiny.plan.limit) == ("cpu", 2, "cpus")
    asked = placement.place(adapter("sft"), tiny_model, load_space(None, "sft"), LAPTOP, cpus_per_trial=1,
                            gpus_per_trial=None, concurrency=8)
    assert asked.concurrency == 2 and "lowered to 2" in asked.notes[0]
    big = config_dir(tmp_path, "qwen05b", QWEN_05B)
    space = parse_space({"trainer": "sft", "fixed": {"use_peft": False, "precision": "fp32", "max_length": 1024,
                                                     "per_device_train_batch_size": 8}, "params": {
        "learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4}}})
    half = placement.place(adapter("sft"), big, space, LAPTOP, cpus_per_trial=1, gpus_per_trial=None, concurrency=None)
    assert half.concurrency == 1 and half.plan.limit == "host memory"


@pytest.mark.slow
def test_a_config_too_big_for_the_machine_is_recorded_not_run(tmp_path, tiny_model):
    """A real search: a batch of a million sequences cannot fit in host RAM; the other config runs."""
    from test_search import run_search_in

    space = """\
trainer: sft
fixed: {use_peft: false, max_length: 64, precision: fp32}
params:
  per_device_train_batch_size: {type: categorical, choices: [4, 1000000]}
"""
    finished = run_search_in(tmp_path, space, trainer="sft", sampler="grid", max_steps=4, confirm_seeds=0)
    big = finished.by_params(per_device_train_batch_size=1000000)
    assert big["status"] == Status.TOO_BIG and big["reason"].startswith("not run:")
    assert big["steps_run"] == 0 and big["wall_seconds"] is None  # never started
    assert finished.by_params(per_device_train_batch_size=4)["status"] == Status.OK
    plan = finished.outcome.search["plan"]
    assert plan["device"] == "cpu" and plan["concurrent"] >= 1 and plan["budget_mb"] > 0
    assert any("memory plan" in line for line in finished.echoed)
