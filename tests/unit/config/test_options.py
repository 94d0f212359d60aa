"""tuner search's options are declared once (tuner.config.options): the command line is generated from the declaration,
and the command line and ``search.prepare`` check values with the same rules and words."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from tuner import cli
from tuner.config import options
from tuner.config.options import SearchOptions, check_options, flag, option_field, option_fields, value_type
from tuner.config.trainers import ADAPTERS
from tuner.errors import TunerError

RULED = [f.name for f in option_fields() if f.metadata.get("rule") is not None]


def _search_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["search"]


def _actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in _search_parser()._actions}


def _flat(text: str) -> str:
    return " ".join(text.split())  # argparse wraps help lines


def _bad_value(name: str):
    rule = option_field(name).metadata["rule"]
    return -1 if rule is options.NOT_NEGATIVE else 0


def test_every_field_is_one_documented_flag_with_the_declared_default():
    actions = _actions()
    for f in option_fields():
        action = actions[f.name]
        negated = ["--no-" + flag(f)[2:]] if value_type(f) is bool else []  # --prune / --no-prune
        assert action.option_strings == [flag(f), *negated], f.name
        assert f.metadata["help"] and _flat(f.metadata["help"]) in _flat(action.help), f.name
        if f.metadata.get("action") != "append":
            assert action.default == f.default, f.name
        assert tuple(action.choices or ()) == tuple(f.metadata.get("choices") or ()), f.name
    assert actions["reward_funcs"].option_strings == ["--reward-func"]


def test_help_shows_the_real_default():
    text = _flat(_search_parser().format_help())
    assert "seconds before a trial is killed (default: 1800)" in text
    assert "(default: 2; 0 turns confirmation off)" in text
    assert "number of trials (default: 12; grid: every point)" in text
    assert "continue the unfinished search of EXPERIMENT (its own options are reused; completed trials are kept)" \
        " --confirm-seeds" in text  # no default: no "(default: None)"
    assert "None" not in text


def test_a_default_changed_in_the_declaration_shows_in_help_and_parsing(monkeypatch):
    monkeypatch.setattr(option_field("trial_timeout"), "default", 900.0)
    monkeypatch.setattr(option_field("sampler"), "default", "random")
    text = _flat(_search_parser().format_help())
    assert "seconds before a trial is killed (default: 900)" in text
    assert "(default: random)" in text
    args = cli.build_parser().parse_args(["search"])
    assert args.trial_timeout == 900.0 and args.sampler == "random"


def test_choices_come_from_the_trainer_table_and_the_sampler_constant():
    actions = _actions()
    assert tuple(actions["trainer"].choices) == tuple(ADAPTERS)
    assert tuple(actions["sampler"].choices) == options.SAMPLERS


@pytest.mark.parametrize("name", RULED)
def test_command_line_and_code_refuse_a_value_with_the_same_words(name, capsys):
    f = option_field(name)
    bad = _bad_value(name)
    with pytest.raises(SystemExit) as exit:
        cli.build_parser().parse_args(["search", flag(f), str(bad)])
    assert exit.value.code == cli.EXIT_USAGE
    cli_line = capsys.readouterr().err
    with pytest.raises(TunerError) as error:
        check_options(SearchOptions(**{name: bad}))
    rule = f.metadata["rule"].text
    assert f"argument {flag(f)}: {rule}, got {bad}" in cli_line
    assert str(error.value) == f"{flag(f)} {bad}: {rule}"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_and_inf_are_refused_both_ways(value, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["search", "--trial-timeout", str(value)])
    assert "argument --trial-timeout: must be positive" in capsys.readouterr().err
    with pytest.raises(TunerError, match="--trial-timeout .*: must be positive"):
        check_options(SearchOptions(trial_timeout=value))


def test_code_gets_the_choice_checks_the_command_line_gets():
    with pytest.raises(TunerError, match=r"^--sampler bogus: unknown sampler; choose one of tpe, random, grid$"):
        check_options(SearchOptions(sampler="bogus"))
    with pytest.raises(TunerError, match=r"^--trainer ppo: unknown trainer; choose one of grpo, "):
        check_options(SearchOptions(trainer="ppo"))
    check_options(SearchOptions())  # the defaults pass their own rules


def test_command_line_values_become_the_options():
    args = cli.build_parser().parse_args(["search", "--reward-func", "a", "--reward-func", "m:f", "--trials", "3",
                                          "--cpus-per-trial", "0.5", "-o", "out.yaml", "--seed", "7"])
    got = options.options_from(**vars(args))
    assert got == SearchOptions(reward_funcs=["a", "m:f"], trials=3, cpus_per_trial=0.5, seed=7)
    assert dataclasses.asdict(options.options_from()) == dataclasses.asdict(SearchOptions())


def test_search_reexports_the_declaration():
    from tuner.search import driver as search

    assert search.SearchOptions is SearchOptions
    assert search.SAMPLERS is options.SAMPLERS
    assert search.options_from(trials=None, max_steps=5, command="search") == SearchOptions(max_steps=5)


def test_the_other_commands_take_store_flags_from_the_same_declaration():
    args = cli.build_parser().parse_args(["export", "--experiment", "x"])
    assert args.store == option_field("store").default and args.tracking_uri is None
    assert cli.build_parser().parse_args(["ui"]).store == option_field("store").default


def test_cli_import_stays_light():
    code = "import sys, tuner.cli; heavy = {'torch', 'trl', 'ray', 'mlflow', 'optuna'} & set(sys.modules); " \
           "assert not heavy, heavy"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
