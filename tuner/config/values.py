"""Typed checks of every parameter value a user writes: search spaces (``fixed:``, ``choices:``, fixed values,
``when:`` and range bounds) and trial configs (``params:``).

The expected type of a name comes from the trainer's TRL config dataclass (``GRPOConfig.learning_rate: float``)
or from tuner's own params (``tuner.config.trainers.TUNER_PARAM_TYPES``). A number written in any YAML spelling is a number (``2e-4``,
``"1E5"``: PyYAML reads ``1e-2`` without a dot as a string); a value of another type is refused in one line
naming the file, the key and the expected type, before any trial runs::

    from tuner.config.values import check_params
    check_params({"learning_rate": "2e-4"}, adapter("grpo"), "trial.yaml: params")   # {"learning_rate": 0.0002}
    check_params({"weight_decay": "abc"}, adapter("grpo"), "trial.yaml: params")
    # TunerError: trial.yaml: params.weight_decay: expected a number, got 'abc' (a string); ...
"""

from __future__ import annotations

import enum
import functools
import math
import re
import types
import typing
from typing import Any, Literal, Union

from tuner.config.trainers import LORA_PARAMS, TUNER_PARAM_TYPES, Adapter
from tuner.errors import TunerError

__all__ = ["check_params", "check_space_values", "check_value", "param_types"]


# A number as YAML 1.2 (and Python) write it: 2e-4, 1E5, -3, .5, 1_000 is not one.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@functools.cache
def param_types(entry: Adapter) -> dict[str, Any]:
    """Every name a trainer's space or trial may set -> its type annotation (TRL's config fields, tuner's own)."""
    config = entry.config_type()
    return {**typing.get_type_hints(config), **TUNER_PARAM_TYPES}


@functools.cache
def _adapter(annotation):
    from pydantic import ConfigDict, TypeAdapter

    return TypeAdapter(annotation, config=ConfigDict(arbitrary_types_allowed=True))


def _valid(annotation, value, strict: bool) -> tuple[bool, Any]:
    from pydantic import ValidationError

    try:
        return True, _adapter(annotation).validate_python(value, strict=strict)
    except ValidationError:
        return False, None
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot check: trust the value, TRL checks it
        return True, value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_value(value: Any, annotation: Any, where: str) -> Any:
    """``value`` as ``annotation`` takes it, or a TunerError saying ``where`` (e.g. "x.yaml: fixed.beta")
    wants which type. Numbers written as strings become numbers; strings, lists and true/false are never
    converted into anything else, and the value itself is kept ("cosine" stays a string, not an enum)."""
    if annotation is Any:
        return value
    ok, _ = _valid(annotation, value, strict=True)
    if ok:
        return value
    candidates = []
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        candidates.append(int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text))
    elif _is_number(value):
        candidates.append(value)
    for number in candidates:
        # an integral float for a whole-number field (YAML 1e5 -> 100000.0) becomes an int
        ok, converted = _valid(annotation, number, strict=not (isinstance(number, float) and number.is_integer()))
        if ok and _is_number(converted) and math.isfinite(converted) and converted == number:
            return converted
    if isinstance(value, str) and not candidates:
        ok, converted = _valid(annotation, value, strict=False)  # an enum's name or value, e.g. a scheduler type
        if ok and isinstance(converted, (str, enum.Enum)):
            return value
    if not isinstance(value, list) and _takes_a_list(annotation):
        ok, _ = _valid(annotation, [value], strict=True)  # TRL turns a single loss_type into a list
        if ok:
            return value
    expected = describe_type(annotation)
    raise TunerError(f"{where}: expected {expected}, got {value!r} ({_kind(value)}); write {expected} there")


def _takes_a_list(annotation) -> bool:
    return any(typing.get_origin(a) is list for a in _members(annotation))


def _members(annotation) -> list:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def describe_type(annotation) -> str:
    """How a person says the type: 'a number', 'a whole number or null', "one of 'fp32', 'bf16-mixed'"."""
    parts: list[str] = []
    members = _members(annotation)
    has_str = str in members
    for a in members:
        origin = typing.get_origin(a)
        if a is float:
            text = "a number"
        elif a is int:
            text = "a whole number"
        elif a is bool:
            text = "true or false"
        elif a is str:
            text = "a string"
        elif a is type(None):
            text = "null"
        elif origin is Literal:
            text = "one of " + ", ".join(repr(v) for v in typing.get_args(a))
        elif isinstance(a, type) and issubclass(a, enum.Enum):
            if has_str:
                continue
            text = "one of " + ", ".join(repr(m.value) for m in a)
        elif origin is list:
            (item,) = typing.get_args(a) or (Any,)
            plural = {str: "strings", float: "numbers", int: "whole numbers", bool: "true/false values"}
            text = "a list" if item is Any else f"a list of {plural.get(item) or '(' + describe_type(item) + ')'}"
        elif origin is dict or a is dict:
            text = "a mapping"
        else:
            text = getattr(a, "__name__", str(a))
        if text not in parts:
            parts.append(text)
    return " or ".join(parts)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "a string"
    if _is_number(value):
        return "a number"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def check_params(params: dict[str, Any], entry: Adapter, where: str) -> dict[str, Any]:
    """A trial's params with every name known and every value typed; ``where`` is e.g. "trial.yaml: params"."""
    from tuner.config.space import check_names

    check_names(params, entry.config_fields(), entry.name, where)
    typed = param_types(entry)
    checked = {name: check_value(value, typed[name], f"{where}.{name}") for name, value in params.items()}
    lora = [name for name in LORA_PARAMS if name in checked]
    if lora and "use_peft" not in checked:
        raise TunerError(f"{where}.{lora[0]}: a LoRA setting has no effect without use_peft; add use_peft: true "
                         f"to the params, or remove {lora[0]}")
    return checked


def check_space_values(space) -> None:
    """Type every value a space writes (fixed, choices, fixed values, when, bounds) against its trainer's
    fields, in place: numbers written as strings become numbers. Names must already be known
    (``tuner.config.space.check_param_names``)."""
    from tuner.config.space import CategoricalParam, FixedParam, FloatParam, IntParam

    typed = param_types(space.entry)
    where = space.source
    space.fixed = {name: check_value(value, typed[name], f"{where}: fixed.{name}")
                   for name, value in space.fixed.items()}
    for name, p in space.params.items():
        annotation = typed[name]
        at = f"{where}: params.{name}"
        if isinstance(p, CategoricalParam):
            p.choices = [check_value(c, annotation, f"{at}.choices.{i}") for i, c in enumerate(p.choices)]
        elif isinstance(p, FixedParam):
            p.value = check_value(p.value, annotation, f"{at}.value")
        elif isinstance(p, FloatParam):
            if annotation is not Any and float not in _members(annotation):
                raise TunerError(f"{at}: type float samples fractional values, but {name} takes "
                                 f"{describe_type(annotation)}; use type: int or categorical")
        elif isinstance(p, IntParam):
            if annotation is not Any and not ({int, float} & set(_members(annotation))):
                raise TunerError(f"{at}: type int samples whole numbers, but {name} takes "
                                 f"{describe_type(annotation)}; use type: categorical")
        for dep, wanted in (p.when or {}).items():
            dep_type = typed[dep]
            if isinstance(wanted, list) and not _takes_a_list(dep_type):
                p.when[dep] = [check_value(w, dep_type, f"{at}.when.{dep}.{i}") for i, w in enumerate(wanted)]
            else:
                p.when[dep] = check_value(wanted, dep_type, f"{at}.when.{dep}")
