"""The user's inputs: paths resolved against the folder the command runs in, every value typed (2e-4 is a number),
GRPO rewards probed on real rows before any trial, a space's trainer as the default, and errors raised inside a
trial told in one line with their place instead of being lost in Ray's logs.

Real trainers on the tiny model, real files in a temporary working directory, the real CLI entry (in this
process, like most cases of tests/unit/cli/test_cli_errors.py). Refusals must come before the store exists: no MLflow
run, no Optuna study. The one case that runs a search (relative paths reaching Ray's trials) is
tests/e2e/inputs/test_inputs_e2e.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers import USER_REWARDS as REWARDS
from helpers import tuner_in as tuner
from helpers import write_files as write

from tuner.config.trainers import adapter
from tuner.errors import TunerError
from tuner.inputs.data import builtin_dataset
from tuner.search import driver as search
from tuner.trial import TrialSpec, prepare_trial_spec, run_trial, run_trial_isolated
from tuner.trial._isolation import _child

STORE = "mlflow"  # relative: each test runs in its own tmp_path, so the store would appear there

# GRPO prompts of the user's own (with a column a reward can read); 8 rows: the probe reads 4, a trial a few.
PROMPTS = "".join(json.dumps({"prompt": row["prompt"], "solution": "4"}) + "\n"
                  for row in builtin_dataset(adapter("grpo"), size=8).to_list())
CHAT_PROMPTS = "".join(json.dumps({"prompt": [{"role": "user", "content": row["prompt"]}]}) + "\n"
                       for row in builtin_dataset(adapter("grpo"), size=8).to_list())


def assert_refused(result: tuple[int, str, str], fragment: str, folder: Path) -> str:
    code, out, err = result
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), err
    assert fragment in lines[0], lines[0]
    assert code == 2 and out == "" and "Traceback" not in err
    # refused before anything was written: no store, so no MLflow run and no Optuna study
    assert not (folder / STORE).exists()
    assert not list(folder.rglob("*.db"))
    return lines[0]


def grpo_search(*args: str) -> tuple[str, ...]:
    return ("search", "--store", STORE, "--dataset", "prompts.jsonl", *args)


# -- paths are the user's paths ----------------------------------------------------------------------------------

# One grid point: grpo is the space's trainer (no --trainer on the command line), and the fixed and searched
# numbers are spelled as people write them (PyYAML reads 1e-2 and 2e-3 as strings). Small so the search takes
# seconds: batch 2 x 2 generations of 6 tokens.
E2E_SPACE = """\
trainer: grpo
fixed:
  per_device_train_batch_size: 2
  num_generations: 2
  max_completion_length: 6
  weight_decay: 1e-2
  use_peft: false
  activation_checkpointing: false
params:
  precision: {type: categorical, choices: [fp32]}
  learning_rate: {type: categorical, choices: [2e-3]}
