"""The trainer table: one entry per TRL trainer, and how a trial's params become that trainer.

    adapter("dpo").config_class                 # "DPOConfig": what a search space may set
    adapter("grpo").progress_metric             # "reward": what learning is judged on
    adapter("kto").rows                         # "unpaired": the shape of its built-in rows (tuner.inputs)

Everything that differs between trainers is a field of its ``Adapter`` in ``ADAPTERS``; every other module
asks the entry instead of naming trainers. Adding a trainer is one entry here plus its search space YAML
(CONTRIBUTING.md). What all trainers share (precision, LoRA, logging every step with the nan/inf filter off)
is below the table.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from tuner.config import precision as precisions
from tuner.errors import TunerError

# tuner's own params and what each holds; every other param is a field of the trainer's TRL config.
TUNER_PARAM_TYPES: dict[str, Any] = {
    "precision": Literal[precisions.NAMES],  # a row of tuner.config.precision
    "use_peft": bool,
    "lora_r": int,
    "lora_alpha": int,
    "lora_dropout": float,
    "lora_target_modules": Union[str, list[str]],
    # How a trial of several ranks (tuner.trial.ranks) holds the model: "none" (DDP: every rank a whole copy) or
    # "fsdp" (FSDP2 full sharding: weights, gradients and optimizer state split over the ranks). One rank: no effect.
    "sharding": Literal["none", "fsdp"],  # SHARDINGS
    # The rest of TRL's ModelConfig, as `trl <trainer>` applies it (trl.get_peft_config, get_quantization_config,
    # the scripts' model_init_kwargs): a --from config's model settings reach its trials as written.
    "lora_target_parameters": Union[list[str], None],
    "lora_modules_to_save": Union[list[str], None],
    "lora_task_type": str,
    "use_rslora": bool,
    "use_dora": bool,
    "model_revision": str,
    "attn_implementation": Union[str, None],
    "load_in_4bit": bool,
    "load_in_8bit": bool,
    "bnb_4bit_quant_type": str,
    "use_bnb_nested_quant": bool,
    "bnb_4bit_quant_storage": Union[str, None],
}
SHARDINGS = ("none", "fsdp")
# What "sharding: fsdp" sets in TrainingArguments: FSDP2, full shard, each decoder layer (the model's
# _no_split_modules) its own unit. The export says the same in an accelerate config file (tuner.report.export).
FSDP_ARGS: dict[str, Any] = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"fsdp_version": 2}}
LORA_PARAMS = (*(name for name in TUNER_PARAM_TYPES if name.startswith("lora_")), "use_rslora", "use_dora")
# How a trial loads its model (TRL's ModelConfig): from_pretrained's revision and attention, and bitsandbytes.
MODEL_PARAMS = ("model_revision", "attn_implementation", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
                "use_bnb_nested_quant", "bnb_4bit_quant_storage")
SPACES_DIR = Path(str(importlib.resources.files("tuner.search_spaces")))  # search_spaces/, also in a wheel

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
    # The shape of its built-in rows: a key of tuner.inputs._tiny_data.ROWS (the tiny model's task) and of
    # tuner.inputs.tasks.ROWS (exact-answer questions for a pretrained model).
    rows: Literal["prompt", "preference", "unpaired", "completion"]
    sequence_classifier: bool = False
    progress_metric: str = "loss"  # what learning is judged on (tuner.verdicts.learning): the loss, or GRPO's reward
    # Online: generates its completions and learns from reward functions (GRPO), not from labelled data.
    uses_reward_funcs: bool = False
    # Its loss falls to 0 as its preference margins grow, and its gradient with it (the reward model's
    # -log sigmoid(margin), DPO's sigmoid, IPO and hinge losses, KTO's): a loss near 0 has stopped pushing the weights.
    margin_loss: bool = False
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

    def config_type(self):
        """The TRL config dataclass (imports trl)."""
        return getattr(importlib.import_module("trl"), self.config_class)

    def config_fields(self) -> set[str]:
        """Names a search space may set for this trainer (the TRL config's dataclass fields)."""
        return {f.name for f in dataclasses.fields(self.config_type())}


def _entries(*adapters: Adapter) -> dict[str, Adapter]:
    return {a.name: a for a in adapters}


ADAPTERS: dict[str, Adapter] = _entries(
    Adapter("grpo", "GRPOConfig", "GRPOTrainer", "trl.scripts.grpo", "CAUSAL_LM",
            columns=(("prompt",),), reads=("prompt",), rows="prompt",
            progress_metric="reward", uses_reward_funcs=True, length_pairs=()),
    Adapter("dpo", "DPOConfig", "DPOTrainer", "trl.scripts.dpo", "CAUSAL_LM",
            # DPO extracts a missing prompt from chosen/rejected.
            columns=(("prompt", "chosen", "rejected"), ("chosen", "rejected")),
            reads=("prompt", "chosen", "rejected"), rows="preference", margin_loss=True,
            length_pairs=(("prompt", "chosen"), ("prompt", "rejected"))),
    Adapter("kto", "KTOConfig", "KTOTrainer", "trl.scripts.kto", "CAUSAL_LM",
            # KTO unpairs chosen/rejected into completion/label.
            columns=(("prompt", "completion", "label"), ("prompt", "chosen", "rejected"), ("chosen", "rejected")),
            reads=("prompt", "completion", "chosen", "rejected"), rows="unpaired",
            length_pairs=(("prompt", "completion"),), bool_columns=("label",), rows_in_order=True, margin_loss=True),
    Adapter("reward", "RewardConfig", "RewardTrainer", "trl.scripts.reward", "SEQ_CLS",
            # The reward trainer takes an optional prompt.
            columns=(("chosen", "rejected"), ("prompt", "chosen", "rejected")),
            reads=("prompt", "chosen", "rejected"), rows="preference",
            sequence_classifier=True, margin_loss=True,
            length_pairs=(("prompt", "chosen"), ("prompt", "rejected"))),
    Adapter("sft", "SFTConfig", "SFTTrainer", "trl.scripts.sft", "CAUSAL_LM",
            # SFT converts from/value "conversations".
            columns=(("text",), ("prompt", "completion"), ("messages",), ("conversations",)),
            reads=("text", "prompt", "completion", "messages"), rows="completion"),
)
DEFAULT_TRAINER = "grpo"  # `tuner search` with neither --trainer nor a space file


def names() -> tuple[str, ...]:
    return tuple(ADAPTERS)


def adapter(trainer: str) -> Adapter:
    if trainer not in ADAPTERS:
        raise TunerError(f"unknown trainer {trainer!r}; choose one of {', '.join(ADAPTERS)}")
    return ADAPTERS[trainer]


@dataclass
class SplitParams:
    """A trial's params, split by where each one goes."""

    precision: str
    use_peft: bool
    lora: dict[str, Any]
    config: dict[str, Any]  # TRL config fields
    sharding: str = "none"
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # MODEL_PARAMS: how the model is loaded  # "fsdp": FSDP_ARGS go to TrainingArguments when the trial has several ranks


def split_params(params: dict[str, Any]) -> SplitParams:
    params = dict(params)
    precision = precisions.precision(params.pop("precision", precisions.DEFAULT)).name
    use_peft = bool(params.pop("use_peft", False))
    lora = {k: params.pop(k) for k in LORA_PARAMS if k in params}
    sharding = str(params.pop("sharding", "none"))
    model = {k: params.pop(k) for k in MODEL_PARAMS if k in params}
    return SplitParams(precision, use_peft, lora, params, sharding, model)


def lora_config_kwargs(entry: Adapter, lora: dict[str, Any]) -> dict[str, Any]:
    """PEFT LoraConfig kwargs; defaults follow TRL's ModelConfig so the export means the same run."""
    targets = lora.get("lora_target_modules", "all-linear")
    kwargs = {
        "task_type": lora.get("lora_task_type") or entry.lora_task_type,
        "r": int(lora.get("lora_r", 16)),
        "lora_alpha": int(lora.get("lora_alpha", 32)),
        "lora_dropout": float(lora.get("lora_dropout", 0.05)),
        "target_modules": targets,
    }
    # the rest of ModelConfig's LoRA settings, only where set (as trl.get_peft_config passes them)
    for key, name in (("use_rslora", "use_rslora"), ("use_dora", "use_dora"),
                      ("lora_modules_to_save", "modules_to_save"), ("lora_target_parameters", "target_parameters")):
        if lora.get(key):
            kwargs[name] = lora[key]
    return kwargs


def model_load_kwargs(model: dict[str, Any], config: dict[str, Any], compute_dtype) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments for a trial's MODEL_PARAMS and its TRL config's ``model_init_kwargs``,
    as TRL's scripts build them (revision, attention, trust_remote_code, then the file's own model_init_kwargs); the
    weights' dtype is the trial's precision, never a key here."""
    kwargs: dict[str, Any] = {}
    if model.get("model_revision") not in (None, "main"):
        kwargs["revision"] = model["model_revision"]
    if model.get("attn_implementation"):
        kwargs["attn_implementation"] = model["attn_implementation"]
    if config.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    init = dict(config.get("model_init_kwargs") or {})
    for key in ("dtype", "torch_dtype", "device_map"):  # the precision decides the dtype; a trial places itself
        init.pop(key, None)
    kwargs.update(init)
    if model.get("load_in_4bit") or model.get("load_in_8bit"):
        from transformers import BitsAndBytesConfig

        if model.get("load_in_4bit"):
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_compute_dtype=compute_dtype,
                bnb_4bit_quant_type=model.get("bnb_4bit_quant_type", "nf4"),
                bnb_4bit_use_double_quant=bool(model.get("use_bnb_nested_quant")),
                bnb_4bit_quant_storage=model.get("bnb_4bit_quant_storage"))
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    return kwargs
