"""tuner.inputs.data (built-in and user datasets) and tuner.inputs.rewards (GRPO reward functions)."""

import json
import random
import time

import pytest

from tuner.config.trainers import ADAPTERS, adapter
from tuner.errors import TunerError
from tuner.inputs._tiny_data import VOCABULARY
from tuner.inputs.data import builtin_dataset, check_columns, load_dataset_spec
from tuner.inputs.rewards import TRL_REWARDS, builtin_reward, resolve_reward_funcs, reward_func_spec

TRAINERS = tuple(ADAPTERS)
REQUIRED_COLUMNS = {name: [list(columns) for columns in a.columns] for name, a in ADAPTERS.items()}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _error(function, *args, **kwargs) -> str:
    with pytest.raises(TunerError) as caught:
        function(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- built-in datasets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer", TRAINERS)
def test_builtin_dataset_fits_its_trainer(trainer):
    dataset = builtin_dataset(adapter(trainer), size=64)
    assert len(dataset) == 64
    check_columns(dataset, adapter(trainer), "builtin")
    assert list(dataset.column_names) in REQUIRED_COLUMNS[trainer]


@pytest.mark.parametrize("trainer", TRAINERS)
def test_builtin_dataset_is_deterministic(trainer):
    assert builtin_dataset(adapter(trainer), size=32).to_list() == builtin_dataset(adapter(trainer), size=32).to_list()
    assert builtin_dataset(adapter(trainer), size=32).to_list() != builtin_dataset(adapter(trainer), size=32, seed=1).to_list()


@pytest.mark.parametrize("trainer", TRAINERS)
def test_builtin_dataset_uses_only_vocabulary_words(trainer):
    vocabulary = set(VOCABULARY)
    for row in builtin_dataset(adapter(trainer), size=256):
        for value in row.values():
            if isinstance(value, str):
                assert set(value.split()) <= vocabulary, value


@pytest.mark.parametrize("column", ["chosen", "rejected", "completion"])
def test_builtin_completions_start_with_a_space(column):
    # TRL joins standard-format prompt and completion as prompt + completion, with nothing between.
    for trainer in ("dpo", "kto", "reward"):
        dataset = builtin_dataset(adapter(trainer), size=16)
        if column in dataset.column_names:
            assert all(text.startswith(" ") and not text.startswith("  ") for text in dataset[column])


def test_builtin_kto_labels_are_balanced_booleans():
    dataset = builtin_dataset(adapter("kto"), size=64)
    assert dataset.features["label"].dtype == "bool"
    assert sum(dataset["label"]) == 32


def test_builtin_preferences_follow_one_pattern():
    for row in builtin_dataset(adapter("dpo"), size=32):
        assert row["chosen"].split()[:2] == ["yes", "good"]
        assert row["rejected"].split()[:2] == ["no", "bad"]


def test_vocabulary_is_sorted_lowercase_words():
    assert VOCABULARY == sorted(set(VOCABULARY))
    assert all(word.isalpha() and word.islower() for word in VOCABULARY)
    assert 100 <= len(VOCABULARY) <= 200


def test_unknown_trainer_lists_the_known_ones():
    message = _error(adapter, "ppo")
    assert "unknown trainer 'ppo'" in message
    assert all(trainer in message for trainer in TRAINERS)


# --- user datasets -------------------------------------------------------------------------------------


def test_check_columns_names_what_is_missing():
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": ["a"], "chosen": ["b"]})
    message = _error(check_columns, dataset, adapter("dpo"), "data/prefs.jsonl")
    assert message.startswith(
        "data/prefs.jsonl: dpo needs columns prompt, chosen, rejected; missing: rejected (has: prompt, chosen)"
    )


# Every column set each trainer lists, as (trainer, columns): e.g. DPO extracts the prompt from chosen/rejected
# itself, SFT takes prompt/completion as well as text.
LISTED_SETS = [(name, columns) for name, sets in REQUIRED_COLUMNS.items() for columns in sets]


@pytest.mark.parametrize(("trainer", "columns"), LISTED_SETS,
                         ids=[f"{name}-{'+'.join(columns)}" for name, columns in LISTED_SETS])
def test_check_columns_accepts_any_listed_set(trainer, columns):
    from datasets import Dataset

    # exactly the set's columns, one row; a KTO label is a true/false, as check_columns asks
    dataset = Dataset.from_dict({c: [True] if c in adapter(trainer).bool_columns else ["a b"] for c in columns})
    check_columns(dataset, adapter(trainer), "x.jsonl")  # raises TunerError if it refuses the set


@pytest.mark.parametrize(("trainer", "columns", "missing"), [
    ("dpo", {"chosen": ["a b"]}, "missing: rejected"),  # the closest set is chosen/rejected
    ("sft", {"prompt": ["a"]}, "missing: text"),  # prompt alone is no set; of the sets one column away, the first
    ("kto", {"prompt": ["a"], "completion": [" b"]}, "missing: label"),
])
def test_check_columns_refuses_a_set_that_is_none_of_the_listed_ones(trainer, columns, missing):
    from datasets import Dataset

    message = _error(check_columns, Dataset.from_dict(columns), adapter(trainer), "x.jsonl")
    assert message.startswith(f"x.jsonl: {trainer} needs columns ") and missing in message, message
    assert "accepted column sets: " in message  # each of these trainers lists more than one


def test_check_columns_wants_boolean_kto_labels():
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": ["a"], "completion": [" b"], "label": [1]})
    assert "kto column 'label' must be true/false" in _error(check_columns, dataset, adapter("kto"), "x.jsonl")


def test_load_builtin_when_no_dataset_is_given():
    assert load_dataset_spec(None, adapter("sft")).to_list() == builtin_dataset(adapter("sft")).to_list()


def test_load_jsonl_file(tmp_path):
    rows = builtin_dataset(adapter("dpo"), size=8).to_list()
    path = _write_jsonl(tmp_path / "prefs.jsonl", rows)
    assert load_dataset_spec(str(path), adapter("dpo")).to_list() == rows


def test_load_jsonl_with_a_missing_column(tmp_path):
    path = _write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "a", "chosen": " b"}])
    assert f"{path}: dpo needs columns prompt, chosen, rejected; missing: rejected" in _error(
        load_dataset_spec, str(path), adapter("dpo")
    )


