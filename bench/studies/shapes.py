"""Real models' shapes built locally: published config numbers, random weights, the tiny tokenizer. Nothing
is downloaded; what they measure is set-up, step time and memory at the real size, not learning.

    from bench.studies.shapes import build_shaped_model, QWEN25_05B
    path = build_shaped_model(QWEN25_05B)   # $TUNER_CACHE_DIR/shape-qwen2.5-0.5b, built once (~1 GB, bf16)
    tuner search --model PATH --trainer grpo --trials 2 --max-steps 2
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

# Qwen/Qwen2.5-0.5B's config.json (the numbers that decide size and speed). Its checkpoint is stored in bf16.
QWEN25_05B: dict[str, Any] = {
    "name": "qwen2.5-0.5b",
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}

_MARKER = "tuner-shape.complete"


def shape_dir(shape: dict[str, Any]) -> Path:
    cache = os.environ.get("TUNER_CACHE_DIR") or Path.home() / ".cache" / "tuner"
    return Path(cache).expanduser() / f"shape-{shape['name']}"


def build_shaped_model(shape: dict[str, Any] = QWEN25_05B, path: str | os.PathLike | None = None) -> Path:
    """Write a causal LM of ``shape`` (seeded random weights, the checkpoint's dtype) and the tiny tokenizer
    to ``path`` (default: shape_dir(shape)); a complete build is reused. Built in a staging folder and renamed
    into place, so a half-written folder is never taken for a model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tuner.inputs.models import build_tiny_tokenizer

    path = Path(path or shape_dir(shape)).absolute()
    if (path / _MARKER).is_file():
        return path
    tokenizer = build_tiny_tokenizer()
    numbers = {k: v for k, v in shape.items() if k not in ("name", "model_type", "dtype")}
    config = AutoConfig.for_model(shape["model_type"], **numbers, pad_token_id=tokenizer.pad_token_id,
                                  eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    dtype = getattr(torch, shape["dtype"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / _MARKER).write_text(shape["name"] + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.rename(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
