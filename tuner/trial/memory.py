"""How much memory one trial needs, before it runs.

    from transformers import AutoConfig
    from tuner.trial.memory import estimate, estimate_trial
    from tuner.inputs.models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model("Qwen2.5-0.5B"))
    need = estimate_trial(adapter("sft"), config, {"precision": "bf16-mixed", "per_device_train_batch_size": 8})
    need.describe()    # '~11.7 GiB: weights 1.8, gradients 1.8, optimizer 3.7, activations 3.1, logits 0.8, ...'
    estimate_trial(adapter("sft"), config_7b, params, ranks=4, sharding="fsdp")   # per rank of a 4-GPU trial

``estimate`` is the rule itself (the trainer's shape given as keywords); ``estimate_trial`` fills those in
from the trainer name and the installed TRL's config defaults. Both are arithmetic on the model's config:
no model is built and nothing is allocated. How many trials fit at once is the search's: tuner.search._packing.

What each term counts and how accurate it is: docs/architecture.md ("The memory estimate and the plan").
"""

from __future__ import annotations

import functools
import math
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, ClassVar

from tuner.config.trainers import SHARDINGS, Adapter
from tuner.errors import TunerError

__all__ = [
    "ACTIVATION_BYTES",
    "CPU_PROCESS_BASELINE",
    "CUDA_CONTEXT",
    "DTYPE_BYTES",
    "MemoryEstimate",
    "SHARDINGS",
    "count_parameters",
    "estimate",
    "estimate_trial",
    "lora_parameters",
    "measure_process_baseline",
    "needs_reference",
    "precision_bytes",
]

MiB = 2**20
GiB = 2**30

# Bytes per value of each dtype a precision mode names (tuner.config.precision.PRECISIONS: the weights' dtype, and
# autocast's; "-pure" stores the weights in the 2-byte dtype with no autocast, "-mixed" keeps fp32 weights).
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

# What autograd keeps per token and decoder layer, in bytes: (per hidden unit, per key/value width unit
# (num_key_value_heads x head_dim), per MLP intermediate unit), keyed by (LoRA, 2-byte weights).
# Measured with torch.autograd.graph.saved_tensors_hooks on transformers 5.23 Qwen2 decoder layers (SDPA
# attention), fitted over 5 layer shapes (exact, residual 0): e.g. full fp32 = 4 bytes x (9H + 2kv + 4I):
# the RMSNorms' inputs and outputs, q/k/v/output for SDPA, o_proj's input, and gate, up, SiLU(gate) and the
# product for the MLP. "-pure" adds the fp32 copies HF's RMSNorm makes. LoRA (PEFT 0.21, r=16, dropout 0.05,
# all-linear) keeps each adapted layer's dropped-out input in fp32. "-mixed" is counted as fp32: CPU
# autocast kept 96% (full) and 85% (LoRA) of fp32's bytes; it keeps fp32 norm inputs and residuals.
# For scale: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
# give 34 bytes x hidden per token and layer for a 16-bit GPT layer with a 4x non-gated MLP and dropout.
ACTIVATION_BYTES: dict[tuple[bool, bool], tuple[int, int, int]] = {
    (False, False): (36, 8, 16),  # full fine-tuning, fp32 / -mixed
    (False, True): (23, 4, 8),  # full fine-tuning, -pure
    (True, False): (58, 8, 20),  # LoRA, fp32 / -mixed
    (True, True): (54, 4, 14),  # LoRA, -pure
}
# With activation checkpointing each decoder layer keeps only its input: bytes per token and hidden unit,
# measured the same way (8 with fp32 residuals, 5 with 2-byte ones; LoRA keeps less, 6 and 4).
CHECKPOINTED_BYTES: dict[bool, int] = {False: 8, True: 5}  # keyed by 2-byte weights
# Eager attention also keeps the fp32 softmax of every score: bytes per (head x key position) per token,
# measured 5-6 on the same layers. SDPA and flash attention keep no scores.
EAGER_SCORE_BYTES = 6

