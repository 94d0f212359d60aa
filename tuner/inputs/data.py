"""Training data for trials: the built-in dataset of a trainer, and user datasets with their columns checked.

    from tuner.inputs.data import builtin_dataset, load_dataset_spec
    builtin_dataset(adapter("dpo"), size=64)                       # deterministic: the trainer entry's built-in rows
    load_dataset_spec("data/prefs.jsonl", "dpo")          # a local file, a save_to_disk folder, or a hub id

What a trainer reads (its column sets, its built-in rows) is its entry in ``tuner.config.trainers``; the tiny model's
own task is ``tuner.inputs._tiny_data``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.config.trainers import Adapter
from tuner.errors import TunerError
from tuner.inputs import _tiny_data as tiny_data
from tuner.inputs import sums, tasks

if TYPE_CHECKING:
    import datasets

__all__ = [
    "builtin_dataset",
    "check_columns",
    "load_dataset_spec",
]

_FILE_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def builtin_dataset(entry: Adapter, size: int = 256, seed: int = 0, tiny: bool = True,
                    real: bool = False) -> datasets.Dataset:
    """A deterministic dataset of the trainer entry's built-in rows: the tiny model's own task (``tiny``), else
    exact-answer questions a pretrained model can learn (tuner.inputs.tasks, TRL's standard plain-text format); for
    GRPO and SFT on a real model (``real``: not one of tuner's tiny models) single-digit sums in chat form, tasks a
    135M instruct model moves on within tens of steps (tuner.inputs.sums.sum_rows, sum_sft_rows).

    The same ``(entry, size, seed, tiny, real)`` always gives the same rows.
    """
    from datasets import Dataset

    if size < 1:
        raise TunerError(f"built-in dataset size must be at least 1, but got {size=}")
    if tiny:
        rng = random.Random(f"{entry.name}:{seed}")  # a string seed is hashed deterministically (not by PYTHONHASHSEED)
        rows = [tiny_data.ROWS[entry.rows](rng, i) for i in range(size)]
    elif real and entry.uses_reward_funcs:
        rows = sums.sum_rows(size, seed)
    elif real and entry.rows == "completion":
        rows = sums.sum_sft_rows(size, seed)
    else:
        rows = tasks.ROWS[entry.rows](size, seed)
    return Dataset.from_dict({key: [row[key] for row in rows] for key in rows[0]})


def builtin_reward(tiny: bool, real: bool = False) -> str:
    """The reward of the built-in data (for a trainer that learns from rewards), as a --reward-func value: the tiny
    task's; the chat sums' for a real model (``real``, tuner.inputs.sums.bare_sum_reward); else the exact answer
    of tuner.inputs.tasks."""
    from tuner.inputs import rewards, sums, tasks

    if tiny:
        return rewards.BUILTIN
    return rewards.reward_func_spec(sums.bare_sum_reward if real else tasks.exact_answer_reward)


def check_columns(dataset: datasets.Dataset, entry: Adapter, where: str) -> None:
    """Raise a TunerError unless ``dataset`` has one of the column sets the trainer ``entry`` accepts.

    The message names ``where`` (a file or dataset id), the closest accepted set, what is missing and what is there.
    """
    has = list(dataset.column_names)
    accepted = [list(columns) for columns in entry.columns]
    if any(set(columns) <= set(has) for columns in accepted):
        _check_bool_columns(dataset, entry, where)
        return
    closest = min(accepted, key=lambda columns: len(set(columns) - set(has)))  # ties: the first, most explicit
    missing = [column for column in closest if column not in has]
    message = (
        f"{where}: {entry.name} needs columns {', '.join(closest)}; missing: {', '.join(missing)} "
        f"(has: {', '.join(has) or 'no columns'})"
    )
    if len(accepted) > 1:
        message += "; accepted column sets: " + " | ".join(", ".join(columns) for columns in accepted)
    raise TunerError(message + "; rename or add the columns")


def _check_bool_columns(dataset: datasets.Dataset, entry, where: str) -> None:
    # KTO indexes with the label as a boolean mask; 0/1 integers or "yes"/"no" strings fail deep inside training.
    for column in entry.bool_columns:
        if column not in dataset.column_names or "completion" not in dataset.column_names:
            continue
        dtype = getattr(dataset.features[column], "dtype", type(dataset.features[column]).__name__)
        if dtype != "bool":
            raise TunerError(
                f"{where}: {entry.name} column {column!r} must be true/false (desirable or not), but it holds {dtype}; "
                f"write it as JSON true/false or cast it with dataset.cast_column({column!r}, Value('bool'))"
            )


def load_dataset_spec(spec: str | os.PathLike | None, entry: Adapter, split: str = "train",
                      tiny: bool = True, real: bool = False) -> datasets.Dataset:
    """--dataset value -> a checked Dataset.

    None or "builtin" -> builtin_dataset(entry, tiny=tiny, real=real). A local .jsonl/.json/.parquet/.csv file -> that file.
    A local directory written by ``save_to_disk``, or holding data files -> that dataset (its ``split``).
    Anything else is a Hugging Face Hub dataset id, loaded with ``datasets.load_dataset(spec, split=split)``.
    """
    if spec is None or spec == "builtin":
        return builtin_dataset(entry, tiny=tiny, real=real)
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        dataset = _load_file(path, split)
    elif path.is_dir():
        dataset = _load_folder(path, split)
    elif _looks_like_path(spec):
        raise TunerError(
            f"dataset file {spec!r} does not exist; check the path, or pass --dataset builtin for the built-in data"
        )
    else:
        dataset = _load_hub(spec, split)
    if len(dataset) == 0:
        raise TunerError(f"{spec}: dataset split {split!r} has no rows; a trial needs at least one example")
    check_columns(dataset, entry, spec)
    return dataset


def _looks_like_path(spec: str) -> bool:
    from tuner.inputs.models import looks_like_path

    return looks_like_path(spec) or Path(spec).suffix.lower() in _FILE_LOADERS


def _load_file(path: Path, split: str) -> datasets.Dataset:
    import datasets

    loader = _FILE_LOADERS.get(path.suffix.lower())
    if loader is None:
        raise TunerError(
            f"{path}: unsupported dataset file type {path.suffix or '(none)'!r}; "
            f"use one of {', '.join(_FILE_LOADERS)} or a folder written by Dataset.save_to_disk"
        )
    if path.stat().st_size == 0:
        raise TunerError(f"{path}: the file is empty; a trial needs at least one example")
    try:
        # A local file is one split; `split` only picks among the splits of hub datasets and save_to_disk folders.
        return datasets.load_dataset(loader, data_files={"train": str(path)}, split="train")
    except Exception as error:  # noqa: BLE001 - parser errors come in many types; all mean "this file is bad"
        bad = _bad_json_place(path) if loader == "json" else None
        if bad is not None:  # the datasets loader names no line ("An error occurred while generating the dataset")
            raise TunerError(f"{path}: cannot be read as json ({bad}); fix that line") from error
        raise TunerError(f"{path}: cannot be read as {loader} ({_one_line(error)}); fix the file format") from error


def _bad_json_place(path: Path) -> str | None:
    """Where a .json/.jsonl file stops being JSON objects ("line 3, column 14: Expecting ','"), or None."""
    import json

    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("["):  # one JSON document: a list of objects
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            return f"line {error.lineno}, column {error.colno}: {error.msg}"
        lines = [(f"item {i}", row) for i, row in enumerate(rows)] if isinstance(rows, list) else []
    else:  # JSON lines: one object per line
        lines = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                lines.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as error:
                return f"line {number}, column {error.colno}: {error.msg}"
    for place, row in lines:
        if not isinstance(row, dict):
            return f"{place}: expected a JSON object {{...}} with the columns as keys, got {type(row).__name__}"
    return None


def resolve_dataset_path(spec: str | os.PathLike | None) -> str | None:
    """--dataset as the trials must see it: a local file or folder becomes absolute (trials run in other working
    directories); None, "builtin" and hub ids stay as they are."""
    if spec is None or spec == "builtin":
        return spec
    path = Path(os.fspath(spec)).expanduser()
    return str(path.resolve()) if path.exists() else os.fspath(spec)


def _load_folder(path: Path, split: str) -> datasets.Dataset:
    import datasets

    saved = (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
    try:
        # A save_to_disk folder, or else a folder of data files (such as `hf download --repo-type dataset` writes).
        loaded = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path), split=split)
    except Exception as error:  # noqa: BLE001 - no data files, unreadable files, a missing split
        raise TunerError(
            f"{path} is a directory but cannot be loaded as a dataset ({_one_line(error)}); pass a folder written "
            "by Dataset.save_to_disk, a folder of .jsonl/.parquet/.csv files, or one such file"
        ) from error
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise TunerError(f"{path}: no split {split!r}; it has: {', '.join(loaded)}; pass one of them as the split")
        return loaded[split]
    return loaded


def _load_hub(spec: str, split: str) -> datasets.Dataset:
    import datasets

    from tuner.inputs.models import hub_unavailable_reason, looks_like_hub_id

    if not looks_like_hub_id(spec):
        raise TunerError(
            f"dataset {spec!r} is not a local file or folder, nor a hub dataset id like 'org/name'; "
            "fix the name, or pass --dataset builtin for the built-in data"
        )
    fix = (
        f"download it first (hf download {spec} --repo-type dataset --local-dir DIR) and pass --dataset DIR, "
        "or pass --dataset builtin for the built-in data"
    )
    reason = hub_unavailable_reason(spec, repo_type="dataset")
    if reason is not None:
        raise TunerError(
            f"dataset {spec!r} is neither a local file nor reachable on the Hugging Face Hub ({reason}); {fix}"
        )
    try:
        loaded = datasets.load_dataset(spec, split=split)
    except Exception as error:  # noqa: BLE001 - not found, gated, no network, bad split: all one line for the user
        raise TunerError(f"dataset {spec!r} split {split!r} cannot be loaded ({_one_line(error)}); {fix}") from error
    if not isinstance(loaded, datasets.Dataset):  # an IterableDataset or dict would need other handling downstream
        raise TunerError(f"dataset {spec!r} split {split!r} did not load as a single table ({type(loaded).__name__})")
    return loaded


def _one_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
