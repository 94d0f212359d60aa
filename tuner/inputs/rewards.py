"""GRPO reward functions: the built-in one for the built-in data, TRL's named ones, and user functions.

    from tuner.inputs.rewards import resolve_reward_funcs, reward_func_spec
    resolve_reward_funcs(None)                     # [builtin_reward]
    resolve_reward_funcs(["think_format_reward"])  # a trl.rewards function, as `trl grpo --reward_funcs` names it
    resolve_reward_funcs(["my_rewards:length"])    # a function of yours ("module:function" or "module.function")
    resolve_reward_paths(["my_rewards:length"])    # ["/abs/folder/my_rewards.py:length"]: what trials are given
    reward_func_spec("my_rewards:length")          # "my_rewards.length", as TRL's YAML `reward_funcs` wants it
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.errors import TunerError, describe_exception

__all__ = ["BUILTIN", "TRL_REWARDS", "builtin_reward", "resolve_reward_funcs", "resolve_reward_paths", "reward_func_spec"]

BUILTIN = "builtin"  # the name that selects builtin_reward

# The names `trl grpo --reward_funcs` accepts (trl/scripts/grpo.py, `reward_funcs_registry`).
TRL_REWARDS: tuple[str, ...] = (
    "accuracy_reward",
    "reasoning_accuracy_reward",
    "think_format_reward",
    "get_soft_overlong_punishment",
)
# trl/scripts/grpo.py builds the overlong punishment with these values; we match them so the exported YAML
# trains with the same reward that was searched.
_SOFT_OVERLONG = {"max_completion_len": 1280, "soft_punish_cache": 256}


def builtin_reward(prompts: list | None = None, completions: list | None = None, **kwargs) -> list[float]:
    """The default GRPO reward on the built-in data: the fraction of a completion's words that are real words.

    A word is real when it is in ``tuner.inputs._tiny_data.VOCABULARY``; the tiny model's tokenizer also holds word
    fragments and single characters, so a random policy writes about one real word in four. That gives
    completions in one group different rewards (a learning signal from the first step), and a policy that learns
    to write whole words climbs towards 1.0: on the tiny model, GRPO at learning rate 1e-2 (batch 8) goes from
    about 0.25 to about 0.5 in 20 steps. Completions are strings (standard format) or lists of
    {"role", "content"} messages (conversational format); an empty completion gets 0.0.
    """
    from tuner.inputs._tiny_data import VOCABULARY

    vocabulary = frozenset(VOCABULARY)
    rewards = []
    for completion in completions or []:
        words = _text(completion).lower().split()  # split on spaces only: "redx" is a fragment, not "red"
        rewards.append(sum(word in vocabulary for word in words) / len(words) if words else 0.0)
    return rewards


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, list):  # conversational: the messages the model wrote
        return " ".join(_text(message) for message in completion)
    return str(completion)


def resolve_reward_funcs(specs: list[str] | None) -> list[Callable]:
    """--reward values -> the callables GRPOTrainer takes as ``reward_funcs``.

    None or [] -> [builtin_reward]. "builtin" -> builtin_reward. A name in TRL_REWARDS -> that trl.rewards
    function. "module:function" or "module.function" -> imported, with the current folder on sys.path as
    `trl grpo` does.
    """
    return [_resolve_one(spec) for spec in specs] if specs else [builtin_reward]


def _resolve_one(spec: str) -> Callable:
    if spec == BUILTIN:
        return builtin_reward
    if spec in TRL_REWARDS:
        import trl.rewards

        function = getattr(trl.rewards, spec)
        return function(**_SOFT_OVERLONG) if spec == "get_soft_overlong_punishment" else function
    module_name, function_name = _split(spec)
    fix = "check the name, or pass 'builtin' or one of: " + ", ".join(TRL_REWARDS)
    if module_name.endswith(".py"):
        return _from_file(spec, module_name, function_name, fix)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as trl/scripts/grpo.py does, so ./my_rewards.py is found
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a missing module or one that fails while importing
        cause = " ".join(str(error).split()) or type(error).__name__
        raise TunerError(f"reward function {spec!r} cannot be imported: {cause}; {fix}") from error
    function = getattr(module, function_name, None)
    if function is None:
        raise TunerError(
            f"reward function {spec!r} cannot be imported: module {module_name!r} has no {function_name!r}; {fix}"
        )
    if not callable(function):
        raise TunerError(f"reward function {spec!r} is not callable (it is a {type(function).__name__}); {fix}")
    return function


def resolve_reward_paths(specs: list[str] | None) -> list[str] | None:
    """--reward-func values as trials must see them: a module that is a .py file in this folder
    ("my_rewards:length", "lib.scoring:length" for lib/scoring.py), or a path to one ("src/r.py:length"),
    becomes "/abs/path/my_rewards.py:length", because trials run in other working directories."""
    if not specs:
        return specs
    resolved = []
    for spec in specs:
        if spec == BUILTIN or spec in TRL_REWARDS:
            resolved.append(spec)
            continue
        module_name, function_name = _split(spec)
        file = Path(module_name if module_name.endswith(".py") else module_name.replace(".", os.sep) + ".py")
        resolved.append(f"{file.expanduser().resolve()}:{function_name}" if file.expanduser().is_file() else spec)
    return resolved


_FILE_MODULES: dict[str, object] = {}


def _from_file(spec: str, file: str, function_name: str, fix: str) -> Callable:
    path = Path(file).expanduser().resolve()
    if not path.is_file():
        raise TunerError(f"reward function {spec!r} cannot be imported: no file {path}; {fix}")
    module = _FILE_MODULES.get(str(path))
    if module is None:
        # its own name, so it never shadows (or is shadowed by) another module called like the file
        name = f"tuner_reward_{path.stem}_{abs(hash(str(path))):x}"
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))  # its own imports of modules beside it, as `trl grpo` finds them
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:  # a file Python does not import (not .py)
            raise TunerError(f"reward function {spec!r} cannot be imported: {path.name} is not a Python module; {fix}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 - the module fails while importing
            del sys.modules[name]
            raise TunerError(f"reward function {spec!r} cannot be imported: {describe_exception(error)}; "
                             "fix the module") from error
        _FILE_MODULES[str(path)] = module
    function = getattr(module, function_name, None)
    if function is None:
        raise TunerError(f"reward function {spec!r} cannot be imported: {path.name} has no {function_name!r}; {fix}")
    if not callable(function):
        raise TunerError(f"reward function {spec!r} is not callable (it is a {type(function).__name__}); {fix}")
    return function


def _split(spec: str) -> tuple[str, str]:
    separator = ":" if ":" in spec else "."
    module_name, _, function_name = spec.rpartition(separator)
    if not module_name or not function_name or spec.count(":") > 1:
        raise TunerError(
            f"reward function {spec!r} is not 'builtin', a TRL reward ({', '.join(TRL_REWARDS)}) "
            "or an import path 'module:function' / 'module.function'"
        )
    return module_name, function_name


def reward_func_spec(spec: str | Callable[..., Any]) -> str:
    """How ``spec`` is written in TRL's YAML ``reward_funcs`` list: a TRL name as is, else a dotted import path."""
    if spec == BUILTIN or spec is builtin_reward:
        return f"{__name__}.builtin_reward"
    if callable(spec):
        return f"{spec.__module__}.{spec.__qualname__}"
    if spec in TRL_REWARDS:
        return spec
    module_name, function_name = _split(spec)
    if module_name.endswith(".py"):  # a file resolved by resolve_reward_paths: TRL imports it from the folder it runs in
        module_name = Path(module_name).stem
    return f"{module_name}.{function_name}"
