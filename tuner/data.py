"""Training data for trials: tiny built-in datasets per trainer, and user datasets with their columns checked.

    from tuner.data import builtin_dataset, load_dataset_spec
    builtin_dataset("dpo", size=64)                       # deterministic, words from VOCABULARY only
    load_dataset_spec("data/prefs.jsonl", "dpo")          # a local file, a save_to_disk folder, or a hub id

The built-in data is made so that the embedded tiny model (random weights) visibly learns in 20 optimizer
steps at batch 8 (measured with TRL 1.16: DPO and reward accuracy reach 1.0 at learning rate 5e-3, SFT loss
falls from 6.0 to 3.4, KTO loss from 0.5 to 0.16, GRPO reward doubles at 1e-2). The preference trainers share
one pattern, "colours are good, animals are bad":

- grpo:   prompts such as "name red cat colours"; the default reward (``tuner.rewards.builtin_reward``) is
          the fraction of completion words that are words of VOCABULARY; a random policy writes about one
          in four (the rest are word fragments), so completions in a group get different rewards.
- dpo, reward: chosen " yes good red blue green", rejected " no bad cat dog fox".
- kto:    the same completions unpaired, labelled True (colours) / False (animals), half and half.
- sft:    "text" lines from one small grammar: "the red cat sees four small dog".

Completions start with a space because TRL joins standard-format prompt and completion as ``prompt + completion``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import TunerError

if TYPE_CHECKING:
    import datasets

__all__ = [
    "ANIMALS",
    "COLOURS",
    "REQUIRED_COLUMNS",
    "TRAINERS",
    "VOCABULARY",
    "builtin_dataset",
    "check_columns",
    "check_trainer",
    "load_dataset_spec",
]

TRAINERS = ("grpo", "dpo", "kto", "reward", "sft")

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
COLOURS = ["black", "blue", "brown", "gold", "gray", "green", "orange", "pink", "purple", "red", "white", "yellow"]
ANIMALS = [
    "bear", "bird", "cat", "cow", "dog", "duck", "fish", "fox", "frog",
    "goat", "horse", "lion", "mouse", "owl", "pig", "sheep", "tiger", "wolf",
]  # fmt: skip
_VERBS = [
    "are", "chase", "chases", "count", "do", "does", "eat", "eats", "find", "finds", "give", "has", "have",
    "is", "like", "likes", "list", "make", "name", "say", "see", "sees", "take", "want", "wants",
]  # fmt: skip
_ANSWERS = ["bad", "false", "good", "maybe", "no", "right", "true", "wrong", "yes"]
_ADJECTIVES = ["big", "cold", "fast", "happy", "hot", "new", "old", "sad", "slow", "small"]
_NOUNS = [
    "animal", "animals", "ball", "box", "car", "colour", "colours", "fire", "house",
    "moon", "number", "numbers", "star", "sun", "tree", "water", "word", "words",
]  # fmt: skip
_FUNCTION_WORDS = [
    "a", "an", "and", "i", "in", "it", "not", "of", "on", "or", "that", "the", "they",
    "this", "to", "very", "we", "what", "which", "with", "you",
]  # fmt: skip

# Every word of every built-in dataset; the tiny model's tokenizer has exactly these words (plus special tokens),
# so nothing built in is ever tokenized to <unk>. Sorted so token ids are stable.
VOCABULARY: list[str] = sorted(
    set(DIGITS + COLOURS + ANIMALS + _VERBS + _ANSWERS + _ADJECTIVES + _NOUNS + _FUNCTION_WORDS)
)

# Column sets each TRL 1.16 trainer accepts (any one set suffices), most explicit first. From the trainers'
# `_prepare_dataset`: DPO and KTO extract a missing prompt from chosen/rejected, KTO unpairs chosen/rejected
# into completion/label, the reward trainer takes an optional prompt, SFT converts from/value "conversations".
REQUIRED_COLUMNS: dict[str, list[list[str]]] = {
    "grpo": [["prompt"]],
    "dpo": [["prompt", "chosen", "rejected"], ["chosen", "rejected"]],
    "kto": [["prompt", "completion", "label"], ["prompt", "chosen", "rejected"], ["chosen", "rejected"]],
    "reward": [["chosen", "rejected"], ["prompt", "chosen", "rejected"]],
    "sft": [["text"], ["prompt", "completion"], ["messages"], ["conversations"]],
}

_FILE_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def check_trainer(trainer: str) -> str:
    """Return ``trainer`` if it is one tuner knows, else raise a TunerError listing the known ones."""
    if trainer not in TRAINERS:
        raise TunerError(f"unknown trainer {trainer!r}; choose one of: {', '.join(TRAINERS)}")
    return trainer


def builtin_dataset(trainer: str, size: int = 256, seed: int = 0) -> datasets.Dataset:
    """A deterministic tiny dataset for ``trainer`` in TRL's standard (plain text) format.

    The same ``(trainer, size, seed)`` always gives the same rows; all words come from VOCABULARY.
    """
    from datasets import Dataset

    check_trainer(trainer)
    if size < 1:
        raise TunerError(f"built-in dataset size must be at least 1, but got {size=}")
    rng = random.Random(f"{trainer}:{seed}")  # a string seed is hashed deterministically (not by PYTHONHASHSEED)
    rows = [_BUILDERS[trainer](rng, i) for i in range(size)]
    return Dataset.from_dict({key: [row[key] for row in rows] for key in rows[0]})


def _grpo_row(rng: random.Random, i: int) -> dict:
    # Short prompts that mention colours and animals; the reward only looks at the completion, so the prompt
    # gives the policy context to condition on without making the task depend on reading it.
    verb = rng.choice(["name", "say", "list", "count"])
    words = rng.sample(COLOURS, 1) + rng.sample(ANIMALS, 1)
    rng.shuffle(words)
    return {"prompt": " ".join([verb, *words, rng.choice(["colours", "words"])])}


def _prompt(rng: random.Random) -> str:
    return f"do you like the {rng.choice(COLOURS)} {rng.choice(ANIMALS)}"


def _good(rng: random.Random) -> str:
    return " " + " ".join(["yes", "good", *rng.sample(COLOURS, rng.randint(2, 4))])


def _bad(rng: random.Random) -> str:
    return " " + " ".join(["no", "bad", *rng.sample(ANIMALS, rng.randint(2, 4))])


def _preference_row(rng: random.Random, i: int) -> dict:
    return {"prompt": _prompt(rng), "chosen": _good(rng), "rejected": _bad(rng)}


def _kto_row(rng: random.Random, i: int) -> dict:
    # Alternating labels keep desirable and undesirable exactly balanced, so KTO's default weights fit.
    desirable = i % 2 == 0
    prompt = _prompt(rng)
    return {"prompt": prompt, "completion": _good(rng) if desirable else _bad(rng), "label": desirable}


def _sft_row(rng: random.Random, i: int) -> dict:
    subject = f"the {rng.choice(COLOURS)} {rng.choice(ANIMALS)}"
    verb = rng.choice(["sees", "likes", "finds", "chases", "eats"])
    count = rng.choice(DIGITS[2:])
    return {"text": f"{subject} {verb} {count} {rng.choice(_ADJECTIVES)} {rng.choice(ANIMALS)}"}


_BUILDERS = {
    "grpo": _grpo_row,
    "dpo": _preference_row,
    "kto": _kto_row,
    "reward": _preference_row,
    "sft": _sft_row,
}


def check_columns(dataset: datasets.Dataset, trainer: str, where: str) -> None:
    """Raise a TunerError unless ``dataset`` has one of the column sets ``trainer`` accepts.

    The message names ``where`` (a file or dataset id), the closest accepted set, what is missing and what is there.
    """
    check_trainer(trainer)
    has = list(dataset.column_names)
    accepted = REQUIRED_COLUMNS[trainer]
    if any(set(columns) <= set(has) for columns in accepted):
        _check_label_type(dataset, trainer, where)
        return
    closest = min(accepted, key=lambda columns: len(set(columns) - set(has)))  # ties: the first, most explicit
    missing = [column for column in closest if column not in has]
    message = (
        f"{where}: {trainer} needs columns {', '.join(closest)}; missing: {', '.join(missing)} "
        f"(has: {', '.join(has) or 'no columns'})"
    )
    if len(accepted) > 1:
        message += "; accepted column sets: " + " | ".join(", ".join(columns) for columns in accepted)
    raise TunerError(message + "; rename or add the columns")


def _check_label_type(dataset: datasets.Dataset, trainer: str, where: str) -> None:
    # KTO indexes with the label as a boolean mask; 0/1 integers or "yes"/"no" strings fail deep inside training.
    if trainer != "kto" or "label" not in dataset.column_names or "completion" not in dataset.column_names:
        return
    dtype = getattr(dataset.features["label"], "dtype", type(dataset.features["label"]).__name__)
    if dtype != "bool":
        raise TunerError(
            f"{where}: kto column 'label' must be true/false (desirable or not), but it holds {dtype}; "
            "write it as JSON true/false or cast it with dataset.cast_column('label', Value('bool'))"
        )


def load_dataset_spec(spec: str | os.PathLike | None, trainer: str, split: str = "train") -> datasets.Dataset:
    """--dataset value -> a checked Dataset.

    None or "builtin" -> builtin_dataset(trainer). A local .jsonl/.json/.parquet/.csv file -> that file.
    A local directory written by ``save_to_disk``, or holding data files -> that dataset (its ``split``).
    Anything else is a Hugging Face Hub dataset id, loaded with ``datasets.load_dataset(spec, split=split)``.
    """
    check_trainer(trainer)
    if spec is None or spec == "builtin":
        return builtin_dataset(trainer)
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        dataset = _load_file(path, split)
    elif path.is_dir():
        dataset = _load_folder(path, split)
    elif _looks_like_path(spec):
        raise TunerError(
            f"dataset file {spec!r} does not exist; check the path, or leave --dataset out to use the built-in data"
        )
    else:
        dataset = _load_hub(spec, split)
    if len(dataset) == 0:
        raise TunerError(f"{spec}: dataset split {split!r} has no rows; a trial needs at least one example")
    check_columns(dataset, trainer, spec)
    return dataset


def _looks_like_path(spec: str) -> bool:
    from tuner.models import looks_like_path

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

    from tuner.models import hub_unavailable_reason, looks_like_hub_id

    if not looks_like_hub_id(spec):
        raise TunerError(
            f"dataset {spec!r} is not a local file or folder, nor a hub dataset id like 'org/name'; "
            "fix the name, or leave --dataset out to use the built-in data"
        )
    fix = (
        f"download it first (hf download {spec} --repo-type dataset --local-dir DIR) and pass DIR, "
        "or leave --dataset out to use the built-in data"
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
