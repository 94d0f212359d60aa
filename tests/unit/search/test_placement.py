"""The memory plan applied to a search: how many trials at once, what each asks of Ray, and configs that cannot
fit recorded as ``too_big`` without being run. Model shapes are real configs (Qwen2.5's published numbers)
written as config.json only: planning reads the config, never the weights. Plans for the tiny model, and a real
search that records a config too big for the machine, are tests/e2e/search/test_placement_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config.space import load_space, parse_space
from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.search import _placement as placement
from tuner.trial import memory
from tuner.trial.memory import GiB

# Qwen/Qwen2.5-0.5B's and Qwen/Qwen2.5-7B's config.json numbers.
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1000000.0,
               rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16")

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
    assert plan.summary().concurrent == plan.concurrency


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


# -- a trial across several GPUs ----------------------------------------------------------------------

# Made-up nodes: GPU count and size; host RAM roomy enough that the GPUs bound them (each rank loads the checkpoint).
A100_80 = placement.Cluster(gpus=8, gpu_memory_bytes=80 * GiB, host_memory_bytes=2048 * GiB, cpus=64)
A100_40 = placement.Cluster(gpus=8, gpu_memory_bytes=40 * GiB, host_memory_bytes=1024 * GiB, cpus=64)
PAIR_24 = placement.Cluster(gpus=2, gpu_memory_bytes=24 * GiB, host_memory_bytes=256 * GiB, cpus=16)
EIGHT_16 = placement.Cluster(gpus=8, gpu_memory_bytes=16 * GiB, host_memory_bytes=1024 * GiB, cpus=64)


def full_fine_tune(trainer: str, batch: int = 8, precisions=("bf16-mixed", "fp32")):
    """A full fine-tune space: AdamW's fp32 state, no LoRA, the precision searched."""
    return parse_space({"trainer": trainer, "fixed": {"use_peft": False, "per_device_train_batch_size": batch},
                        "params": {"precision": {"type": "categorical", "choices": list(precisions)},
                                   "learning_rate": {"type": "float", "low": 1e-6, "high": 1e-5}}})


def fsdp_estimate(trainer, model, params, ranks):
    from transformers import AutoConfig

    return memory.estimate_trial(adapter(trainer), AutoConfig.from_pretrained(model), params, ranks=ranks,
                                 sharding="fsdp" if ranks > 1 else None)


