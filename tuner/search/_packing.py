"""Packing trials onto a machine: how many trials of given memory estimates run at once, and what each asks of
Ray (``plan``); how many GPUs of one node a trial too big for one GPU needs (``gpus_needed``).

    need = memory.estimate_trial(adapter("sft"), config, {"precision": "bf16-mixed", "per_device_train_batch_size": 8})
    plan([need], gpus=1, gpu_memory_bytes=80 * 2**30, host_memory_bytes=256 * 2**30, cpus=16)
                       # -> Plan(concurrent=5, gpus_per_trial=0.2, limit="gpu memory", ...)
                       #    .resources() -> {"cpu": 3, "gpu": 0.2}: tune.with_resources(trainable, that)

    # a 7B full fine-tune fits no 80 GiB GPU: the fewest GPUs whose FSDP shards do
    gpus_needed(lambda n: memory.estimate_trial(adapter("sft"), config_7b, params, ranks=n,
                                                sharding="fsdp" if n > 1 else None),
                gpus_per_node=8, gpu_memory_bytes=80 * 2**30)       # -> Spread(gpus=4, per_rank=..., ...)

The estimates are tuner.trial.memory's; _placement.py applies the plan to a search space and the Ray cluster. How the
plan packs: docs/architecture.md ("The memory estimate and the plan").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.errors import TunerError
from tuner.trial.memory import CPU_PROCESS_BASELINE, CPU_TRAINER_RUNTIME, CUDA_HOST_LIBRARIES, GiB, MemoryEstimate

__all__ = ["Fit", "Plan", "Spread", "gpus_needed", "plan"]


@dataclass(frozen=True)
class Fit:
    """One config's verdict."""

    needs: int  # bytes of the device (GPU, or host RAM for a CPU trial); one rank's when ranks > 1
    host: int  # bytes of host RAM its processes need, all ranks together
    fits: bool
    per_gpu: int  # how many such trials fit on one GPU (0 without GPUs; 1 with whole GPUs per trial)
    gpus_per_trial: float  # for this config alone, e.g. with tune.with_resources(..., lambda config: ...)
    reason: str = ""  # why it cannot run, with the numbers; "" when it fits
    ranks: int = 1  # processes of the trial: one per GPU, or CPU processes


@dataclass(frozen=True)
class Plan:
    """How many trials run at once and what each asks Ray for."""

    concurrent: int  # trials at once (0: none of the configs fits)
    gpus_per_trial: float  # Ray's GPU share, the same for every trial: a fraction, or whole GPUs (0 without GPUs)
    cpus_per_trial: int
    limit: str  # what bounds ``concurrent``: "gpu memory", "gpus", "host memory", "cpus" or "nothing fits"
    fits: list[Fit]
    ranks: int = 1  # processes per trial

    def resources(self) -> dict[str, float]:
        """Ray's per-trial resources, e.g. {"cpu": 4, "gpu": 0.25} for tune.with_resources."""
        return {"cpu": self.cpus_per_trial, "gpu": self.gpus_per_trial}

    def describe(self) -> str:
        if not self.concurrent:
            return f"no config fits: {next((f.reason for f in self.fits if f.reason), '')}"
        share = f", {self.gpus_per_trial:g} GPU each" if self.gpus_per_trial else ""
        if self.ranks > 1:
            share = f", {self.ranks} {'GPUs' if self.gpus_per_trial else 'processes'} each"
        return f"{self.concurrent} trial(s) at once{share} (bounded by {self.limit})"


def _share(per_gpu: int) -> float:
    """1/per_gpu rounded down to Ray's 0.0001 resolution, so per_gpu of them still fit on one GPU."""
    return max(1, math.floor(10_000 / per_gpu)) / 10_000


