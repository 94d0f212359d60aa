"""Search spaces: a YAML file -> a validated SearchSpace -> sampled trial params.

A space file looks like this (see ``search_spaces/*.yaml`` for the shipped ones)::

    trainer: grpo
    fixed:                      # every trial uses these; not searched
      max_completion_length: 16
    params:
      precision: {type: categorical, choices: [fp32, bf16-mixed, fp16-pure]}
      learning_rate: {type: float, low: 1.0e-5, high: 1.0e-2, log: true}
      use_peft: {type: categorical, choices: [true, false]}
      lora_r: {type: categorical, choices: [8, 16], when: {use_peft: true}}

Parameter names are tuner's own (``precision`` and the LoRA settings in ``TUNER_PARAMS``) or
fields of the trainer's TRL config class (``GRPOConfig`` ...). Unknown names, keys and types
are errors that name the file and the key path.
"""

from __future__ import annotations

import difflib
import itertools
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.config import precision, trainers
from tuner.config.user_yaml import read_yaml_file, validated
from tuner.errors import TunerError

# Precision is one dimension: where the weights live and whether autocast runs on top.
# "-pure" loads the weights in that dtype (the bug reports' "torch_dtype half" case);
# "-mixed" keeps fp32 weights under autocast (fp16-mixed adds a GradScaler).
PRECISIONS = precision.NAMES

# tuner's own dimensions; every other param name must be a field of the trainer's TRL config.
TUNER_PARAMS = tuple(trainers.TUNER_PARAM_TYPES)

Scalar = Union[bool, int, float, str, list[str], None]
# A fixed value may also be a mapping or a list of anything: a --from config's lr_scheduler_kwargs, model_init_kwargs,
# dataset_kwargs reach every trial as written (a searched param's choices stay scalars).
Fixed = Union[Scalar, dict[str, Any], list[Any]]


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Only sample this param when every named param has the given value (or one of a list).
    when: dict[str, Scalar] | None = None


class FloatParam(_Param):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False  # sample uniformly in log space, for scale-like params such as learning_rate

    @model_validator(mode="after")
    def _check_bounds(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"low and high must be finite numbers, but got low={self.low}, high={self.high}")
        if self.low > self.high:
            raise ValueError(f"low must not exceed high, but got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0, but got low={self.low}")
        return self


class IntParam(_Param):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = 1

    @model_validator(mode="after")
    def _check_bounds(self):
        if self.low > self.high:
            raise ValueError(f"low must not exceed high, but got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0, but got low={self.low}")
        if self.step < 1:
            raise ValueError(f"step must be at least 1, but got step={self.step}")
        return self


class CategoricalParam(_Param):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)


class FixedParam(_Param):
    type: Literal["fixed"]
    value: Scalar


Param = Annotated[Union[FloatParam, IntParam, CategoricalParam, FixedParam], Field(discriminator="type")]


