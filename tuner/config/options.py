"""``tuner search``'s options, declared once: each field's default, help and value rule live side by side.

    SearchOptions(trials=40, sampler="random")   # the programmatic search (search.prepare checks it)
    check_options(options)                       # "--trials 0: must be at least 1": one check for CLI and code
    flag(f), help_text(f)                        # what tuner.cli turns every field into: one --flag each

Fields are declared in TRL's style (``field(default=..., metadata={"help": ...})``, as in ``GRPOConfig``); the
command line is generated from them (tuner.cli), so a new option is one field here. Metadata keys:

    help          what the option does; "(default: X)" is appended from the real default
    default_help  what a ``None`` default means, shown instead of it ("12; grid: every point")
    default_note  said after a real default ("0 turns confirmation off")
    rule          a ``Rule`` the value must satisfy (AT_LEAST_1, POSITIVE, NOT_NEGATIVE)
    choices       the allowed values (also checked for ``SearchOptions`` built in code)
    flag          the command-line flag, when it is not ``--`` + the name with dashes (``--reward-func``)
    action        argparse action: ``append`` for a repeatable flag whose field is a list (a ``bool`` field
                  is ``--name`` / ``--no-name``)
    metavar       argparse metavar (``FILE``, ``N``)
    env           an environment variable that, when set, replaces the default on the command line (a team names
                  its shared store once, where ``ray start`` runs: docs/distributed.md, "A shared cluster")

Light on purpose: ``tuner --help`` imports this module (no torch, TRL, Ray or MLflow).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from tuner.config.trainers import ADAPTERS, DEFAULT_TRAINER, Adapter, adapter
from tuner.errors import TunerError

SAMPLERS = ("tpe", "random", "grid")
SUBMITTED_JOB_ENV = "TUNER_JOB"  # set by tuner submit in the search's environment on the cluster: its Ray job id
CLUSTER_ENV = "TUNER_CLUSTER"  # the cluster's job server, when --cluster is left out (and in a submitted search's)
DEFAULT_TRIALS = 12  # --trials left out (grid: every point)


@dataclass(frozen=True)
class Rule:
    """What a number must be, e.g. ``Rule("must be at least 1", lambda v: v >= 1)``; nan and inf never are."""

    text: str  # completes "--trials 0: ..." and "argument --trials: ..., got 0"
    holds: Callable[[Any], bool]

    def allows(self, value) -> bool:
        return bool(self.holds(value)) and not (isinstance(value, float) and math.isinf(value))


AT_LEAST_1 = Rule("must be at least 1", lambda v: v >= 1)
POSITIVE = Rule("must be positive", lambda v: v > 0)
NOT_NEGATIVE = Rule("must not be negative", lambda v: v >= 0)


@dataclass
class SearchOptions:
    """Everything ``tuner search`` takes; the command line's flags are generated from these fields."""

    trainer: str | None = field(
        default=None,
        metadata={"help": "TRL trainer", "choices": ADAPTERS.keys(),  # a live view: an entry added to the table is a choice
                  "default_help": f"the --search-space file's trainer, else {DEFAULT_TRAINER}"},
    )
    model: str | None = field(
        default=None,
        metadata={"help": "local directory, hub id, alias (e.g. Qwen2.5-0.5B), 'tiny', the embedded 2-layer "
                  "Qwen2-shaped model, or 'tiny-pretrained', the same shape pretrained here on the built-in "
                  "questions (a test and demo model for the pretrained ranges; built once, minutes on a CPU)",
                  "default_help": "--from's model_name_or_path, else tiny"},
    )
    dataset: str | None = field(
        default=None,
        metadata={"help": "local .jsonl/.json/.parquet/.csv file, hub dataset id, or 'builtin' (tuner's built-in "
                  "data for the trainer)",
                  "default_help": "--from's dataset_name, else builtin"},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "GRPO reward: a TRL built-in name (accuracy_reward, think_format_reward, ...) or "
                  "module:function (module: e.g. a .py file in this folder); repeat for several",
                  "default_help": "tuner's built-in reward, for the built-in data only: --dataset needs a "
                  "--reward-func",
                  "flag": "--reward-func", "action": "append", "metavar": "NAME"},
    )
    from_config: str | None = field(
        default=None,
        metadata={"help": "start from your `trl <trainer> --config` file: trial 0 runs it as written, the search "
                  "varies precision, learning rate, clipping, warm-up, batch split, LoRA rank and loss_type around "
                  "its values, and the export is your file with the fewest changes; --model, --dataset and "
                  "--reward-func given beside it replace the file's model_name_or_path, dataset_name and "
                  "reward_funcs, as on TRL's own command line",
                  "flag": "--from", "metavar": "CONFIG.yaml"},
    )
    search_space: str | None = field(
        default=None,
        metadata={"help": "search-space YAML", "default_help": "search_spaces/<trainer>.yaml", "metavar": "FILE"},
    )
    sampler: str = field(
        default="tpe",
        metadata={"help": "how configs are proposed: tpe, random, or grid, which runs every combination of an "
                  "all-categorical space once",
                  "choices": SAMPLERS},
    )
    trials: int | None = field(
        default=None,
        metadata={"help": "number of trials", "default_help": f"{DEFAULT_TRIALS}; grid: every point", "rule": AT_LEAST_1},
    )
    max_steps: int = field(
        default=20,
        metadata={"help": "optimizer steps per trial", "rule": AT_LEAST_1},
    )
    seed: int = field(
        default=0,
        metadata={"help": "sampler and training seed: with random/grid the same seed gives the same configs; with "
                  "tpe also with --concurrency 1, while measured speeds rank the same"},
    )
    concurrency: int | None = field(
        default=None,
        metadata={"help": "trials at once", "default_help": "as many as resources allow", "rule": AT_LEAST_1},
    )
    cpus_per_trial: float = field(
        default=1.0,
        metadata={"help": "CPUs reserved per trial", "rule": POSITIVE},
    )
    gpus_per_trial: float | None = field(
        default=None,
        metadata={"help": "GPUs per trial, e.g. 0.25 for four trials on one GPU, or 2 or more whole GPUs: a trial of "
                  "one process per GPU (see --processes-per-trial)",
                  "default_help": "packed by memory: the share of a GPU the largest config of the space needs "
                  "(tuner.trial.memory); CPU trials on a machine without GPUs", "rule": NOT_NEGATIVE},
    )
    processes_per_trial: int | None = field(
        default=None,
        metadata={"help": "processes per trial: each trial is one data-parallel training job (DDP; FSDP with the "
                  "space's sharding: fsdp), started by torch's elastic launcher (torchrun's engine); on GPUs one "
                  "process per GPU, on a CPU gloo processes sharing the trial's CPUs",
                  "default_help": "--gpus-per-trial when it is 2 or more, else 1; more when the memory plan finds "
                  "that a config fits no single GPU", "rule": AT_LEAST_1, "metavar": "N"},
    )
    ray_address: str | None = field(
        default=None,
        metadata={"help": "join an existing Ray cluster",
                  "default_help": "start Ray locally, a Ray of the search's own even where `ray start` or "
                  "RAY_ADDRESS names a cluster (pass that address here to use it)"},
    )
    store: str = field(
        default="mlflow",
        metadata={"help": "local MLflow store folder (and the Optuna study beside it), relative to the working "
                  "directory", "env": "TUNER_STORE"},
    )
    tracking_uri: str | None = field(
        default=None,
        metadata={"help": "MLflow tracking URI, e.g. http://127.0.0.1:5000", "default_help": "the local store",
                  "env": "TUNER_TRACKING_URI"},
    )
    optuna_storage: str | None = field(
        default=None,
        metadata={"help": "where the search's Optuna study lives: an SQLAlchemy URL, e.g. "
                  "postgresql+psycopg://USER@HOST/DB that a team's searches share (optuna-dashboard opens it too)",
                  "default_help": "optuna.db beside the MLflow store (--store)", "env": "TUNER_OPTUNA_STORAGE",
                  "metavar": "URL"},
    )
    experiment: str | None = field(
        default=None,
        metadata={"help": "MLflow experiment name", "default_help": "<trainer>-<model>"},
    )
    trial_timeout: float = field(
        default=1800.0,
        metadata={"help": "seconds before a trial is killed", "rule": POSITIVE},
    )
    resume: str | None = field(
        default=None,
        metadata={"help": "continue the unfinished search of EXPERIMENT (its own options are reused; completed "
                  "trials are kept)", "metavar": "EXPERIMENT"},
    )
    confirm_seeds: int = field(
        default=2,
        metadata={"help": "re-run the top candidates on N more seeds; recommend one only if every seed is stable",
                  "default_note": "0 turns confirmation off", "rule": NOT_NEGATIVE, "metavar": "N"},
    )
    prune: bool | None = field(
        default=None,
        metadata={"help": "stop stable trials whose learning speed so far is behind the others at a quarter of "
                  "the steps (successive halving, Ray Tune's ASHA), and trials too slow to win; --no-prune runs "
                  "every trial to the end",
                  "default_help": "on, except with --sampler grid; for a pretrained model only the slow trials "
                  "are stopped (its learning does not show in a quarter of the steps: the longer rungs halve)"},
    )
    confirm_top: int = field(
        default=2,
        metadata={"help": "how many top candidates to confirm", "rule": AT_LEAST_1, "metavar": "K"},
    )
    warm_start: str = field(
        default="auto",
        metadata={"help": "start from earlier searches of the same trainer, model (or another size of its family) "
                  "and hardware in this store (every experiment; the dataset compared by fingerprint): their "
                  "recommendation runs first, precisions that crashed and batch sizes that ran out of memory in "
                  "every trial there are left out, their trials (of this model) are told to the sampler and a "
                  "third of the trials run, and on the same data their speeds are reused; the pick is still "
                  "confirmed on this data, and if their pick fails here, or nothing is confirmed, the search runs "
                  "a cold search's trials, less its speed stage where their speeds are reused "
                  "(docs/how-a-search-works.md, Warm start). "
                  "auto: when a finished search matches; none: start cold; or a search's run id",
                  "metavar": "auto|none|RUN_ID"},
    )
    cluster_share: float | None = field(
        default=None,
        metadata={"help": "the share of the Ray cluster's GPUs (its CPUs, for CPU trials) that this search's trials "
                  "hold at once, e.g. 0.5: on a shared cluster the other searches' trials queue for the rest",
                  "default_help": "all that fit; tuner submit: 0.5, so that one search never takes a shared "
                  "cluster unless asked (--cluster-share 1, or --max-gpus N)",
                  "rule": Rule("must be above 0 and at most 1", lambda v: 0 < v <= 1), "metavar": "SHARE"},
    )
    max_gpus: float | None = field(
        default=None,
        metadata={"help": "the most GPUs this search's trials hold at once, e.g. 4 of a shared cluster's 16",
                  "default_help": "no cap beyond --cluster-share", "rule": POSITIVE, "metavar": "N"},
    )
    budget: int | None = field(
        default=None,
        metadata={"help": "when no stable trial learned within --max-steps, the best third of them are re-run with 3x "
                  "the steps (then 9x, ...) until one learns; this caps the optimizer steps those longer runs "
                  "spend in all", "default_help": "3 x trials x max-steps", "default_note": "",
                  "rule": NOT_NEGATIVE, "metavar": "STEPS"},
    )

    @property
    def entry(self) -> Adapter:
        """The trainer's entry in the trainer table (once the trainer is known: ``--trainer``, the space file's,
        or the default): the one place the search's trainer name is looked up."""
        return adapter(self.trainer or DEFAULT_TRAINER)


