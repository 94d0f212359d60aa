"""The trainer table: one entry per TRL trainer, and how a trial's params become that trainer.

    adapter("dpo").config_class                 # "DPOConfig": what a search space may set
    adapter("grpo").progress_metric             # "reward": what learning is judged on
    build_trainer("sft", model_path, params, dataset, run)

Everything that differs between trainers is a field of its ``Adapter`` in ``ADAPTERS``; every other module
asks the entry instead of naming trainers. Adding a trainer is one entry here plus its search space YAML
(CONTRIBUTING.md). What all trainers share (precision, LoRA, logging every step with the nan/inf filter off)
is below the table.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Union

from tuner import precision as precisions
from tuner import tasks, tiny_data, weights
from tuner.errors import TunerError

# tuner's own params and what each holds; every other param is a field of the trainer's TRL config.
TUNER_PARAM_TYPES: dict[str, Any] = {
    "precision": Literal[precisions.NAMES],  # a row of tuner.precision
    "use_peft": bool,
    "lora_r": int,
    "lora_alpha": int,
    "lora_dropout": float,
    "lora_target_modules": Union[str, list[str]],
}
LORA_PARAMS = tuple(name for name in TUNER_PARAM_TYPES if name.startswith("lora_"))
SPACES_DIR = Path(str(importlib.resources.files("tuner.search_spaces")))  # search_spaces/, also in a wheel

Row = Callable[[random.Random, int], dict]  # (seeded rng, row index) -> one built-in row
TaskRows = Callable[[int, int], list[dict]]  # (size, seed) -> rows


@dataclass(frozen=True)
class Adapter:
    """One TRL trainer, as tuner needs to know it."""

    name: str  # the --trainer value
    config_class: str  # name in `trl`: its dataclass fields are what a search space may set
    trainer_class: str  # name in `trl`
    script: str  # TRL CLI script module whose parser must accept our exported YAML
    lora_task_type: str  # PEFT task type: reward models are sequence classifiers
    # Column sets the trainer accepts (any one suffices), most explicit first; from its `_prepare_dataset`.
    columns: tuple[tuple[str, ...], ...]
    reads: tuple[str, ...]  # the columns it reads when present (others pass through, e.g. to GRPO rewards)
    tiny_rows: Row  # the built-in data's rows for the embedded tiny model (tuner.tiny_data)
    task_rows: TaskRows  # the built-in data for a pretrained model: exact-answer questions (tuner.tasks)
    sequence_classifier: bool = False
    progress_metric: str = "loss"  # what learning is judged on (tuner.learning): the loss, or GRPO's reward
    # Online: generates its completions and learns from reward functions (GRPO), not from labelled data.
    uses_reward_funcs: bool = False
    # How the export measures max_length on the user's rows: (prompt column, completion column) pairs whose
    # joined texts must fit; None: by the row's own shape (text, messages or prompt+completion); () not measured.
    length_pairs: tuple[tuple[str, str], ...] | None = None
    bool_columns: tuple[str, ...] = ()  # columns that must hold true/false (KTO indexes with its label)
    # Trains on the rows in their order whatever its seed (KTO: TRL's sequential sampler, which its precomputed KL
    # term requires): a trial shuffles them with its seed, or every confirmation seed would train the same batches.
    rows_in_order: bool = False
    space_file: str = ""  # the shipped search space (default: search_spaces/<name>.yaml)

    @property
    def default_space(self) -> Path:
        return SPACES_DIR / (self.space_file or f"{self.name}.yaml")


def _entries(*adapters: Adapter) -> dict[str, Adapter]:
    return {a.name: a for a in adapters}


ADAPTERS: dict[str, Adapter] = _entries(
    Adapter("grpo", "GRPOConfig", "GRPOTrainer", "trl.scripts.grpo", "CAUSAL_LM",
            columns=(("prompt",),), reads=("prompt",), tiny_rows=tiny_data.grpo_row, task_rows=tasks.grpo_rows,
            progress_metric="reward", uses_reward_funcs=True, length_pairs=()),
    Adapter("dpo", "DPOConfig", "DPOTrainer", "trl.scripts.dpo", "CAUSAL_LM",
            # DPO extracts a missing prompt from chosen/rejected.
            columns=(("prompt", "chosen", "rejected"), ("chosen", "rejected")),
            reads=("prompt", "chosen", "rejected"), tiny_rows=tiny_data.preference_row,
            task_rows=tasks.preference_rows, length_pairs=(("prompt", "chosen"), ("prompt", "rejected"))),
    Adapter("kto", "KTOConfig", "KTOTrainer", "trl.scripts.kto", "CAUSAL_LM",
            # KTO unpairs chosen/rejected into completion/label.
            columns=(("prompt", "completion", "label"), ("prompt", "chosen", "rejected"), ("chosen", "rejected")),
            reads=("prompt", "completion", "chosen", "rejected"), tiny_rows=tiny_data.kto_row, task_rows=tasks.kto_rows,
            length_pairs=(("prompt", "completion"),), bool_columns=("label",), rows_in_order=True),
    Adapter("reward", "RewardConfig", "RewardTrainer", "trl.scripts.reward", "SEQ_CLS",
            # The reward trainer takes an optional prompt.
            columns=(("chosen", "rejected"), ("prompt", "chosen", "rejected")),
            reads=("prompt", "chosen", "rejected"), tiny_rows=tiny_data.preference_row, task_rows=tasks.preference_rows,
            sequence_classifier=True,
            length_pairs=(("prompt", "chosen"), ("prompt", "rejected"))),
    Adapter("sft", "SFTConfig", "SFTTrainer", "trl.scripts.sft", "CAUSAL_LM",
            # SFT converts from/value "conversations".
            columns=(("text",), ("prompt", "completion"), ("messages",), ("conversations",)),
            reads=("text", "prompt", "completion", "messages"), tiny_rows=tiny_data.sft_row, task_rows=tasks.sft_rows),
)
DEFAULT_TRAINER = "grpo"  # `tuner search` with neither --trainer nor a space file


def names() -> tuple[str, ...]:
    return tuple(ADAPTERS)


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
    precision = precisions.precision(params.pop("precision", precisions.DEFAULT)).name
    use_peft = bool(params.pop("use_peft", False))
    lora = {k: params.pop(k) for k in LORA_PARAMS if k in params}
    return SplitParams(precision, use_peft, lora, params)


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
        **precisions.PRECISIONS[split.precision].flags,
        **run,
        "logging_steps": 1,
        "logging_nan_inf_filter": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    config = getattr(trl, a.config_class)(**args)

    dtype = getattr(torch, precisions.PRECISIONS[split.precision].weight_dtype)
    # Trainer seeds itself only after the model exists, and a reward model's score head is newly
    # initialised at load: seed first, or the same trial spec trains a different model every run.
    set_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The weights come from the node's one converted copy in shared memory when that pays (tuner.weights).
    trained = not split.use_peft  # full fine-tuning writes them
    if a.sequence_classifier:
        model = weights.from_pretrained(AutoModelForSequenceClassification, model_path, dtype, trained, num_labels=1)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        model = weights.from_pretrained(AutoModelForCausalLM, model_path, dtype, trained)

    peft_config = None
    if split.use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(**lora_config_kwargs(trainer, split.lora))

    kwargs = dict(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                  peft_config=peft_config, callbacks=callbacks)
    if a.uses_reward_funcs:
        kwargs["reward_funcs"] = reward_funcs
    built = getattr(trl, a.trainer_class)(**kwargs)
    # With tqdm off, Trainer prints every log dict; tuner reports progress itself.
    built.remove_callback(PrinterCallback)
    return built