def plan(estimate_bytes: int | MemoryEstimate | Sequence[int | MemoryEstimate], *, gpus: int,
         gpu_memory_bytes: int, host_memory_bytes: int, cpus: int, headroom: float = 0.85,
         gpus_per_trial: int | None = None) -> Plan:
    """How many trials of these configs run at once. ``estimate_bytes``: one estimate per config (bytes, or
    ``MemoryEstimate``s, which also carry their host RAM need; plain bytes assume a GPU trial's process takes
    CPU_PROCESS_BASELINE + CPU_TRAINER_RUNTIME + CUDA_HOST_LIBRARIES of host RAM, a CPU trial the bytes
    themselves). Each trial gets at least one CPU per process; ``headroom`` of each GPU's and of the host's
    memory is used.

    ``gpus_per_trial``: whole GPUs per trial, one rank on each (None: a fraction of one GPU, packed by memory;
    the estimates' ``ranks`` when above 1). A config then fits when its per-rank estimate fits one GPU, and at
    most ``gpus // gpus_per_trial`` trials run at once. The estimates must be for that many ranks.
    """
    if not 0 < headroom <= 1:
        raise TunerError(f"plan: headroom must be in (0, 1], got {headroom}")
    items = [estimate_bytes] if isinstance(estimate_bytes, (int, MemoryEstimate)) else list(estimate_bytes)
    if not items:
        raise TunerError("plan: no estimates given")
    item_ranks = {item.ranks for item in items if isinstance(item, MemoryEstimate)}
    whole = gpus_per_trial
    if gpus > 0:
        if whole is None and max(item_ranks, default=1) > 1:
            whole = max(item_ranks)  # a multi-rank estimate means a GPU per rank
        if whole is not None:
            if whole != int(whole) or whole < 1:
                raise TunerError(f"plan: gpus_per_trial counts whole GPUs (one rank each), got {whole}")
            whole = int(whole)
            if whole > gpus:
                raise TunerError(f"plan: {whole} GPUs per trial, the machine has {gpus}")
            if item_ranks - {whole}:
                raise TunerError(f"plan: estimates for {sorted(item_ranks)} ranks, but {whole} GPUs per trial "
                                 f"(one rank per GPU): estimate with ranks={whole}")
    elif whole:
        raise TunerError(f"plan: gpus_per_trial={whole} without GPUs")
    gpu_usable = gpu_memory_bytes * headroom
    host_usable = host_memory_bytes * headroom
    fits: list[Fit] = []
    for item in items:
        if isinstance(item, MemoryEstimate):
            needs, host, ranks = item.total, item.host, item.ranks
        else:
            needs = int(item)
            host = needs if gpus <= 0 else CPU_PROCESS_BASELINE + CPU_TRAINER_RUNTIME + CUDA_HOST_LIBRARIES
            ranks = whole or 1
        host *= ranks  # every rank is a process of its own on the host
        per_rank = f" per rank ({ranks} ranks)" if ranks > 1 else ""
        reason, per_gpu = "", 0
        if gpus > 0:
            per_gpu = int(gpu_usable // needs) if needs > 0 else 1
            if whole:
                per_gpu = min(per_gpu, 1)  # a rank has its GPU to itself
            if per_gpu == 0:
                reason = (f"needs ~{needs / GiB:.1f} GiB{per_rank}, the GPU has {gpu_memory_bytes / GiB:.1f} GiB "
                          f"({headroom:.0%} usable: {gpu_usable / GiB:.1f} GiB): try LoRA, a smaller batch, "
                          "activation checkpointing" + (", more GPUs per trial" if whole else ""))
        if not reason and host > host_usable:
            processes = f" for its {ranks} processes" if ranks > 1 else ""
            reason = (f"needs ~{host / GiB:.1f} GiB of host memory{processes}, the machine has "
                      f"{host_memory_bytes / GiB:.1f} GiB ({headroom:.0%} usable: {host_usable / GiB:.1f} GiB): "
                      "try LoRA, a smaller batch, "
                      "activation checkpointing" + (", a smaller model" if gpus <= 0 else ""))
        share = float(whole) if whole else (_share(per_gpu) if per_gpu else (1.0 if gpus > 0 else 0.0))
        fits.append(Fit(needs=needs, host=host, fits=not reason, per_gpu=per_gpu, gpus_per_trial=share,
                        reason=reason, ranks=ranks))

    ranks = max(f.ranks for f in fits)
    fitting = [f for f in fits if f.fits]
    if not fitting:
        return Plan(concurrent=0, gpus_per_trial=float(whole or 1) if gpus > 0 else 0.0, cpus_per_trial=max(1, cpus),
                    limit="nothing fits", fits=fits, ranks=ranks)
    # Every trial gets the share of the largest fitting config, so any mix of them fits.
    bounds = {"host memory": int(host_usable // max(f.host for f in fitting)), "cpus": max(1, cpus // ranks)}
    device_bound = "gpus" if whole else "gpu memory"
    if gpus > 0:
        bounds[device_bound] = gpus // whole if whole else gpus * min(f.per_gpu for f in fitting)
    limit = min(bounds, key=lambda k: (bounds[k], k != device_bound))
    concurrent = bounds[limit]
    if whole:
        gpus_per_trial_out = float(whole)
    else:
        gpus_per_trial_out = _share(math.ceil(concurrent / gpus)) if gpus > 0 else 0.0
    return Plan(concurrent=concurrent, gpus_per_trial=gpus_per_trial_out, cpus_per_trial=max(1, cpus // concurrent),
                limit=limit, fits=fits, ranks=ranks)


@dataclass(frozen=True)
class Spread:
    """How many GPUs of one node a trial needs (``gpus_needed``)."""

    gpus: int | None  # the fewest that fit, one rank each; None when all of a node's do not
    per_rank: int  # bytes per rank at ``gpus`` (at the most GPUs tried when None)
    one_gpu: int  # bytes the trial needs on a single GPU
    reason: str = ""  # why no count fits, with the numbers; "" when one does


def _rank_counts(gpus_per_node: int) -> list[int]:
    """1, 2, 4, 8, ... up to the node's GPUs, and the node's count itself when it is no power of two."""
    counts = [2**k for k in range(gpus_per_node.bit_length()) if 2**k <= gpus_per_node]
    return counts + ([gpus_per_node] if counts[-1] != gpus_per_node else [])


def gpus_needed(estimate_for_ranks: Callable[[int], int | MemoryEstimate], *, gpus_per_node: int,
                gpu_memory_bytes: int, headroom: float = 0.85) -> Spread:
    """The fewest GPUs of one node whose per-rank estimate fits ``headroom`` of one GPU's memory.
    ``estimate_for_ranks(n)``: the per-rank need at n ranks, e.g. FSDP-sharded above 1
    (``lambda n: estimate_trial(..., ranks=n, sharding="fsdp" if n > 1 else None)``).

    Counts tried: powers of two (then the node's own count). A trial's batch is per_device x ranks, so trials on
    2, 4, 8 GPUs stay comparable by halving or doubling; they tile an 8-GPU node with no GPU left idle (3 would
    leave 2 of 8 unused); and FSDP's flat parameters split evenly. One node only: ranks talk over NVLink, not the
    network.
    """
    if gpus_per_node < 1:
        raise TunerError(f"gpus_needed: gpus_per_node must be at least 1, got {gpus_per_node}")
    usable = gpu_memory_bytes * headroom

    def need(n: int) -> int:
        got = estimate_for_ranks(n)
        return got.total if isinstance(got, MemoryEstimate) else int(got)

    one_gpu = need(1)
    per_rank = one_gpu
    for n in _rank_counts(gpus_per_node):
        per_rank = one_gpu if n == 1 else need(n)
        if per_rank <= usable:
            return Spread(gpus=n, per_rank=per_rank, one_gpu=one_gpu)
    return Spread(gpus=None, per_rank=per_rank, one_gpu=one_gpu, reason=(
        f"needs ~{one_gpu / GiB:.1f} GiB on one GPU and ~{per_rank / GiB:.1f} GiB per rank even sharded over all "
        f"{gpus_per_node} GPUs of a node; a GPU has {gpu_memory_bytes / GiB:.1f} GiB ({headroom:.0%} usable: "
        f"{usable / GiB:.1f} GiB): try LoRA, a smaller batch, activation checkpointing"))
