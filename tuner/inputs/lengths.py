"""The token lengths of a dataset's rows, as a trainer reads them: the export's max_length, and the profile a warm
start compares two datasets by.

    kind, texts = sequences(entry, row, tokenizer)        # the texts of one row whose longest is its length
    lengths = token_lengths(entry, dataset, tokenizer)    # one per row, of the first MEASURE_ROWS rows
    profile(lengths)                                      # "p10=6,p50=7,p90=8,n=256"
    alike("p10=6,p50=7,p90=8,n=256", "p10=6,p50=8,p90=8,n=256")   # True: within ALIKE of each other

What a row's length is: for GRPO (no pairs of columns, ``Adapter.length_pairs == ()``) its prompt, the part read
from the data (the completion is generated to the search's fixed max_completion_length); for DPO, KTO and the
reward model the longest prompt+answer; for SFT the whole text or conversation (with the model's chat template).

Two profiles are alike when each of their 10th, 50th and 90th percentiles (nearest rank) lie within ALIKE (a share)
or one token of each other: rows of such lengths pad and batch alike, so one config's tokens/s on the one data is
its speed on the other (tuner.search._warm: the speeds a warm start reuses).
"""

from __future__ import annotations

import math
from typing import Any

from tuner.config.trainers import Adapter

__all__ = ["ALIKE", "MEASURE_ROWS", "QUANTILES", "alike", "data_profile", "nearest_rank", "parse", "profile",
           "sequences", "text_of", "token_lengths"]

MEASURE_ROWS = 256  # enough rows for a stable high percentile; tokenizing them takes well under a second
QUANTILES = (10, 50, 90)
ALIKE = 0.1  # two profiles' percentiles within 10% (or one token) of each other


def text_of(value: Any, tokenizer) -> str:
    """A dataset cell as the text the trainer tokenizes: a string, or a conversation (list of messages)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if getattr(tokenizer, "chat_template", None):
            try:
                return tokenizer.apply_chat_template(value, tokenize=False)
            except Exception:  # noqa: BLE001 - a template that cannot render these messages: count their words
                pass
        return "\n".join(str(m.get("content", "")) for m in value)
    return "" if value is None else str(value)


def _join(prompt: Any, rest: Any, tokenizer) -> str:
    if isinstance(prompt, list) and isinstance(rest, list):
        return text_of(prompt + rest, tokenizer)
    return text_of(prompt, tokenizer) + text_of(rest, tokenizer)


def sequences(entry: Adapter, row: dict[str, Any], tokenizer) -> tuple[str, list[str]]:
    """(what is measured, the texts of one row whose longest is the row's length)."""
    prompt = row.get("prompt", "" if not isinstance(row.get("chosen", row.get("completion")), list) else [])
    pairs = entry.length_pairs
    if pairs:
        return (" and ".join(f"{first}+{second}" for first, second in pairs),
                [_join(row.get(first, prompt), row[second], tokenizer) for first, second in pairs])
    if pairs == () and "prompt" in row:  # GRPO: the prompt is read, the completion generated
        return "prompt", [text_of(row["prompt"], tokenizer)]
    if "messages" in row:
        return "messages", [text_of(row["messages"], tokenizer)]
    if "completion" in row:
        return "prompt+completion", [_join(prompt, row["completion"], tokenizer)]
    return "text", [text_of(row.get("text"), tokenizer)]


def token_lengths(entry: Adapter, dataset, tokenizer, rows: int = MEASURE_ROWS) -> tuple[list[int], str]:
    """(the token length of each of the first ``rows`` rows, sorted; what was measured: "prompt+chosen ...")."""
    n = min(rows, len(dataset))
    lengths, what = [], ""
    for row in dataset.select(range(n)):
        what, texts = sequences(entry, row, tokenizer)
        lengths.append(max(len(tokenizer(text, add_special_tokens=True)["input_ids"]) for text in texts))
    return sorted(lengths), what


def nearest_rank(lengths: list[int], percent: float) -> int:
    """The ``percent``-th percentile of sorted ``lengths`` (nearest rank)."""
    return lengths[max(0, math.ceil(percent / 100 * len(lengths)) - 1)]


def profile(lengths: list[int]) -> str:
    """The lengths as a warm start compares them: "p10=6,p50=7,p90=8,n=256"; "" for no rows."""
    if not lengths:
        return ""
    return ",".join([*(f"p{q}={nearest_rank(lengths, q)}" for q in QUANTILES), f"n={len(lengths)}"])


def data_profile(entry: Adapter, dataset: str | None, model_path: str) -> str:
    """The profile of ``dataset`` (a --dataset spec; None: the trainer's built-in rows) with the model's tokenizer;
    "" when it cannot be measured (a warm start then reuses no other data's speeds: nothing fails for it)."""
    try:
        from transformers import AutoTokenizer

        from tuner.inputs import data, models

        rows = data.load_dataset_spec(dataset, entry, tiny=models.is_tiny(model_path),
                                      real=not models.is_built_here(model_path))
        return profile(token_lengths(entry, rows, AutoTokenizer.from_pretrained(model_path))[0])
    except Exception:  # noqa: BLE001 - the inputs were checked before this; a profile is an optimisation only
        return ""


def parse(text: str) -> dict[str, int]:
    """A profile's numbers ({"p10": 6, ..., "n": 256}); {} for "" or text that is not a profile."""
    try:
        return {key: int(value) for key, value in (part.split("=") for part in text.split(",") if part)}
    except ValueError:
        return {}


def alike(first: str, second: str) -> bool:
    """Whether two profiles' rows are of the same lengths: each percentile within ALIKE or one token. A missing
    profile (a search before profiles were kept, or data that could not be measured) is alike to none."""
    a, b = parse(first), parse(second)
    keys = [f"p{q}" for q in QUANTILES]
    if not all(key in a and key in b for key in keys):
        return False
    return all(abs(a[key] - b[key]) <= max(1, ALIKE * max(a[key], b[key])) for key in keys)
