"""The memory plan on this CPU: trials of the tiny model bounded by CPUs and host memory (one or several processes
each), and a real search that records a config too big for the machine as ``too_big`` without running it (plans on
made-up machines, from config.json files only, are tests/unit/search/test_placement.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_search_in

from tuner.config.space import load_space, parse_space
from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.records import Status
from tuner.search import _placement as placement
from tuner.trial.memory import GiB

# Qwen/Qwen2.5-0.5B's and Qwen/Qwen2.5-7B's config.json numbers.
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)

H100 = placement.Cluster(gpus=1, gpu_memory_bytes=80 * GiB, host_memory_bytes=256 * GiB, cpus=16)
LAPTOP = placement.Cluster(gpus=0, gpu_memory_bytes=0, host_memory_bytes=24 * GiB, cpus=2)


def config_dir(tmp_path: Path, name: str, numbers: dict) -> str:
    from transformers import AutoConfig

    folder = tmp_path / name
    AutoConfig.for_model("qwen2", **numbers).save_pretrained(folder)
    return str(folder)


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
    space = """\
trainer: sft
fixed: {use_peft: false, max_length: 64, precision: fp32}
params:
  per_device_train_batch_size: {type: categorical, choices: [4, 1000000]}
"""
    finished = run_search_in(tmp_path, space, trainer="sft", sampler="grid", max_steps=4, confirm_seeds=0,
                             budget=0)  # no longer rung for the ok trial, which 4 steps cannot judge: not asserted
    big = finished.by_params(per_device_train_batch_size=1000000)
    assert big["status"] == Status.TOO_BIG and big["reason"].startswith("not run:")
    assert big["steps_run"] == 0 and big["wall_seconds"] is None  # never started
    assert finished.by_params(per_device_train_batch_size=4)["status"] == Status.OK
    plan = finished.outcome.search["plan"]
    assert plan["device"] == "cpu" and plan["concurrent"] >= 1 and plan["budget_mb"] > 0
    assert any("memory plan" in line for line in finished.echoed)


def test_cpu_trials_with_several_processes(tiny_model):
    two = placement.place(adapter("sft"), tiny_model, load_space(None, "sft"), LAPTOP, cpus_per_trial=1,
                          gpus_per_trial=None, concurrency=None, processes_per_trial=2)
    assert (two.device, two.ranks, two.resources) == ("cpu", 2, {"cpu": 2, "gpu": 0.0})  # a CPU per process
    assert two.concurrency == 1  # two CPUs: one per process
    assert two.budget_bytes * 2 <= 0.85 * LAPTOP.host_memory_bytes  # a share of host RAM per process
    assert "2 processes each" in two.describe() and two.summary().ranks == 2
    with pytest.raises(TunerError, match="for CPU trials only"):
        placement.place(adapter("sft"), tiny_model, load_space(None, "sft"), H100, cpus_per_trial=1,
                        gpus_per_trial=None, concurrency=None, processes_per_trial=2)
