"""What one trial is: ``TrialSpec``, and the trial config YAML that ``tuner trial --config`` reads.

    spec = prepare_trial_spec("trial.yaml")   # read, typed (pydantic), params checked against the TRL config
    TrialSpec(trainer="sft", params={"learning_rate": 1e-3}, max_steps=6)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from tuner.config import trainers
from tuner.config.user_yaml import load_yaml, validated
from tuner.errors import TunerError
from tuner.inputs.quiet import quiet_libraries
from tuner.trial._faults import parse_fault


@dataclass
class TrialSpec:
    """Everything one trial needs; the YAML that ``tuner trial --config`` reads is this, as a mapping."""

    trainer: str
    params: dict[str, Any]  # sampled + fixed search params (precision, learning_rate, use_peft, ...)
    model: str = "tiny"  # --model value: "tiny", a local directory, a hub id or an alias
    dataset: str | None = None  # None: the built-in tiny dataset for the trainer
    reward_funcs: list[str] | None = None  # GRPO only; None: tuner's built-in reward
    max_steps: int = 20  # short: the failures this hunts show up in the first steps
    seed: int = 0
    warmup_steps: int = 2  # steps excluded from speed figures: first steps pay for allocation and caching
    fault: str | None = None  # see FAULT_ENV
    ranks: int = 1  # processes of one data-parallel job (tuner.trial.ranks): one per GPU, or gloo processes on a CPU
    signals_every: int = 5  # early-warning readings (tuner.trial.signals) on step 1 and every N-th; 0: off
    # The learning-rate schedule's length, when the trial is the first max_steps steps of a longer run (a search's
    # risk rung, tuner.search._extend): the rate decays as that run's would. 0: the trial's own max_steps.
    schedule_steps: int = 0

    @property
    def run_steps(self) -> int:
        """The steps the trainer is configured for (its schedule's length); the trial stops at max_steps."""
        return max(self.max_steps, self.schedule_steps)

    @property
    def entry(self) -> trainers.Adapter:
        """The trainer's entry in the trainer table: the one place a trial's trainer name is looked up."""
        return trainers.adapter(self.trainer)

    @classmethod
    def from_mapping(cls, data: dict, where: str = "<trial>") -> "TrialSpec":
        """A trial config's structure, checked by ``_TrialConfig``; the params' names and types are checked
        against the trainer's TRL config by ``prepare_trial_spec`` (that needs TRL)."""
        config = validated(_TrialConfig, data, where, "a trial config must be a YAML mapping with keys trainer and "
                           "params", _describe)
        if config.fault is not None:
            parse_fault(config.fault, f"{where}: fault")
        return cls(**config.model_dump())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def job_spec(self, **changes: Any) -> dict[str, Any]:
        """This spec with ``changes`` (params, seed, max_steps, schedule_steps), as the mapping a trial's job carries
        through Ray (tuner.records.TrialJob's ``spec``)."""
        return dataclasses.replace(self, **changes).to_dict()


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrialSpec) if f.default is not dataclasses.MISSING}


class _TrialConfig(BaseModel):
    """What a trial config may say: TrialSpec's fields, typed. Strict: `max_steps: true` is a typo, not 1."""

    model_config = ConfigDict(extra="forbid")
    trainer: StrictStr
    params: dict[str, Any]
    model: StrictStr = _DEFAULTS["model"]
    dataset: StrictStr | None = _DEFAULTS["dataset"]
    reward_funcs: list[StrictStr] | None = _DEFAULTS["reward_funcs"]
    max_steps: StrictInt = Field(_DEFAULTS["max_steps"], ge=1)
    seed: StrictInt = Field(_DEFAULTS["seed"], ge=0)
    warmup_steps: StrictInt = Field(_DEFAULTS["warmup_steps"], ge=0)
    fault: StrictStr | None = _DEFAULTS["fault"]
    ranks: StrictInt = Field(_DEFAULTS["ranks"], ge=1)
    signals_every: StrictInt = Field(_DEFAULTS["signals_every"], ge=0)
    schedule_steps: StrictInt = Field(_DEFAULTS["schedule_steps"], ge=0)

    @field_validator("trainer")
    @classmethod
    def _known_trainer(cls, trainer: str) -> str:
        if trainer not in trainers.ADAPTERS:
            raise ValueError("unknown trainer")  # said in full by _describe
        return trainer

    @field_validator("reward_funcs", mode="before")
    @classmethod
    def _one_name(cls, value):
        return [value] if isinstance(value, str) else value  # `reward_funcs: accuracy_reward` means a list of one