def prunes(options: SearchOptions) -> bool:
    """Whether the search stops trials that fall behind: --prune as given, else on for all but grid searches."""
    return options.sampler != "grid" if options.prune is None else options.prune


def option_fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(SearchOptions)


def option_field(name: str) -> dataclasses.Field:
    return next(f for f in option_fields() if f.name == name)


def flag(f: dataclasses.Field) -> str:
    """The command-line flag of a field: ``--max-steps`` for max_steps, unless its metadata names one."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def value_type(f: dataclasses.Field) -> type:
    """The type one command-line value is parsed as: ``int`` for ``int | None``, ``str`` for ``list[str] | None``."""
    hint = typing.get_type_hints(SearchOptions)[f.name]
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = kinds[0]
    return (typing.get_args(kind) or (str,))[0] if typing.get_origin(kind) is list else kind


def _shown(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 1800.0 -> "1800"
    return str(value)


def help_text(f: dataclasses.Field) -> str:
    """The field's help with "(default: X)" made from its real default (or its ``default_help``)."""
    text = f.metadata["help"]
    default = None if f.default is dataclasses.MISSING else f.default
    shown = f.metadata.get("default_help") if default is None else _shown(default)
    env = f.metadata.get("env")
    if env:
        shown = f"${env} when set, else {shown}"
    if shown is None:
        return text
    note = f.metadata.get("default_note")
    return f"{text} (default: {shown}{'; ' + note if note else ''})"


