"""Successive halving in a real search on the tiny model: a trial far behind at a rung is pruned there, judged by its
figures at the rung whether its rows come while it runs or only after its end (the rules are
tests/unit/search/test_pruning.py)."""

from __future__ import annotations

import pytest
from helpers import run_search_in, runs_of

from tuner.records import Status
from tuner.search import _execution as execution

# How the rows of the trial that falls behind reach the driver: while it still runs (each step slowed), or all of
# them only once it ended (a poll longer than the trials: a machine fast enough to end a trial before its rows are
# read). Either way, the verdict must be the same.
TIMINGS = {"still running at the rung": {"TUNER_FAULT": "slow@1", "TUNER_FAULT_WHEN": "learning_rate=1.0e-7"},
           "rows only after its end": {"TUNER_LIVE_POLL_S": "600"}}


@pytest.mark.slow
@pytest.mark.parametrize("timing", TIMINGS)
def test_a_trial_far_behind_at_a_rung_is_pruned_there_whatever_the_timing(tmp_path, tiny_model, monkeypatch, timing):
    """Grid order, one at a time: a learning rate that learns finishes first; one 100000x smaller is judged at the
    first rung (step 10 of 40) by its figures there and stopped: pruned at step 10 exactly, never recorded from
    a later step or from its end, and the search goes on."""
    for name, value in TIMINGS[timing].items():
        monkeypatch.setenv(name, value)
    space = """\
trainer: sft
fixed: {use_peft: false, max_length: 64, precision: fp32, per_device_train_batch_size: 8}
params:
  learning_rate: {type: categorical, choices: [0.01, 1.0e-7]}
"""
    finished = run_search_in(tmp_path, space, trainer="sft", sampler="grid", max_steps=40, concurrency=1,
                             confirm_seeds=0, prune=True)
    good, behind = finished.by_params(learning_rate=0.01), finished.by_params(learning_rate=1e-7)
    assert good["status"] == Status.OK and good["learned"] and good["steps_run"] == 40
    assert behind["status"] == Status.PRUNED, behind
    rung = execution.Halving(40).grace
    assert behind["stopped_at_step"] == behind["steps_run"] == rung, behind  # judged at the rung itself
    assert f"stopped by successive halving at step {rung} of 40" in behind["reason"]
    assert behind["node_id"] and behind["node_id"] == good["node_id"]  # the record says where it ran, as any trial's
    assert finished.outcome.recommended["number"] == good["number"]
    # its MLflow run is closed with the verdict (KILLED: stopped by the search, not failed)
    (run,) = [r for r in runs_of(finished, "trial") if r.data.params.get("learning_rate") == "1e-07"]
    assert run.info.status == "KILLED" and run.data.tags.get("tuner.status") == Status.PRUNED
