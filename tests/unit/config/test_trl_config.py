"""A user's `trl <trainer> --config` file in tuner's terms (tuner.config.trl_config), and their file edited with the
fewest changes (tuner.report.fix.edit_text): TRL's own parser reads both, nothing trains here.
"""

from __future__ import annotations

import pytest
from helpers import REWARD_HALF, read

from tuner.config import trl_config
from tuner.config.user_yaml import load_yaml
from tuner.errors import TunerError
from tuner.report import fix
from tuner.search._neighbours import neighbours


@pytest.mark.parametrize(("lines", "precision"), [
    ("dtype: float16\nbf16: false\n", "fp16-pure"),  # the "half" weights of docs/failures.md
    ("dtype: bfloat16\nbf16: false\n", "bf16-pure"),
    ("dtype: bfloat16\nbf16: true\n", "bf16-pure"),  # bf16 autocast over bf16 weights: the weights decide
    ("dtype: float32\nbf16: false\n", "fp32"),
    ("dtype: float32\n", "bf16-mixed"),  # TRL turns bf16 on when it is left out
    ("bf16: true\n", "bf16-mixed"),
])
def test_precision_is_the_row_of_their_weights_and_trls_flags(tmp_path, lines, precision):
    assert read(tmp_path, "model_name_or_path: tiny\n" + lines, "reward").params["precision"] == precision


def test_their_fields_become_trial_params_and_the_plumbing_does_not(tmp_path):
    source = read(tmp_path, REWARD_HALF)
    assert source.trainer == "reward"  # from the file's own comment
    assert source.params == {"precision": "fp16-pure", "use_peft": True, "lora_r": 8,
                             "lora_target_modules": "all-linear",  # TRL reads a one-name list as the name
                             "learning_rate": 2e-4, "per_device_train_batch_size": 2,
                             "gradient_accumulation_steps": 32}
    assert source.model == "tiny"


def test_the_derived_space_holds_trial_0_and_keeps_the_effective_batch(tmp_path):
    source = read(tmp_path, REWARD_HALF)
    space = trl_config.derive_space(source)
    first = trl_config.trial0(space, source)
    assert first["precision"] == "fp16-pure" and first["learning_rate"] == 2e-4
    lr = space.params["learning_rate"]
    assert lr.low == pytest.approx(2e-5) and lr.high == pytest.approx(2e-3)
    assert space.effective_batch == 64 and "gradient_accumulation_steps" not in space.fixed
    for batch in space.params["per_device_train_batch_size"].choices:
        assert 64 % batch == 0
    assert "lora_r" in space.params and "use_peft" in space.params
    # the YAML printed at the start reads back as the same space
    (tmp_path / "space.yaml").write_text(trl_config.space_yaml(space))
    from tuner.config.space import load_space

    assert load_space(tmp_path / "space.yaml").params == space.params


def test_single_changes_follow_trial_0s_verdict(tmp_path):
    source = read(tmp_path, REWARD_HALF)
    space = trl_config.derive_space(source)
    first = trl_config.trial0(space, source)

    def changed(point):
        return {k: v for k, v in point.items() if first.get(k) != v}

    unstable = neighbours(space, first, {"status": "diverged"})
    assert changed(unstable[0]) == {"precision": "fp32"}
    assert changed(unstable[1]) == {"learning_rate": 2e-5}  # downwards first
    assert all(len(changed(p)) == 1 for p in unstable)
    not_learning = neighbours(space, first, {"status": "ok", "learned": False})
    assert changed(not_learning[0]) == {"learning_rate": 2e-3}  # upwards first
    healthy = neighbours(space, first, {"status": "ok", "learned": True})
    assert all(set(changed(p)) <= set(trl_config.SPEED_KNOBS) for p in healthy)


def test_edit_text_changes_only_the_named_values_and_keeps_every_other_line():
    new = fix.edit_text(REWARD_HALF, load_yaml(REWARD_HALF), {"dtype": "float32", "learning_rate": 2e-5,
                                                            "fp16": False})
    before, after = REWARD_HALF.splitlines(), new.splitlines()
    assert after[2] == 'dtype: float32       # "half" weights'  # its comment kept
    assert after[7] == "learning_rate: 2.0e-05"  # a float YAML 1.1 reads back as a float
    assert [a for a, b in zip(after, before) if a != b] == [after[2], after[7]]
    assert after[-1] == "fp16: false"  # a key the file lacked, appended
    loaded = load_yaml(new)
    assert list(loaded)[:len(load_yaml(REWARD_HALF))] == list(load_yaml(REWARD_HALF))
    assert loaded["learning_rate"] == 2e-5


@pytest.mark.parametrize(("text", "trainer", "fragment"), [
    ("model_name_or_path: tiny\nlearnin_rate: 0.1\n", "reward", "learnin_rate: unknown; did you mean learning_rate?"),
    ("model_name_or_path: tiny\nreward_funcs: [accuracy_reward]\n", "dpo", "a setting of trl grpo, not of trl dpo"),
    ("# trl dpo --config x.yaml\nmodel_name_or_path: tiny\n", "kto", "the file says it is for `trl dpo`"),
    ("model_name_or_path: tiny\nlearning_rate: fast\n", "sft", "learning_rate"),
    ("- a list\n", "sft", "must be a YAML mapping"),
])
def test_a_file_trl_would_refuse_is_refused_naming_file_and_key(tmp_path, text, trainer, fragment):
    with pytest.raises(TunerError) as error:
        read(tmp_path, text, trainer)
    message = str(error.value)
    assert "my.yaml" in message and fragment in message and "\n" not in message


def test_the_files_env_is_set_as_trl_sets_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNER_TEST_FROM_ENV", raising=False)
    source = read(tmp_path, REWARD_HALF + "env:\n  TUNER_TEST_FROM_ENV: 3\n")
    assert any(note.startswith("env: ") for note in source.notes)  # said before the trials
    source.set_env()
    import os

    assert os.environ["TUNER_TEST_FROM_ENV"] == "3"
    monkeypatch.delenv("TUNER_TEST_FROM_ENV")
