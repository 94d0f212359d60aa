"""Published `trl <trainer> --config` files through `tuner search --from` (tuner.config.trl_config, trl_keys).

tests/data/config/published/ holds 16 configs as their authors published them (TRL's examples/cli_configs and
docs/source/clis.md, alignment-handbook and open-r1 recipes), each with its source and commit in a comment. TRL's own
CLI is the judge of what is accepted: ``trl <trainer> --config`` parses the file with its dataclasses and hands
every key they do not know to ``accelerate launch``, whose parser refuses what it does not know
(trl/cli/commands/training.py). Each file is checked as published and refreshed to today's names (the keys TRL
refuses renamed or removed): refused in one line naming every key TRL refuses, accepted when TRL accepts it, and
trial 0 running every key as written.
"""

from __future__ import annotations

import pytest
import yaml
from helpers import CURRENT_NAME, PUBLISHED, refreshed, trainer_of, trl_refuses

from tuner.config import trl_config, trl_keys
from tuner.errors import TunerError

# Keys that are tuner's search inputs, precision or the run's plumbing: a trial sets them itself.
INPUTS = {"model_name_or_path", "dataset_name", "reward_funcs", "dtype", "bf16", "fp16", "use_peft"}


def test_the_published_set_covers_every_trainer_and_what_users_meet():
    # the claims below hold on configs of all five trainers, and the files keep what the issue met
    assert {trainer_of(p) for p in PUBLISHED} == {"sft", "dpo", "grpo", "kto", "reward"}
    texts = {p.name: p.read_text() for p in PUBLISHED}
    assert all(t.startswith("# source: huggingface/") and " @ " in t.splitlines()[0] for t in texts.values())
    assert sum("num_processes: 4" in t for t in texts.values()) >= 2
    assert sum("cosine_with_min_lr" in t for t in texts.values()) >= 2
    assert any("load_in_4bit: true" in t for t in texts.values())


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_a_published_file_is_refused_exactly_when_trl_refuses_it_naming_every_key(path):
    refused = trl_refuses(trainer_of(path), path)
    if not refused:
        source = trl_config.read_config(path)
        assert source.trainer == trainer_of(path)
        return
    with pytest.raises(TunerError) as error:
        trl_config.read_config(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    # every key at once, each with what to write instead
    assert f"would refuse {len(refused)} key" in message
    # in the file's order, each key with its reason: "k1: why; k2: why"
    body = message.split(" key: " if len(refused) == 1 else " keys: ", 1)[1]
    starts = []
    for i, key in enumerate(refused):
        starts.append(body.index(f"{key}: ") if i == 0 else body.index(f"; {key}: ", starts[-1]) + 2)
    assert starts[0] == 0
    for key, start, end in zip(refused, starts, [*starts[1:], len(body)]):
        reason = body[start + len(key) + 2:end]
        assert reason.strip("; "), key
        if key in CURRENT_NAME:
            assert CURRENT_NAME[key] in reason  # a renamed key names its current name, not a look-alike
            assert "did you mean" not in reason


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_refreshed_to_current_names_every_key_reaches_trial_0_or_is_said(tmp_path, path):
    fresh = refreshed(path, tmp_path)
    assert trl_refuses(trainer_of(path), fresh) == []  # TRL accepts the refreshed file
    source = trl_config.read_config(fresh)
    raw = yaml.safe_load(fresh.read_text())
    said = " ".join(source.notes)
    for key, value in raw.items():
        if key in source.params:
            # as written: mappings (lr_scheduler_kwargs, gradient_checkpointing_kwargs) and model settings included
            written = value[0] if key == "lora_target_modules" and isinstance(value, list) and len(value) == 1 \
                else value
            assert source.params[key] == written, key
        elif key in source.launch:
            assert key in trl_keys.launch_keys()
        else:
            assert key in INPUTS or key in trl_config.HARNESS or f"{key}:" in said, key
    # the space around trial 0 carries every non-searched param as a fixed value, mappings included
    space = trl_config.derive_space(source)
    for key, value in source.params.items():
        if key not in space.params and key not in ("precision", "gradient_accumulation_steps", "use_peft"):
            assert space.fixed[key] == value, key


def test_accelerate_launch_keys_are_accepted_and_a_bad_value_is_refused_in_one_line(tmp_path):
    # TRL's docs publish num_processes: 4 for DPO; accelerate's parser checks its value as `trl dpo` would
    (path,) = [p for p in PUBLISHED if p.stem == "trl_cli_dpo"]
    source = trl_config.read_config(path)
    assert source.launch == {"num_processes": 4} and source.num_processes == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("num_processes: 4", "num_processes: four"))
    with pytest.raises(TunerError) as error:
        trl_config.read_config(bad)
    assert "num_processes" in str(error.value) and "\n" not in str(error.value)


def test_unknown_keys_get_a_close_name_only_when_one_is_close(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("# trl sft --config my.yaml\nmodel_name_or_path: tiny\nlearnin_rate: 0.1\nfoo_bar: 1\n"
                    "torch_dtype: bfloat16\n")
    with pytest.raises(TunerError) as error:
        trl_config.read_config(path)
    message = str(error.value)
    assert "refuse 3 keys" in message
    assert "learnin_rate: unknown; did you mean learning_rate?" in message
    assert "foo_bar: unknown: remove it" in message
    assert "torch_dtype: TRL and transformers now call it dtype" in message
