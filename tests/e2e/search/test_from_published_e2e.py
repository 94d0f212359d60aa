"""A published-style TRL config through `tuner search --from` for real: a cosine_with_min_lr schedule runs ok as
trial 0 of a 1-trial search on the tiny model, and its export says nothing changed (trial 0 of every published config,
without a search, is tests/training/search/test_from_published.py).
"""

from __future__ import annotations

import pytest

from tuner import cli

SCHEDULED = """\
# trl reward --config reward_sched.yaml
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: trl-lib/ultrafeedback_binarized
dtype: float32
bf16: false
learning_rate: 0.01          # the tiny model's scale: it learns within 10 steps
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
per_device_train_batch_size: 8
max_length: 64
output_dir: out/reward-sched
"""


@pytest.mark.slow
def test_a_cosine_with_min_lr_config_runs_ok_and_the_export_says_nothing_changed(tmp_path, tiny_model, monkeypatch,
                                                                               capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sched.yaml").write_text(SCHEDULED)
    # 1 trial (theirs) of 10 steps, no confirmation seeds or longer rungs: the file's own verdict
    code = cli.main(["search", "--from", "sched.yaml", "--model", "tiny", "--dataset", "builtin", "--trials", "1",
                     "--max-steps", "10", "--confirm-seeds", "0", "--budget", "0", "--experiment", "sched"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    assert "trials ran on model: tiny from --model (over the file's model_name_or_path: Qwen/Qwen2.5-0.5B)" in out
    assert cli.main(["export", "--experiment", "sched", "-o", "fixed.yaml"]) == cli.EXIT_OK
    said = capsys.readouterr().err
    assert "wrote fixed.yaml: nothing to change: your config as written, with the evidence" in said
    body = [line for line in (tmp_path / "fixed.yaml").read_text().splitlines() if not line.startswith("#")]
    assert body == [line for line in SCHEDULED.splitlines() if not line.startswith("#")]
