"""tuner.inputs.lengths: the token lengths of a dataset's rows with the model's tokenizer, and the profile a warm
start compares two datasets by (other data whose rows are of alike lengths runs at the same speeds)."""

import json

import pytest

from tuner.config.trainers import ADAPTERS, adapter
from tuner.inputs import lengths
from tuner.inputs.data import builtin_dataset


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("first, second, expected", [
    ("p10=6,p50=7,p90=8,n=256", "p10=6,p50=7,p90=8,n=256", True),
    ("p10=6,p50=7,p90=8,n=256", "p10=7,p50=8,p90=9,n=64", True),  # one token apart each: short rows
    ("p10=100,p50=200,p90=400,n=256", "p10=109,p50=219,p90=439,n=256", True),  # within 10%
    ("p10=100,p50=200,p90=400,n=256", "p10=100,p50=200,p90=450,n=256", False),  # the long tail grew by 12%
    ("p10=6,p50=7,p90=8,n=256", "p10=6,p50=7,p90=10,n=256", False),  # two tokens on 8
    ("p10=6,p50=7,p90=8,n=256", "", False),  # a search from before profiles were kept
    ("", "", False),
    ("p10=6,p50=7,p90=8,n=256", "p50=7,n=256", False),
    ("p10=6,p50=7,p90=8,n=256", "not a profile", False),
])
def test_two_profiles_are_alike_when_each_percentile_is_within_a_tenth_or_a_token(first, second, expected):
    assert lengths.alike(first, second) is expected
    assert lengths.alike(second, first) is expected


def test_a_profile_is_the_nearest_rank_percentiles_of_the_lengths():
    assert lengths.profile(list(range(1, 101))) == "p10=10,p50=50,p90=90,n=100"
    assert lengths.profile([5]) == "p10=5,p50=5,p90=5,n=1"
    assert lengths.profile([]) == ""
    assert lengths.parse("p10=10,p50=50,p90=90,n=100") == {"p10": 10, "p50": 50, "p90": 90, "n": 100}


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
