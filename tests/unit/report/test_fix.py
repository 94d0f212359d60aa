"""The answer to a --from search (tuner.report.fix) on hand-made trial records: trial 0's line, the fewest changes,
the evidence for each, and a healthy config left alone unless a trial was measurably faster. The records are
written here; tests/e2e/search/test_from_config.py runs the same answer on real searches.
"""

from __future__ import annotations

import pytest
from helpers import REWARD_HALF, read

from tuner.report import fix

THEIRS = {"precision": "fp16-pure", "learning_rate": 2e-4, "use_peft": True, "lora_r": 8,
          "lora_target_modules": "all-linear", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 32}


def record(number, status="ok", learned=True, speed=1000.0, step=None, signal=None, reason="", **changes):
    return {"number": number, "status": status, "learned": learned, "tokens_per_second": speed, "progress": 0.3,
            "stopped_at_step": step, "guard_signal": signal, "reason": reason, "max_steps": 8,
            "params": {**THEIRS, **changes}}


def test_trial_0s_line_names_the_verdict_and_its_cause_in_their_terms(tmp_path):
    source = read(tmp_path, REWARD_HALF)
    diverged = record(0, "diverged", False, step=4, signal="non_finite", reason="grad_norm is nan at step 4")
    assert fix.trial0_line(diverged, source.params) == ("your config diverged at step 4: grad_norm is nan "
                                                        "(fp16 weights, gradient accumulation 32)")
    crashed = record(0, "crashed", False, step=2, reason="process killed by SIGFPE (Floating point exception)")
    assert fix.trial0_line(crashed, {**source.params, "precision": "bf16-pure"}).endswith("(bf16 weights)")


def test_the_fewest_changes_win_and_each_carries_its_evidence(tmp_path):
    source = read(tmp_path, REWARD_HALF)
    records = [
        record(0, "diverged", False, step=4, signal="non_finite"),
        record(1, "diverged", False, step=3, signal="non_finite", max_grad_norm=0.3),
        record(2, speed=900.0, precision="fp32"),  # one change: stable and learning
        record(3, speed=3000.0, precision="fp32", learning_rate=1e-4),  # faster, but two changes
    ]
    answer = fix.answer(source, records, best=records[3])
    assert answer.from_trial == 2 and not answer.healthy
    keys = {c.key: (c.old, c.new) for c in answer.changes}
    assert keys == {"dtype": ("float16", "float32")}  # bf16 and fp16 were already false
    (change,) = answer.changes
    assert change.evidence == ("fp16-pure diverged in 2 of 2 trials at steps 3-4; "
                                  "fp32 was ok in 2 of 2 (learned in 2)")
    assert "dtype: float32" in answer.text.splitlines()[2]
    assert fix.diff_lines(answer)[2].startswith("  dtype: float16 -> float32    (fp16-pure diverged")


def side_by_side(*ratios, theirs=1000.0, status="ok"):
    """Speed re-runs (tuner.search._remeasure): per pair, trial 1 at ``ratio`` x trial 0's tokens/s."""
    runs = []
    for pair, ratio in enumerate(ratios):
        runs += [dict(record(1, status, speed=theirs * ratio, precision="fp32"), remeasures=1, pair=pair),
                 dict(record(0, speed=theirs, precision="fp16-pure"), remeasures=0, pair=pair)]
    return runs


@pytest.mark.parametrize(("faster", "again", "changed"), [
    (1.1, (), False),  # not measurably faster: nothing re-run, nothing changed
    (1.5, (1.4, 1.3), True),  # faster in the search and in both pairs side by side
    (1.5, (1.4, 0.8), False),  # one pair side by side says otherwise: the search's lone figures were the load
    (1.5, (1.4,), False),  # a pair missing (an interrupted search): not shown
    (1.5, (), False),
])
def test_a_healthy_config_is_changed_only_for_a_speed_up_measured_again_side_by_side(tmp_path, faster, again, changed):
    source = read(tmp_path, REWARD_HALF)
    records = [record(0, speed=1000.0, precision="fp16-pure"),
               record(1, speed=1000.0 * faster, precision="fp32", learning_rate=1e-3)]
    answer = fix.answer(source, records, best=records[1], remeasures=side_by_side(*again))
    assert answer.healthy and answer.summary.startswith("already stable")
    assert bool(answer.changes) is changed
    # the learning rate is a learning knob: never changed for speed
    assert all(c.param in ("precision",) for c in answer.changes)
    if changed:
        assert answer.changes[0].evidence.endswith("side by side with yours again: 1.40x, 1.30x")
    else:
        assert answer.text == REWARD_HALF  # their file as it is
    if not changed and faster >= fix.SPEEDUP:
        assert "looked 1.5x as fast, but not again side by side with yours" in answer.summary


def test_a_speed_re_run_that_broke_does_not_count_for_the_change(tmp_path):
    source = read(tmp_path, REWARD_HALF)
    records = [record(0, speed=1000.0, precision="fp16-pure"), record(1, speed=1500.0, precision="fp32")]
    runs = side_by_side(1.4, 1.4)
    runs[2]["status"] = "diverged"  # pair 1's run of trial 1
    answer = fix.answer(source, records, best=records[1], remeasures=runs)
    assert not answer.changes and "(1.40x, not measured)" in answer.summary
    assert fix.pair_ratios(1, runs) == [pytest.approx(1.4), None]
    assert answer.text == REWARD_HALF  # their file as it is


def test_export_length_flags_are_written_into_their_file(tmp_path):
    from tuner.report import export

    source = read(tmp_path, REWARD_HALF)
    answer = fix.answer(source, [record(0, "diverged", False, step=4), record(1, precision="fp32")], best=None)
    search = {"trainer": "reward", "fix": answer.to_dict(), "trl_config": fix.load_text(answer.text)}
    out = export.with_overrides(search, {"max_length": 512, "max_completion_length": None})
    lines = out["fix"]["text"].splitlines()
    assert lines[-1] == "max_length: 512" and out["trl_config"]["max_length"] == 512  # appended: theirs had none
    assert lines[:-2] == answer.text.splitlines()  # every other line as it was


def test_the_answer_goes_to_search_json_and_back_and_an_older_ones_reads(tmp_path):
    import json

    source = read(tmp_path, REWARD_HALF)
    answer = fix.answer(source, [record(0, "diverged", False, step=4), record(1, precision="fp32")], best=None)
    assert answer.changes and answer.exportable
    again = fix.Fix.from_dict(json.loads(json.dumps(answer.to_dict())))  # search.json is JSON
    assert again == answer
    # A search.json from before the answer said what its verdict covers and where its trials ran: read as written.
    older = {k: v for k, v in answer.to_dict().items() if k not in ("horizon", "inputs", "notes")}
    assert fix.diff_lines(fix.Fix.from_dict(older)) == [answer.trial0, answer.summary,
                                                         *fix.diff_lines(answer)[2:2 + len(answer.changes)]]