"""


def test_prepare_stores_absolute_paths_and_the_space_trainer(tiny_model, tmp_path, monkeypatch):
    write(tmp_path, {"prompts.jsonl": PROMPTS, "rewards/mine.py": REWARDS,
                     "space.yaml": E2E_SPACE.replace("trainer: grpo", "trainer: grpo  # the default trainer")})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    options = search.options_from(dataset="prompts.jsonl", reward_funcs=["rewards/mine.py:length"],
                                  search_space="space.yaml", store=str(tmp_path / STORE), trainer=None)
    prepared = search.prepare(options)
    o = prepared.options
    assert o.trainer == "grpo"
    assert o.dataset == str(tmp_path / "prompts.jsonl")
    assert o.reward_funcs == [f"{tmp_path / 'rewards' / 'mine.py'}:length"]
    assert o.search_space == prepared.space.source == str(tmp_path / "space.yaml")
    assert prepared.space.fixed["weight_decay"] == 0.01
    assert prepared.space.params["learning_rate"].choices == [0.002]


def test_space_trainer_is_the_default_and_a_conflicting_flag_is_refused(tiny_model, tmp_path, monkeypatch, capsys):
    space = E2E_SPACE.replace("trainer: grpo", "trainer: dpo").replace("  num_generations: 2\n  max_completion_length: 6\n", "")
    accepted, refused = tmp_path / "accepted", tmp_path / "refused"
    write(accepted, {"space.yaml": space})
    monkeypatch.chdir(accepted)
    prepared = search.prepare(search.options_from(search_space="space.yaml", store=str(accepted / STORE)))
    assert prepared.options.trainer == "dpo" and prepared.experiment == "dpo-tiny"
    assert_refused(tuner(refused, monkeypatch, capsys, "search", "--store", STORE, "--search-space", "space.yaml",
                         "--trainer", "reward", files={"space.yaml": space}),
                   "space.yaml: trainer: the space is for 'dpo' but --trainer is 'reward'", refused)


# -- numbers as people write them; wrong types refused -----------------------------------------------------------


def test_yaml_numbers_in_a_trial_config_train_for_real(tiny_model, tmp_path, monkeypatch, capsys):
    # 1e-2 for weight_decay was the fused AdamW error, 2e-4 for learning_rate the '<=' float/str TypeError.
    # sft is the cheapest trainer; 2 steps at batch 2 run the optimizer for real.
    config = ("trainer: sft\nmax_steps: 2\nwarmup_steps: 0\n"
              "params: {learning_rate: 2e-4, weight_decay: 1e-2, per_device_train_batch_size: 2, max_length: 1E2}\n")
    code, out, err = tuner(tmp_path, monkeypatch, capsys, "trial", "--config", "trial.yaml",
                           files={"trial.yaml": config})
    assert code == 0, err
    assert "status:            ok" in out, out
    spec = prepare_trial_spec(tmp_path / "trial.yaml")
    assert spec.params == {"learning_rate": 0.0002, "weight_decay": 0.01, "per_device_train_batch_size": 2,
                           "max_length": 100}
    assert all(type(v) in (int, float) for v in spec.params.values())


WRONG_TYPES = [
    ("fixed", "space.yaml", "  weight_decay: heavy\n", "space.yaml: fixed.weight_decay: expected a number, got 'heavy'"),
    ("choices", "space.yaml", "  per_device_train_batch_size: {type: categorical, choices: [2, 2.5]}\n",
     "space.yaml: params.per_device_train_batch_size.choices.1: expected a whole number, got 2.5"),
    ("bool-for-number", "space.yaml", "  learning_rate: {type: categorical, choices: [true]}\n",
     "space.yaml: params.learning_rate.choices.0: expected a number, got True"),
    ("float-range-for-int", "space.yaml", "  gradient_accumulation_steps: {type: float, low: 1, high: 4}\n",
     "space.yaml: params.gradient_accumulation_steps: type float samples fractional values, but "
     "gradient_accumulation_steps takes a whole number"),
    ("trial-config", "trial.yaml", "learning_rate: fast", "trial.yaml: params.learning_rate: expected a number, got 'fast'"),
    ("trial-config-bool", "trial.yaml", "use_peft: 1e-2", "trial.yaml: params.use_peft: expected true or false"),
]


@pytest.mark.parametrize(("file", "line", "fragment"), [w[1:] for w in WRONG_TYPES], ids=[w[0] for w in WRONG_TYPES])
def test_a_value_of_the_wrong_type_is_refused_naming_file_and_key(file, line, fragment, tiny_model, tmp_path,
                                                                  monkeypatch, capsys):
    if file == "space.yaml":
        space = "trainer: sft\nfixed:\n  max_length: 32\nparams:\n  precision: {type: categorical, choices: [fp32]}\n"
        if line.startswith("  weight_decay"):
            space = space.replace("fixed:\n", "fixed:\n" + line)
        else:
            space += line
        args = ("search", "--store", STORE, "--search-space", "space.yaml")
        files = {"space.yaml": space}
    else:
        args = ("trial", "--config", "trial.yaml")
        files = {"trial.yaml": f"trainer: sft\nmax_steps: 2\nparams: {{{line}}}\n"}
    assert_refused(tuner(tmp_path, monkeypatch, capsys, *args, files=files), fragment, tmp_path)


def test_lora_settings_without_use_peft_are_refused(tmp_path, monkeypatch, capsys):
    base = "trainer: sft\nparams:\n  lora_r: {type: categorical, choices: [4, 8]}\n"
    assert_refused(tuner(tmp_path, monkeypatch, capsys, "search", "--store", STORE, "--search-space", "space.yaml",
                         files={"space.yaml": base}),
                   "space.yaml: params.lora_r: LoRA settings need use_peft, which is not set", tmp_path)
    off = base.replace("params:\n", "fixed:\n  use_peft: false\nparams:\n")
    assert_refused(tuner(tmp_path, monkeypatch, capsys, "search", "--store", STORE, "--search-space", "space.yaml",
                         files={"space.yaml": off}),
                   "space.yaml: params.lora_r: LoRA settings need use_peft, which is never true", tmp_path)


def test_a_broken_jsonl_line_is_named(tmp_path, monkeypatch, capsys):
    rows = PROMPTS.splitlines()
    rows[4] = rows[4][:-1]  # line 5 loses its closing brace
    assert_refused(tuner(tmp_path, monkeypatch, capsys, *grpo_search("--reward-func", "builtin"),
                         files={"prompts.jsonl": "\n".join(rows) + "\n"}),
                   "prompts.jsonl: cannot be read as json (line 5, column", tmp_path)


# -- rewards are probed before any trial -------------------------------------------------------------------------


def test_grpo_on_the_users_data_needs_a_reward(tiny_model, tmp_path, monkeypatch, capsys):
    assert_refused(tuner(tmp_path, monkeypatch, capsys, *grpo_search(), files={"prompts.jsonl": PROMPTS}),
                   "--dataset prompts.jsonl: grpo on your own data needs a reward for it", tmp_path)


PROBES = [
    ("raises", "my_rewards:boom", PROMPTS, "reward function 'my_rewards:boom' fails on 4 rows of prompts.jsonl with "
     "plain-text completions: ValueError: this reward is broken (my_rewards.py:9 in boom)"),
    ("wrong-count", "my_rewards:one_reward", PROMPTS,
     "reward function 'my_rewards:one_reward' returned 1 rewards for 4 completions"),
    ("nan", "my_rewards:not_a_number", PROMPTS, "reward function 'my_rewards:not_a_number' returned nan"),
    ("not-numbers", "my_rewards:words", PROMPTS, "reward function 'my_rewards:words' returned 'many'"),
    ("missing-column", "accuracy_reward", CHAT_PROMPTS,
     "reward function 'accuracy_reward' needs a dataset column 'solution', which prompts.jsonl does not have"),
    # TRL's think_format_reward reads completion[0]["content"]: conversational only
    ("plain-text-for-a-chat-reward", "think_format_reward", PROMPTS,
     "reward function 'think_format_reward' fails on 4 rows of prompts.jsonl with plain-text completions: TypeError"),
]


@pytest.mark.parametrize(("reward", "data", "fragment"), [p[1:] for p in PROBES], ids=[p[0] for p in PROBES])
def test_a_reward_that_cannot_work_is_refused_before_any_trial(reward, data, fragment, tiny_model, tmp_path,
                                                               monkeypatch, capsys):
    assert_refused(tuner(tmp_path, monkeypatch, capsys, *grpo_search("--reward-func", reward),
                         files={"prompts.jsonl": data, "my_rewards.py": REWARDS}), fragment, tmp_path)


def test_accuracy_reward_without_math_verify_is_refused(tiny_model, tmp_path, monkeypatch, capsys):
    if importlib.util.find_spec("math_verify") is not None:
        pytest.skip("math_verify is installed here: accuracy_reward can run")
    line = assert_refused(tuner(tmp_path, monkeypatch, capsys, *grpo_search("--reward-func", "accuracy_reward"),
                                files={"prompts.jsonl": CHAT_PROMPTS.replace('}]}', '}], "solution": "4"}')}),
                          "reward function 'accuracy_reward' needs a package that is not installed: ImportError: "
                          "Please install the `math_verify` package", tmp_path)
    assert "accuracy_rewards.py:" in line  # where it was raised


def test_rewards_that_work_pass_the_probe_in_either_format(tiny_model, tmp_path, monkeypatch):
    write(tmp_path, {"plain.jsonl": PROMPTS, "chat.jsonl": CHAT_PROMPTS, "my_rewards.py": REWARDS})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for data, rewards in (("plain.jsonl", ["my_rewards:length", "builtin"]),
                          ("chat.jsonl", ["my_rewards:length", "think_format_reward", "get_soft_overlong_punishment"])):
        prepared = search.prepare(search.options_from(dataset=data, reward_funcs=rewards, store=str(tmp_path / STORE)))
        assert prepared.options.dataset == str(tmp_path / data)


# -- errors inside a trial come back in one line, with where ------------------------------------------------------


def test_a_trial_that_cannot_load_its_data_says_why_not_exit_code_1(tiny_model, tmp_path):
    # What a relative --dataset did inside Ray: the trial's process could not find the file.
    spec = TrialSpec(trainer="sft", params={}, dataset=str(tmp_path / "gone.jsonl"), max_steps=1)
    result = run_trial_isolated(spec, tmp_path / "trial", timeout=300)
    assert result.status == "crashed"
    assert result.reason.startswith(f"TunerError: dataset file '{tmp_path / 'gone.jsonl'}' does not exist")
    assert "(tuner/inputs/data.py:" in result.reason and " in load_dataset_spec)" in result.reason
    assert "exited with code" not in result.reason


def test_the_child_entry_turns_any_error_into_a_crashed_result(tmp_path):
    _child({"trainer": "sft", "params": {}, "bogus": 1}, str(tmp_path))  # in this process: nothing is spawned
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "crashed"
    assert result["reason"].startswith("TypeError: TrialSpec.__init__() got an unexpected keyword argument 'bogus'")


def test_a_reward_raising_during_training_is_named_with_its_place(tiny_model, tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    # tiny GRPO run (1 step, 2 prompts x 2 generations of 4 tokens): the reward is called in the first step
    spec = TrialSpec(trainer="grpo", reward_funcs=[f"{tmp_path / 'my_rewards.py'}:boom"], max_steps=1,
                     params={"per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 4})
    result = run_trial(spec, tmp_path / "work")
    assert result.status == "crashed"
    assert result.reason == "ValueError: this reward is broken (my_rewards.py:9 in boom)"


def test_trial_config_paths_are_resolved_against_the_working_directory(tiny_model, tmp_path, monkeypatch):
    write(tmp_path, {"data/prompts.jsonl": PROMPTS, "my_rewards.py": REWARDS,
                     "trial.yaml": "trainer: grpo\nmax_steps: 1\ndataset: data/prompts.jsonl\n"
                                   "reward_funcs: my_rewards:length\nparams: {}\n"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = prepare_trial_spec("trial.yaml")
    assert spec.dataset == str(tmp_path / "data" / "prompts.jsonl")
    assert spec.reward_funcs == [f"{tmp_path / 'my_rewards.py'}:length"]
    with pytest.raises(TunerError, match=r"^trial\.yaml: reward_funcs: grpo on your own dataset needs a reward"):
        (tmp_path / "trial.yaml").write_text("trainer: grpo\ndataset: data/prompts.jsonl\nparams: {}\n")
        prepare_trial_spec("trial.yaml")