def test_a_7b_full_fine_tune_spans_the_fewest_gpus_its_fsdp_shards_fit(tmp_path):
    model = config_dir(tmp_path, "qwen7b", QWEN_7B)
    usable = 0.85 * A100_80.gpu_memory_bytes
    plan = placement.place(adapter("sft"), model, full_fine_tune("sft"), A100_80, cpus_per_trial=1,
                           gpus_per_trial=None, concurrency=None)
    n = plan.ranks
    assert plan.device == "cuda" and plan.sharding == "fsdp" and n in (2, 4, 8)
    assert plan.resources == {"cpu": 1, "gpu": n} and plan.concurrency == A100_80.gpus // n
    for precision in ("bf16-mixed", "fp32"):
        params = {"use_peft": False, "per_device_train_batch_size": 8, "precision": precision}
        assert fsdp_estimate("sft", model, params, 1).total > usable  # one GPU is too small
        assert plan.check({"precision": precision, "learning_rate": 1e-6}) is None  # one rank fits one GPU
    worst = {"use_peft": False, "per_device_train_batch_size": 8, "precision": "fp32"}
    assert plan.largest_bytes() == fsdp_estimate("sft", model, worst, n).total <= usable
    assert fsdp_estimate("sft", model, worst, n // 2).total > usable  # half the GPUs do not hold it: the fewest
    assert plan.notes and plan.notes[0].startswith(f"a trial spans {n} GPUs (FSDP full shard): ~")
    assert "GiB per rank; one GPU would need ~" in plan.notes[0]
    assert f"{n} GPUs each ({n} ranks, fsdp)" in plan.describe() and "per rank" in plan.describe()
    summary = plan.summary()
    assert (summary.ranks, summary.sharding, summary.gpus_per_trial) == (n, "fsdp", n)
    assert summary.to_dict()["ranks"] == n  # search.json's plan

    # DPO's frozen reference model is sharded too, but a DPO rank still needs more than an SFT rank
    dpo = placement.place(adapter("dpo"), model, full_fine_tune("dpo"), A100_80, cpus_per_trial=1,
                          gpus_per_trial=None, concurrency=None)
    assert dpo.ranks >= n and dpo.sharding == "fsdp" and dpo.concurrency == A100_80.gpus // dpo.ranks
    sft_rank, dpo_rank = plan.estimate_of({"precision": "fp32"}), fsdp_estimate("dpo", model, worst, n)
    assert dpo_rank.total > sft_rank.total and 0 < dpo_rank.reference <= fsdp_estimate("dpo", model, worst, 1).reference / n + 1
    assert dpo.largest_bytes() <= usable < fsdp_estimate("dpo", model, worst, dpo.ranks // 2).total


def test_smaller_gpus_take_more_of_them_and_too_few_say_why(tmp_path):
    model = config_dir(tmp_path, "qwen7b", QWEN_7B)
    space = full_fine_tune("sft", batch=2, precisions=("bf16-mixed",))
    small = {"use_peft": False, "per_device_train_batch_size": 2, "precision": "bf16-mixed"}
    forty = placement.place(adapter("sft"), model, space, A100_40, cpus_per_trial=1, gpus_per_trial=None,
                            concurrency=None)
    usable = 0.85 * A100_40.gpu_memory_bytes
    assert forty.ranks > 1 and forty.largest_bytes() <= usable < fsdp_estimate("sft", model, small, forty.ranks // 2).total
    assert forty.concurrency == 8 // forty.ranks
    # two 24 GiB GPUs, or eight 16 GiB ones, hold no 7B full fine-tune: refused with the numbers
    for cluster in (PAIR_24, EIGHT_16):
        with pytest.raises(TunerError, match="no config of the space fits") as refused:
            placement.place(adapter("sft"), model, space, cluster, cpus_per_trial=1, gpus_per_trial=None,
                            concurrency=None)
        per_rank = fsdp_estimate("sft", model, small, cluster.gpus).total
        assert per_rank > 0.85 * cluster.gpu_memory_bytes
        message = str(refused.value)
        assert f"all {cluster.gpus} GPUs of a node" in message and f"~{per_rank / GiB:.1f} GiB per rank" in message
        assert f"{cluster.gpu_memory_bytes / GiB:.1f} GiB" in message and "LoRA" in message


def test_host_memory_holds_every_rank_of_a_trial(tmp_path):
    model = config_dir(tmp_path, "qwen7b", QWEN_7B)
    tight = placement.Cluster(gpus=8, gpu_memory_bytes=80 * GiB, host_memory_bytes=256 * GiB, cpus=64)
    plan = placement.place(adapter("sft"), model, full_fine_tune("sft"), tight, cpus_per_trial=1,
                           gpus_per_trial=None, concurrency=None)
    one_rank_host = plan.estimate_of({"precision": "fp32"}).host
    # every rank is a process that loads the checkpoint: the trials' ranks together stay within the host
    assert plan.concurrency * plan.ranks * one_rank_host <= 0.85 * tight.host_memory_bytes
    assert plan.concurrency < tight.gpus // plan.ranks and plan.plan.limit == "host memory"


def test_whole_gpus_per_trial_given_are_used_and_checked_per_rank(tmp_path):
    model = config_dir(tmp_path, "qwen7b", QWEN_7B)
    space = full_fine_tune("sft", precisions=("bf16-mixed",))
    eight = placement.place(adapter("sft"), model, space, A100_80, cpus_per_trial=1, gpus_per_trial=8,
                            concurrency=None)
    assert (eight.ranks, eight.sharding, eight.resources["gpu"], eight.concurrency) == (8, "fsdp", 8, 1)
    assert "trials shard the model (FSDP full shard)" in eight.notes[0]
    with pytest.raises(TunerError, match=r"per rank \(2 ranks\)"):  # 2 GPUs' shards do not fit one GPU
        placement.place(adapter("sft"), model, space, A100_80, cpus_per_trial=1, gpus_per_trial=2, concurrency=None)
    with pytest.raises(TunerError, match="whole GPUs"):
        placement.place(adapter("sft"), model, space, A100_80, cpus_per_trial=1, gpus_per_trial=2.5, concurrency=None)
    # a 7B LoRA fits one GPU: two GPUs per trial are plain DDP, each rank with the whole model
    lora = parse_space({"trainer": "sft", "fixed": {"use_peft": True, "precision": "bf16-pure"},
                        "params": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4}}})
    ddp = placement.place(adapter("sft"), model, lora, A100_80, cpus_per_trial=1, gpus_per_trial=2, concurrency=None)
    assert (ddp.ranks, ddp.sharding, ddp.concurrency, ddp.notes) == (2, None, 4, [])
    assert ddp.estimate_of({}).buckets > 0 and ddp.summary().sharding == "none"
