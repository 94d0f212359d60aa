"""Probe the user's inputs before any trial starts: the rows the trainer reads are checked for type and put
through TRL's chat-template step and the model's tokenizer, and each GRPO reward function is called once on
a few real rows with completions in the dataset's format. A problem is one line naming the function or the
file, raised before Ray, MLflow or the study exist; otherwise every trial would crash the same way.

    from tuner.inputs.probe import probe_inputs
    probe_inputs(adapter("grpo"), dataset, "prompts.jsonl", model_path, ["accuracy_reward"], [accuracy_reward])
"""

from __future__ import annotations

import asyncio
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.config.trainers import Adapter
from tuner.errors import TunerError, describe_exception
from tuner.inputs.rewards import TRL_REWARDS

__all__ = ["SAMPLES", "UserInputs", "check_rewards", "check_rows", "check_tokenizer", "check_user_inputs",
           "probe_inputs"]

SAMPLES = 4  # rows per probe: enough to catch a crash or a wrong count, cheap with any model

# What the probe pretends the policy wrote: a plain answer and one in the think format TRL's rewards look for.
COMPLETIONS = ("the answer is 4", "<think>\ntwo and two\n</think>\nthe answer is 4")

# Keyword arguments GRPOTrainer passes every reward function besides the dataset's own columns.
_TRAINER_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")

TEXT, MESSAGES = "text", "messages"


def probe_inputs(entry: Adapter, dataset, where: str, model_path: str | None = None,
                 reward_specs: list[str] | None = None, reward_funcs: list | None = None) -> None:
    """Every check below, in order; ``where`` names the data ("prefs.jsonl", "the built-in grpo data")."""
    formats = check_rows(dataset, entry, where)
    if model_path is not None:
        check_tokenizer(dataset, entry, where, model_path, formats)
    if entry.uses_reward_funcs and reward_funcs:
        check_rewards(reward_specs, reward_funcs, dataset, where)


# -- the rows -----------------------------------------------------------------------------------------------------


def _format(feature) -> str | None:
    from datasets import Value

    if isinstance(feature, Value) and feature.dtype in ("string", "large_string"):
        return TEXT
    inner = getattr(feature, "feature", None)
    if isinstance(inner, dict) and {"role", "content"} <= set(inner):
        return MESSAGES
    return None


def _value_format(value) -> str | None:
    if isinstance(value, str):
        return TEXT
    if isinstance(value, list) and value and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in value):
        return MESSAGES
    return None


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, list):
        return "a list that is not {role, content} messages" if value else "an empty list"
    return type(value).__name__


def check_rows(dataset, entry: Adapter, where: str) -> dict[str, str]:
    """Each column ``trainer`` reads holds text or {role, content} messages in every row, all columns in one
    format, with no null; returns column -> format ("text" or "messages")."""
    columns = [c for c in entry.reads if c in dataset.column_names]
    formats: dict[str, str] = {}
    for column in columns:
        found = _format(dataset.features[column])
        nulls = dataset.data.column(column).null_count
        if found is None or nulls:
            # the error path only: find the first row that is wrong
            for number, value in enumerate(dataset[column], 1):
                if _value_format(value) is None:
                    raise TunerError(
                        f"{where}: row {number}, column {column!r}: {entry.name} needs text or a list of "
                        f"{{role, content}} messages, got {_kind(value)}; fix or drop that row")
        found = found or _value_format(dataset[0][column])
        assert found is not None  # every row's format was checked above when its feature did not say
        formats[column] = found
    if len(set(formats.values())) > 1:
        plain = [c for c, f in formats.items() if f == TEXT]
        chat = [c for c, f in formats.items() if f == MESSAGES]
        raise TunerError(f"{where}: {entry.name} needs {', '.join(formats)} in one format, but {', '.join(plain)} "
                         f"{'is' if len(plain) == 1 else 'are'} text and {', '.join(chat)} "
                         f"{'is' if len(chat) == 1 else 'are'} {{role, content}} messages; convert one side")
    return formats


def check_tokenizer(dataset, entry: Adapter, where: str, model_path: str, formats: dict[str, str]) -> None:
    """The first rows through TRL's chat-template step and the model's tokenizer, as the trainer prepares them."""
    from transformers import AutoTokenizer
    from trl.data_utils import maybe_apply_chat_template

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except Exception as error:  # noqa: BLE001 - a broken or missing tokenizer, in many library types
        raise TunerError(f"model {model_path}: its tokenizer cannot be loaded ({describe_exception(error)}); "
                         "pass a model folder that holds the tokenizer files save_pretrained writes") from error
    if MESSAGES in formats.values() and not getattr(tokenizer, "chat_template", None):
        raise TunerError(f"{where}: the rows are {{role, content}} messages but the tokenizer of {model_path} has no "
                         "chat template; pass a chat (Instruct) model, or write the rows as plain text")
    for number in range(1, min(SAMPLES, len(dataset)) + 1):
        example = {column: dataset[number - 1][column] for column in formats}
        try:
            prepared = maybe_apply_chat_template(example, tokenizer)
            for text in prepared.values():
                if isinstance(text, str):
                    tokenizer(text)
        except Exception as error:  # noqa: BLE001 - whatever the template or tokenizer raises
            raise TunerError(f"{where}: row {number} cannot be prepared for {entry.name} with the tokenizer of "
                             f"{model_path} ({describe_exception(error)}); fix that row") from error


# -- GRPO reward functions ----------------------------------------------------------------------------------------


def _ignore(*args, **kwargs) -> None:
    return None


def _name(spec, function) -> str:
    return spec if isinstance(spec, str) else getattr(function, "__name__", type(function).__name__)