class SearchSpace(BaseModel):
    """A validated search space: which trainer, what every trial fixes, and what is searched."""

    model_config = ConfigDict(extra="forbid")
    trainer: str  # an entry of the trainer table (checked below)
    description: str = ""
    fixed: dict[str, Fixed] = Field(default_factory=dict)
    params: dict[str, Param] = Field(min_length=1)
    # Replacements for some params when the model is pretrained (any model but the embedded tiny one): a random
    # tiny model needs large steps to learn in 20 steps, a pretrained one is wrecked by them.
    pretrained: dict[str, Param] = Field(default_factory=dict)
    # Held constant: per_device_train_batch_size x gradient_accumulation_steps. Set, the accumulation follows from
    # each sampled batch size (a space derived from the user's config, tuner.config.trl_config: the same
    # effective batch, split differently).
    effective_batch: int | None = Field(default=None, ge=1)
    source: str = Field(default="<memory>", exclude=True)

    @property
    def entry(self) -> trainers.Adapter:
        """The trainer's entry in the trainer table: the one place a space's trainer name is looked up."""
        return trainers.adapter(self.trainer)

    @field_validator("trainer")
    @classmethod
    def _known_trainer(cls, trainer: str) -> str:
        if trainer not in trainers.ADAPTERS:
            raise ValueError(f"unknown trainer {trainer!r}; choose one of {', '.join(trainers.ADAPTERS)}")
        return trainer

    @model_validator(mode="after")
    def _check_conditions(self):
        seen: list[str] = []
        for name, param in self.params.items():
            for dep in param.when or {}:
                if dep not in self.params:
                    raise ValueError(f"params.{name}.when: condition on unknown parameter {dep!r}")
                if dep not in seen:
                    raise ValueError(f"params.{name}.when: {dep!r} must be declared before {name!r}")
            seen.append(name)
        precision = self.params.get("precision")
        if precision is not None:
            values = _values(precision)
            unknown = [v for v in values if v not in PRECISIONS]
            if unknown:
                raise ValueError(f"params.precision: unknown precision {unknown[0]!r}; choose from {', '.join(PRECISIONS)}")
        unknown = sorted(set(self.pretrained) - set(self.params))
        if unknown:
            raise ValueError(f"pretrained.{unknown[0]}: replaces a parameter that params does not declare")
        overlap = sorted(set(self.fixed) & set(self.params))
        if overlap:
            raise ValueError(f"fixed.{overlap[0]}: also declared under params; keep one")
        self._check_lora()
        self._check_effective_batch()
        return self

    def _check_effective_batch(self) -> None:
        if self.effective_batch is None:
            return
        if "gradient_accumulation_steps" in self.params or "gradient_accumulation_steps" in self.fixed:
            raise ValueError("effective_batch: gradient_accumulation_steps follows from it; remove one of them")
        batch = self.params.get("per_device_train_batch_size")
        values = _values(batch) if isinstance(batch, (CategoricalParam, FixedParam)) else None
        if values is None or any(not isinstance(b, int) or b < 1 or self.effective_batch % b for b in values):
            raise ValueError("effective_batch: needs per_device_train_batch_size as a categorical param whose every "
                             f"choice divides {self.effective_batch}")

    def _with_accumulation(self, values: dict[str, Any]) -> dict[str, Any]:
        if self.effective_batch is not None and "per_device_train_batch_size" in values:
            values["gradient_accumulation_steps"] = self.effective_batch // values["per_device_train_batch_size"]
        return values

    def _check_lora(self) -> None:
        # LoRA settings only reach a trial whose use_peft is true; without one they would be dropped silently.
        lora = [(section, name) for section, names in (("params", self.params), ("fixed", self.fixed))
                for name in names if name in trainers.LORA_PARAMS]
        if not lora:
            return
        if "use_peft" in self.fixed:
            peft = [self.fixed["use_peft"]]
        elif "use_peft" in self.params and not isinstance(self.params["use_peft"], (FloatParam, IntParam)):
            peft = _values(self.params["use_peft"])
        else:
            peft = []
        if True not in peft:
            section, name = lora[0]
            state = "is never true" if peft else "is not set"
            raise ValueError(f"{section}.{name}: LoRA settings need use_peft, which {state} in this space; add "
                             f"use_peft: true under fixed (or use_peft as a categorical param), or remove {name}")

    # -- sampling -------------------------------------------------------------------------------

    def active(self, name: str, values: dict[str, Any]) -> bool:
        """Whether ``name`` is sampled given the values chosen so far (its ``when`` holds)."""
        for dep, wanted in (self.params[name].when or {}).items():
            allowed = wanted if isinstance(wanted, list) else [wanted]
            if dep not in values or values[dep] not in allowed:
                return False
        return True

    def suggest(self, trial) -> dict[str, Any]:
        """Define-by-run sampling on an ``optuna.Trial``: the trial's params, fixed values included."""
        values: dict[str, Any] = {}
        for name, p in self.params.items():
            if not self.active(name, values):
                continue
            if isinstance(p, FloatParam):
                values[name] = trial.suggest_float(name, p.low, p.high, log=p.log)
            elif isinstance(p, IntParam):
                values[name] = trial.suggest_int(name, p.low, p.high, log=p.log, step=p.step)
            elif isinstance(p, CategoricalParam):
                values[name] = trial.suggest_categorical(name, _optuna_choices(p.choices))
                values[name] = _from_optuna(values[name], p.choices)
            else:
                values[name] = p.value
        return {**self.fixed, **self._with_accumulation(values)}

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of the categorical params once (inactive params left out, duplicates dropped)."""
        searched = {n: p for n, p in self.params.items() if not isinstance(p, FixedParam)}
        not_categorical = [n for n, p in searched.items() if not isinstance(p, CategoricalParam)]
        if not_categorical:
            raise TunerError(
                f"{self.source}: params.{not_categorical[0]}: the grid sampler needs every param categorical or "
                f"fixed, but {not_categorical[0]!r} is {self.params[not_categorical[0]].type}; "
                "use --sampler tpe or random, or list its values as choices"
            )
        names = list(self.params)
        options = [_values(self.params[n]) for n in names]
        combos, seen = [], set()
        for combo in itertools.product(*options):
            chosen: dict[str, Any] = {}
            for name, value in zip(names, combo):
                if self.active(name, chosen):
                    chosen[name] = value
            key = repr(sorted(chosen.items(), key=lambda kv: kv[0]))
            if key not in seen:
                seen.add(key)
                combos.append(chosen)  # enqueued, then suggest() adds what follows from them
        return combos

    def searched_names(self) -> list[str]:
        return [n for n, p in self.params.items() if not isinstance(p, FixedParam)]

    def for_model(self, pretrained: bool) -> "SearchSpace":
        """The space a search on this model uses: ``pretrained:`` replacements applied for a pretrained model."""
        if not pretrained or not self.pretrained:
            return self
        params = {name: self.pretrained.get(name, param) for name, param in self.params.items()}
        for name, param in params.items():
            if param.when is None and self.params[name].when is not None:
                params[name] = param.model_copy(update={"when": self.params[name].when})
        copy = self.model_copy(update={"params": params, "pretrained": {}})
        copy.source = self.source
        return copy

    def precisions(self) -> list[str]:
        p = self.params.get("precision")
        if p is None:
            return [str(self.fixed.get("precision", precision.DEFAULT))]
        return list(_values(p))

    def values_of(self, name: str) -> list[Any]:
        """The values a categorical or fixed param takes ([] when the space does not set it)."""
        if name in self.params and not isinstance(self.params[name], (FloatParam, IntParam)):
            return list(_values(self.params[name]))
        return [self.fixed[name]] if name in self.fixed else []

    def without_precisions(self, dropped: list[str]) -> "SearchSpace":
        """A copy whose precision choices exclude ``dropped`` (the hardware cannot run them)."""
        p = self.params.get("precision")
        if p is None or not dropped:
            return self
        kept = [v for v in _values(p) if v not in dropped]
        if not kept:
            raise TunerError(
                f"{self.source}: params.precision: none of {', '.join(_values(p))} can run on this machine "
                f"({', '.join(dropped)} need a GPU); add fp32 or bf16-mixed to the choices"
            )
        return self.without_choices("precision", list(dropped))

    def without_choices(self, name: str, dropped: list) -> "SearchSpace":
        """A copy whose choices of ``name`` (categorical or fixed) exclude ``dropped`` (at least one choice kept: the
        caller's rule)."""
        p = self.params.get(name)
        if p is None or isinstance(p, (FloatParam, IntParam)) or not dropped:
            return self
        params = dict(self.params)
        params[name] = CategoricalParam(type="categorical", choices=[v for v in _values(p) if v not in dropped],
                                        when=p.when)
        copy = self.model_copy(update={"params": params})
        copy.source = self.source
        return copy


def _values(p) -> list:
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    if isinstance(p, FixedParam):
        return [p.value]
    raise TypeError(p)


def _optuna_choices(choices: list) -> list:
    # Optuna's categorical choices must be None/bool/int/float/str: lists become strings.
    return [",".join(c) if isinstance(c, list) else c for c in choices]


def _from_optuna(value, choices: list):
    for c in choices:
        if isinstance(c, list) and ",".join(c) == value:
            return c
    return value


# -- loading and checking ---------------------------------------------------------------------


def shipped_space_path(trainer: str) -> Path:
    return trainers.adapter(trainer).default_space


def load_space(path: str | Path | None = None, trainer: str | None = None) -> SearchSpace:
    """Read and validate a space file; ``None`` means the shipped space for ``trainer``."""
    if path is None:
        if trainer is None:
            raise ValueError("load_space needs a space file or a trainer (for its shipped space)")
        path = shipped_space_path(trainer)
    path = Path(path)
    where = str(path)
    raw, _ = read_yaml_file(path, where, "search space file", "pass an existing YAML file to --search-space")
    space = parse_space(raw, where)
    if trainer is not None and space.trainer != trainer:
        raise TunerError(
            f"{where}: trainer: the space is for {space.trainer!r} but --trainer is {trainer!r}; "
            f"pass --trainer {space.trainer} or a space written for {trainer}"
        )
    return space


def parse_space(raw: Any, where: str = "<memory>") -> SearchSpace:
    space = validated(SearchSpace, raw, where, "a search space must be a YAML mapping with keys trainer, params "
                      "(and optionally fixed)", _describe)
    space.source = where
    return space


_MEMBERS: dict[str, type[BaseModel]] = {"float": FloatParam, "int": IntParam, "categorical": CategoricalParam,
                                        "fixed": FixedParam}
# How pydantic names the members of Scalar in an error path; users wrote a value, not a type.
_SCALAR_MEMBERS = {"bool", "int", "float", "str", "list[str]", "none"}


def _describe(error: ValidationError) -> str:
    errors = error.errors()
    # An unknown key explains the "missing" error its misspelt twin causes ("lowx" -> "low: Field required").
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(part) for part in first["loc"]]
    model: type[BaseModel] = SearchSpace
    # A discriminated union reports the chosen member ("float") in the path; users never wrote that.
    if len(loc) >= 3 and loc[0] == "params" and loc[2] in _MEMBERS:
        model = _MEMBERS[loc.pop(2)]
    scalar = len(loc) >= 2 and loc[-1] in _SCALAR_MEMBERS and first["type"].endswith("_type")
    if scalar:
        loc.pop()
    path = ".".join(loc)
    message = first["msg"].removeprefix("Value error, ")
    kind = first["type"]
    if kind == "extra_forbidden":
        known = [name for name in model.model_fields if name != "source"]
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        message = f"unknown key; remove it or check its spelling ({hint})"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        message = "type must be one of float, int, categorical, fixed"
    elif scalar:
        message = f"must be a number, string, true/false, null or a list of strings (got {first['input']!r})"
    elif kind in ("model_attributes_type", "dict_type"):
        message = f"must be a mapping of names to values (got {first['input']!r})"
    elif kind == "too_short":
        message = "must not be empty"
    elif kind == "missing":
        message = "required key is missing; add it"
    elif "input" in first and kind not in ("value_error", "missing"):
        message = f"{message} (got {first['input']!r})"
    return f"{path}: {message}" if path else message


def check_param_names(space: SearchSpace, config_fields: set[str]) -> None:
    """Every param and fixed name must be tuner's own or a field of the trainer's TRL config."""
    for section, names in (("params", space.params), ("fixed", space.fixed)):
        check_names(names, config_fields, space.trainer, f"{space.source}: {section}")


def check_names(names, config_fields: set[str], trainer: str, where: str) -> None:
    """Raise for the first name that is neither tuner's own nor in ``config_fields``, with the closest known one."""
    known = set(TUNER_PARAMS) | config_fields
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TunerError(f"{where}.{name}: unknown parameter for {trainer}{hint}")
