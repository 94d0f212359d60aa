"""The exit code of `tuner trial`: 0 for an ok trial, EXIT_NO_TRIAL_OK for any other status, on two real trials of the
tiny model (the bad-input cases of the CLI, which train nothing, are tests/unit/cli/test_cli_errors.py)."""

from __future__ import annotations

import pytest

from tuner import cli

# -- exit codes of tuner trial ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_tuner_trial_exits_0_only_for_an_ok_trial(tmp_path, tiny_model, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trial_yaml = ("trainer: sft\nmax_steps: 3\nparams: {learning_rate: 1.0e-4, per_device_train_batch_size: 2, "
                  "max_length: 32}\n")
    codes = {}
    for name, extra in (("plain", ""), ("faulty", "fault: error@1\n")):  # error@1: the trial raises at step 1
        (tmp_path / f"{name}.yaml").write_text(trial_yaml + extra)
        code = cli.main(["trial", "--config", f"{name}.yaml"])
        status = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("status:")).split()[1]
        codes[name] = status, code
        # the rule: 0 for an ok trial, EXIT_NO_TRIAL_OK for any other status
        assert code == (cli.EXIT_OK if status == "ok" else cli.EXIT_NO_TRIAL_OK), (name, status, code)
    # an sft step at lr 1e-4 trains cleanly (tests/e2e/search/test_reliability.py relies on it); the fault makes a crash
    assert codes == {"plain": ("ok", 0), "faulty": ("crashed", 4)}
