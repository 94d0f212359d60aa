"""The YAML files a user writes (a search space, a trial config, a TRL config): read and checked as tuner reads
every one, each problem one TunerError line naming the file and the key::

    raw, text = read_yaml_file(path, where, "search space file", "pass an existing YAML file to --search-space")
    load_yaml("lr: 2e-4")                                   # {"lr": 0.0002}: 2e-4 is a number
    space = validated(SearchSpace, raw, where, "a search space must be a YAML mapping ...", describe)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tuner.errors import TunerError

__all__ = ["load_yaml", "read_yaml_file", "validated"]


def read_yaml_file(path: Path, where: str, what: str, missing: str) -> tuple[Any, str]:
    """A YAML file's data and text, read as tuner reads every file a user writes (``load_yaml``: 2e-4 is a number,
    a key written twice is an error). Anything wrong is one TunerError naming ``where``; ``missing`` says how to
    fix a file that is not there."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TunerError(f"{where}: {what} not found; {missing}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise TunerError(f"{where}: cannot read the {what} ({type(e).__name__}); pass a readable YAML file") from None
    try:
        return load_yaml(text), text
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        if problem.startswith("duplicate key"):
            raise TunerError(f"{where}: {problem}{at}; keep only one of them") from None
        raise TunerError(f"{where}: malformed YAML{at}: {problem}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice is an error: YAML would silently keep the last one."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1, which PyYAML follows, reads a number without a dot (2e-4, 1E5) as a string; YAML 1.2 and people
# read it as a number.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, except that a key given twice is an error and 2e-4 is a number (raises yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


_Model = TypeVar("_Model", bound=BaseModel)


def validated(model: type[_Model], raw: Any, where: str, not_a_mapping: str,
              describe: Callable[[ValidationError], str]) -> _Model:
    """``model.model_validate(raw)`` for a YAML mapping the user wrote (a search space, a trial config): a value
    that is not a mapping, or does not validate, is one TunerError line naming ``where`` and, via ``describe``,
    the key and how to fix it."""
    if not isinstance(raw, dict):
        raise TunerError(f"{where}: {not_a_mapping}")
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise TunerError(f"{where}: {describe(error)}") from None
