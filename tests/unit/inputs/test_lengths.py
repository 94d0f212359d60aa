"""tuner.inputs.lengths: the token lengths of a dataset's rows with the model's tokenizer, and the profile a warm
start compares two datasets by (other data whose rows are of alike lengths runs at the same speeds)."""


import pytest

from tuner.inputs import lengths


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