def env_default(f: dataclasses.Field) -> Any:
    """The command line's default for ``f``: its environment variable's value when the field names one and it is
    set (TUNER_STORE, TUNER_TRACKING_URI), else the declared default (None for a required field)."""
    env = f.metadata.get("env")
    if env and os.environ.get(env):
        return os.environ[env]
    return None if f.default is dataclasses.MISSING else f.default


def check_options(options: SearchOptions) -> None:
    """Every value against its field's choices and rule; raises TunerError "--FLAG VALUE: what is wrong".

    The command line checks the same rules while parsing (argparse's "argument --trials: ..., got 0"); this is
    the check for options built in code, and ``search.prepare`` runs it on every search.
    """
    for f in option_fields():
        value = getattr(options, f.name)
        if value is None:
            continue
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise TunerError(f"{flag(f)} {value}: unknown {f.name}; choose one of {', '.join(choices)}")
        rule = f.metadata.get("rule")
        if rule is not None and not rule.allows(value):
            raise TunerError(f"{flag(f)} {value}: {rule.text}")


def options_from(**kwargs) -> SearchOptions:
    """SearchOptions from keyword arguments (e.g. ``vars(args)``): unknown names and ``None`` values are ignored."""
    names = {f.name for f in option_fields()}
    return SearchOptions(**{k: v for k, v in kwargs.items() if k in names and v is not None})
