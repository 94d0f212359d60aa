"""A user's ``trl <trainer> --config`` file in tuner's terms: trial 0's params, and the search space around them.

    source = read_config("my.yaml", trainer=None)   # TRL's own parser checks it: an unknown key -> TunerError
    source.params           # trial 0: {"precision": "fp16-pure", "learning_rate": 0.3, "use_peft": True, ...}
    space = derive_space(source)                    # fixed: their fields; params: the knobs around their values
    trl_values(source.entry, params)                # the TRL keys and values a trial's params stand for

``tuner search --from my.yaml`` reads the file with this module. The trainer is ``--trainer``, else the file's
own word for it (a comment ``# trl dpo ...``), else the one trainer whose TRL parser knows every key. Their
precision is one row of tuner.config.precision (the weights' ``dtype`` and the ``bf16``/``fp16`` flags as TRL
reads them, TRL's "bf16 on when left out" included), their LoRA settings tuner's ``use_peft``/``lora_*``, their
model, dataset and reward functions the search's ``--model``/``--dataset``/``--reward-func``; every other field
of the trainer's TRL config is a fixed param of every trial, except the run's own plumbing (``HARNESS``: where
it writes, how long, how it logs), which trials set themselves and the export passes through unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.config import precision as precisions
from tuner.config import trainers, trl_keys
from tuner.config.space import CategoricalParam, FloatParam, SearchSpace, parse_space
from tuner.config.user_yaml import read_yaml_file
from tuner.errors import TunerError

__all__ = ["HARNESS", "LR_DOWN", "LR_UP", "SPEED_KNOBS", "SourceConfig", "derive_space", "read_config",
           "space_yaml", "trl_values", "trial0", "narrowed", "flags_over_file",
           "run_here"]

# The run's plumbing: a trial sets these itself (tuner.trial.trainer) and the export passes the user's through.
HARNESS = frozenset({
    "output_dir", "overwrite_output_dir", "max_steps", "num_train_epochs", "logging_steps", "logging_strategy",
    "logging_first_step", "logging_dir", "logging_nan_inf_filter", "report_to", "run_name", "project",
    "trackio_space_id", "save_strategy", "save_steps", "save_total_limit", "save_only_model", "save_safetensors",
    "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
    "hub_revision", "eval_strategy", "eval_steps", "do_eval", "do_train", "do_predict", "eval_on_start",
    "per_device_eval_batch_size", "eval_accumulation_steps", "seed", "data_seed", "use_cpu", "disable_tqdm",
    "dataloader_num_workers", "resume_from_checkpoint", "load_best_model_at_end", "metric_for_best_model",
    "greater_is_better", "log_level", "log_level_replica", "log_on_each_node", "log_completions",
    "num_completions_to_print", "bf16", "fp16",  # the last two: tuner's precision
})
# ModelConfig fields that are tuner's own params (tuner.config.trainers.TUNER_PARAM_TYPES).
LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
# The rest of ModelConfig: each trial applies them as `trl <trainer>` does (tuner.config.trainers.MODEL_PARAMS and
# the LoRA extras).
MODEL_SETTINGS = frozenset(set(trainers.MODEL_PARAMS) | set(trainers.LORA_PARAMS)) - set(LORA_KEYS)
# Keys TRL accepts that a trial does not apply, with what it does instead (said before the trials start).
NOT_IN_TRIALS = {
    "dataset_config": "trials load the dataset's default configuration (give a local file to --dataset for another)",
    "dataset_train_split": "trials train on the dataset's train split",
    "dataset_test_split": "trials do not evaluate",
    "dataset_streaming": "trials load the dataset whole",
    "datasets": "trials train on dataset_name / --dataset, not on a dataset mixture",
    "streaming": "trials load the dataset whole",
    "test_split_size": "trials do not evaluate",
    "reward_model_name_or_path": "trials score completions with reward_funcs / --reward-func only",
    "ignore_bias_buffers": "trials run without DDP's bias-buffer setting (one process)",
    "env": "set in tuner's environment before the trials start, so every trial has it",
}
# The knobs that change tokens/s (tuner.search._staging.SPEED_PARAMS, as far as a derived space varies them): a
# healthy config is changed only in these, and only when a trial measured them faster.
SPEED_KNOBS = ("precision", "per_device_train_batch_size", "gradient_accumulation_steps", "use_peft", "lora_r")
LR_DOWN, LR_UP = 10.0, 10.0  # the learning rate is searched from theirs / LR_DOWN to theirs x LR_UP
_WEIGHTS = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16", "float32": "float32",
            "float": "float32", "auto": "float32", None: "float32"}


@dataclass
class SourceConfig:
    """The user's TRL config file, read and checked; ``params`` is trial 0 (their run, in tuner's terms)."""

    path: str  # absolute
    text: str  # the file as written: the export edits it
    raw: dict[str, Any]  # its mapping, in the file's order
    trainer: str
    params: dict[str, Any]
    effective: dict[str, Any]  # every key TRL reads from it, as TRL reads it (bf16 left out -> true)
    model: str | None = None
    dataset: str | None = None
    reward_funcs: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    launch: dict[str, Any] = field(default_factory=dict)  # the keys `trl` hands to `accelerate launch`

    def set_env(self) -> None:
        """The file's ``env:`` mapping put in this process's environment, as `trl` does; set before trials start,
        every trial process inherits it."""
        import os

        env = self.raw.get("env")
        if isinstance(env, dict):
            os.environ.update({str(k): str(v) for k, v in env.items()})

    @property
    def num_processes(self) -> int | None:
        """Processes per run that their file asks `accelerate launch` for (``num_processes``), if any."""
        value = self.launch.get("num_processes")
        return int(value) if value is not None else None

    @property
    def entry(self) -> trainers.Adapter:
        return trainers.adapter(self.trainer)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SourceConfig":
        return cls(**data)


def _parser(entry: trainers.Adapter):
    return importlib.import_module(entry.script).make_parser()


_NAMED = re.compile(r"\btrl\s+(" + "|".join(trainers.ADAPTERS) + r")\b")


def _trainer_named(text: str) -> str | None:
    """The trainer a comment of the file names (``# trl dpo --config this.yaml``), if any."""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            found = _NAMED.search(line)
            if found:
                return found.group(1)
    return None


def _which_trainer(where: str, raw: dict[str, Any], text: str, trainer: str | None) -> str:
    named = _trainer_named(text)
    if trainer is not None and named is not None and named != trainer:
        raise TunerError(f"{where}: the file says it is for `trl {named}` but --trainer is {trainer}; pass "
                         f"--trainer {named}, or the config you run with trl {trainer}")
    chosen = trainer or named
    if chosen is None:
        fits = [name for name, entry in trainers.ADAPTERS.items()
                if set(raw) <= trl_keys.parser_fields(entry) | trl_keys.launch_keys()]
        if len(fits) != 1:
            among = ", ".join(fits) if fits else "none of " + ", ".join(trainers.ADAPTERS)
            raise TunerError(f"{where}: cannot tell which trainer it is for (its keys fit {among}); pass --trainer "
                             "NAME, or start the file with a comment such as `# trl dpo --config this.yaml`")
        chosen = fits[0]
    return trainers.adapter(chosen).name


def _trl_parse(where: str, path: Path, trainer: str):
    """The file through TRL's own parser, as `trl <trainer> --config` reads it: its objects by class name."""
    import warnings

    import torch

    extra = [] if torch.cuda.is_available() else ["--use_cpu", "true"]  # TRL refuses bf16 on a CPU without it
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                *parsed, launch, _ = _parser(trainers.adapter(trainer)).parse_args_and_config(
                    ["--config", str(path), "--output_dir", out, *extra], return_remaining_strings=True,
                    separate_remaining_strings=True)
                if launch:  # the keys TRL hands to `accelerate launch`: accelerate's parser checks their values
                    from accelerate.commands.launch import launch_command_parser

                    launch_command_parser().parse_args([*_launch_args(launch), "train.py"])
        except SystemExit:  # argparse: a value of the wrong type
            message = (said.getvalue().strip().splitlines() or ["rejected"])[-1]
            message = message.split("error: ", 1)[-1]
            raise TunerError(f"{where}: `trl {trainer} --config` refuses it: {message}; fix that value") from None
        except (ValueError, TypeError) as e:
            message = " ".join(str(e).split())[:300]
            raise TunerError(f"{where}: `trl {trainer} --config` refuses it: {message}") from None
    return {type(obj).__name__: obj for obj in parsed if dataclasses.is_dataclass(obj)}


def _launch_args(strings: list[str]) -> list[str]:
    """TRL's ``--key value`` pairs for accelerate, with accelerate's own name for TRL's ``--accelerate_config``."""
    return ["--config_file" if s == "--accelerate_config" else s for s in strings]


def read_config(path: str | Path, trainer: str | None = None) -> SourceConfig:
    """Read and check a `trl <trainer> --config` file; raises TunerError naming the file and key."""
    where = str(path)
    file = Path(path).expanduser()
    raw, text = read_yaml_file(file, where, "config file", "pass the YAML you give `trl <trainer> --config`")
    if not isinstance(raw, dict) or not raw:
        raise TunerError(f"{where}: a TRL config must be a YAML mapping of settings (model_name_or_path: ..., "
                         "learning_rate: ...)")
    name = _which_trainer(where, raw, text, trainer)
    trl_keys.check_keys(where, raw, name)
    parsed = _trl_parse(where, file, name)
    entry = trainers.adapter(name)
    config = parsed[entry.config_class]
    model_args = parsed.get("ModelConfig")
    effective: dict[str, Any] = {}
    for obj in parsed.values():
        effective.update({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})

    notes: list[str] = []
    params: dict[str, Any] = {"precision": _precision(where, raw, config, notes)}
    if model_args is not None and model_args.use_peft:
        params["use_peft"] = True
        for key in LORA_KEYS:
            if key in raw:
                params[key] = raw[key]
        targets = params.get("lora_target_modules")
        if isinstance(targets, list) and len(targets) == 1:
            params["lora_target_modules"] = targets[0]  # as TRL's ModelConfig reads [all-linear]: the one name
        if "lora_target_modules" not in raw:
            notes.append("lora_target_modules is not set: PEFT's default targets for the model in TRL; trials use "
                         "all-linear")
    fields = entry.config_fields()
    launch: dict[str, Any] = {}
    for key, value in raw.items():
        if key in MODEL_SETTINGS:
            if key in trainers.MODEL_PARAMS or params.get("use_peft"):  # LoRA's extras mean nothing without LoRA
                params[key] = value  # ModelConfig's other settings: applied as each trial loads its model
        elif key in fields and key not in HARNESS and key != "reward_funcs":  # reward_funcs: --reward-func
            params[key] = value  # every field of their trainer's config, mappings included, as written
        elif key in NOT_IN_TRIALS:
            notes.append(f"{key}: {NOT_IN_TRIALS[key]}")
        elif key not in fields and key in trl_keys.launch_keys():
            launch[key] = value
            if key != "num_processes":
                notes.append(f"{key}: `trl {name}` passes it to `accelerate launch` for your run; the trials do not "
                             "(a trial is launched by tuner)")
    rewards = effective.get("reward_funcs") if entry.uses_reward_funcs else None
    return SourceConfig(
        path=str(file.resolve()), text=text, raw=raw, trainer=name, params=params,
        effective={k: _plain(v) for k, v in effective.items()},
        model=raw.get("model_name_or_path"), dataset=raw.get("dataset_name"),
        reward_funcs=[str(r) for r in rewards] if rewards else None, notes=notes, launch=launch)


def flags_over_file(source: SourceConfig, model: str | None, dataset: str | None, reward_funcs: list[str] | None,
                    processes: int | None) -> tuple[dict[str, Any], list[str]]:
    """The file under the command line, as on TRL's own (`trl dpo --config f.yaml --model_name_or_path X`): each
    of --model, --dataset, --reward-func and --processes-per-trial given replaces the file's value, left out it is
    the file's (None where neither says). Returns the values by those names and one line per input saying where
    it came from; a model other than the file's drops the file's ``model_revision`` (a revision of their model)."""
    origins = []
    chosen: dict[str, Any] = {}
    for name, given, flag, key, theirs in (
            ("model", model, "--model", "model_name_or_path", source.model),
            ("dataset", dataset, "--dataset", "dataset_name", source.dataset),
            ("reward_funcs", reward_funcs, "--reward-func", "reward_funcs", source.reward_funcs),
            ("processes", processes, "--processes-per-trial", "num_processes", source.num_processes)):
        chosen[name] = given if given is not None else theirs
        if name == "reward_funcs" and not source.entry.uses_reward_funcs:
            continue
        label = "processes_per_trial" if name == "processes" else name
        shown = ", ".join(given) if isinstance(given, list) else given
        if name == "dataset" and given == "builtin":
            shown = "tuner's built-in data"
        if given is not None and theirs is not None and given != theirs:
            origins.append(f"{label}: {shown} from {flag} (over the file's {key}: {theirs})")
        elif given is not None:
            origins.append(f"{label}: {shown} from {flag}")
        elif theirs is not None:
            origins.append(f"{label}: {', '.join(theirs) if isinstance(theirs, list) else theirs} from the file's "
                           f"{key}")
        elif name == "model":
            origins.append("model: tiny (neither --model nor the file's model_name_or_path)")
        elif name == "dataset":
            origins.append("dataset: tuner's built-in data (neither --dataset nor the file's dataset_name)")
    weights = source.params.get("reward_weights")
    if reward_funcs and isinstance(weights, list) and len(weights) != len(reward_funcs):
        raise TunerError(f"{source.path}: reward_weights: {len(weights)} weights, for the file's reward_funcs, but "
                         f"--reward-func gives {len(reward_funcs)} function(s); pass as many --reward-func as "
                         "weights, or edit reward_weights")
    revision = source.params.get("model_revision")
    if model is not None and model != source.model and revision is not None:
        source.params.pop("model_revision")
        origins.append(f"model_revision: {revision} is the file's model's; not applied to --model {model}")
    return chosen, origins


def run_here(source: SourceConfig, on_gpu: bool, *params: dict[str, Any]) -> list[str]:
    """Replace in ``source.params`` (and each of ``params``, e.g. a space's fixed values) what this machine cannot
    run (tuner.config.trl_keys.cannot_run) by what it runs instead; one line per key saying so, to print before any
    trial. Their file is left as it is: the export keeps those keys."""
    lines = []
    for substitution in trl_keys.cannot_run({**source.params, **{k: v for p in params for k, v in p.items()}}, on_gpu):
        lines.append(f"{source.path}: {substitution.describe()}")
        for mapping in (source.params, *params):
            if substitution.key in mapping:
                if substitution.instead is None:
                    mapping.pop(substitution.key)
                else:
                    mapping[substitution.key] = substitution.instead
    return lines


def _plain(value: Any) -> Any:
    """A parsed value as JSON keeps it (enums by their value, anything odd as text)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return getattr(value, "value", str(value))


def _precision(where: str, raw: dict[str, Any], config, notes: list[str]) -> str:
    """The precision row of their weights' dtype and TRL's bf16/fp16 flags (as TRL reads them)."""
    dtype_key = "dtype" if "dtype" in raw else "torch_dtype" if "torch_dtype" in raw else None
    written = raw.get(dtype_key) if dtype_key else None
    weights = _WEIGHTS.get(str(written) if written is not None else None)
    if weights is None:
        raise TunerError(f"{where}: {dtype_key}: {written!r} is not a dtype tuner knows; use float32, bfloat16 or "
                         "float16 (or auto)")
    if written in (None, "auto"):
        notes.append(f"dtype is {written or 'not set'}: trials load the weights in float32 (a checkpoint saved in "
                     "bf16 loads in bf16 under auto: set dtype to say so)")
    flags = {"bf16": bool(config.bf16), "fp16": bool(config.fp16)}
    for row in precisions.PRECISIONS.values():
        if row.weight_dtype == weights and row.flags == flags:
            return row.name
    if weights != "float32":
        # half weights under autocast to a half dtype: the weights decide (autocast to their own dtype changes
        # nothing; the GradScaler of fp16: true is a difference trials do not reproduce)
        row = next(r for r in precisions.PRECISIONS.values() if r.weight_dtype == weights and r.autocast_dtype is None)
        on = [k for k, v in flags.items() if v]
        notes.append(f"{dtype_key}: {written} with {' and '.join(on)}: true: trials run {row.name} ({weights} weights, "
                     "no autocast)")
        return row.name
    raise TunerError(f"{where}: bf16 and fp16 are both true; TRL runs one of them: set the other to false")


def trl_values(entry: trainers.Adapter, params: dict[str, Any]) -> dict[str, Any]:
    """The TRL config keys (and values) a trial's params stand for: precision as dtype, bf16 and fp16."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name == "precision":
            row = precisions.precision(value)
            out["dtype"] = row.weight_dtype
            out.update(row.flags)
        else:
            out[name] = value
    return out


# -- the space around their values ----------------------------------------------------------------------------


def _choices(*values) -> list:
    seen = []
    for v in values:
        if v is not None and v not in seen:
            seen.append(v)
    return seen


def _batch_choices(batch: int, effective: int) -> list[int]:
    """Batch sizes from a quarter to 4x theirs that divide the effective batch (theirs first)."""
    wanted = [batch, batch * 2, batch // 2, batch * 4, batch // 4]
    return _choices(*[b for b in wanted if b >= 1 and effective % b == 0])


def derive_space(source: SourceConfig) -> SearchSpace:
    """The knobs that decide stability and speed, searched around the user's values; everything else of their
    config fixed. Their own value is always one of the choices (or inside the range), so trial 0 is a point of it."""
    entry = source.entry
    eff = {**source.effective, **source.params}
    fixed = {k: v for k, v in source.params.items() if k != "precision"}
    if source.params.get("use_peft"):
        fixed.pop("use_peft")  # searched below
    params: dict[str, Any] = {}
    mine = source.params["precision"]
    params["precision"] = {"type": "categorical", "choices": _choices(mine, *precisions.NAMES)}
    lr = float(eff.get("learning_rate") or 1e-5)
    params["learning_rate"] = {"type": "float", "low": lr / LR_DOWN, "high": lr * LR_UP, "log": True}
    clip = eff.get("max_grad_norm")
    params["max_grad_norm"] = {"type": "categorical", "choices": _choices(clip, 0.3, 1.0)}
    warm = eff.get("warmup_steps", 0) or 0
    params["warmup_steps"] = {"type": "categorical", "choices": _choices(warm, 0, 0.1)}
    batch = int(eff.get("per_device_train_batch_size") or 8)
    accumulation = int(eff.get("gradient_accumulation_steps") or 1)
    effective_batch = batch * accumulation
    params["per_device_train_batch_size"] = {"type": "categorical",
                                             "choices": _batch_choices(batch, effective_batch)}
    if source.params.get("use_peft"):
        # LoRA's rank and scale around theirs, and LoRA itself: on a small model a full fine-tune learns where
        # LoRA does not move the reward
        r, alpha = int(eff.get("lora_r") or 16), int(eff.get("lora_alpha") or 32)
        params["use_peft"] = {"type": "categorical", "choices": [True, False]}
        lora = {"use_peft": True}
        params["lora_r"] = {"type": "categorical", "choices": _choices(r, max(1, r // 2), r * 2), "when": lora}
        params["lora_alpha"] = {"type": "categorical", "choices": _choices(alpha, max(1, alpha // 2), alpha * 2),
                                "when": lora}
    if "loss_type" in entry.config_fields():
        shipped = _shipped_choices(entry, "loss_type")
        theirs = eff.get("loss_type")
        if isinstance(theirs, str) and any(isinstance(c, list) for c in shipped):
            theirs = [theirs]  # DPO's loss_type is a list of losses
        params["loss_type"] = {"type": "categorical", "choices": _choices(theirs, *shipped)}
    if entry.uses_reward_funcs and eff.get("temperature") is not None:
        # GRPO learns from the reward's spread within a group: sampling temperature is what makes one
        params["temperature"] = {"type": "categorical", "choices": _choices(float(eff["temperature"]), 1.0)}
    for name in params:
        fixed.pop(name, None)
    fixed.pop("gradient_accumulation_steps", None)  # follows from the batch size: the same effective batch
    raw = {"trainer": entry.name, "description": f"derived from {source.path}", "fixed": fixed, "params": params,
           "effective_batch": effective_batch}
    return parse_space(raw, f"{source.path} (derived space)")


def _shipped_choices(entry: trainers.Adapter, name: str) -> list:
    from tuner.config.space import load_space

    param = load_space(None, entry.name).params.get(name)
    return list(param.choices) if isinstance(param, CategoricalParam) else []


def narrowed(derived: SearchSpace, space: SearchSpace) -> SearchSpace:
    """The derived space with a ``--search-space`` file's params and fixed values put over it."""
    params = {**derived.params, **space.params}
    fixed = {k: v for k, v in {**derived.fixed, **space.fixed}.items() if k not in params}
    for name in space.fixed:
        params.pop(name, None)
    effective_batch = derived.effective_batch
    if "gradient_accumulation_steps" in params or "gradient_accumulation_steps" in space.fixed:
        effective_batch = None  # the file decides the accumulation itself
    elif effective_batch is not None and ("per_device_train_batch_size" in space.fixed
                                          or "per_device_train_batch_size" in space.params):
        fixed_batch = fixed.get("per_device_train_batch_size")
        choices = [fixed_batch] if fixed_batch is not None else list(getattr(params["per_device_train_batch_size"],
                                                                             "choices", []))
        if any(not isinstance(b, int) or effective_batch % b for b in choices):
            raise TunerError(f"{space.source}: per_device_train_batch_size: each value must divide the effective "
                             f"batch {effective_batch} of the --from config, or set gradient_accumulation_steps too")
        if isinstance(fixed_batch, int):  # an int by now: anything else was refused above
            fixed["gradient_accumulation_steps"] = effective_batch // fixed_batch
            effective_batch = None
    raw = {"trainer": derived.trainer, "description": f"{derived.description}, narrowed by {space.source}",
           "fixed": fixed, "params": {k: p.model_dump(exclude_none=True) for k, p in params.items()},
           "effective_batch": effective_batch}
    result = parse_space(raw, f"{space.source} over {derived.source}")
    return result


def space_yaml(space: SearchSpace) -> str:
    """The space as a YAML file `--search-space` reads back."""
    import yaml

    data = space.model_dump(exclude_none=True, exclude_defaults=True)
    head = {"trainer": space.trainer, **{k: v for k, v in data.items() if k not in ("trainer", "params")}}
    lines = [yaml.safe_dump(head, sort_keys=False, default_flow_style=None, width=110).rstrip(), "params:"]
    for name, param in data["params"].items():  # one line per param: what is searched reads at a glance
        lines.append(f"  {name}: " + yaml.safe_dump(param, sort_keys=False, default_flow_style=True,
                                                    width=10**6).strip())
    return "\n".join(lines) + "\n"


def trial0(space: SearchSpace, source: SourceConfig) -> dict[str, Any]:
    """Trial 0's values of the space's searched params (what the study is given first)."""
    values = {}
    for name, param in space.params.items():
        if name in source.params:
            value = source.params[name]
        elif name in source.effective:
            value = source.effective[name]
        else:
            continue
        if isinstance(param, FloatParam):
            value = float(value)
            if not (param.low <= value <= param.high) or not math.isfinite(value):
                continue
        elif isinstance(param, CategoricalParam) and value not in param.choices:
            if [value] not in param.choices:
                continue
            value = [value]  # DPO's loss_type written as one name
        values[name] = value
    return values
