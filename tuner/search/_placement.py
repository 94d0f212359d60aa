"""Where a search's trials run: tuner.trial.memory's plan applied to a search space and the Ray cluster.

    placement = place(trainer, model_path, space, cluster=Cluster.of_ray(ray), cpus_per_trial=1,
                      gpus_per_trial=None, concurrency=None)
    placement.resources         # {"cpu": 1, "gpu": 0.25}: Ray's per-trial request (fractional GPUs pack trials)
    placement.concurrency       # never more than fit in GPU memory, host RAM and CPUs
    placement.check(params)     # None, or why this config cannot fit (it is then recorded, not run)

Before launching, every config the space can produce is bounded by its memory corners: each value of the
params that change memory (precision, LoRA, batch size, lengths, checkpointing, ...) crossed with the others,
ranges at both ends. The plan packs trials by the largest corner that fits; a sampled config whose own
estimate is over its per-trial share is reported as ``too_big`` with its numbers instead of being run.

``--gpus-per-trial`` left out means: on a cluster with GPUs, the plan's share (e.g. 0.2: five trials per GPU);
with no GPU, CPU trials. Given, it is used as written and the plan only checks it and caps concurrency.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from tuner.config.trainers import Adapter
from tuner.errors import TunerError
from tuner.trial import memory

# The params tuner.trial.memory.estimate reads: the ones whose values change a trial's peak memory.
MEMORY_PARAMS = ("precision", "use_peft", "lora_r", "lora_target_modules", "per_device_train_batch_size",
                 "gradient_checkpointing", "activation_checkpointing", "optim", "max_length",
                 "max_completion_length", "num_generations", "beta", "gradient_accumulation_steps",
                 "steps_per_generation", "generation_batch_size")
MAX_CORNERS = 4096  # beyond this many combinations, each param's largest value alone is kept (a bound still)


@dataclass(frozen=True)
class Cluster:
    """What the trials can use: GPUs (count and memory of one), host memory and CPUs."""

    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    cpus: int

    @classmethod
    def of_ray(cls, ray) -> "Cluster":
        """The running Ray cluster's resources; GPU memory asked of one GPU (locally, or by a 1-GPU Ray task)."""
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        return cls(gpus=gpus, gpu_memory_bytes=_gpu_memory(ray) if gpus else 0,
                   host_memory_bytes=_host_memory(ray), cpus=int(resources.get("CPU", 1)))


def _gpu_memory(ray) -> int:
    import torch

    if torch.cuda.is_available():
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))

    @ray.remote(num_gpus=1, num_cpus=0)
    def total_memory() -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory

    return int(ray.get(total_memory.remote(), timeout=120))


