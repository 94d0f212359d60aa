"""tuner.search._packing: how many trials of given estimates run at once (the GPU's memory, the host's, the CPUs),
what each asks of Ray, why a config fits nowhere, and the fewest GPUs of a node a sharded trial fits."""

from __future__ import annotations

import pytest
from helpers import FULL_FT, qwen05_estimate, qwen7b_config  # the estimates these plans pack: Qwen2.5 shapes

from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.search import _packing as packing
from tuner.search._packing import gpus_needed, plan
from tuner.trial import memory
from tuner.trial.memory import GiB

GB = 10**9


def test_plan_packs_four_15_gb_trials_on_an_80_gb_gpu():
    p = plan([15 * GB] * 4, gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=16)
    assert (p.concurrent, p.gpus_per_trial, p.limit) == (4, 0.25, "gpu memory")
    assert all(f.fits for f in p.fits) and p.resources() == {"cpu": 4, "gpu": 0.25}
    two = plan(15 * GB, gpus=2, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=16)
    assert (two.concurrent, two.gpus_per_trial) == (8, 0.25)
    three = plan(20 * GB, gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=16)
    assert three.concurrent == 3 and three.gpus_per_trial * 3 <= 1 < three.gpus_per_trial * 4


def test_plan_never_packs_more_than_the_largest_fitting_config_allows():
    p = plan([10 * GB, 30 * GB], gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=16)
    assert p.concurrent == 2 and p.gpus_per_trial == 0.5
    assert [f.per_gpu for f in p.fits] == [6, 2] and [f.gpus_per_trial for f in p.fits] == [0.1666, 0.5]


def test_a_config_bigger_than_the_gpu_does_not_fit_and_says_why():
    p = plan([100 * GB, 15 * GB], gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=16)
    big, small = p.fits
    assert not big.fits and small.fits and p.concurrent == 4  # the others still run
    assert f"{100 * GB / GiB:.1f} GiB" in big.reason and f"{80 * GB / GiB:.1f} GiB" in big.reason
    assert "LoRA" in big.reason and "smaller batch" in big.reason and "checkpointing" in big.reason
    nothing = plan(100 * GB, gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=16)
    assert nothing.concurrent == 0 and nothing.limit == "nothing fits" and "93.1 GiB" in nothing.describe()


def test_host_memory_and_cpus_limit_concurrency():
    per_process = memory.CPU_PROCESS_BASELINE + memory.CPU_TRAINER_RUNTIME + memory.CUDA_HOST_LIBRARIES
    host = int(3.5 * per_process / 0.85)  # room for 3 trial processes
    p = plan(5 * GB, gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=host, cpus=16)
    assert (p.concurrent, p.limit, p.gpus_per_trial) == (3, "host memory", 0.3333)
    assert plan(5 * GB, gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=512 * GB, cpus=2).concurrent == 2
    # a MemoryEstimate brings its own host need: weights loaded on the host first
    need = qwen05_estimate()
    assert plan(need, gpus=1, gpu_memory_bytes=80 * GB, host_memory_bytes=need.host, cpus=16).concurrent == 0
    # CPU trials: the host holds everything
    cpu = plan([4 * GB] * 2, gpus=0, gpu_memory_bytes=0, host_memory_bytes=16 * GB, cpus=8)
    assert (cpu.concurrent, cpu.gpus_per_trial, cpu.limit) == (3, 0.0, "host memory")
    assert "host memory" in plan(20 * GB, gpus=0, gpu_memory_bytes=0, host_memory_bytes=16 * GB, cpus=8).fits[0].reason


def _sharded(trainer, params, config=None):
    config = config or qwen7b_config()
    return lambda n: memory.estimate_trial(adapter(trainer), config, params, ranks=n,
                                           sharding="fsdp" if n > 1 else None)


def test_gpus_needed_is_the_fewest_gpus_whose_shards_fit():
    usable = 0.85 * 80 * GiB
    sft = _sharded("sft", FULL_FT)
    assert sft(1).total > 80 * GiB  # a 7B full fine-tune fits no single 80 GiB GPU
    spread = gpus_needed(sft, gpus_per_node=8, gpu_memory_bytes=80 * GiB)
    n = spread.gpus
    assert n in (2, 4, 8) and spread.per_rank == sft(n).total <= usable
    assert sft(n // 2).total > usable  # half as many do not fit: the fewest
    assert spread.one_gpu == sft(1).total and not spread.reason
    # DPO's frozen reference is sharded too, but still adds to every rank at the same count
    dpo = _sharded("dpo", FULL_FT)
    assert dpo(n).total > sft(n).total and dpo(n).reference <= dpo(1).reference / n + 1
    assert gpus_needed(dpo, gpus_per_node=8, gpu_memory_bytes=80 * GiB).gpus >= n
    none = gpus_needed(sft, gpus_per_node=8, gpu_memory_bytes=16 * GiB)
    assert none.gpus is None and "all 8 GPUs" in none.reason and "16.0 GiB" in none.reason
    assert f"~{sft(8).total / GiB:.1f} GiB per rank" in none.reason
    # counts tried: powers of two, then the node's own
    assert packing._rank_counts(8) == [1, 2, 4, 8] and packing._rank_counts(6) == [1, 2, 4, 6]
    assert gpus_needed(lambda n: 100 * GB // n, gpus_per_node=6, gpu_memory_bytes=20 * GB).gpus == 6


def test_plan_with_whole_gpus_per_trial_checks_one_rank_against_one_gpu():
    p = plan(60 * GB, gpus=8, gpu_memory_bytes=80 * GB, host_memory_bytes=2048 * GB, cpus=64, gpus_per_trial=2)
    assert (p.concurrent, p.gpus_per_trial, p.limit, p.ranks) == (4, 2.0, "gpus", 2)
    assert p.resources()["gpu"] == 2.0 and "2 GPUs each" in p.describe()
    too_big = plan(70 * GB, gpus=8, gpu_memory_bytes=80 * GB, host_memory_bytes=2048 * GB, cpus=64, gpus_per_trial=4)
    assert too_big.concurrent == 0 and "per rank (4 ranks)" in too_big.fits[0].reason
    # each rank is a process on the host: its host need counts once per rank
    need = memory.estimate_trial(adapter("sft"), qwen7b_config(), FULL_FT, ranks=4, sharding="fsdp")
    host = int(need.host * 4 * 1.5 / 0.85)  # room for one 4-rank trial, not two
    hosted = plan(need, gpus=8, gpu_memory_bytes=80 * GiB, host_memory_bytes=host, cpus=64)
    assert (hosted.concurrent, hosted.limit, hosted.gpus_per_trial) == (1, "host memory", 4.0)  # ranks read from it
    assert hosted.fits[0].host == 4 * need.host
    assert plan(need, gpus=8, gpu_memory_bytes=80 * GiB, host_memory_bytes=2**50, cpus=6).concurrent == 1  # a CPU a rank
    with pytest.raises(TunerError, match="estimate with ranks=2"):
        plan(need, gpus=8, gpu_memory_bytes=80 * GiB, host_memory_bytes=2**50, cpus=64, gpus_per_trial=2)
    with pytest.raises(TunerError, match="the machine has 2"):
        plan(60 * GB, gpus=2, gpu_memory_bytes=80 * GB, host_memory_bytes=2**50, cpus=64, gpus_per_trial=4)
