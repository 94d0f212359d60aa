"""Where a search's trials run: the packing plan (_packing.py) applied to a search space and the Ray cluster.

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

A space whose largest corner fits no single GPU spreads every trial over the fewest GPUs of a node whose FSDP
shards fit (_packing.gpus_needed), one rank per GPU:

    placement = place(trainer, "Qwen2.5-7B", space, cluster=Cluster(gpus=8, gpu_memory_bytes=80 * 2**30, ...), ...)
    placement.ranks, placement.sharding     # 4, "fsdp": a trial is 4 processes, one per GPU
    placement.resources                     # {"cpu": 1, "gpu": 4.0}
    placement.notes                         # ["a trial spans 4 GPUs (FSDP full shard): ~48.3 GiB per rank; ..."]

``--gpus-per-trial`` of 2 or more is whole GPUs, one rank each; sharded ("fsdp") when the largest corner does not
fit one GPU under DDP, unless the space's ``sharding`` param says. On CPUs, ``processes_per_trial`` ranks.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from tuner.config.trainers import Adapter
from tuner.errors import TunerError
from tuner.search import _packing as packing
from tuner.trial import memory

if TYPE_CHECKING:
    from tuner.config.options import SearchOptions
    from tuner.config.space import SearchSpace

# The params tuner.trial.memory.estimate reads: the ones whose values change a trial's peak memory.
MEMORY_PARAMS = ("precision", "use_peft", "lora_r", "lora_target_modules", "per_device_train_batch_size",
                 "gradient_checkpointing", "activation_checkpointing", "optim", "max_length",
                 "max_completion_length", "num_generations", "beta", "gradient_accumulation_steps",
                 "steps_per_generation", "generation_batch_size", "sharding")
MAX_CORNERS = 4096  # beyond this many combinations, each param's largest value alone is kept (a bound still)


@dataclass(frozen=True)
class Cluster:
    """What the trials can use: GPUs (count and memory of one), host memory and CPUs."""

    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    cpus: int
    gpus_per_node: int | None = None  # None: one node holds all ``gpus``; a multi-GPU trial stays on one node

    @property
    def node_gpus(self) -> int:
        return self.gpus_per_node or self.gpus

    def whole_gpu_trials(self, gpus_per_trial: int) -> int:
        """How many trials of that many GPUs fit at once, each on one node."""
        nodes, rest = divmod(self.gpus, self.node_gpus)
        return nodes * (self.node_gpus // gpus_per_trial) + rest // gpus_per_trial

    @classmethod
    def of_ray(cls, ray: ModuleType) -> "Cluster":
        """The running Ray cluster's resources; GPU memory asked of one GPU (locally, or by a 1-GPU Ray task)."""
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        return cls(gpus=gpus, gpu_memory_bytes=_gpu_memory(ray) if gpus else 0,
                   host_memory_bytes=_host_memory(ray), cpus=int(resources.get("CPU", 1)),
                   gpus_per_node=_gpus_per_node(ray) if gpus else None)


def _gpu_memory(ray: ModuleType) -> int:
    import torch

    if torch.cuda.is_available():
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))

    @ray.remote(num_gpus=1, num_cpus=0)
    def total_memory() -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory

    return int(ray.get(total_memory.remote(), timeout=120))


def _gpus_per_node(ray: ModuleType) -> int | None:
    """The fewest GPUs on any node that has some (a bound for unequal nodes); None for a single node."""
    counts = [int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]
    counts = [c for c in counts if c]
    return min(counts) if len(counts) > 1 else None


