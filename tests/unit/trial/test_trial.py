"""One trial without training: trial configs checked, `tuner trial` refusing a bad config in one line, and the
measurement functions on hand-made numbers. Trials trained for real on the tiny model are
tests/training/trial/test_trial_training.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tuner.errors import TunerError
from tuner.trial import TrialSpec, load_trial_spec
from tuner.trial.measure import throughput

# -- trial configs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"trainer": "sft", "params": {}, "learning_rate": 0.1}, "learning_rate: unknown key"),
        ({"trainer": "sft"}, "missing key 'params'"),
        ({"params": {}}, "missing key 'trainer'"),
        ({"trainer": "sft", "params": [1, 2]}, "params: must be a mapping"),
        ({"trainer": "sft", "params": {}, "max_steps": 0}, "max_steps: must be a whole number >= 1, got 0"),
        ({"trainer": "sft", "params": {}, "max_steps": "ten"}, "max_steps: must be a whole number >= 1, got 'ten'"),
        ({"trainer": "sft", "params": {}, "max_steps": 2.5}, "max_steps:"),
        ({"trainer": "sft", "params": {}, "max_steps": True}, "max_steps:"),  # bool is an int to Python
        ({"trainer": "sft", "params": {}, "seed": -1}, "seed:"),
        ({"trainer": "sft", "params": {}, "fault": "sigbus@2"}, "fault must be '<kind>@<step>'"),
        ({"trainer": "sft", "params": {}, "fault": "sigfpe@x"}, "fault must be '<kind>@<step>'"),
        (["trainer", "sft"], "must be a YAML mapping"),
    ],
)
def test_from_mapping_rejects_bad_configs_in_one_line(data, expected):
    with pytest.raises(TunerError) as error:
        TrialSpec.from_mapping(data, "trial.yaml")
    message = str(error.value)
    assert message.startswith("trial.yaml: ") and expected in message
    assert "\n" not in message


def test_from_mapping_accepts_a_full_config():
    spec = TrialSpec.from_mapping({"trainer": "reward", "params": {"learning_rate": 0.3}, "max_steps": 5,
                                   "seed": 3, "fault": "oom@2"})
    assert (spec.trainer, spec.max_steps, spec.seed, spec.fault) == ("reward", 5, 3, "oom@2")
    assert spec.model == "tiny" and spec.dataset is None  # defaults: the tiny model, the built-in data


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trainer: sft\nparams: {learning_rate: 0.1\n", "malformed YAML"),
        ("trainer: sft\n  params: x\n", "malformed YAML"),
        ("", "must be a YAML mapping"),
        ("trainer: sft\nparams: {}\nmax_steps: -3\n", "max_steps: must be a whole number >= 1, got -3"),
    ],
)
def test_load_trial_spec_errors_name_the_file(text, expected, tmp_path):
    path = tmp_path / "trial.yaml"
    path.write_text(text)
    with pytest.raises(TunerError) as error:
        load_trial_spec(path)
    message = str(error.value)
    assert message.startswith(str(path)) and expected in message
    assert "\n" not in message


def test_load_trial_spec_missing_file(tmp_path):
    with pytest.raises(TunerError, match="trial config not found"):
        load_trial_spec(tmp_path / "nope.yaml")


# -- `tuner trial` -----------------------------------------------------------------------------------------


def _tuner_trial(config, cwd) -> subprocess.CompletedProcess:
    # os.environ carries the session's TUNER_CACHE_DIR to the command
    return subprocess.run([sys.executable, "-m", "tuner.cli", "trial", "--config", str(config)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env={**os.environ})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trainer: sft\nparams: {}\nbogus: 1\n", "bogus: unknown key"),
        ("trainer: sft\nparams: {learning_rate: 0.1\n", "malformed YAML"),
        (None, "trial config not found"),
    ],
    ids=["unknown-key", "malformed", "missing-file"],
)
def test_tuner_trial_command_bad_config_is_one_line_exit_2(text, expected, tmp_path):
    config = tmp_path / "trial.yaml"
    if text is not None:
        config.write_text(text)
    done = _tuner_trial(config, tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("tuner: error: ") and expected in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


# -- measurement -------------------------------------------------------------------------------------------


def test_throughput_counts_only_steps_after_warmup():
    times = [(1, 10.0), (2, 15.0), (3, 16.0), (4, 17.0), (5, 18.0)]
    history = [{"step": s, "num_tokens": 100.0 * s} for s, _ in times]
    # after 2 warm-up steps: steps 3..5, 2 steps in 2 s, 200 tokens; the slow first steps do not count
    tokens, samples = throughput(history, times, warmup=2, samples_per_step=8)
    assert tokens == pytest.approx(100.0)
    assert samples == pytest.approx(8.0)


def test_throughput_falls_back_to_all_steps_and_gives_up_on_one():
    times = [(1, 0.0), (2, 4.0)]
    history = [{"step": 1, "num_tokens": 10.0}, {"step": 2, "num_tokens": 30.0}]
    # fewer than 2 steps after warm-up: measure over every step there is
    assert throughput(history, times, warmup=2, samples_per_step=4) == (pytest.approx(5.0), pytest.approx(1.0))
    assert throughput(history[:1], times[:1], warmup=0, samples_per_step=4) == (None, None)


def test_throughput_without_token_counts_still_gives_samples():
    times = [(1, 0.0), (2, 1.0), (3, 3.0)]
    tokens, samples = throughput([{"step": 1, "loss": 1.0}], times, warmup=0, samples_per_step=2)
    assert tokens is None and samples == pytest.approx(2.0 * 2 / 3.0)
    # steps stamped at the same instant give no rate rather than a division by zero
    assert throughput([], [(1, 5.0), (2, 5.0)], warmup=0, samples_per_step=2) == (None, None)


def test_the_slow_limit_follows_the_best_learned_trial_with_a_minutes_margin():
    from tuner.search._execution import slow_limit

    ok = {"status": "ok", "learned": True, "progress": 0.3, "tokens_per_second": 100.0, "max_steps": 20}
    # nothing learned yet: no limit
    assert slow_limit([{**ok, "learned": False, "number": 0, "wall_seconds": 5.0}]) is None
    # the tiny model's 2-second trials: a minute more, not 4 s (their times jitter by more than 2x under load)
    assert slow_limit([{**ok, "number": 1, "wall_seconds": 2.0}])[0] == pytest.approx(62.0)
    # a real model's 250-second trials: twice that, and the reason names the trial it was measured against
    limit, reason = slow_limit([{**ok, "number": 3, "wall_seconds": 250.0},
                                {**ok, "number": 4, "wall_seconds": 500.0, "tokens_per_second": 10.0}])
    assert limit == pytest.approx(500.0) and "trial 3" in reason and "250 s" in reason


def test_a_trial_config_takes_a_schedule_length():
    spec = TrialSpec.from_mapping({"trainer": "sft", "params": {}, "max_steps": 60, "schedule_steps": 500})
    assert (spec.max_steps, spec.schedule_steps, spec.run_steps) == (60, 500, 500)
    assert TrialSpec(trainer="sft", params={}, max_steps=20).run_steps == 20  # 0: its own length
    with pytest.raises(TunerError, match="schedule_steps: must be a whole number >= 0"):
        TrialSpec.from_mapping({"trainer": "sft", "params": {}, "schedule_steps": -1}, "trial.yaml")