def test_load_empty_jsonl(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert "empty" in _error(load_dataset_spec, str(path), adapter("sft"))


def test_load_saved_dataset_folder(tmp_path):
    from datasets import DatasetDict

    dataset = builtin_dataset(adapter("kto"), size=8)
    dataset.save_to_disk(str(tmp_path / "single"))
    DatasetDict({"train": dataset}).save_to_disk(str(tmp_path / "splits"))
    assert load_dataset_spec(str(tmp_path / "single"), adapter("kto")).to_list() == dataset.to_list()
    assert load_dataset_spec(str(tmp_path / "splits"), adapter("kto")).to_list() == dataset.to_list()
    assert "no split 'test'" in _error(load_dataset_spec, str(tmp_path / "splits"), adapter("kto"), split="test")


def test_load_folder_of_data_files(tmp_path):
    # The layout `hf download --repo-type dataset --local-dir DIR` leaves: data files, no save_to_disk metadata.
    rows = builtin_dataset(adapter("reward"), size=8).to_list()
    (tmp_path / "data").mkdir()
    _write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    assert load_dataset_spec(str(tmp_path), adapter("reward")).to_list() == rows


def test_load_bad_local_specs(tmp_path):
    assert "does not exist" in _error(load_dataset_spec, str(tmp_path / "missing.jsonl"), adapter("sft"))
    assert "does not exist" in _error(load_dataset_spec, "./missing.jsonl", adapter("sft"))
    (tmp_path / "data.txt").write_text("hello")
    assert "unsupported dataset file type '.txt'" in _error(load_dataset_spec, str(tmp_path / "data.txt"), adapter("sft"))
    (tmp_path / "empty").mkdir()
    message = _error(load_dataset_spec, str(tmp_path / "empty"), adapter("sft"))
    assert "is a directory but cannot be loaded as a dataset" in message
    assert "nor a hub dataset id" in _error(load_dataset_spec, "bad name!", adapter("sft"))


def test_load_unreachable_hub_dataset_offline(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    message = _error(load_dataset_spec, "tuner-tests/no-such-dataset", adapter("dpo"))
    assert time.monotonic() - started < 5
    assert "dataset 'tuner-tests/no-such-dataset' is neither a local file nor reachable" in message


# --- rewards -------------------------------------------------------------------------------------------


def _random_policy_completions(count: int, length: int = 16) -> list[str]:
    # What an untrained policy writes: uniformly random tokens of the tiny model's tokenizer.
    from tuner.inputs.models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    rng = random.Random(0)
    return [
        tokenizer.decode([rng.randrange(len(tokenizer)) for _ in range(length)], skip_special_tokens=True)
        for _ in range(count)
    ]


def test_builtin_reward_varies_on_random_completions():
    rewards = builtin_reward(prompts=["name red cat colours"] * 32, completions=_random_policy_completions(32))
    assert len(rewards) == 32 and all(0.0 <= reward <= 1.0 for reward in rewards)
    # A random policy already earns different rewards, so GRPO's advantages are not all zero from step one.
    assert len(set(rewards)) > 3
    assert 0.05 < sum(rewards) / len(rewards) < 0.6


def test_builtin_reward_prefers_whole_words():
    words, fragments, mixed, empty = builtin_reward(
        completions=[" yes good red blue", " re gr blu xq", " red gr", ""]
    )
    assert (words, fragments, mixed, empty) == (1.0, 0.0, 0.5, 0.0)


def test_builtin_reward_accepts_conversational_completions():
    completions = [[{"role": "assistant", "content": "yes red"}], [{"role": "assistant", "content": "re d"}]]
    assert builtin_reward(prompts=[[{"role": "user", "content": "hi"}]] * 2, completions=completions) == [1.0, 0.0]


def test_resolve_reward_funcs_defaults_and_names():
    assert resolve_reward_funcs(None) == [builtin_reward]
    assert resolve_reward_funcs([]) == [builtin_reward]
    assert resolve_reward_funcs(["builtin"]) == [builtin_reward]
    both_spellings = ["tuner.inputs.rewards:builtin_reward", "tuner.inputs.rewards.builtin_reward"]
    assert resolve_reward_funcs(both_spellings) == [builtin_reward, builtin_reward]
    functions = resolve_reward_funcs(list(TRL_REWARDS))
    assert len(functions) == len(TRL_REWARDS) and all(callable(function) for function in functions)


def test_resolve_reward_funcs_import_errors():
    message = _error(resolve_reward_funcs, ["nope:missing"])
    assert message.startswith("reward function 'nope:missing' cannot be imported: No module named 'nope'")
    assert "has no 'missing'" in _error(resolve_reward_funcs, ["tuner.inputs.rewards:missing"])
    assert "not callable" in _error(resolve_reward_funcs, ["tuner.inputs.rewards:TRL_REWARDS"])
    assert "is not 'builtin', a TRL reward" in _error(resolve_reward_funcs, ["nodots"])


def test_resolve_reward_funcs_finds_modules_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "tuner_test_my_rewards.py").write_text("def length(completions, **kwargs):\n    return [1.0]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    (function,) = resolve_reward_funcs(["tuner_test_my_rewards:length"])
    assert function(completions=["a"]) == [1.0]


def test_reward_func_spec_for_trl_yaml():
    assert reward_func_spec("builtin") == "tuner.inputs.rewards.builtin_reward"
    assert reward_func_spec(builtin_reward) == "tuner.inputs.rewards.builtin_reward"
    assert reward_func_spec("think_format_reward") == "think_format_reward"
    assert reward_func_spec("my_lib.rewards:custom") == "my_lib.rewards.custom"
    assert reward_func_spec("my_lib.rewards.custom") == "my_lib.rewards.custom"


# --- the built-in data of a pretrained model -----------------------------------------------------------------


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_pretrained_models_builtin_data_is_the_task_rows_and_fits_its_trainer(trainer):
    tasks_rows = builtin_dataset(adapter(trainer), size=16, tiny=False)
    check_columns(tasks_rows, adapter(trainer), "the built-in data")
    assert tasks_rows.to_list() != builtin_dataset(adapter(trainer), size=16).to_list()
    assert tasks_rows.to_list() == builtin_dataset(adapter(trainer), size=16, tiny=False).to_list()