def _host_memory(ray: ModuleType) -> int:
    """Host RAM the trials share: this machine's for a local Ray, else the smallest node's (Ray's "memory"
    resource is what Ray lets tasks use of it: ~70% of what was free when the node started)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        import psutil

        return psutil.virtual_memory().total
    return int(min(n["Resources"].get("memory", 0) for n in nodes) / 0.7)


@dataclass
class PlanSummary:
    """The memory plan as search.json and the search run record it (``plan``; to_dict)."""

    device: str  # "cuda" or "cpu"
    concurrent: int  # trials at once
    gpus_per_trial: float
    cpus_per_trial: float
    limit: str  # what bounds the trials at once: "gpu memory", "host memory", "cpus", ...
    per_trial_mb: int  # the largest fitting config's estimate (per rank with ranks)
    budget_mb: int  # the memory one trial (rank) may use
    ranks: int | None = None  # processes per trial, where more than one
    sharding: str | None = None  # of a trial's ranks ("fsdp", or "none": DDP), where more than one

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None or k not in ("ranks", "sharding")}


@dataclass
class Placement:
    device: str  # "cuda" or "cpu": where the trials run
    plan: packing.Plan
    resources: dict[str, float]  # Ray's per-trial request
    concurrency: int
    budget_bytes: int  # device memory one rank may use: its GPU share (a whole GPU with ranks), or host RAM on a CPU
    estimate_of: Callable[[dict[str, Any]], memory.MemoryEstimate] = field(repr=False)  # per rank
    notes: list[str] = field(default_factory=list)  # what the plan changed of the user's options
    ranks: int = 1  # processes per trial: one per GPU, or CPU processes (gloo)
    sharding: str | None = None  # of trials whose params name none: "fsdp", or None (DDP, or a single process)
    capped: str | None = None  # why fewer trials run at once than fit: the search's share of a shared cluster

    def check(self, params: dict[str, Any]) -> str | None:
        """Why this config cannot run within its share, with the numbers; None when it fits."""
        need = self.estimate_of(params)
        if need.total <= self.budget_bytes:
            return None
        if self.device == "cuda":
            share = (f"one GPU of its {self.ranks}" if self.ranks > 1
                     else f"its share of the GPU ({self.resources['gpu']:g})")
        else:
            share = "its share of host RAM" + (f" per process ({self.ranks} each)" if self.ranks > 1 else "")
        return (f"not run: tuner.trial.memory estimates {need.describe()}, over {share}: "
                f"{self.budget_bytes / memory.GiB:.1f} GiB; try LoRA, a smaller batch or activation checkpointing")

    def largest_bytes(self) -> int:
        """The largest fitting corner's need: per rank when a trial has several."""
        return max(f.needs for f in self.plan.fits if f.fits)

    def _ranks_text(self) -> str:
        unit = "GPUs" if self.device == "cuda" else "processes"
        return f"{self.ranks} {unit} each ({self.ranks} ranks, {self.sharding or 'ddp'})"

    def describe(self) -> str:
        share = f", {self.resources['gpu']:g} GPU each" if self.device == "cuda" else ""
        if self.ranks > 1:
            share = f", {self._ranks_text()}"
        per = "rank" if self.ranks > 1 else "trial"
        return (f"{self.concurrency} at a time{share} (memory plan: up to ~{self.largest_bytes() / memory.GiB:.1f} "
                f"GiB per {per}, bounded by {self.plan.limit})")

    def summary(self) -> PlanSummary:
        """What search.json and the parent run record of the plan (per_trial_mb is per rank with ranks)."""
        several = self.ranks > 1
        return PlanSummary(self.device, self.concurrency, self.resources["gpu"], self.resources["cpu"],
                           self.plan.limit, round(self.largest_bytes() / memory.MiB),
                           round(self.budget_bytes / memory.MiB), ranks=self.ranks if several else None,
                           sharding=(self.sharding or "none") if several else None)


def memory_corners(space: SearchSpace, limit: int = MAX_CORNERS) -> list[dict[str, Any]]:
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


def for_search(o: SearchOptions, model_path: str, space: SearchSpace, ray: ModuleType) -> Placement:
    """The memory plan for a search (its options, model and space) on the Ray cluster it runs on."""
    from tuner.search._prepare import trial_ranks

    cluster = Cluster.of_ray(ray)
    ranks, gpus = trial_ranks(o), o.gpus_per_trial
    if gpus is None and cluster.gpus > 0 and ranks > 1:
        gpus = ranks  # --processes-per-trial N on GPUs: a process per GPU
    on_gpu = cluster.gpus > 0 if gpus is None else gpus > 0
    placed = place(o.entry, model_path, space, cluster, cpus_per_trial=o.cpus_per_trial, gpus_per_trial=gpus,
                   concurrency=o.concurrency, processes_per_trial=1 if on_gpu else ranks)
    placed.concurrency, placed.capped = share_cap(placed, cluster, cluster_share=o.cluster_share, max_gpus=o.max_gpus)
    return placed


