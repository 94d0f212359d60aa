"""Export: the recommended config as TRL's own CLI reads it, and the rule that picks it.

The exported YAML must pass ``trl <trainer> --config FILE`` unchanged and mean the run tuner measured:
the parser is TRL's own (``trl.scripts.<trainer>.make_parser``), which rejects unknown keys, and every
value we wrote is read back from the parsed config objects. `tuner export` after real searches, and a length
measured with the tiny model's tokenizer, are tests/e2e/report/test_export_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import cpu_flag, on_cpu, sampled_params, trl_parse

from tuner import cli
from tuner.config.precision import PRECISIONS as PRECISION_ROWS
from tuner.config.space import PRECISIONS, load_space
from tuner.config.trainers import ADAPTERS, adapter
from tuner.verdicts import recommend

TRAINERS = tuple(ADAPTERS)
MODEL = "/models/tiny"  # TRL's parser does not open the model; any path reads back as written


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
    reward_funcs = ["tuner.inputs.rewards.builtin_reward"] if trainer == "grpo" else None
    config = recommend.trl_config(adapter(trainer), params, MODEL, reward_funcs=reward_funcs)
    assert "use_cpu" not in config  # the file is for the machine the user trains on
    path = tmp_path / "recommended.yaml"
    path.write_text(recommend.render(config, "yaml", header="tuner test\nsecond header line"))

    parsed = trl_parse(trainer, path, tmp_path / "out", *cpu_flag(config))
    script_args, args, model_args = parsed[0], parsed[1], parsed[2]

    # Every key we wrote lands in one of TRL's dataclasses with the value we wrote.
    for key, value in config.items():
        holders = [p for p in parsed if hasattr(p, key)]
        assert holders, f"{key} is in no TRL dataclass"
        for holder in holders:
            assert same(value, getattr(holder, key)), (key, value, type(holder).__name__, getattr(holder, key))

    # The precision means the run tuner measured: the weights' dtype, and autocast only for "-mixed".
    assert model_args.dtype == PRECISION_ROWS[precision].weight_dtype
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
def test_trl_refuses_bf16_on_a_cpu_without_use_cpu_so_the_export_writes_bf16_false(tmp_path):
    # What TRL does: its configs turn bf16 on when the key is left out, and refuse bf16 on a CPU unless use_cpu.
    # So an fp32 export must say bf16: false to load here without use_cpu; and the parse tests above can fail.
    config = recommend.trl_config(adapter("grpo"), {"precision": "fp32", "learning_rate": 1e-4}, MODEL)
    assert config["bf16"] is False and "use_cpu" not in config
    path = tmp_path / "fp32.yaml"
    path.write_text(recommend.render(config, "yaml"))
    assert trl_parse("grpo", path, tmp_path / "out")[1].bf16 is False
    path.write_text(recommend.render({k: v for k, v in config.items() if k != "bf16"}, "yaml"))
    with pytest.raises(ValueError, match="use_cpu"):
        trl_parse("grpo", path, tmp_path / "out")
    # bf16-mixed keeps bf16: true (the run the search measured); on a CPU it loads with --use_cpu on the command line
    mixed = recommend.trl_config(adapter("grpo"), {"precision": "bf16-mixed", "learning_rate": 1e-4}, MODEL)
    path.write_text(recommend.render(mixed, "yaml"))
    with pytest.raises(ValueError, match="use_cpu"):
        trl_parse("grpo", path, tmp_path / "out")
    assert trl_parse("grpo", path, tmp_path / "out", "--use_cpu", "true")[1].bf16 is True


def test_trl_parser_rejects_unknown_keys(tmp_path):
    # The parser the tests rely on is strict: a key TRL does not know fails the parse.
    config = recommend.trl_config(adapter("dpo"), {"precision": "fp32", "learning_rate": 1e-4}, MODEL)
    path = tmp_path / "unknown.yaml"
    path.write_text(recommend.render({**config, "tuner_only_key": 1}, "yaml"))
    with pytest.raises(ValueError, match="Unknown arguments"):
        trl_parse("dpo", path, tmp_path / "out")


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure", "fp16-pure"])
def test_non_mixed_precisions_export_bf16_off(precision):
    # TRL's configs default bf16 to True when it is left out; an fp32 or "-pure" trial ran without autocast.
    config = recommend.trl_config(adapter("reward"), {"precision": precision}, MODEL)
    assert config["bf16"] is False and config["fp16"] is False


def test_render_json_and_yaml_hold_the_same_config():
    config = recommend.trl_config(adapter("dpo"), sampled_params("dpo", True, "bf16-mixed", 7), MODEL)
    as_yaml = yaml.safe_load(recommend.render(config, "yaml", header="a\nb"))
    assert as_yaml == json.loads(recommend.render(config, "json")) == config


# -- recommend.recommend: the rule, on hand-made records --------------------------------------


def record(number, status="ok", tokens_per_second=1000.0, progress=0.2, learned=True):
    return {"number": number, "status": status, "tokens_per_second": tokens_per_second, "progress": progress,
            "learned": learned and progress is not None, "params": {"precision": "fp32"}}


def test_recommend_picks_the_highest_learning_speed_among_ok_trials_that_learned():
    trials = [
        record(0, tokens_per_second=900.0),  # 180
        record(1, status="diverged", tokens_per_second=9000.0, progress=0.9),
        record(2, status="collapsed", tokens_per_second=8000.0, progress=0.5),
        record(3, status="crashed", tokens_per_second=7000.0, progress=None),
        record(4, status="oom", tokens_per_second=6000.0, progress=None),
        record(5, tokens_per_second=5000.0, progress=0.4, learned=False),  # ok, but no significant trend
        record(6, tokens_per_second=4000.0, progress=None),  # ok, too short to judge learning
        record(7, tokens_per_second=1500.0, progress=0.3),  # 450
        record(8, tokens_per_second=1200.0, progress=0.8),  # 960: slower, but learns most per second
        record(9, tokens_per_second=None, progress=0.8),  # no speed measured
    ]
    assert recommend.recommend(trials)["number"] == 8
    assert recommend.objective(trials[8]) == pytest.approx(960.0)
    assert recommend.objective(trials[5]) == 0.0 and recommend.objective(trials[1]) == 0.0


@pytest.mark.parametrize("status", ["diverged", "collapsed", "crashed", "oom", "invalid"])
def test_recommend_never_picks_a_non_ok_trial(status):
    # Even as the only trial, and the fastest, and learning: an unstable trial is never recommended.
    assert recommend.recommend([record(0, status=status, tokens_per_second=1e6, progress=0.9)]) is None
    assert recommend.recommend([record(0, status=status, tokens_per_second=1e6, progress=0.9),
                                record(1, tokens_per_second=10.0)])["number"] == 1


def test_recommend_of_nothing_is_none():
    assert recommend.recommend([]) is None


@pytest.mark.parametrize("source", ["search", "from"], ids=["search", "from-a-file-without-its-last-newline"])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_every_file_tuner_export_writes_ends_with_one_newline(fmt, source, tmp_path):
    """A text file's last line ends with a newline: without it `cat` runs the shell's prompt onto the last line,
    and diff and git flag the file. The files `tuner export -o` writes (tuner.cli._write_export): the config, and
    the accelerate config beside it for a search of several ranks; of a search, and of a --from search whose file
    had no last newline."""
    from tuner.report import fix

    search = search_json("reward", {"model_name_or_path": MODEL, "learning_rate": 1e-4}, {})
    search["recommended"]["params"] = {"precision": "fp32", "learning_rate": 1e-4}
    search["plan"] = {"ranks": 2}  # trials of 2 processes: an accelerate config is written beside the file
    if source == "from":
        text = fix.edit_text("model_name_or_path: tiny\nlearning_rate: 0.3", {}, {"learning_rate": 1e-4})
        search["fix"] = {"source": "my.yaml", "trial0": "your config diverged at step 3", "changes": [],
                         "summary": "1 change", "text": text}
    written = cli._write_export(str(tmp_path / f"recommended.{fmt}"), search, "exp", "RUN", fmt)
    assert [Path(path).name for path in written] == [f"recommended.{fmt}", "recommended.accelerate.yaml"]
    for path in written:
        text = Path(path).read_text()
        assert text.endswith("\n") and not text.endswith("\n\n"), (path, text[-80:])


# -- what the export leaves out, and the lengths it writes ---------------------------------------------------


def search_json(trainer: str, config: dict, info: dict) -> dict:
    """The parts of a search.json that `tuner export` renders."""
    return {"trainer": trainer, "rule": recommend.RULE, "trl_config": config, "export": info,
            "recommended": {"number": 3, "tokens_per_second": 1000.0, "progress": 0.2}}


@pytest.mark.parametrize("trainer", TRAINERS)
def test_export_of_a_cpu_search_leaves_out_use_cpu_and_the_shipped_spaces_trial_lengths(trainer, tmp_path):
    from tuner.report import export

    space = load_space(None, trainer)  # the shipped space: its fixed lengths keep trials short
    harness = export.harness_lengths(space)
    assert harness, f"the shipped {trainer} space fixes a short-trial length"
    params = sampled_params(trainer, False, "fp32", 11)
    assert all(params[name] == value for name, value in harness.items())  # every trial ran with them
    reward_funcs = ["tuner.inputs.rewards.builtin_reward"] if trainer == "grpo" else None
    config, info = export.build(adapter(trainer), params, MODEL, space=space, reward_funcs=reward_funcs, on_cpu=True)
    assert "use_cpu" not in config and not set(harness) & set(config)
    path = tmp_path / "recommended.yaml"
    path.write_text(export.render_export(search_json(trainer, config, info), "exp", "RUN"))
    text = path.read_text()
    assert "use_cpu" not in yaml.safe_load(text)
    # the header says which value each length has and why: here TRL's own default, and what the trials used
    for name, value in harness.items():
        line = next(line for line in text.splitlines() if line.startswith(f"# {name}: "))
        assert "TRL's default" in line and f"the search's short trials used {value}" in line, line
    assert "# Not set: use_cpu." in text
    # TRL's parser, on this machine, without use_cpu: the lengths are TRL's defaults, not the trials' 64 or 12
    args = trl_parse(trainer, path, tmp_path / "out")[1]
    defaults = export.length_fields(adapter(trainer))
    for name in harness:
        assert getattr(args, name) == defaults[name] != harness[name]
    assert args.use_cpu is False


def test_a_length_from_the_users_own_space_is_kept():
    from tuner.config.space import parse_space
    from tuner.report import export

    space = parse_space({"trainer": "dpo", "fixed": {"max_length": 64},
                         "params": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3}}}, "my_space.yaml")
    config, info = export.build(adapter("dpo"), {"max_length": 64, "learning_rate": 1e-4}, MODEL, space=space)
    assert config["max_length"] == 64
    assert info["lengths"] == [{"name": "max_length", "value": 64,
                                "why": "your search space's fixed value (every trial ran with it)"}]


def test_export_length_flags_set_a_length_and_say_so():
    from tuner.errors import TunerError
    from tuner.report import export

    config, info = export.build(adapter("sft"), {"learning_rate": 1e-4, "max_length": 64}, MODEL,
                                space=load_space(None, "sft"))
    changed = export.with_overrides(search_json("sft", config, info), {"max_length": 2048})
    assert changed["trl_config"]["max_length"] == 2048
    assert "# max_length: 2048: set by --max-length.\n" in export.render_export(changed, "exp", "RUN")
    grpo, grpo_info = export.build(adapter("grpo"), {"learning_rate": 1e-4, "max_completion_length": 12}, MODEL,
                                   space=load_space(None, "grpo"))
    assert "max_completion_length" not in grpo
    search = search_json("grpo", grpo, grpo_info)
    assert export.with_overrides(search, {"max_completion_length": 256})["trl_config"]["max_completion_length"] == 256
    with pytest.raises(TunerError, match="^--max-length 512: grpo has no max_length setting; its length flags: "
                                         "--max-completion-length$"):
        export.with_overrides(search, {"max_length": 512})


def test_a_bf16_export_of_a_cpu_search_says_how_to_run_it_on_a_cpu():
    from tuner.report import export

    config, info = export.build(adapter("reward"), {"precision": "bf16-mixed", "learning_rate": 1e-4}, MODEL, on_cpu=True)
    assert config["bf16"] is True and "use_cpu" not in config
    header = export.header(search_json("reward", config, info), "exp", "RUN")
    assert "bf16: true (the bf16-mixed precision the search measured) needs a GPU with bfloat16" in header
    assert "add --use_cpu to the trl command" in header


def test_failure_advice_follows_from_the_failures_seen():
    no_signal = {**record(0, status="collapsed", progress=None), "guard_signal": "zero_reward_std",
                 "reason": "frac_reward_zero_std is 1.0 for 5 steps in a row at step 5"}
    text = recommend.failure_summary([no_signal, {**no_signal, "number": 1}])
    # A reward without spread is about the reward function, not the learning rate.
    assert "reward gives GRPO no signal" in text and "learning rate" not in text
    nan = {**record(2, status="diverged", progress=None), "guard_signal": "non_finite", "reason": "loss is nan at step 3"}
    flat = record(3, progress=0.001, learned=False)
    text = recommend.failure_summary([nan, nan, flat])
    lines = [line for line in text.splitlines() if line.startswith("Advice:")]
    assert "NaN/inf" in lines[0] and "did not learn" in lines[1]


def test_an_export_from_the_packaged_copy_says_what_it_is_and_what_to_use_where_the_hub_is(tmp_path):
    from tuner.inputs.packaged import _COMPLETE_MARKER, PACKAGED, packaged_of
    from tuner.report import export

    model = PACKAGED["SmolLM2-135M-Instruct"]
    folder = tmp_path / model.build / model.alias
    folder.mkdir(parents=True)
    params = {"learning_rate": 1e-6, "max_length": 64}
    assert packaged_of(folder) is None  # a build not finished (no marker) is not the copy
    _, info = export.build(adapter("dpo"), params, str(folder), space=load_space(None, "dpo"))
    assert not any(model.hub_id in note for note in info["notes"])
    (folder / _COMPLETE_MARKER).write_text(model.build)
    assert packaged_of(folder) == model and packaged_of(tmp_path / "other" / model.alias) is None
    config, info = export.build(adapter("dpo"), params, str(folder), space=load_space(None, "dpo"))
    assert config["model_name_or_path"] == str(folder)  # what `trl dpo --config` runs here, unchanged
    [note] = [note for note in info["notes"] if note.startswith("model_name_or_path:")]
    assert f"--model_name_or_path {model.hub_id}" in note and model.distribution in note
