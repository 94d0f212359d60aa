"""The real TRL trainer of one trial: its config, model (precision, LoRA) and callbacks.

    build_trainer(adapter("sft"), model_path, params, dataset, run)
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

from tuner.config import precision as precisions
from tuner.config.trainers import FSDP_ARGS, Adapter, lora_config_kwargs, model_load_kwargs, split_params
from tuner.trial import weights


def build_trainer(entry: Adapter, model_path: str, params: dict[str, Any], dataset, run: dict[str, Any],
                  reward_funcs: list | None = None, callbacks: list | None = None):
    """The real TRL trainer for one trial.

    ``run`` holds the settings every trial shares (max_steps, seed, output_dir, use_cpu); the
    ones forced here keep the guard's view honest: a log every optimizer step, and no nan/inf
    filter, which would otherwise rewrite a NaN loss as the running mean.
    """
    import torch
    import trl
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        PrinterCallback,
        set_seed,
    )

    split = split_params(params)
    rank = "RANK" in os.environ  # a rank of a distributed trial (tuner.trial.ranks: torch's elastic launcher)
    # the model is built here, so TRL never reads model_init_kwargs (it would warn and ignore them): they go to
    # from_pretrained below, as TRL's scripts pass them
    args = {
        **{k: v for k, v in split.config.items() if k != "model_init_kwargs"},
        **(FSDP_ARGS if split.sharding == "fsdp" and rank else {}),
        **precisions.PRECISIONS[split.precision].flags,
        **run,
        "logging_steps": 1,
        "logging_nan_inf_filter": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    config_type = getattr(trl, entry.config_class)
    config = config_type(**current_names(config_type, args))

    dtype = getattr(torch, precisions.PRECISIONS[split.precision].weight_dtype)
    # Trainer seeds itself only after the model exists, and a reward model's score head is newly
    # initialised at load: seed first, or the same trial spec trains a different model every run.
    set_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The weights come from the node's one converted copy in shared memory when that pays (tuner.trial.weights).
    trained = not split.use_peft  # full fine-tuning writes them
    load = model_load_kwargs(split.model, split.config, dtype)
    auto_class = AutoModelForSequenceClassification if entry.sequence_classifier else AutoModelForCausalLM
    if entry.sequence_classifier:
        load["num_labels"] = 1
    if "quantization_config" in load or "revision" in load:  # not the node's shared full-precision copy
        model = auto_class.from_pretrained(model_path, dtype=dtype, **load)
    else:
        model = weights.from_pretrained(auto_class, model_path, dtype, trained, **load)
    if entry.sequence_classifier:
        model.config.pad_token_id = tokenizer.pad_token_id

    peft_config = None
    if split.use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(**lora_config_kwargs(entry, split.lora))

    kwargs = dict(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                  peft_config=peft_config, callbacks=callbacks)
    if entry.uses_reward_funcs:
        kwargs["reward_funcs"] = reward_funcs
    with trained_quietly():  # PEFT reads the renamed is_gradient_checkpointing as it wraps the model for LoRA
        built = getattr(trl, entry.trainer_class)(**kwargs)
    # With tqdm off, Trainer prints every log dict; tuner reports progress itself.
    built.remove_callback(PrinterCallback)
    return built


# transformers 5 renamed these (the old names warn "deprecated ... removed in v6" every time a config is built);
# TRL's configs still declare the old ones, gradient_checkpointing defaulting to True.
RENAMED_ARGS = (("gradient_checkpointing", "activation_checkpointing"),
                ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"))

# transformers 5 renamed the model's methods too, and TRL (1.16) and PEFT (0.21) still call the old ones: TRL while
# it trains, around every generation (GRPO: trl.models.utils._unwrap_model_for_generation) and every reference pass
# (DPO, KTO: disable_gradient_checkpointing), whether checkpointing is on or not; PEFT as it wraps a model for LoRA
# (PeftModel reads is_gradient_checkpointing). Each warns "`...` is deprecated and will be removed in v6" in the
# trial's log about a call neither tuner nor its user makes; trained_quietly ignores exactly these three while a
# trial's trainer is built and while it trains. Any other FutureWarning still shows.
LIBRARY_CALLS_TO_RENAMED = r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` " \
                           r"is deprecated"


@contextlib.contextmanager
def trained_quietly():
    """While a trial's trainer is built and trains: TRL's and PEFT's own calls to transformers' renamed checkpointing
    methods warn nothing (the warnings filters are restored after)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LIBRARY_CALLS_TO_RENAMED, category=FutureWarning)
        yield


def current_names(config_type, args: dict[str, Any]) -> dict[str, Any]:
    """A trial's TRL config arguments under transformers' current names, TRL's defaults for them kept: the same
    config, built without a FutureWarning in every trial's log. A transformers without the new names: unchanged."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(config_type)}
    args = dict(args)
    for old, new in RENAMED_ARGS:
        if new not in fields or old not in fields:
            continue
        if old in args:
            value = args.pop(old)
            args.setdefault(new, value)
        elif new not in args and fields[old].default is not None:
            args[new] = fields[old].default
    return args
