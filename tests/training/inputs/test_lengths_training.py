"""tuner.inputs.lengths on real rows with the tiny model's tokenizer: the built-in rows of two seeds alike, rows four
times as long not (the profiles themselves, on made-up figures, are tests/unit/inputs/test_lengths.py)."""

import json

import pytest

from tuner.config.trainers import ADAPTERS, adapter
from tuner.inputs import lengths
from tuner.inputs.data import builtin_dataset


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("trainer", sorted(ADAPTERS))
def test_the_built_in_rows_of_two_seeds_are_alike_and_rows_four_times_as_long_are_not(trainer, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    entry = adapter(trainer)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    here, _ = lengths.token_lengths(entry, builtin_dataset(entry, seed=0), tokenizer)
    other, what = lengths.token_lengths(entry, builtin_dataset(entry, seed=1), tokenizer)
    assert len(here) == lengths.MEASURE_ROWS and min(here) > 1, (what, here[:5])  # something was measured
    assert lengths.alike(lengths.profile(here), lengths.profile(other)), (lengths.profile(here), lengths.profile(other))
    # the same rows with every text column four times as long: other lengths
    rows = builtin_dataset(entry, seed=1).to_list()
    longer = [{k: (" ".join([v] * 4) if isinstance(v, str) and k != "label" else v) for k, v in row.items()}
              for row in rows]
    profile = lengths.data_profile(entry, _write_jsonl(tmp_path / "long.jsonl", longer), tiny_model)
    assert profile and not lengths.alike(lengths.profile(here), profile), (lengths.profile(here), profile)


def test_grpo_rows_are_measured_by_their_prompt(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    row = builtin_dataset(adapter("grpo"), seed=0)[0]
    what, texts = lengths.sequences(adapter("grpo"), row, tokenizer)
    assert what == "prompt" and texts == [lengths.text_of(row["prompt"], tokenizer)] and texts[0]


def test_data_that_cannot_be_measured_has_no_profile_and_fails_nothing(tiny_model, tmp_path):
    assert lengths.data_profile(adapter("sft"), str(tmp_path / "missing.jsonl"), tiny_model) == ""
    assert lengths.data_profile(adapter("sft"), None, tiny_model).startswith("p10=")  # the built-in rows