# TRL's fused LM head (trl.trainer.utils.add_fused_lm_head, TRL >= 1.x) computes logits in tiles of
# trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE tokens x trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE vocabulary
# entries; read from the installed TRL when it has them, else these (TRL 1.16's).
FUSED_TILE = (4096, 32768)
# Tile-sized buffers alive at once: on a GPU the Triton kernel folds the tile in place (1, compute dtype);
# on a CPU TRL's torch fallback makes fp32 temporaries of the tile (z, exp, products, the gradient: ~7).
FUSED_TILE_COPIES = {"cuda": 1, "cpu": 7}
# Without the fused head (older TRL): the fp32 logits and log_softmax's saved output, batch x seq x vocab each.
UNFUSED_LOGIT_COPIES = 2

# The CUDA context and the kernels' modules on the GPU, invisible to torch.cuda.max_memory_allocated:
# ~300-800 MB depending on the GPU and CUDA version (pytorch/pytorch#34323 reports 781 MB before lazy
# module loading, the default since CUDA 11.7).
CUDA_CONTEXT = 500 * MiB
# The resident set of a Python process that imported torch, transformers, TRL, PEFT and datasets:
# measure_process_baseline() gave 462 MiB (torch 2.13 CPU build, transformers 5.23, TRL 1.16, Linux x86-64);
# tests/training/trial/test_memory_training.py measures it again and checks this figure against it.
CPU_PROCESS_BASELINE = 462 * MiB
# What a training run adds beyond its tensors (tokenizer, dataset tables, accelerate state, thread pools):
# `tuner trial` on the tiny model (tensors < 1 MiB) peaked at 515 MiB against the 462 MiB baseline.
CPU_TRAINER_RUNTIME = 50 * MiB
# Host memory a GPU trial's process takes beyond CPU_PROCESS_BASELINE: the CUDA libraries (cuBLAS, cuDNN,
# NCCL) mapped into it. An assumption (no GPU was at hand to measure it), ~1 GiB with lazy module loading.
CUDA_HOST_LIBRARIES = 1 * GiB

# How a multi-rank trial splits its model (tuner.config.trainers.SHARDINGS): "none" is DDP (every rank holds
# everything), "fsdp" FSDP FULL_SHARD (ZeRO-3: parameters, gradients and optimizer state divided over the ranks).

# TRL's defaults where a trial's params do not say (TRL 1.16's configs; estimate_trial reads the installed ones).
DEFAULT_BATCH = 8
DEFAULT_CHECKPOINTING = True  # TRL's configs turn gradient_checkpointing on
DEFAULT_LORA_R = 16  # tuner.config.trainers.lora_config_kwargs, TRL's ModelConfig
DEFAULT_LORA_TARGETS = "all-linear"
GENERATION_PROMPT_TOKENS = 512  # GRPO prompts are not truncated in TRL 1.x; older TRL's max_prompt_length

# Model types whose q/k/v projections carry a bias while their config has no attention_bias field.
_QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
# Model types with a per-head RMSNorm on queries and keys (q_norm, k_norm over head_dim).
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
# Model types with four norms per decoder layer (before and after attention and MLP).
_FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}

