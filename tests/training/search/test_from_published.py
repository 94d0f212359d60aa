"""Published TRL configs as trial 0 of a `tuner search --from` on the tiny model: the flags beside --from win over
the file, what this CPU cannot run is said before any trial starts, and trial 0 runs the rest of the file as
written without a false crash (tests/data/config/published/, refreshed to today's TRL names as in
tests/unit/config/test_published_configs.py).

Trials here are 3 steps (a false crash, such as cosine_with_min_lr without its lr_scheduler_kwargs, happens at the
first step), to keep the file within a minute on a 2-core CPU. The one search (1 trial of 10 steps) is
tests/e2e/search/test_from_published_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from helpers import PUBLISHED, refreshed, trainer_of

from tuner.errors import TunerError
from tuner.records import Status
from tuner.search import driver
from tuner.search._sampling import enqueue
from tuner.trial import TrialSpec, run_trial


def published(stem: str) -> Path:
    (path,) = [p for p in PUBLISHED if p.stem == stem]
    return path


def prepare(tmp_path: Path, path: Path, **flags) -> driver.Prepared:
    return driver.prepare(driver.SearchOptions(from_config=str(path), store=str(tmp_path / "mlflow"), **flags))


def trial0_params(prepared: driver.Prepared) -> dict:
    """Trial 0's params as the search hands them to the trial: their values enqueued, the space's fixed ones."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    enqueue(study, prepared.start.first)
    return prepared.space.suggest(study.ask())


# name -> what this CPU cannot run of it (said before the trials), and a key trial 0 must carry as written
CASES = {
    "handbook_smollm3_apo": (("use_liger_kernel", "attn_implementation"), "lr_scheduler_kwargs"),  # the false crash
    "handbook_zephyr_dpo_qlora": (("load_in_4bit", "optim", "attn_implementation"), "gradient_checkpointing_kwargs"),
    "openr1_distill_sft": (("use_liger_kernel", "attn_implementation"), "lr_scheduler_kwargs"),
    "trl_cli_dpo": ((), None),  # num_processes: 4, replaced by --processes-per-trial 1
}


@pytest.mark.slow
@pytest.mark.parametrize("stem", CASES)
def test_trial_0_of_a_published_config_runs_as_written_with_the_flags_beside_it(tmp_path, tiny_model, stem):
    cannot, carried = CASES[stem]
    path = refreshed(published(stem), tmp_path)
    raw = yaml.safe_load(path.read_text())
    prepared = prepare(tmp_path, path, model="tiny", dataset="builtin", processes_per_trial=1)
    # the flags won over the file, and the search says so
    o = prepared.options
    assert o.model == "tiny" and o.dataset == "builtin" and o.processes_per_trial == 1
    origins = "\n".join(prepared.start.origins)
    assert f"over the file's model_name_or_path: {raw['model_name_or_path']}" in origins
    # what this CPU cannot run is said before any trial, one line per key, with what trial 0 runs instead (a CUDA
    # machine with bitsandbytes, liger-kernel and flash-attn installed runs them)
    import torch

    if torch.cuda.is_available():
        cannot = ()
    for key in cannot:
        (line,) = [w for w in prepared.warnings if f": {key}: " in w]
        assert "the trials run" in line and "your file keeps it" in line
    params = trial0_params(prepared)
    assert not {k for k in cannot if raw.get(k) is True} & {k for k, v in params.items() if v is True}
    if carried is not None:
        assert params[carried] == raw[carried]  # a mapping, as written
    for key, value in raw.items():  # every other setting of trial 0 is theirs
        if key in params and key not in cannot and key not in ("lora_target_modules", "loss_type"):
            assert params[key] == value, key
    spec = TrialSpec(trainer=trainer_of(path), params=params, model=prepared.model_path, dataset=o.dataset,
                     max_steps=3, seed=0)  # 3 steps: a false crash comes at the first
    result = run_trial(spec)
    assert result.status == Status.OK, result.reason


def test_the_files_num_processes_is_a_trials_processes_unless_the_flag_says_otherwise(tmp_path, tiny_model):
    path = refreshed(published("trl_cli_dpo"), tmp_path)
    prepared = prepare(tmp_path, path, model="tiny", dataset="builtin")
    assert prepared.options.processes_per_trial == 4
    assert "processes_per_trial: 4 from the file's num_processes" in prepared.start.origins


def test_dataset_file_and_reward_funcs_flags_replace_the_files(tmp_path, tiny_model):
    rows = [{"chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(16)]
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = refreshed(published("trl_cli_dpo"), tmp_path)
    prepared = prepare(tmp_path, path, model="tiny", dataset=str(data), processes_per_trial=1)
    assert prepared.options.dataset == str(data.resolve())
    assert f"dataset: {data} from --dataset (over the file's dataset_name: anthropic/hh-rlhf)" in prepared.start.origins
    # GRPO: the file's reward_funcs are open-r1's names, which TRL does not know: refused naming the file and
    # the flag; the flag then replaces them, and reward_weights must match the functions given
    grpo = refreshed(published("openr1_grpo_demo"), tmp_path)
    with pytest.raises(TunerError, match=r"reward_funcs: .*'accuracy'.*or pass --reward-func NAME"):
        prepare(tmp_path, grpo, model="tiny", dataset="builtin")
    with pytest.raises(TunerError, match="reward_weights: 3 weights"):
        prepare(tmp_path, grpo, model="tiny", dataset="builtin", reward_funcs=["tuner.inputs.rewards.builtin_reward"])


def test_the_advice_of_an_unreachable_model_refusal_works_when_followed(tmp_path, tiny_model):
    path = refreshed(published("trl_cli_sft"), tmp_path)  # Qwen/Qwen2.5-0.5B on stanfordnlp/imdb: no hub here
    with pytest.raises(TunerError) as error:
        prepare(tmp_path, path)
    assert "--model tiny" in str(error.value)
    with pytest.raises(TunerError) as error:
        prepare(tmp_path, path, model="tiny")
    assert "--dataset builtin" in str(error.value)
    prepared = prepare(tmp_path, path, model="tiny", dataset="builtin")
    assert prepared.options.model == "tiny"


def test_assistant_only_loss_without_a_template_that_marks_turns_is_refused_and_the_advice_works(tmp_path,
                                                                                                  tiny_model):
    # SmolLM3's SFT recipe trains on the assistant's turns only: TRL needs conversational rows and a chat template
    # with {% generation %} markers; the tiny model has neither, so every trial would end `invalid`.
    path = refreshed(published("handbook_smollm3_sft"), tmp_path)
    with pytest.raises(TunerError) as error:
        prepare(tmp_path, path, model="tiny", dataset="builtin")
    message = str(error.value)
    assert "assistant_only_loss: true needs a chat template" in message and "\n" not in message
    assert "or assistant_only_loss: false" in message
    path.write_text(path.read_text().replace("assistant_only_loss: true", "assistant_only_loss: false"))
    prepared = prepare(tmp_path, path, model="tiny", dataset="builtin")
    assert trial0_params(prepared)["assistant_only_loss"] is False
