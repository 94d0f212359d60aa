"""Precision modes, one row each: how a trial loads and trains, what it needs, what TRL flags it exports.

    PRECISIONS["fp16-mixed"].grad_scaler          # True: fp32 weights, fp16 autocast, a GradScaler
    PRECISIONS["bf16-pure"].weight_dtype          # "bfloat16": the weights themselves are half ("torch_dtype half")
    unsupported(on_gpu=False)                     # {"fp16-mixed": "fp16 mixed precision ... needs a CUDA GPU"}
    slow_here(on_gpu=False, built_here=False)     # {"fp16-pure": "float16 weights train about 10x slower ..."}

"-pure" is the weights' own dtype with no autocast (the reports of a model loaded in half precision);
"-mixed" keeps fp32 weights and autocasts the forward pass. Adding a mode is one row here (and the
spaces that search it).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import TunerError

__all__ = ["DEFAULT", "NAMES", "PRECISIONS", "Precision", "order", "precision", "slow_here", "unsupported"]


@dataclass(frozen=True)
class Precision:
    name: str
    weight_dtype: str  # torch dtype the model is loaded in (TRL's ModelConfig.dtype in the export)
    autocast_dtype: str | None  # the dtype of the autocast forward pass, None: no autocast
    grad_scaler: bool  # fp16 autocast scales the loss (torch GradScaler): skipped steps are normal while it calibrates
    needs_cuda: bool  # not a real training mode on a CPU
    slow_on_cpu: bool  # a CPU trains a real model about 10x slower in it than in fp32: not searched there
    trl_flags: tuple[tuple[str, bool], ...]  # TrainingArguments flags, all of them (an unset bf16 defaults to on)

    @property
    def flags(self) -> dict[str, bool]:
        return dict(self.trl_flags)

    @property
    def compute_dtype(self) -> str:
        """The dtype the forward pass computes in: the autocast dtype, else the weights' own."""
        return self.autocast_dtype or self.weight_dtype

    @property
    def uses_bfloat16(self) -> bool:
        return "bfloat16" in (self.weight_dtype, self.autocast_dtype)


def _row(name: str, weights: str, autocast: str | None = None, *, needs_cuda: bool = False,
         slow_on_cpu: bool = False) -> Precision:
    flags = (("bf16", autocast == "bfloat16"), ("fp16", autocast == "float16"))
    return Precision(name, weights, autocast, grad_scaler=autocast == "float16", needs_cuda=needs_cuda,
                     slow_on_cpu=slow_on_cpu, trl_flags=flags)


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    _row("fp32", "float32"),
    _row("bf16-mixed", "float32", "bfloat16"),
    # On a CPU, autocast + GradScaler in float16 is not a real training mode: torch's CPU GradScaler exists,
    # but fp16 mixed precision is a GPU feature users never run on a CPU.
    _row("fp16-mixed", "float32", "float16", needs_cuda=True),
    _row("bf16-pure", "bfloat16"),
    # Measured on SmolLM2-135M-Instruct, one thread of a 2-core CPU: about 30 s a step in float16 weights against
    # 2-4 s in fp32 and 1.4-2.3 s in bf16 (CPUs have no float16 matmul kernels worth the name). On tuner's own
    # tiny models a step costs milliseconds either way, and that is where the float16 failures are reproduced.
    _row("fp16-pure", "float16", slow_on_cpu=True),
)}
DEFAULT = "fp32"  # a trial whose params name no precision
NAMES = tuple(PRECISIONS)  # in the table's order: how reports and plots list them


def order(name: str) -> int:
    """Sort key: the table's order, unknown names last."""
    return NAMES.index(name) if name in NAMES else len(NAMES)


def precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise TunerError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def unsupported(on_gpu: bool, bf16_supported: bool = True) -> dict[str, str]:
    """Precisions this hardware cannot run, each with why: dropped with one warning, never run as something else."""
    cannot = {}
    for p in PRECISIONS.values():
        if p.needs_cuda and not on_gpu:
            cannot[p.name] = f"{p.name} ({p.autocast_dtype} autocast + GradScaler) needs a CUDA GPU"
        elif on_gpu and p.uses_bfloat16 and not bf16_supported:
            cannot[p.name] = "this GPU has no bfloat16 support"
    return cannot


def slow_here(on_gpu: bool, built_here: bool) -> dict[str, str]:
    """Precisions left out of a sampled space because this hardware trains the model an order of magnitude slower
    in them (a trial would spend the search's time on one config), each with why. Only on a CPU, and not for
    tuner's own tiny models (``built_here``), whose steps cost milliseconds in any precision. A config that names
    one (``--from``, ``tuner verify``) still runs it: the rule is about what to try, not what may run."""
    if on_gpu or built_here:
        return {}
    return {p.name: f"{p.weight_dtype} weights train a real model about 10x slower than fp32 on a CPU (measured on "
                    "SmolLM2-135M-Instruct: ~30 s a step against 2-4 s); search it on a GPU, or name it in "
                    "--from / --search-space with no other precision to run it here"
            for p in PRECISIONS.values() if p.slow_on_cpu}