_MODULE_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# -- the model's shape -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    model_type: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    eager: bool

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_layers(self, sequence_classifier: bool) -> list[tuple[str, int, int]]:
        """(module name as PEFT sees it, in features, out features) for every linear layer, the head last."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        layers = []
        for n in range(self.layers):
            for name in _MODULE_NAMES:
                part = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                layers.append((f"model.layers.{n}.{part}.{name}", *shapes[name]))
        layers.append(("score", h, 1) if sequence_classifier else ("lm_head", h, self.vocab))
        return layers


def _shape(model_config) -> _Shape:
    config = model_config
    if isinstance(config, Mapping):
        config = SimpleNamespace(**config.get("text_config", config))
    elif hasattr(config, "get_text_config"):
        config = config.get_text_config()
    try:
        hidden, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
        vocab = config.vocab_size
    except AttributeError as error:
        raise TunerError(f"model config: {error}; memory planning needs a decoder-only transformer's config "
                         "(hidden_size, num_hidden_layers, num_attention_heads, vocab_size)") from None
    model_type = str(getattr(config, "model_type", "") or "")
    attention_bias = getattr(config, "attention_bias", None)
    return _Shape(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or hidden // heads,
        intermediate=getattr(config, "intermediate_size", None) or 4 * hidden,
        vocab=vocab,
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        model_type=model_type,
        qkv_bias=bool(attention_bias) if attention_bias is not None else model_type in _QKV_BIAS,
        o_bias=bool(attention_bias),
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        eager=getattr(config, "_attn_implementation", None) == "eager",
    )


def count_parameters(model_config, *, sequence_classifier: bool = False) -> int:
    """Parameters of the model the config describes (tied embeddings counted once), as
    ``sum(p.numel() for p in model.parameters())`` counts them; a sequence classifier has a 1-output score head."""
    s = _shape(model_config)
    return s.layers * _layer_parameters(s) + _outer_parameters(s, sequence_classifier)


def _layer_parameters(s: _Shape) -> int:
    """Parameters of one decoder layer."""
    per_layer = sum(fan_in * fan_out for _, fan_in, fan_out in s.linear_layers(False)[:len(_MODULE_NAMES)])
    per_layer += (s.q_width + 2 * s.kv_width) * s.qkv_bias + s.hidden * s.o_bias
    per_layer += (2 * s.intermediate + s.hidden) * s.mlp_bias
    per_layer += s.hidden * (4 if s.model_type in _FOUR_NORMS else 2)
    return per_layer + 2 * s.head_dim * (s.model_type in _QK_NORM)


def _outer_parameters(s: _Shape, sequence_classifier: bool) -> int:
    """Parameters outside the decoder layers: embeddings, final norm, and an untied lm_head or a score head."""
    head = s.hidden if sequence_classifier else (0 if s.tied else s.vocab * s.hidden)
    return s.vocab * s.hidden + s.hidden + head


def _targeted(name: str, targets) -> bool:
    """PEFT's rule (peft.tuners.tuners_utils.check_target_module_exists): a string is a regular expression
    matched against the whole module name, a list names modules by their last name parts."""
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def lora_parameters(model_config, *, r: int = DEFAULT_LORA_R, target_modules=DEFAULT_LORA_TARGETS,
                    sequence_classifier: bool = False) -> int:
    """Trainable parameters under LoRA, as PEFT's ``get_nb_trainable_parameters()`` counts them: r x (in + out)
    per targeted linear layer ("all-linear": every one but the output head), plus a sequence classifier's
    score head, which PEFT trains in full (``modules_to_save``)."""
    s = _shape(model_config)
    layers = s.linear_layers(sequence_classifier)
    if target_modules == "all-linear":
        chosen = layers[:-1]
    else:
        chosen = [layer for layer in layers if _targeted(layer[0], target_modules)]
    trainable = sum(r * (fan_in + fan_out) for _, fan_in, fan_out in chosen)
    return trainable + (s.hidden if sequence_classifier else 0)


# -- one trial's estimate --------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """Expected peak memory of one trial, by term, in bytes. ``total`` is what the trial needs of its device
    (the GPU, or the host for a CPU trial); ``host`` what its process needs of the host's RAM. With several
    ``ranks`` every figure is one rank's (one process, one GPU)."""

    device: str
    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    logits: int
    generation: int
    overhead: int
    host: int
    parameters: int  # of the model, adapters not included
    trainable: int
    gathered: int = 0  # FSDP: the unsharded units all-gathered for forward and backward
    buckets: int = 0  # DDP: the gradient buckets of the all-reduce
    ranks: int = 1  # processes of the trial (data parallel, one per GPU)
    sharding: str | None = None  # None: every rank holds everything (DDP with ranks > 1); "fsdp": full shard

    TERMS: ClassVar[tuple[str, ...]] = ("weights", "gradients", "optimizer", "reference", "gathered", "buckets",
                                        "activations", "logits", "generation", "overhead")
    _LABELS: ClassVar[dict[str, str]] = {"gathered": "FSDP gathered", "buckets": "DDP buckets"}

    @property
    def total(self) -> int:
        return sum(getattr(self, term) for term in self.TERMS)

    @property
    def allocated(self) -> int:
        """The total less the overhead: comparable with torch.cuda.max_memory_allocated() on a GPU."""
        return self.total - self.overhead

    def breakdown(self) -> dict[str, int]:
        return {term: getattr(self, term) for term in self.TERMS}

    def describe(self) -> str:
        """One line, e.g. '~11.7 GiB: weights 1.8, gradients 1.8, optimizer 3.7, ... (GiB)' (MiB under 1 GiB);
        with several ranks '~47.0 GiB per rank, 4 ranks, fsdp: weights 7.1, ... (GiB)'."""
        unit, size, digits = ("GiB", GiB, 1) if self.total >= GiB else ("MiB", MiB, 0)
        labels = {**self._LABELS, "overhead": "CUDA context" if self.device == "cuda" else "process"}
        parts = [f"{labels.get(term, term)} {value / size:.{digits}f}" for term, value in self.breakdown().items() if value]
        ranks = f" per rank, {self.ranks} ranks, {self.sharding or 'ddp'}" if self.ranks > 1 else ""
        return f"~{self.total / size:.{digits}f} {unit}{ranks}: {', '.join(parts)} ({unit})"