def _host_memory(ray) -> int:
    """Host RAM the trials share: this machine's for a local Ray, else the smallest node's (Ray's "memory"
    resource is what Ray lets tasks use of it: ~70% of what was free when the node started)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        import psutil

        return psutil.virtual_memory().total
    return int(min(n["Resources"].get("memory", 0) for n in nodes) / 0.7)


@dataclass
class Placement:
    device: str  # "cuda" or "cpu": where the trials run
    plan: memory.Plan
    resources: dict[str, float]  # Ray's per-trial request
    concurrency: int
    budget_bytes: int  # device memory one trial may use: its GPU share, or its share of host RAM on a CPU
    estimate_of: Callable[[dict[str, Any]], memory.MemoryEstimate] = field(repr=False)
    notes: list[str] = field(default_factory=list)  # what the plan changed of the user's options

    def check(self, params: dict[str, Any]) -> str | None:
        """Why this config cannot run within its share, with the numbers; None when it fits."""
        need = self.estimate_of(params)
        if need.total <= self.budget_bytes:
            return None
        share = f"its share of the GPU ({self.resources['gpu']:g})" if self.device == "cuda" else "its share of host RAM"
        return (f"not run: tuner.trial.memory estimates {need.describe()}, over {share}: "
                f"{self.budget_bytes / memory.GiB:.1f} GiB; try LoRA, a smaller batch or activation checkpointing")

    def largest_bytes(self) -> int:
        return max(f.needs for f in self.plan.fits if f.fits)

    def describe(self) -> str:
        share = f", {self.resources['gpu']:g} GPU each" if self.device == "cuda" else ""
        return (f"{self.concurrency} at a time{share} (memory plan: up to ~{self.largest_bytes() / memory.GiB:.1f} "
                f"GiB per trial, bounded by {self.plan.limit})")

    def summary(self) -> dict[str, Any]:
        """What search.json and the parent run record of the plan."""
        return {"device": self.device, "concurrent": self.concurrency, "gpus_per_trial": self.resources["gpu"],
                "cpus_per_trial": self.resources["cpu"], "limit": self.plan.limit,
                "per_trial_mb": round(self.largest_bytes() / memory.MiB),
                "budget_mb": round(self.budget_bytes / memory.MiB)}


def memory_corners(space, limit: int = MAX_CORNERS) -> list[dict[str, Any]]:
    """Configs that bound the space's memory: every value of each memory param (both ends of a range) crossed."""
    from tuner.config.space import CategoricalParam, FixedParam

    axes: dict[str, list[Any]] = {}
    for name in MEMORY_PARAMS:
        if name in space.params:
            p = space.params[name]
            if isinstance(p, CategoricalParam):
                axes[name] = list(p.choices)
            elif isinstance(p, FixedParam):
                axes[name] = [p.value]
            else:
                axes[name] = [p.low, p.high]
        elif name in space.fixed:
            axes[name] = [space.fixed[name]]
    if math.prod(len(v) for v in axes.values()) > limit:
        raise TunerError(f"{space.source}: more than {limit} memory corners; narrow the space")  # never for shipped ones
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*axes.values())] or [{}]


def place(entry: Adapter, model_path: str, space, cluster: Cluster, *, cpus_per_trial: float,
          gpus_per_trial: float | None, concurrency: int | None, headroom: float = 0.85) -> Placement:
    """How many trials at once and what each asks of Ray, from the memory every config of ``space`` needs."""
    from transformers import AutoConfig

    on_gpu = cluster.gpus > 0 if gpus_per_trial is None else gpus_per_trial > 0
    device = "cuda" if on_gpu else "cpu"
    model_config = AutoConfig.from_pretrained(model_path)

    def estimate_of(params: dict[str, Any]) -> memory.MemoryEstimate:
        return memory.estimate_trial(entry, model_config, {**space.fixed, **params}, device=device)

    corners = [estimate_of(c) for c in memory_corners(space)]
    cpus = max(1, int(cluster.cpus // cpus_per_trial))
    plan = memory.plan(corners, gpus=cluster.gpus if on_gpu else 0, gpu_memory_bytes=cluster.gpu_memory_bytes,
                       host_memory_bytes=cluster.host_memory_bytes, cpus=cpus, headroom=headroom)
    if not plan.concurrent:
        raise TunerError(f"--model {model_path}: no config of the space fits this machine: "
                         f"{next(f.reason for f in plan.fits if f.reason)}")
    notes: list[str] = []
    if on_gpu:
        share = plan.gpus_per_trial if gpus_per_trial is None else gpus_per_trial
        bound = min(plan.concurrent if gpus_per_trial is None else plan.concurrent * 10**6,
                    int(cluster.gpus / share + 1e-9), cpus)
        budget = int(cluster.gpu_memory_bytes * headroom * share)
        if gpus_per_trial is not None:  # the user's share: the host memory bound still holds
            bound = min(bound, int(cluster.host_memory_bytes * headroom // max(f.host for f in plan.fits if f.fits)))
    else:
        share = 0.0
        bound = plan.concurrent
        budget = int(cluster.host_memory_bytes * headroom // bound)
    wanted = concurrency or bound
    if concurrency and concurrency > bound:
        notes.append(f"--concurrency {concurrency} lowered to {bound}: more trials at once do not fit ({plan.limit})")
    return Placement(device=device, plan=plan, resources={"cpu": cpus_per_trial, "gpu": share},
                     concurrency=max(1, min(wanted, bound)), budget_bytes=budget, estimate_of=estimate_of, notes=notes)
