"""Successive halving beside the guard: Ray Tune's ASHA stops stable trials whose learning speed so far is behind
the trials that reached the same step (status ``pruned``), told to Optuna as PRUNED; never a confirmation re-run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner import execution, sampling
from tuner.records import Status, new_record
from tuner.space import parse_space

LIVE = {execution.LIVE: True, "step": 9, "so_far": {"steps_run": 9, "tokens_per_second": 1200.0, "progress": 0.05,
                                                    "progress_p_value": 0.2, "learned": False,
                                                    "samples_per_second": 20.0}}


def test_a_pruned_trial_keeps_its_figures_so_far_and_says_why():
    result = execution.pruned_result(LIVE, max_steps=40)
    assert result["status"] == Status.PRUNED and result["stopped_at_step"] == 9 and result["steps_run"] == 9
    assert result["tokens_per_second"] == 1200.0 and result["progress"] == 0.05 and not result["learned"]
    assert "step 9 of 40" in result["reason"] and "successive-halving rung" in result["reason"]


@pytest.mark.parametrize("max_steps", [8, 12, 20, 30, 40, 100, 400, 1000])
def test_the_rungs_rows_are_cut_at_are_the_ones_ray_tune_judges_at(max_steps):
    halving = execution.Halving(max_steps)
    (bracket,) = halving._brackets  # Ray Tune's own milestones (private: checked here, never relied on)
    assert sorted(milestone for milestone, _ in bracket._rungs) == execution.halving_rungs(max_steps)
    assert execution.halving_rungs(max_steps)[0] == halving.grace


def test_rows_are_cut_so_that_a_report_ends_at_every_rung():
    rows = [{"step": step} for step in range(1, 31)]
    batches = execution.cut_at(rows, {7, 21})
    assert [batch[-1]["step"] for batch in batches] == [7, 21, 30]
    assert [row for batch in batches for row in batch] == rows  # every row once, in order
    assert execution.cut_at(rows[:5], {7}) == [rows[:5]] and execution.cut_at([], {7}) == []


def test_optuna_is_told_a_pruned_trial_as_pruned_and_stable():
    import optuna

    space = parse_space({"trainer": "sft", "params": {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1}}})
    study = sampling.make_study("tpe", 0, 10, None, "pruning")
    trial, params = sampling.ask(study, space, None)
    record = new_record(execution.pruned_result(LIVE, 40), number=trial.number, params=params, max_steps=40, seed=0)
    sampling.tell(study, trial, record)
    frozen = study.trials[0]
    assert frozen.state == optuna.trial.TrialState.PRUNED
    assert frozen.intermediate_values == {9: pytest.approx(0.05 * 1200.0)}
    assert sampling.constraint_of(record) <= 0  # stable as far as it ran: not steered away from like a failure


def test_grid_searches_run_every_point_to_the_end_unless_asked_to_prune():
    from tuner.options import SearchOptions, prunes
    from tuner.cli import build_parser

    assert prunes(SearchOptions()) and not prunes(SearchOptions(sampler="grid"))
    assert prunes(SearchOptions(sampler="grid", prune=True)) and not prunes(SearchOptions(prune=False))
    assert build_parser().parse_args(["search", "--no-prune"]).prune is False
    assert build_parser().parse_args(["search"]).prune is None


def test_halving_never_stops_a_confirmation_rerun():
    halving = execution.Halving(max_steps=40)
    rerun = SimpleNamespace(trial_id="x", config={"extra": {"confirms": 3}, "spec": {"max_steps": 40}})
    behind = {execution.SO_FAR: -1e9, "step": 30, execution.LIVE: True}
    assert halving.on_trial_result(None, rerun, behind) == execution.TrialScheduler.CONTINUE


@pytest.mark.slow
def test_a_trial_far_behind_at_a_rung_is_pruned_and_the_search_goes_on(tmp_path, tiny_model, monkeypatch):
    """Grid order, one at a time: a learning rate that learns finishes first; one 100000x smaller, slowed so
    it is still running at the first rung (step 10 of 40), is stopped there by ASHA, not run to the end."""
    from tests.test_search import run_search_in

    monkeypatch.setenv("TUNER_FAULT", "slow@1")
    monkeypatch.setenv("TUNER_FAULT_WHEN", "learning_rate=1.0e-7")
    space = """\
trainer: sft
fixed: {use_peft: false, max_length: 64, precision: fp32, per_device_train_batch_size: 8}
params:
  learning_rate: {type: categorical, choices: [0.01, 1.0e-7]}
"""
    finished = run_search_in(tmp_path, space, trainer="sft", sampler="grid", max_steps=40, concurrency=1,
                             confirm_seeds=0, prune=True)
    good, slow = finished.by_params(learning_rate=0.01), finished.by_params(learning_rate=1e-7)
    assert good["status"] == Status.OK and good["learned"]
    assert slow["status"] == Status.PRUNED, slow
    assert slow["stopped_at_step"] == slow["steps_run"] == execution.Halving(40).grace  # judged at the rung itself
    assert "successive-halving rung" in slow["reason"]
    assert finished.outcome.recommended["number"] == good["number"]
    # its MLflow run is closed with the verdict (KILLED: stopped by the search, not failed)
    from tests.test_search import runs_of

    (run,) = [r for r in runs_of(finished, "trial") if r.data.params.get("learning_rate") == "1e-07"]
    assert run.info.status == "KILLED" and run.data.tags.get("tuner.status") == Status.PRUNED


@pytest.mark.slow
def test_a_trial_judged_at_a_rung_is_pruned_there_however_late_its_rows_arrive(tmp_path, tiny_model, monkeypatch):
    """As on a machine fast enough that a trial ends before its rows are read: no row reaches the driver while
    the trials run (a poll longer than the trials). The one behind at the rung is still pruned at the rung's
    step, with its figures there, not recorded from its end; the other is judged by its whole run."""
    from tests.test_search import run_search_in

    monkeypatch.setenv("TUNER_LIVE_POLL_S", "600")
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
    assert behind["stopped_at_step"] == behind["steps_run"] == rung and f"step {rung} of 40" in behind["reason"]
    assert finished.outcome.recommended["number"] == good["number"]