def place(entry: Adapter, model_path: str, space: SearchSpace, cluster: Cluster, *, cpus_per_trial: float,
          gpus_per_trial: float | None, concurrency: int | None, headroom: float = 0.85,
          processes_per_trial: int = 1) -> Placement:
    """How many trials at once and what each asks of Ray, from the memory every config of ``space`` needs.
    ``gpus_per_trial`` of 2 or more: whole GPUs, a rank on each. ``processes_per_trial``: ranks of a CPU trial."""
    from transformers import AutoConfig

    on_gpu = cluster.gpus > 0 if gpus_per_trial is None else gpus_per_trial > 0
    device = "cuda" if on_gpu else "cpu"
    if processes_per_trial < 1 or (on_gpu and processes_per_trial != 1):
        raise TunerError(f"processes_per_trial={processes_per_trial}: at least 1, and for CPU trials only (a GPU "
                         "trial has one process per GPU: --gpus-per-trial)")
    model_config = AutoConfig.from_pretrained(model_path)
    corners = memory_corners(space)
    gpu_usable = cluster.gpu_memory_bytes * headroom

    def estimator(ranks: int, sharding: str | None, force: bool = False
                  ) -> Callable[[dict[str, Any]], memory.MemoryEstimate]:
        """Per-rank estimates at ``ranks``; ``sharding`` for params that name none (for all of them: ``force``)."""
        def estimate_of(params: dict[str, Any]) -> memory.MemoryEstimate:
            merged = {**space.fixed, **params}
            chosen = sharding if force else merged.get("sharding", sharding)
            return memory.estimate_trial(entry, model_config, merged, device=device, ranks=ranks,
                                         sharding=chosen or "none")
        return estimate_of

    def largest(ranks: int, sharding: str | None, force: bool = False) -> memory.MemoryEstimate:
        estimate_of = estimator(ranks, sharding, force)
        return max((estimate_of(c) for c in corners), key=lambda e: e.total)

    notes: list[str] = []
    ranks, sharding, whole, spread = 1, None, None, None
    if not on_gpu:
        ranks = processes_per_trial
    elif gpus_per_trial is not None and gpus_per_trial > 1:
        if gpus_per_trial != int(gpus_per_trial):
            raise TunerError(f"--gpus-per-trial {gpus_per_trial}: above 1, a trial takes whole GPUs (one process "
                             "each): 2, 4, 8, ...")
        whole = ranks = int(gpus_per_trial)
        if ranks > cluster.node_gpus:
            raise TunerError(f"--gpus-per-trial {ranks}: a trial's GPUs share one node, which has {cluster.node_gpus}")
        # DDP where every rank holds the whole model (no all-gathers: the faster), else FSDP's shards.
        ddp = largest(ranks, None)
        if ddp.total > gpu_usable:
            sharding = "fsdp"
            notes.append(f"--gpus-per-trial {ranks}: trials shard the model (FSDP full shard); under DDP every "
                         f"rank would need ~{ddp.total / memory.GiB:.1f} GiB ({gpu_usable / memory.GiB:.1f} GiB usable)")
    elif gpus_per_trial is None and cluster.node_gpus > 1:
        if largest(1, None).total > gpu_usable:
            spread = packing.gpus_needed(lambda n: largest(n, "fsdp" if n > 1 else None, force=True),
                                         gpus_per_node=cluster.node_gpus, gpu_memory_bytes=cluster.gpu_memory_bytes,
                                         headroom=headroom)
            if spread.gpus is not None:
                whole = ranks = spread.gpus
                sharding = "fsdp"
                notes.append(f"a trial spans {ranks} GPUs (FSDP full shard): ~{spread.per_rank / memory.GiB:.1f} GiB "
                             f"per rank; one GPU would need ~{spread.one_gpu / memory.GiB:.1f} GiB "
                             f"({gpu_usable / memory.GiB:.1f} GiB usable)")
            else:
                notes.append(f"the space's largest configs fit no GPU, nor a node's GPUs together (they are "
                             f"recorded as too_big): {spread.reason}")

    estimate_of = estimator(ranks, sharding)
    # Ray holds cpus_per_trial CPUs for a trial, and each of its processes needs a CPU of its own.
    slots = max(1, int(cluster.cpus // (max(cpus_per_trial, ranks) if ranks > 1 else cpus_per_trial)))
    plan = packing.plan([estimate_of(c) for c in corners], gpus=cluster.gpus if on_gpu else 0,
                        gpu_memory_bytes=cluster.gpu_memory_bytes, host_memory_bytes=cluster.host_memory_bytes,
                        cpus=slots * ranks, headroom=headroom, gpus_per_trial=whole)
    if not plan.concurrent:
        reason = next(f.reason for f in plan.fits if f.reason)
        if spread is not None and spread.gpus is None:
            reason = spread.reason  # what a node's GPUs together would hold says more than one GPU alone
        raise TunerError(f"--model {model_path}: no config of the space fits this machine: {reason}")
    if on_gpu and whole:
        share = float(whole)
        bound = min(plan.concurrent, cluster.whole_gpu_trials(whole))
        budget = int(gpu_usable)  # a whole GPU per rank
    elif on_gpu:
        share = plan.gpus_per_trial if gpus_per_trial is None else gpus_per_trial
        bound = min(plan.concurrent if gpus_per_trial is None else plan.concurrent * 10**6,
                    int(cluster.gpus / share + 1e-9), slots)
        budget = int(gpu_usable * share)
        if gpus_per_trial is not None:  # the user's share: the host memory bound still holds
            bound = min(bound, int(cluster.host_memory_bytes * headroom // max(f.host for f in plan.fits if f.fits)))
    else:
        share = 0.0
        bound = plan.concurrent
        budget = int(cluster.host_memory_bytes * headroom // (bound * ranks))  # per process
    wanted = concurrency or bound
    if concurrency and concurrency > bound:
        notes.append(f"--concurrency {concurrency} lowered to {bound}: more trials at once do not fit ({plan.limit})")
    # A CPU trial's ranks each want a CPU: Ray holds them for it, or two such trials would share the same cores.
    cpus = min(max(cpus_per_trial, ranks), max(1, cluster.cpus)) if not on_gpu and ranks > 1 else cpus_per_trial
    return Placement(device=device, plan=plan, resources={"cpu": cpus, "gpu": share},
                     concurrency=max(1, min(wanted, bound)), budget_bytes=budget, estimate_of=estimate_of, notes=notes,
                     ranks=ranks, sharding=sharding)


def share_cap(placement: Placement, cluster: Cluster, *, cluster_share: float | None,
              max_gpus: float | None) -> tuple[int, str | None]:
    """The trials at once a search may hold of a shared cluster: ``cluster_share`` of its GPUs (of its CPUs for
    CPU trials) and at most ``max_gpus`` GPUs; at least one trial. With the note that says why, when it caps."""
    if cluster_share is None and max_gpus is None:
        return placement.concurrency, None
    share = 1.0 if cluster_share is None else cluster_share
    gpu = placement.resources["gpu"]  # a trial's GPUs: its share of one, or its whole GPUs
    if placement.device == "cuda" and gpu > 0:
        held = cluster.gpus * share if max_gpus is None else min(cluster.gpus * share, max_gpus)
        bound, what = int(held / gpu + 1e-9), f"{held:g} of the cluster's {cluster.gpus} GPUs"
    else:
        held = cluster.cpus * share
        bound, what = int(held / max(placement.resources["cpu"], 1e-9) + 1e-9), \
            f"{held:g} of the cluster's {cluster.cpus} CPUs"
    bound = max(1, bound)
    if bound >= placement.concurrency:
        return placement.concurrency, None
    flags = []
    if cluster_share is not None:
        flags.append(f"--cluster-share {cluster_share:g}")
    if max_gpus is not None:
        flags.append(f"--max-gpus {max_gpus:g}")
    return bound, f"{bound} trial{'s' if bound > 1 else ''} at a time ({' and '.join(flags)}: {what})"
