"""Export: the recommended config as TRL's own CLI reads it, and the rule that picks it.

The exported YAML must pass ``trl <trainer> --config FILE`` unchanged and mean the run tuner measured:
the parser is TRL's own (``trl.scripts.<trainer>.make_parser``), which rejects unknown keys, and every
value we wrote is read back from the parsed config objects.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from tuner import cli, recommend
from tuner.space import PRECISIONS, load_space
from tuner.trainers import ADAPTERS, PRECISION_SETTINGS

TRAINERS = tuple(ADAPTERS)
MODEL = "/models/tiny"  # TRL's parser does not open the model; any path reads back as written


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def trl_parse(trainer: str, path: Path, output_dir: Path):
    """TRL's CLI parser on ``--config path``: (script args, trainer config, ModelConfig, dataset mixture)."""
    parser = importlib.import_module(f"trl.scripts.{trainer}").make_parser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notes about TRL's defaults
        return parser.parse_args_and_config(["--config", str(path), "--output_dir", str(output_dir)])


def sampled_params(trainer: str, use_peft: bool, precision: str, seed: int) -> dict:
    """One point of the shipped space for ``trainer`` (seeded), with LoRA and precision set as asked."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction="maximize")
    study.enqueue_trial({"use_peft": use_peft})
    params = load_space(None, trainer).suggest(study.ask())
    assert params["use_peft"] is use_peft
    return {**params, "precision": precision}


def same(exported, parsed) -> bool:
    # ModelConfig turns a one-element lora_target_modules list into the string; PEFT reads both the same.
    if isinstance(exported, list) and len(exported) == 1 and not isinstance(parsed, list):
        exported = exported[0]
    return exported == parsed


# -- recommend.trl_config -> YAML -> TRL's parser ---------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("use_peft", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("trainer", TRAINERS)
def test_exported_yaml_parses_through_trls_own_parser_and_reads_back(trainer, use_peft, precision, tmp_path):
    seed = TRAINERS.index(trainer) * 100 + PRECISIONS.index(precision) * 2 + use_peft
    params = sampled_params(trainer, use_peft, precision, seed)
    reward_funcs = ["tuner.rewards.builtin_reward"] if trainer == "grpo" else None
    config = recommend.trl_config(trainer, params, MODEL, use_cpu=on_cpu(), reward_funcs=reward_funcs)
    path = tmp_path / "recommended.yaml"
    path.write_text(recommend.render(config, "yaml", header="tuner test\nsecond header line"))

    parsed = trl_parse(trainer, path, tmp_path / "out")
    script_args, args, model_args = parsed[0], parsed[1], parsed[2]

    # Every key we wrote lands in one of TRL's dataclasses with the value we wrote.
    for key, value in config.items():
        holders = [p for p in parsed if hasattr(p, key)]
        assert holders, f"{key} is in no TRL dataclass"
        for holder in holders:
            assert same(value, getattr(holder, key)), (key, value, type(holder).__name__, getattr(holder, key))

    # The precision means the run tuner measured: the weights' dtype, and autocast only for "-mixed".
    assert model_args.dtype == PRECISION_SETTINGS[precision][0]
    assert args.bf16 is (precision == "bf16-mixed")
    assert args.fp16 is (precision == "fp16-mixed")
    assert args.learning_rate == params["learning_rate"]
    assert args.logging_nan_inf_filter is False
    assert model_args.model_name_or_path == MODEL
    assert model_args.use_peft is use_peft
    if use_peft:
        expected_targets = params.get("lora_target_modules", "all-linear")
        assert model_args.lora_task_type == ("SEQ_CLS" if trainer == "reward" else "CAUSAL_LM")
        assert model_args.lora_r == params.get("lora_r", 16)
        assert same([expected_targets] if isinstance(expected_targets, str) else expected_targets,
                    model_args.lora_target_modules)
    else:
        # Without LoRA nothing LoRA-shaped is exported (TRL's defaults would be ignored anyway).
        assert not any(k.startswith("lora_") for k in config)
    if trainer == "grpo":
        assert script_args.reward_funcs == reward_funcs


@pytest.mark.skipif(not on_cpu(), reason="a CUDA machine accepts bf16 without use_cpu")
def test_trl_parser_rejects_bf16_on_a_cpu_without_use_cpu(tmp_path):
    # Proves the parse test can fail: the same export minus use_cpu is refused by TRL on this machine.
    config = recommend.trl_config("grpo", {"precision": "bf16-mixed", "learning_rate": 1e-4}, MODEL, use_cpu=True)
    assert config["use_cpu"] is True and config["bf16"] is True
    del config["use_cpu"]
    path = tmp_path / "no_use_cpu.yaml"
    path.write_text(recommend.render(config, "yaml"))
    with pytest.raises(ValueError, match="use_cpu"):
        trl_parse("grpo", path, tmp_path / "out")


def test_trl_parser_rejects_unknown_keys(tmp_path):
    # The parser the tests rely on is strict: a key TRL does not know fails the parse.
    config = recommend.trl_config("dpo", {"precision": "fp32", "learning_rate": 1e-4}, MODEL, use_cpu=on_cpu())
    path = tmp_path / "unknown.yaml"
    path.write_text(recommend.render({**config, "tuner_only_key": 1}, "yaml"))
    with pytest.raises(ValueError, match="Unknown arguments"):
        trl_parse("dpo", path, tmp_path / "out")


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure", "fp16-pure"])
def test_non_mixed_precisions_export_bf16_off(precision):
    # TRL's configs default bf16 to True when it is left out; an fp32 or "-pure" trial ran without autocast.
    config = recommend.trl_config("reward", {"precision": precision}, MODEL, use_cpu=True)
    assert config["bf16"] is False and config["fp16"] is False


def test_render_json_and_yaml_hold_the_same_config():
    config = recommend.trl_config("dpo", sampled_params("dpo", True, "bf16-mixed", 7), MODEL, use_cpu=True)
    as_yaml = yaml.safe_load(recommend.render(config, "yaml", header="a\nb"))
    assert as_yaml == json.loads(recommend.render(config, "json")) == config


# -- recommend.recommend: the rule, on hand-made records --------------------------------------


def record(number, status="ok", tokens_per_second=1000.0, progress=0.2):
    return {"number": number, "status": status, "tokens_per_second": tokens_per_second, "progress": progress,
            "params": {"precision": "fp32"}}


def test_recommend_picks_the_fastest_ok_trial_that_learned():
    trials = [
        record(0, tokens_per_second=900.0),
        record(1, status="diverged", tokens_per_second=9000.0, progress=0.9),
        record(2, status="collapsed", tokens_per_second=8000.0, progress=0.5),
        record(3, status="crashed", tokens_per_second=7000.0, progress=None),
        record(4, status="oom", tokens_per_second=6000.0, progress=None),
        record(5, tokens_per_second=5000.0, progress=0.005),  # ok but below MIN_PROGRESS: did not learn
        record(6, tokens_per_second=4000.0, progress=None),  # ok, too short to measure progress
        record(7, tokens_per_second=1500.0, progress=0.3),
        record(8, tokens_per_second=1200.0, progress=0.8),
        record(9, tokens_per_second=None, progress=0.8),  # no speed measured
    ]
    assert recommend.recommend(trials)["number"] == 7


@pytest.mark.parametrize("status", ["diverged", "collapsed", "crashed", "oom", "invalid"])
def test_recommend_never_picks_a_non_ok_trial(status):
    # Even as the only trial, and the fastest, and learning: an unstable trial is never recommended.
    assert recommend.recommend([record(0, status=status, tokens_per_second=1e6, progress=0.9)]) is None
    assert recommend.recommend([record(0, status=status, tokens_per_second=1e6, progress=0.9),
                                record(1, tokens_per_second=10.0)])["number"] == 1


def test_recommend_of_nothing_is_none():
    assert recommend.recommend([]) is None


# -- tuner export after a real search ---------------------------------------------------------


@pytest.fixture(scope="session")
def anchor(tmp_path_factory, tiny_model):
    import test_search  # the anchor grid search, run once per session whichever file asks first

    return test_search.anchor_search(tmp_path_factory)


@pytest.mark.slow
def test_tuner_export_yaml_and_json_after_a_real_search(anchor, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(anchor.root)  # the default --store ./mlflow is the search's store
    yaml_path, json_path = tmp_path / "recommended.yaml", tmp_path / "recommended.json"
    assert cli.main(["export", "--experiment", anchor.experiment, "-o", str(yaml_path)]) == 0
    assert cli.main(["export", "--experiment", anchor.experiment, "-o", str(json_path), "--format", "json"]) == 0
    assert f"trial {anchor.outcome.recommended['number']}" in capsys.readouterr().err

    exported = yaml.safe_load(yaml_path.read_text())
    # json is valid and says exactly what the YAML says, which is what the search recommended.
    assert json.loads(json_path.read_text()) == exported == anchor.outcome.trl_config
    assert yaml_path.read_text().startswith("# Recommended by tuner")

    parsed = trl_parse("reward", yaml_path, tmp_path / "out")
    args, model_args = parsed[1], parsed[2]
    best = anchor.outcome.recommended["params"]
    assert args.learning_rate == best["learning_rate"]
    assert args.per_device_train_batch_size == 8 and args.max_length == 64
    assert model_args.dtype == PRECISION_SETTINGS[best["precision"]][0]
    assert args.bf16 is False and args.fp16 is False  # the anchor grid has only fp32 and "-pure" precisions
    assert model_args.model_name_or_path == anchor.prepared.model_path
    assert args.use_cpu is on_cpu()


@pytest.mark.slow
def test_tuner_export_process_prints_yaml_to_stdout(anchor, tmp_path):
    done = subprocess.run([sys.executable, "-m", "tuner.cli", "export", "--experiment", anchor.experiment],
                          cwd=anchor.root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == anchor.outcome.trl_config
