"""Per-trainer adapters: a trial's sampled params -> a TRL config, a model, and a TRL trainer.

One plain dict, ``ADAPTERS``, maps a trainer name to what differs between trainers; everything
else (precision, LoRA, logging every step with the nan/inf filter off) is shared.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from tuner.errors import TunerError

LORA_PARAMS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")

# precision -> (weight dtype, TrainingArguments flag turned on). "-pure" is the weights' own
# dtype with no autocast (the "torch_dtype half" reports); "-mixed" keeps fp32 weights.
PRECISION_SETTINGS = {
    "fp32": ("float32", None),
    "bf16-mixed": ("float32", "bf16"),
    "fp16-mixed": ("float32", "fp16"),
    "bf16-pure": ("bfloat16", None),
    "fp16-pure": ("float16", None),
}


@dataclass(frozen=True)
class Adapter:
    config_class: str  # name in `trl`
    trainer_class: str  # name in `trl`
    script: str  # TRL CLI script module whose parser must accept our exported YAML
    lora_task_type: str  # PEFT task type: reward models are sequence classifiers
    sequence_classifier: bool = False
    progress_metric: str = "loss"  # what learning is judged on (tuner.learning): the loss, or GRPO's reward


ADAPTERS: dict[str, Adapter] = {
    "grpo": Adapter("GRPOConfig", "GRPOTrainer", "trl.scripts.grpo", "CAUSAL_LM", progress_metric="reward"),
    "dpo": Adapter("DPOConfig", "DPOTrainer", "trl.scripts.dpo", "CAUSAL_LM"),
    "kto": Adapter("KTOConfig", "KTOTrainer", "trl.scripts.kto", "CAUSAL_LM"),
    "reward": Adapter("RewardConfig", "RewardTrainer", "trl.scripts.reward", "SEQ_CLS", sequence_classifier=True),
    "sft": Adapter("SFTConfig", "SFTTrainer", "trl.scripts.sft", "CAUSAL_LM"),
}


def adapter(trainer: str) -> Adapter:
    if trainer not in ADAPTERS:
        raise TunerError(f"unknown trainer {trainer!r}; choose one of {', '.join(ADAPTERS)}")
    return ADAPTERS[trainer]


def config_class(trainer: str):
    return getattr(importlib.import_module("trl"), adapter(trainer).config_class)


def config_fields(trainer: str) -> set[str]:
    """Names a search space may set for this trainer (the TRL config's dataclass fields)."""
    return {f.name for f in dataclasses.fields(config_class(trainer))}


@dataclass
class SplitParams:
    """A trial's params, split by where each one goes."""

    precision: str
    use_peft: bool
    lora: dict[str, Any]
    config: dict[str, Any]  # TRL config fields


def split_params(params: dict[str, Any]) -> SplitParams:
    params = dict(params)
    precision = params.pop("precision", "fp32")
    if precision not in PRECISION_SETTINGS:
        raise TunerError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISION_SETTINGS)}")
    use_peft = bool(params.pop("use_peft", False))
    lora = {k: params.pop(k) for k in LORA_PARAMS if k in params}
    return SplitParams(precision, use_peft, lora, params)


def precision_flags(precision: str) -> dict[str, bool]:
    _, flag = PRECISION_SETTINGS[precision]
    return {"bf16": flag == "bf16", "fp16": flag == "fp16"}


def lora_config_kwargs(trainer: str, lora: dict[str, Any]) -> dict[str, Any]:
    """PEFT LoraConfig kwargs; defaults follow TRL's ModelConfig so the export means the same run."""
    targets = lora.get("lora_target_modules", "all-linear")
    return {
        "task_type": adapter(trainer).lora_task_type,
        "r": int(lora.get("lora_r", 16)),
        "lora_alpha": int(lora.get("lora_alpha", 32)),
        "lora_dropout": float(lora.get("lora_dropout", 0.05)),
        "target_modules": targets,
    }


def build_trainer(trainer: str, model_path: str, params: dict[str, Any], dataset, run: dict[str, Any],
                  reward_funcs: list | None = None, callbacks: list | None = None):
    """The real TRL trainer for one trial.

    ``run`` holds the settings every trial shares (max_steps, seed, output_dir, use_cpu); the
    ones forced here keep the guard's view honest: a log every optimizer step, and no nan/inf
    filter, which would otherwise rewrite a NaN loss as the running mean.
    """
    import torch
    import trl
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
                              PrinterCallback, set_seed)

    a = adapter(trainer)
    split = split_params(params)
    args = {
        **split.config,
        **precision_flags(split.precision),
        **run,
        "logging_steps": 1,
        "logging_nan_inf_filter": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    config = getattr(trl, a.config_class)(**args)

    dtype = getattr(torch, PRECISION_SETTINGS[split.precision][0])
    # Trainer seeds itself only after the model exists, and a reward model's score head is newly
    # initialised at load: seed first, or the same trial spec trains a different model every run.
    set_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if a.sequence_classifier:
        model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1, dtype=dtype)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)

    peft_config = None
    if split.use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(**lora_config_kwargs(trainer, split.lora))

    kwargs = dict(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                  peft_config=peft_config, callbacks=callbacks)
    if trainer == "grpo":
        kwargs["reward_funcs"] = reward_funcs
    built = getattr(trl, a.trainer_class)(**kwargs)
    # With tqdm off, Trainer prints every log dict; tuner reports progress itself.
    built.remove_callback(PrinterCallback)
    return built
