"""The benchmark harness (bench/): its pure pieces on made-up records, and one --quick run end to end."""

import json
import math

import pytest

from bench.efficiency import NearestMeasured, compare, targets
from bench.history import first_nonfinite_step, wasted_steps
from tuner.space import parse_space

NAN = math.nan

SPACE = parse_space({
    "trainer": "reward",
    "params": {
        "precision": {"type": "categorical", "choices": ["fp32", "bf16-pure", "fp16-pure"]},
        "learning_rate": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
        "per_device_train_batch_size": {"type": "categorical", "choices": [4, 8]},
    },
})


def record(number, precision, lr, batch, status="ok", tps=100.0, progress=0.2, stopped=20):
    return {"number": number, "params": {"precision": precision, "learning_rate": lr, "per_device_train_batch_size": batch},
            "status": status, "tokens_per_second": tps, "progress": progress, "learned": progress > 0.01,
            "stopped_at_step": stopped}


def test_first_nonfinite_step_sees_grad_norm_when_the_filter_hid_the_loss():
    # Trainer's nan/inf filter logs 0.0 for a NaN loss; the grad norm still shows the broken step.
    history = [{"step": 1, "loss": 0.7, "grad_norm": 3.0}, {"step": 2, "loss": 0.0, "grad_norm": NAN},
               {"step": 3, "loss": 0.0, "grad_norm": NAN}]
    assert first_nonfinite_step(history) == 2
    assert wasted_steps(history, steps_run=20) == 18


def test_a_trial_stopped_at_its_first_nan_wastes_nothing():
    history = [{"step": 1, "loss": 0.7, "grad_norm": 3.0}, {"step": 2, "loss": NAN, "grad_norm": NAN}]
    assert wasted_steps(history, steps_run=2) == 0
    assert wasted_steps(history[:1], steps_run=1) == 0


def test_nearest_measured_counts_decades_of_learning_rate_and_differing_choices():
    lookup = NearestMeasured(SPACE, [record(0, "fp32", 1e-4, 8), record(1, "fp16-pure", 0.3, 8)])
    assert lookup.distance({"precision": "fp32", "learning_rate": 1e-3, "per_device_train_batch_size": 4},
                           {"precision": "fp32", "learning_rate": 1e-4, "per_device_train_batch_size": 8}) == pytest.approx(2.0)
    assert lookup({"precision": "fp16-pure", "learning_rate": 0.1, "per_device_train_batch_size": 8})["number"] == 1


def test_targets_are_stable_learning_trials_within_five_percent_of_the_best():
    records = [record(0, "fp32", 1e-4, 8, tps=100.0), record(1, "fp32", 1e-3, 8, tps=96.0),
               record(2, "fp16-pure", 0.3, 8, status="diverged", tps=500.0, stopped=3),
               record(3, "bf16-pure", 1e-5, 8, tps=99.0, progress=0.0)]  # fast enough but did not learn
    best, hits = targets(records)
    assert best["number"] == 0
    assert hits == [0, 1]


def test_compare_runs_both_samplers_on_the_lookup():
    records = [record(i, p, lr, bs, status="diverged" if lr > 0.05 else "ok", tps=tps, stopped=3 if lr > 0.05 else 20)
               for i, (p, lr, bs, tps) in enumerate([
                   ("fp32", 1e-4, 8, 200.0), ("fp32", 1e-3, 4, 120.0), ("bf16-pure", 0.3, 8, 400.0),
                   ("fp16-pure", 0.5, 4, 300.0), ("bf16-pure", 1e-4, 4, 110.0), ("fp16-pure", 1e-3, 8, 150.0)])]
    result = compare(SPACE, records, seeds=[0, 1, 2], budget=12, max_steps=20)
    assert result["best"]["number"] == 0
    for sampler in ("tpe", "random"):
        runs = result["samplers"][sampler]["runs"]
        assert len(runs) == 3
        assert all(r["first_hit"] is None or 1 <= r["first_hit"] <= 12 for r in runs)


@pytest.mark.slow
def test_quick_run_writes_every_table(tmp_path):
    from bench.run import main

    output = tmp_path / "RESULTS.md"
    assert main(["--quick", "--output", str(output)]) == 0
    text = output.read_text()
    for row in ("picked config (per round)", "rounds whose pick is not fp16-pure lr=0.3",
                "wasted steps after the first non-finite step (per round)", "optimizer steps run (per round)",
                "trial start to first optimizer step, median (s)"):
        assert f"| {row} |" in text, row
    assert "wall time of the whole process, median of 1 (s)" in text
    for trainer in ("reward", "grpo"):
        for sampler in ("tpe", "random"):
            assert f"| {trainer} | {sampler} |" in text
    assert "| fp16-pure lr=0.3 |" in text  # the per-trial table has the failing config's row
    assert "GPU: " in text and "command: `" in text
    raw = json.loads((tmp_path / "results.json").read_text())
    assert len(raw["rounds"]) == 1 and set(raw["references"]) == {"reward", "grpo"}
