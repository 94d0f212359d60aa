"""The sequence-length settings of a trainer's TRL config, and the lengths a search's trials ran as its export's
header comment records them.

    length_fields(entry)         # {"max_completion_length": 512}: each length setting of the trainer, TRL's default
    trials_used(12)              # "; the search's short trials used 12, a setting of ...": the export header's words
    search_lengths(text)         # {"max_completion_length": 12}: those words read back from an exported file

``tuner export`` writes the header (tuner.report.export); ``tuner verify`` reads it back, so that a file whose
lengths are left to TRL's defaults is verified at the lengths its search measured. The words are the ones exports
have always written, so files exported before ``tuner verify`` read them still verify as their search ran.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["LENGTH_FIELDS", "length_fields", "search_lengths", "trials_used"]

# The sequence-length settings of TRL's configs (TRL 1.16: max_length for dpo/kto/reward/sft,
# max_completion_length for grpo); max_prompt_length is listed for TRL versions that have it.
LENGTH_FIELDS = ("max_length", "max_prompt_length", "max_completion_length")
_TRIALS_USED = "the search's short trials used"
# "# max_completion_length: not set: TRL's default (512): ...; the search's short trials used 12, a setting ..."
_HEADER_LINE = re.compile(rf"^#\s*({'|'.join(LENGTH_FIELDS)}):\s.*{re.escape(_TRIALS_USED)} (\d+)\b")


def length_fields(entry) -> dict[str, Any]:
    """The trainer's length settings (``entry``: its tuner.config.trainers.Adapter) and TRL's default for each."""
    return {f.name: f.default for f in dataclasses.fields(entry.config_type()) if f.name in LENGTH_FIELDS}


def trials_used(value: int) -> str:
    """The export header's clause for a length the shipped space fixed for its short trials."""
    return f"; {_TRIALS_USED} {value}, a setting of tuner's shipped space, not a choice for your run"


def search_lengths(text: str) -> dict[str, int]:
    """The lengths the search's trials ran, from the header comment (the comment lines before the first setting) of
    a file ``tuner export`` wrote; {} for any other file, a ``tuner search --from`` export included (its trials ran
    the file's own lengths)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break  # the header ends where the settings start: a comment further down is the user's
        match = _HEADER_LINE.match(line.strip())
        if match:
            found[match.group(1)] = int(match.group(2))
    return found
