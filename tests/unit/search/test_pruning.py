"""Successive halving beside the guard: Ray Tune's ASHA stops stable trials whose learning speed so far is behind
the trials that reached the same step (status ``pruned``), told to Optuna as PRUNED; never a confirmation re-run. The
rules here; a real search that prunes a trial far behind is tests/e2e/search/test_pruning_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner.config.space import parse_space
from tuner.records import Status, new_record
from tuner.search import _execution as execution
from tuner.search import _sampling as sampling
from tuner.trial import TrialSpec

LIVE = {execution.LIVE: True, "step": 9, "so_far": {"steps_run": 9, "tokens_per_second": 1200.0, "progress": 0.05,
                                                    "progress_p_value": 0.2, "learned": False,
                                                    "samples_per_second": 20.0}}


def test_a_pruned_trial_keeps_its_figures_so_far_and_says_why():
    result = execution.pruned_result(LIVE, max_steps=40)
    assert result["status"] == Status.PRUNED and result["stopped_at_step"] == 9 and result["steps_run"] == 9
    assert result["tokens_per_second"] == 1200.0 and result["progress"] == 0.05 and not result["learned"]
    assert "step 9 of 40" in result["reason"] and "stopped by successive halving" in result["reason"]


def test_the_searcher_gets_the_same_figures_from_ray_tunes_flattened_result():
    """Ray Tune hands the searcher ``flatten_dict(trial.last_result)`` ("so_far/progress"), the callbacks the dict
    itself: a pruned trial told to Optuna keeps its figures so far (its intermediate value), as its MLflow run does."""
    from ray.tune.utils import flatten_dict

    flat = execution.pruned_result(flatten_dict(LIVE), max_steps=40)
    assert flat == execution.pruned_result(LIVE, max_steps=40)
    assert flat["tokens_per_second"] == 1200.0 and "progress +0.050 x 1200 tokens/s" in flat["reason"]


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


def test_the_summary_names_successive_halving_as_what_stopped_pruned_trials():
    from tuner.verdicts.recommend import failure_summary

    pruned = [{**execution.pruned_result({**LIVE, "step": step}, max_steps=40), "params": {}} for step in (9, 27)]
    summary = failure_summary(pruned)
    assert "2 x pruned: e.g. stopped by successive halving\n" in summary + "\n", summary  # one group, whole words


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
    from tuner.cli import build_parser
    from tuner.config.options import SearchOptions, prunes

    assert prunes(SearchOptions()) and not prunes(SearchOptions(sampler="grid"))
    assert prunes(SearchOptions(sampler="grid", prune=True)) and not prunes(SearchOptions(prune=False))
    assert build_parser().parse_args(["search", "--no-prune"]).prune is False
    assert build_parser().parse_args(["search"]).prune is None


def test_halving_never_stops_a_confirmation_rerun():
    halving = execution.Halving(max_steps=40)
    rerun = SimpleNamespace(trial_id="x", config={"extra": {"confirms": 3}, "spec": {"max_steps": 40}})
    behind = {execution.SO_FAR: -1e9, "step": 30, execution.LIVE: True}
    assert halving.on_trial_result(None, rerun, behind) == execution.TrialScheduler.CONTINUE


def test_the_trials_a_search_keeps_are_handed_out_unprunable_and_halving_lets_them_run():
    """A warm search's earlier recommendation (and --from's trial 0) is a job marked ``keep``: Ray Tune's ASHA lets
    it run on however far behind it is at a rung, and no slow limit is set on it; the trials after it are not kept."""
    import optuna

    from tuner.report.progress import Progress
    from tuner.search.ledger import Ledger
    from tuner.search.loop import Rules, Search


    space = parse_space({"trainer": "sft", "params": {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1}}})
    study = optuna.create_study(sampler=sampling.make_sampler("random", 0, 4), direction="maximize")
    proposer = sampling.Proposer(study, space, "random", 4)
    rules = Rules(TrialSpec(trainer="sft", params={}, max_steps=40, seed=0), 60.0, keep={0})
    searcher = execution.OptunaSearcher(Search(proposer, Ledger(planned=3), rules, [], Progress(3, lambda line: None)))
    jobs = [searcher.suggest(f"t{i}") for i in range(3)]
    assert [bool(job.get("keep")) for job in jobs] == [True, False, False]
    halving = execution.Halving(max_steps=40)
    ahead = {execution.SO_FAR: 1e9, "step": halving.grace, execution.LIVE: True}
    behind = {execution.SO_FAR: -1e9, "step": halving.grace, execution.LIVE: True}
    trials = [SimpleNamespace(trial_id=f"t{i}", config=job) for i, job in enumerate(jobs)]
    halving.on_trial_add(None, trials[1])
    halving.on_trial_add(None, trials[0])
    halving.on_trial_add(None, trials[2])
    assert halving.on_trial_result(None, trials[1], ahead) == execution.TrialScheduler.CONTINUE
    assert halving.on_trial_result(None, trials[0], behind) == execution.TrialScheduler.CONTINUE  # kept
    assert halving.on_trial_result(None, trials[2], behind) == execution.TrialScheduler.STOP  # the same, not kept


def test_a_rung_holds_the_trials_figures_at_the_rung_never_a_run_at_its_end():
    """Ray Tune's ASHA records a trial that ends unrecorded at its last result: a warm search's earlier recommendation
    (kept) and confirmation runs, ended at step 20, set the bar at the rung (step 6) for the trials after them
    (bench/studies/warm_start.py: 23 of the 32 warm trials that started after the recommendation had ended were stopped
    there). A kept trial counts by its figures at the rung; a re-run counts not at all; nothing counts by its end."""
    halving = execution.Halving(max_steps=20)
    rung = halving.grace
    kept = SimpleNamespace(trial_id="kept", config={"keep": True, "number": 0})
    rerun = SimpleNamespace(trial_id="rerun", config={"extra": {"confirms": 0}, "number": 0})
    speed = SimpleNamespace(trial_id="speed", config={"extra": {"remeasures": 0, "pair": 0}, "keep": True})
    later = [SimpleNamespace(trial_id=f"t{i}", config={"number": i}) for i in (1, 2)]
    for trial in (kept, rerun, speed, *later):
        halving.on_trial_add(None, trial)
    at = lambda value, step=rung: {execution.SO_FAR: value, "step": step, execution.LIVE: True}  # noqa: E731
    # the kept trial is slow to start (100 at the rung) and fast by its end; its re-runs are fast throughout
    assert halving.on_trial_result(None, kept, at(100.0)) == execution.TrialScheduler.CONTINUE
    for trial in (rerun, speed):
        assert halving.on_trial_result(None, trial, at(-1e9)) == execution.TrialScheduler.CONTINUE  # never stopped
        halving.on_trial_complete(None, trial, at(5000.0, step=20))
    halving.on_trial_complete(None, kept, at(2500.0, step=20))
    # the trials after them are held to the kept trial's 100 at the rung, not to 2500 or 5000 at step 20
    assert halving.on_trial_result(None, later[0], at(150.0)) == execution.TrialScheduler.CONTINUE
    assert halving.on_trial_result(None, later[1], at(50.0)) == execution.TrialScheduler.STOP  # behind both
    # a kept trial behind at the rung runs on all the same
    slow = SimpleNamespace(trial_id="slow", config={"keep": True, "number": 3})
    halving.on_trial_add(None, slow)
    assert halving.on_trial_result(None, slow, at(-1e9)) == execution.TrialScheduler.CONTINUE
