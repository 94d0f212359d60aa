"""bench/gpu/gpu.py, the one prepared script for a lent GPU: its dry mode on this CPU runs every stage end to end (so the
GPU's minutes go to the measurement, not to finding a typo), its reward has spread on any model, and the recorded
GPU run renders."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BENCH_RECORDED

from bench.gpu import gpu

REPO = Path(__file__).resolve().parents[3]


def test_the_shapes_reward_has_spread_whatever_the_text():
    # the random-weight shape's completions decode to "" (its vocabulary is mostly outside the tiny tokenizer's):
    # the reward reads the token ids, so a group of four empty texts still gets four rewards
    rewards = gpu.hash_reward(["", "", "", ""], completion_ids=[[5, 900], [5, 901], [70000], [3, 3, 3]])
    assert len(set(rewards)) == 4 and all(0 <= r < 1 for r in rewards)
    assert rewards == gpu.hash_reward(["", "", "", ""], completion_ids=[[5, 900], [5, 901], [70000], [3, 3, 3]])


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_writes_its_figures(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu.gpu", "--dry", "--output", str(out), "--signals-on", "dpo"],
                          cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["dry"] and data["device"] == "cpu"
    for trainer in ("grpo", "dpo"):
        stage = data["stages"][f"search_{trainer}"]
        assert "error" not in stage, stage.get("error")
        assert len(stage["trials"]) >= gpu.DRY["trials"]
        assert all(t["peak_memory_mb"] and t["memory_estimate_mb"] for t in stage["trials"])
    speed = data["stages"]["speed"]
    assert [r["config"] for r in speed["rows"]] == ["A", "B", "C"] * gpu.DRY["repeats"]
    from tuner.search.driver import hardware_precisions

    # TRL's default (bf16 autocast over fp32 weights) where this machine runs it, else fp32
    expected = "fp32" if "bf16-mixed" in hardware_precisions(None) else "bf16-mixed"
    assert speed["configs"]["B"]["params"]["precision"] == expected
    assert speed["configs"]["C"]["signals_every"] == 0 and all(r["signals_rows"] == 0 for r in speed["rows"]
                                                             if r["config"] == "C")
    assert all(r["signals_rows"] > 0 for r in speed["rows"] if r["config"] == "A")
    assert speed["pick_over_trl_defaults"] and speed["per_repeat"]
    assert any("fp16" in s for s in data["skipped"])  # fp16-mixed needs CUDA
    assert "## On a GPU" in done.stdout and "**A dry run**" in done.stdout
    # the signals' cost alone: DPO's pick on and off, a pair, the on run read on its sampled steps, each step timed
    signals = data["stages"]["signals"]["dpo"]
    assert [(r["pair"], r["signals_every"]) for r in signals["rows"]] == [(0, 5), (0, 0)]
    assert signals["rows"][0]["signals_rows"] > 0 and signals["rows"][1]["signals_rows"] == 0
    assert len(signals["tokens_off_over_on"]) == 1 and signals["rows"][0]["step_walls"]
    assert "The signals' cost alone" in done.stdout


def test_the_recorded_gpu_run_renders_into_results(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## Earlier\n\ntext\n")
    data = json.loads((BENCH_RECORDED / "gpu.json").read_text())
    gpu.write_section(data, results)
    gpu.write_section(data, results)  # again: replaced in place, not appended twice
    text = results.read_text()
    assert text.count(gpu.SECTION) == 1 and "## Earlier" in text
    assert "NVIDIA" in text and "pick over TRL's defaults" in text
    assert "**The signals' cost alone**" in text and "**The signals' cost alone (dpo_21_steps)**" in text