def _describe(error) -> str:
    """A trial config's first validation error as "key: what is wrong; how to fix"."""
    errors = error.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"),
                 next((e for e in errors if e["type"] == "missing"), errors[0]))
    loc = [str(part) for part in first["loc"]]
    key, kind, got = ".".join(loc), first["type"], first.get("input")
    names = sorted(_TrialConfig.model_fields)
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(loc[0], names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
        return f"{key}: unknown key; remove it or check its spelling ({hint})"
    if kind == "missing":
        return f"missing key {key!r}; a trial config needs trainer and params"
    if loc == ["trainer"]:
        return f"trainer: unknown trainer {got!r}; choose one of {', '.join(trainers.ADAPTERS)}"
    if loc == ["params"]:
        return f"params: must be a mapping of parameter names to values (got {got!r})"
    if loc[0] in ("max_steps", "seed", "warmup_steps", "ranks", "signals_every", "schedule_steps"):
        low = 1 if loc[0] in ("max_steps", "ranks") else 0
        return f"{key}: must be a whole number >= {low}, got {got!r}"
    if loc[0] == "reward_funcs":
        return f"{key}: must be a list of reward function names (got {got!r})"
    return f"{key}: must be a string (got {got!r})"


def load_trial_spec(path: str | os.PathLike) -> TrialSpec:
    where = str(path)
    try:
        raw = load_yaml(Path(path).read_text())  # 2e-4 is a number, a key given twice an error
    except FileNotFoundError:
        raise TunerError(f"{where}: trial config not found; pass an existing YAML file to --config") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TunerError(f"{where}: malformed YAML{at}: {getattr(e, 'problem', e)}") from None
    return TrialSpec.from_mapping(raw, where)


def prepare_trial_spec(path: str | os.PathLike) -> TrialSpec:
    """``tuner trial --config``: the config read, every param's name and type checked against the trainer's
    TRL config, paths resolved against this folder, and the model, data and rewards probed
    (``tuner.inputs.probe``), before any training starts. Bad input is a TunerError."""
    from tuner.config import values
    from tuner.inputs import probe

    quiet_libraries()
    where = str(path)
    spec = load_trial_spec(path)
    spec.params = values.check_params(spec.params, spec.entry, f"{where}: params")
    if spec.reward_funcs and not spec.entry.uses_reward_funcs:
        online = ", ".join(name for name, a in trainers.ADAPTERS.items() if a.uses_reward_funcs)
        raise TunerError(f"{where}: reward_funcs: for {online} only; {spec.trainer} learns from its dataset's "
                         "labels; remove reward_funcs")
    inputs = probe.check_user_inputs(
        spec.entry, spec.model, spec.dataset, spec.reward_funcs,
        missing_reward=f"{where}: reward_funcs: grpo on your own dataset needs a reward for it (tuner's built-in "
                       "reward only scores its built-in data); add reward_funcs: [NAME] with a TRL reward such as "
                       "accuracy_reward, or module:function of yours")
    # The user's paths are the user's: absolute from here on (what the trial and its trial.yaml see).
    spec.model, spec.dataset = inputs.model, inputs.dataset
    spec.reward_funcs = inputs.reward_funcs
    return spec


