"""`tuner verify CONFIG.yaml --steps N` (tuner.trial.verify) without a trial: bad input refused in one line, and the
lengths it runs (an export's at the search's, read back from its header, old exports' words included). The runs
themselves, guarded trials on the tiny model through the command line, are tests/training/trial/test_verify_training.py.
"""

from __future__ import annotations

import pytest
from helpers import exported

from tuner import cli
from tuner.config.space import load_space
from tuner.config.trainers import adapter
from tuner.config.trl_lengths import length_fields, search_lengths


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.yaml").write_text("# trl sft --config old.yaml\nmodel_name_or_path: tiny\ntorch_dtype: bfloat16\n"
                                       "max_seq_length: 512\n")
    assert cli.main(["verify", "old.yaml", "--steps", "10"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "refuse 2 keys" in err and "dtype" in err and "max_length" in err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["verify", "old.yaml", "--steps", "0"])
    assert exit_.value.code == cli.EXIT_USAGE


# -- an export's lengths: the search's, read back from its header ---------------------------------------------------

# The header lines of exports written before tuner verify read them (issue 66): the same words must keep working.
OLD_HEADERS = {
    "# max_completion_length: not set: TRL's default (256): completions are generated, so their length is not in the "
    "data; set it with tuner export --max-completion-length N; the search's short trials used 12, a setting of "
    "tuner's shipped space, not a choice for your run.": {"max_completion_length": 12},
    "# max_length: not set: TRL's default (1024): the search trained on tuner's built-in data, whose lengths say "
    "nothing about yours; set it with tuner export --max-length N; the search's short trials used 64, a setting of "
    "tuner's shipped space, not a choice for your run.": {"max_length": 64},
    "# max_length: 152: measured on prefs.jsonl with the model's tokenizer: the 99th percentile of the prompt+chosen "
    "and prompt+rejected token lengths of 256 rows (147 tokens; longest 161), rounded up to a multiple of 8; the "
    "search's short trials used 64, a setting of tuner's shipped space, not a choice for your run.": {"max_length": 64},
    "# max_length: 2048: set by --max-length.": {},
}


@pytest.mark.parametrize("line", list(OLD_HEADERS))
def test_the_searchs_lengths_are_read_from_an_old_exports_header(line):
    assert search_lengths(f"{line}\n# Run: trl grpo --config THIS_FILE\nlearning_rate: 0.01\n") == OLD_HEADERS[line]


@pytest.mark.parametrize("trainer", ["grpo", "dpo", "sft"])
def test_the_searchs_lengths_are_read_back_from_the_header_tuner_export_writes(trainer, tmp_path):
    space = load_space(None, trainer)
    fixed = {k: v for k, v in space.fixed.items() if k in length_fields(adapter(trainer))}
    assert fixed, f"the shipped {trainer} space fixes a short-trial length"
    text = exported({**space.fixed, "learning_rate": 1e-4}, "/models/tiny", tmp_path / "r.yaml", trainer).read_text()
    assert search_lengths(text) == fixed
    # a comment below the settings is the user's, not the export's
    assert search_lengths("learning_rate: 0.01\n" + next(iter(OLD_HEADERS))) == {}


def test_a_from_export_has_no_search_lengths_its_trials_ran_the_files_own():
    from tuner.report import fix

    text = fix.render_fix(fix.Fix("my.yaml", "your config diverged at step 3", False,
                                  summary="change learning_rate (trial 2)", text="learning_rate: 0.0001\n"), "exp", "RUN")
    assert text.startswith("# tuner search --from my.yaml") and search_lengths(text) == {}