def precision_bytes(name: str) -> tuple[int, int]:
    """(bytes per stored weight, bytes per value the forward computes in) of a precision mode."""
    from tuner.config.precision import precision

    mode = precision(name)
    return DTYPE_BYTES[mode.weight_dtype], DTYPE_BYTES[mode.autocast_dtype or mode.weight_dtype]


def _checkpointing(params: Mapping[str, Any], default: bool = DEFAULT_CHECKPOINTING) -> bool:
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        if params.get(key) is not None:
            return bool(params[key])
    return default


def _optimizer_state_bytes(optim: Any, param_bytes: int) -> int:
    """Bytes of optimizer state per trainable parameter, by TrainingArguments' optim name."""
    name = str(getattr(optim, "value", optim) or "adamw_torch_fused").lower()
    if "8bit" in name:
        return 2  # two 1-byte states (bitsandbytes)
    if name.startswith("sgd") or "adafactor" in name:
        return 0  # SGD without momentum (HF's default); Adafactor's factored states are ~0
    if "lion" in name:
        return param_bytes  # one momentum state
    return 2 * param_bytes  # Adam(W): exp_avg and exp_avg_sq, in the parameter's dtype


@functools.cache
def _installed_fused_tile() -> tuple[int, int] | None:
    """The installed TRL's fused-LM-head tile (tokens, vocabulary), or None when it has no fused head."""
    try:
        from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE
        from trl.trainer import utils as trl_utils
    except ImportError:
        return None
    if not hasattr(trl_utils, "add_fused_lm_head"):
        return None
    return int(TOKEN_CHUNK_SIZE), int(getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", FUSED_TILE[1]))


def estimate(model_config, *, trainer_needs_reference: bool, sequence_classifier: bool, params: dict,
             max_length: int, completion_length: int = 0, generations: int = 1, device: str = "cuda",
             paired: bool = False, fused_lm_head: bool | None = None, overhead: int | None = None,
             ranks: int = 1, sharding: str | None = None) -> MemoryEstimate:
    """Expected peak memory of one trial of ``params`` (tuner's precision/use_peft/lora_* and TRL's
    per_device_train_batch_size, gradient_checkpointing, optim, ...; TRL's defaults where absent).

    ``max_length``: tokens per sequence (prompt and completion). ``completion_length``/``generations``:
    GRPO's max_completion_length and num_generations (0: no generation). ``paired``: chosen and rejected
    run together (DPO, reward models). ``fused_lm_head``: None = as the installed TRL does. ``overhead``:
    replaces the device's fixed cost (e.g. a measured CPU process baseline). ``ranks``: data-parallel processes
    of the trial, and ``sharding`` how they split the model (None or "none": DDP; "fsdp": full shard); the
    estimate is then one rank's.
    """
    if device not in ("cuda", "cpu"):
        raise TunerError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if ranks < 1:
        raise TunerError(f"ranks must be at least 1, got {ranks}")
    if sharding not in (None, *SHARDINGS):
        raise TunerError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    fsdp = sharding == "fsdp"
    from tuner.config.precision import DEFAULT

    weight_bytes, compute_bytes = precision_bytes(params.get("precision", DEFAULT))
    pure = weight_bytes == 2
    lora = bool(params.get("use_peft", False))
    batch = int(params.get("per_device_train_batch_size", DEFAULT_BATCH))
    s = _shape(model_config)

    total = count_parameters(model_config, sequence_classifier=sequence_classifier)
    if lora:
        trainable = lora_parameters(model_config, r=int(params.get("lora_r", DEFAULT_LORA_R)),
                                    target_modules=params.get("lora_target_modules", DEFAULT_LORA_TARGETS),
                                    sequence_classifier=sequence_classifier)
        trainable_bytes = 4  # PEFT's autocast_adapter_dtype keeps adapters in fp32 whatever the base's dtype
    else:
        trainable, trainable_bytes = total, weight_bytes
    weights = total * weight_bytes + (trainable * trainable_bytes if lora else 0)
    gradients = trainable * trainable_bytes
    optimizer = trainable * _optimizer_state_bytes(params.get("optim"), trainable_bytes)
    reference = total * weight_bytes if trainer_needs_reference and not lora else 0
    # Every rank loads the whole checkpoint on the host before FSDP shards it (a bound: accelerate's
    # cpu_ram_efficient_loading leaves that to rank 0).
    loaded = weights + reference
    gathered = buckets = 0
    if fsdp:
        # FULL_SHARD keeps 1/ranks of every parameter, its gradient and its optimizer state on each rank (rounded
        # up: FSDP pads its flat parameters to a multiple of ranks); TRL wraps the reference model the same way.
        weights, gradients, optimizer, reference = (math.ceil(x / ranks)
                                                    for x in (weights, gradients, optimizer, reference))
        # Each unit's parameters are all-gathered unsharded, in the compute dtype (FSDP's mixed-precision
        # param_dtype), for its forward and again for its backward. Counted twice: the unit at work and the next
        # one, prefetched. The largest unit: one decoder layer (transformers' auto-wrap unit) or the root module's
        # own parameters (embeddings, final norm, an untied lm_head), whichever is larger. LoRA's adapters add
        # under 1% to a layer and are left out.
        unit = max(_layer_parameters(s), _outer_parameters(s, sequence_classifier))
        gathered = 2 * unit * compute_bytes
    elif ranks > 1:
        # DDP all-reduces gradients through buckets that copy them: at most one more copy of the trainable
        # gradients (a bound; gradient_as_bucket_view=True shares the memory instead).
        buckets = gradients

    # Activations of one micro-batch.
    rows = batch * (2 if paired else 1)
    tokens = rows * max_length
    per_h, per_kv, per_i = ACTIVATION_BYTES[(lora, pure)]
    layer = per_h * s.hidden + per_kv * s.kv_width + per_i * s.intermediate
    if s.eager:
        layer += EAGER_SCORE_BYTES * s.heads * max_length
    if _checkpointing(params):
        kept = s.layers * CHECKPOINTED_BYTES[pure] * s.hidden + 2 * layer  # the recomputed layer and its gradients
    else:
        kept = (s.layers + 1) * layer  # every layer, plus the backward pass's working set
    activations = tokens * (kept + 8 * s.hidden)  # + the embedding output and the final norm, fp32

    # Logits: GRPO scores completion tokens only.
    scored = rows * (completion_length or max_length)
    if sequence_classifier:
        logits = rows * max_length * 4
    else:
        tile = _installed_fused_tile() if fused_lm_head is None else (FUSED_TILE if fused_lm_head else None)
        if tile is not None:
            tile_bytes = compute_bytes if device == "cuda" else 4
            logits = min(scored, tile[0]) * min(s.vocab, tile[1]) * tile_bytes * FUSED_TILE_COPIES[device]
            logits += scored * s.hidden * 4  # the hidden states' fp32 gradient accumulator
            if not lora:
                logits += s.vocab * s.hidden * 4  # the lm_head's fp32 gradient accumulator
        else:
            logits = scored * s.vocab * 4 * UNFUSED_LOGIT_COPIES

    # GRPO's generation: the KV cache of one generation batch, and the last position's fp32 logits.
    generation = 0
    if completion_length:
        generations = max(1, int(generations))
        steps = int(params.get("steps_per_generation") or params.get("gradient_accumulation_steps", 1) or 1)
        sequences = int(params.get("generation_batch_size") or batch * steps)
        sequences = math.ceil(sequences / generations) * generations
        generation = sequences * (max_length * s.layers * 2 * s.kv_width * compute_bytes + s.vocab * 4 * 2)

    if overhead is None:
        overhead = CUDA_CONTEXT if device == "cuda" else CPU_PROCESS_BASELINE + CPU_TRAINER_RUNTIME
    need = MemoryEstimate(device=device, weights=weights, gradients=gradients, optimizer=optimizer,
                          reference=reference, activations=activations, logits=logits, generation=generation,
                          overhead=overhead, host=0, parameters=total, trainable=trainable, gathered=gathered,
                          buckets=buckets, ranks=ranks, sharding=sharding if fsdp else None)
    # A CPU trial holds everything in host RAM; a GPU trial's process loads its weights (and the reference
    # copy) on the host before moving them. Both per rank: every rank is a process.
    host = (need.total if device == "cpu"
            else CPU_PROCESS_BASELINE + CPU_TRAINER_RUNTIME + CUDA_HOST_LIBRARIES + loaded)
    return replace(need, host=host)


def _config_defaults(entry: Adapter) -> dict[str, Any]:
    """The trainer's TRL config fields and their defaults (None where a field has none)."""
    import dataclasses

    return {f.name: (None if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(entry.config_type())}


def needs_reference(entry: Adapter, params: Mapping[str, Any]) -> bool:
    """Whether the trainer scores against a reference model: its TRL config has a KL weight ``beta`` and the
    trial's (or TRL's default) is above 0. DPO and KTO default to 0.1, GRPO to 0 (no reference)."""
    defaults = _config_defaults(entry)
    if "beta" not in defaults:
        return False
    beta = params.get("beta", defaults["beta"])
    return beta is not None and float(beta) > 0


def estimate_trial(entry: Adapter, model_config, params: dict, *, device: str = "cuda",
                   prompt_length: int | None = None, ranks: int = 1, sharding: str | None = None,
                   **keywords) -> MemoryEstimate:
    """``estimate`` for one of tuner's trainers, its shape read from the trainer's entry in tuner.config.trainers and
    its TRL config's defaults: batch size, max_length, checkpointing; a trainer that generates (its config
    has num_generations) trains on ``prompt_length`` (default GENERATION_PROMPT_TOKENS) plus
    max_completion_length tokens; one whose every column set holds chosen and rejected runs them as a pair.
    ``sharding`` None: the params' "sharding" ("none" or "fsdp"; DDP when absent). Other keywords go to
    ``estimate``."""
    defaults = _config_defaults(entry)
    used = ("per_device_train_batch_size", "optim", "max_length", "max_completion_length", "num_generations",
            "beta", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size")
    merged = {**{k: defaults[k] for k in used if defaults.get(k) is not None}, **params}
    checkpointing_default = defaults.get("activation_checkpointing")
    if checkpointing_default is None:
        checkpointing_default = defaults.get("gradient_checkpointing", DEFAULT_CHECKPOINTING)
    merged["activation_checkpointing"] = _checkpointing(params, bool(checkpointing_default))
    generates = "num_generations" in defaults
    completion = int(merged.get("max_completion_length") or 0) if generates else 0
    if generates:
        max_length = (prompt_length or GENERATION_PROMPT_TOKENS) + completion
    else:
        max_length = int(merged.get("max_length") or 1024)
    paired = all({"chosen", "rejected"} <= set(columns) for columns in entry.columns)
    return estimate(model_config, trainer_needs_reference=needs_reference(entry, merged),
                    sequence_classifier=entry.sequence_classifier, params=merged, max_length=max_length,
                    completion_length=completion, generations=int(merged.get("num_generations") or 1),
                    device=device, paired=paired, ranks=ranks,
                    sharding=params.get("sharding") if sharding is None else sharding, **keywords)


# -- measured: the CPU process baseline -------------------------------------------------------------


# The peak resident set of this process image, in bytes: /proc's VmHWM, which starts afresh at exec. (ru_maxrss
# does not: a child started from a big process reports at least its parent's resident set at the fork.)
_PEAK_RSS_CODE = """
def peak_rss():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
"""


@functools.cache
def measure_process_baseline(modules: tuple[str, ...] = ("torch", "transformers", "trl", "peft", "datasets")) -> int:
    """Peak resident set, in bytes, of a fresh Python process that imports ``modules`` (what every trial
    imports): a CPU trial's fixed cost. Measured once per process, in a child (~10 s on 2 cores)."""
    code = f"{_PEAK_RSS_CODE}\nimport {', '.join(modules)}\nprint(peak_rss())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise TunerError(f"measuring the process baseline failed: {done.stderr.strip().splitlines()[-1:]}")
    return int(done.stdout.split()[-1])