def _missing_arguments(function, given: set[str]) -> list[str]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return []
    return [p.name for p in parameters if p.default is p.empty and p.name not in given
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_rewards(reward_specs: list[str] | None, reward_funcs: list, dataset, where: str) -> None:
    """Call each reward function as GRPOTrainer does, once, on the first rows: it must run, and return one
    finite number (or None, "no reward for this one") per completion."""
    from transformers import TrainerState

    rows = dataset.select(range(min(SAMPLES, len(dataset)))).to_dict()
    prompts = rows["prompt"]
    count = len(prompts)
    chat = _value_format(prompts[0]) == MESSAGES
    texts = [COMPLETIONS[i % len(COMPLETIONS)] for i in range(count)]
    completions: list[Any] = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts
    completion_ids = [list(range(1, len(t.split()) + 1)) for t in texts]  # any token ids: only lengths matter
    columns = {k: v for k, v in rows.items() if k not in ("prompt", "completion", "completion_ids")}
    kwargs = {**columns, "trainer_state": TrainerState(), "log_extra": _ignore, "log_metric": _ignore}
    shape = f"{count} rows of {where} with {'{role, content} message' if chat else 'plain-text'} completions"
    specs: list[str | None] = [*reward_specs] if reward_specs else [None] * len(reward_funcs)
    for spec, function in zip(specs, reward_funcs):
        name = _name(spec, function)
        fix = "fix the function, or pass another --reward-func"
        if spec in TRL_REWARDS:  # not the user's code: the data is what can change
            fix = ("pass another --reward-func, or data it reads (TRL's format and accuracy rewards read "
                   "{role, content} message prompts)" if not chat else "pass another --reward-func")
        missing = _missing_arguments(function, set(_TRAINER_ARGUMENTS) | set(kwargs))
        if missing:
            raise TunerError(f"reward function {name!r} needs a dataset column {missing[0]!r}, which {where} does not "
                             f"have (columns: {', '.join(dataset.column_names)}); add the column, or pass another "
                             "--reward-func")
        try:
            output = function(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            if inspect.iscoroutine(output):  # an async reward function
                output = asyncio.run(output)
        except ImportError as error:
            raise TunerError(f"reward function {name!r} needs a package that is not installed: "
                             f"{describe_exception(error)}; install it, or pass another --reward-func") from error
        except Exception as error:  # noqa: BLE001 - the user's code raises whatever it raises
            raise TunerError(f"reward function {name!r} fails on {shape}: {describe_exception(error)}; {fix}") from error
        _check_output(name, output, count, shape, fix)


def _check_output(name: str, output, count: int, shape: str, fix: str) -> None:
    if isinstance(output, (str, bytes, dict)) or not hasattr(output, "__len__"):
        raise TunerError(f"reward function {name!r} returned {type(output).__name__} on {shape}, not a list of "
                         f"{count} numbers; return one number per completion")
    if len(output) != count:
        raise TunerError(f"reward function {name!r} returned {len(output)} rewards for {count} completions on "
                         f"{shape}; return exactly one number per completion")
    for index, value in enumerate(output):
        if value is None:  # GRPOTrainer's "no reward for this completion"
            continue
        try:
            number = None if isinstance(value, (str, bytes)) else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise TunerError(f"reward function {name!r} returned {value!r} for completion {index + 1} on {shape}, "
                             f"not a number; {fix}")
        if not math.isfinite(number):
            raise TunerError(f"reward function {name!r} returned {number} for completion {index + 1} on {shape}; "
                             f"rewards must be finite numbers (or None to skip one); {fix}")


@dataclass(frozen=True)
class UserInputs:
    """The user's model, data and rewards, checked and probed, with their paths made absolute: trials run in
    Ray's working directories, and MLflow params, trial specs and trial.yaml keep what the trials opened."""

    model_path: str  # the folder the model loads from
    model: str  # as given, or its absolute path when it is a local folder
    dataset: str | None  # as given, or its absolute path when it is a local file or folder
    reward_funcs: list[str] | None  # a module in the user's folder as an absolute file path
    model_line: str = ""  # which model --model resolved to, and from where (models.describe_model)


def check_user_inputs(entry: Adapter, model: str, dataset: str | None, reward_funcs: list[str] | None,
                      missing_reward: str) -> UserInputs:
    """Resolve and probe the inputs of a search or a trial; ``missing_reward`` is the one-line error for GRPO on
    the user's own data without a reward (worded for the flag or the YAML key the user wrote)."""
    from tuner.inputs import data, models, rewards
    from tuner.inputs.packaged import PACKAGED

    model_path = models.resolve_model(model)
    tiny, real = models.is_tiny(model_path), not models.is_built_here(model_path)
    loaded = data.load_dataset_spec(dataset, entry, tiny=tiny, real=real)
    online = entry.uses_reward_funcs
    builtin = dataset in (None, "builtin")
    if online and not builtin and not reward_funcs:
        raise TunerError(missing_reward)
    reward_paths = rewards.resolve_reward_paths(reward_funcs)  # a module in this folder: the file trials import
    if online and builtin and not reward_funcs and not tiny:
        reward_paths = [data.builtin_reward(tiny, real)]  # the built-in task's own reward, said in the export
    functions = rewards.resolve_reward_funcs(reward_paths) if online else None
    label = dataset if dataset is not None and not builtin else f"the built-in {entry.name} data"
    probe_inputs(entry, loaded, label, model_path, reward_funcs, functions)
    line = models.describe_model(model, model_path)
    local_model = Path(model).expanduser()
    if local_model.is_dir():
        model = str(local_model.resolve())
    elif model in PACKAGED and Path(model_path).is_dir():
        model = model_path  # its converted copy: trials load that folder, and never ask the Hub again
    return UserInputs(model_path, model, data.resolve_dataset_path(dataset), reward_paths, line)
