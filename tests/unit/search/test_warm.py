"""Warm start (tuner.search._warm) on made-up searches: the left-out rule and the priors told to Optuna, the budget of
a warm search and its fallbacks, the data a reward makes, another size of a model's family. Real searches in one
store (a second search finds the first, runs its recommendation as trial 0 and says so; --warm-start none and another
trainer start cold; two sizes of a family) are tests/e2e/search/test_warm_e2e.py."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.config.space import parse_space
from tuner.config.user_yaml import load_yaml
from tuner.search import _sampling as sampling
from tuner.search import _warm as warm
from tuner.search.ledger import Ledger
from tuner.stores.tags import WARM_START_TAG
from tuner.trial import TrialSpec

HERE = warm.Here("reward", "tiny", "NVIDIA H100 80GB HBM3", ("fp32", "bf16-mixed", "fp16-mixed", "bf16-pure",
                                                             "fp16-pure"), "builtin:reward")
SPACE = """\
trainer: reward
fixed: {per_device_train_batch_size: 8}
params:
  precision: {type: categorical, choices: [fp32, bf16-pure, fp16-pure]}
  learning_rate: {type: float, low: 1.0e-5, high: 1.0e-2, log: true}
"""


def trial(number: int, precision: str, status: str = "ok", lr: float = 1e-3, **extra) -> dict:
    return {"number": number, "params": {"precision": precision, "learning_rate": lr, "per_device_train_batch_size": 8},
            "status": status, "reason": "" if status == "ok" else "process killed by SIGFPE", "learned": True,
            "progress": 0.2, "tokens_per_second": 1000.0, "max_steps": 20, "stopped_at_step": None, **extra}


def source(trials: list[dict], recommended: dict | None = None, data: str = "builtin:reward",
           hardware: str = HERE.hardware, run_id: str = "r1", lengths: str = "") -> warm.Source:
    was = warm.Here("reward", "tiny", hardware, HERE.precisions, data, lengths)
    return warm.Source(run_id, f"search-{run_id}", "reward-tiny", was,
                       {"trials": trials, "recommended": recommended})


def space():
    return parse_space(load_yaml(SPACE), "space.yaml")


# -- the rules, on made-up searches ----------------------------------------------------------------------------------


def test_a_precision_that_crashed_in_every_trial_is_left_out_with_its_evidence():
    crashed = [trial(i, "fp16-pure", "crashed") for i in range(4)]
    found = [source([*crashed, trial(4, "fp32"), trial(5, "bf16-pure", "diverged")])]
    assert warm.left_out(found, HERE, ["fp32", "bf16-pure", "fp16-pure"]) == {"fp16-pure": "crashed 4 of 4 there"}


@pytest.mark.parametrize("why, trials, kwargs", [
    ("one crash is no evidence", [trial(0, "fp16-pure", "crashed"), trial(1, "fp32")], {}),
    ("diverging depends on the data and the learning rate",
     [trial(0, "fp16-pure", "diverged"), trial(1, "fp16-pure", "diverged"), trial(2, "fp32")], {}),
    ("every precision crashed: the crash is not the precision's",
     [trial(0, "fp16-pure", "crashed"), trial(1, "fp16-pure", "crashed"), trial(2, "fp32", "crashed")], {}),
    ("a --from file's precision runs as written",
     [trial(0, "fp16-pure", "crashed"), trial(1, "fp16-pure", "crashed"), trial(2, "fp32")],
     {"keep": ("fp16-pure",)}),
])
def test_nothing_is_left_out_without_evidence_tied_to_the_precision(why, trials, kwargs):
    assert warm.left_out([source(trials)], HERE, ["fp32", "bf16-pure", "fp16-pure"], **kwargs) == {}, why


def test_crashes_on_other_hardware_leave_nothing_out():
    trials = [trial(0, "fp16-pure", "crashed"), trial(1, "fp16-pure", "crashed"), trial(2, "fp32")]
    assert warm.left_out([source(trials, hardware="cpu")], HERE, ["fp32", "fp16-pure"]) == {}


def batch_trial(number: int, size: int, status: str = "ok", precision: str = "fp32") -> dict:
    record = trial(number, precision, status)
    return {**record, "params": {**record["params"], "per_device_train_batch_size": size}}


def test_a_batch_size_that_ran_out_of_memory_in_every_trial_is_left_out_with_every_larger_one():
    trials = [batch_trial(0, 8, "oom"), batch_trial(1, 8, "oom", precision="bf16-pure"), batch_trial(2, 4),
              batch_trial(3, 16, "oom")]
    found = warm.batches_left_out([source(trials)], HERE, [2, 4, 8, 16, 32])
    assert found == {8: "out of memory in 2 of 2 trials there", 16: "larger than 8, out of memory there",
                     32: "larger than 8, out of memory there"}
    built = warm.build([source(trials, recommended=trials[2])], HERE, space_with_batches(), n_trials=12)
    assert built.batches_left_out == {8: found[8], 16: found[16]}  # the space's choices only
    assert "per_device_train_batch_size 8, 16 left out (out of memory in 2 of 2 trials there)" in built.line
    # the trials at the sizes left out are not told to the sampler; the one at 4 is
    assert [r["number"] for r in built.priors] == [2]


@pytest.mark.parametrize("why, trials, kwargs", [
    ("one OOM is no evidence", [batch_trial(0, 8, "oom"), batch_trial(1, 4)], {}),
    ("a size that also ran", [batch_trial(0, 8, "oom"), batch_trial(1, 8, "oom"), batch_trial(2, 8), batch_trial(3, 4)],
     {}),
    ("nothing smaller ran: the batch is not shown to be the cause", [batch_trial(0, 8, "oom"), batch_trial(1, 8, "oom")],
     {}),
    ("a crash is not out of memory", [batch_trial(0, 8, "crashed"), batch_trial(1, 8, "crashed"), batch_trial(2, 4)],
     {}),
    ("too_big never ran", [batch_trial(0, 8, "too_big"), batch_trial(1, 8, "too_big"), batch_trial(2, 4)], {}),
    ("a --from file's batch size runs as written", [batch_trial(0, 8, "oom"), batch_trial(1, 8, "oom"),
                                                    batch_trial(2, 4)], {"keep": ("fp32", 8)}),
])
def test_no_batch_size_is_left_out_without_evidence(why, trials, kwargs):
    assert warm.batches_left_out([source(trials)], HERE, [4, 8], **kwargs) == {}, why


def test_ooms_on_other_hardware_leave_no_batch_size_out_and_the_smallest_is_always_kept():
    trials = [batch_trial(0, 8, "oom"), batch_trial(1, 8, "oom"), batch_trial(2, 4)]
    assert warm.batches_left_out([source(trials, hardware="cpu")], HERE, [4, 8]) == {}
    assert warm.batches_left_out([source(trials)], HERE, [8, 16]) == {16: "larger than 8, out of memory there"}


def space_with_batches():
    return parse_space(load_yaml(SPACE.replace("fixed: {per_device_train_batch_size: 8}\n", "").replace(
        "params:\n", "params:\n  per_device_train_batch_size: {type: categorical, choices: [4, 8, 16]}\n")), "space.yaml")


def test_the_space_keeps_a_precision():
    trials = [trial(0, "fp16-pure", "crashed"), trial(1, "fp16-pure", "crashed"), trial(2, "fp32")]
    assert warm.left_out([source(trials)], HERE, ["fp16-pure"]) == {}


def test_build_runs_the_recommendation_first_and_tells_same_data_trials():
    trials = [trial(0, "fp16-pure", "crashed"), trial(1, "fp16-pure", "crashed"), trial(2, "fp32", lr=2e-3),
              trial(3, "bf16-pure", lr=5e-3)]
    built = warm.build([source(trials, recommended=trials[2])], HERE, space(), n_trials=12)
    assert built.picks == [{"precision": "fp32", "learning_rate": 2e-3}]
    assert built.left_out == {"fp16-pure": "crashed 2 of 2 there"}
    assert [r["number"] for r in built.priors] == [2, 3]  # the left-out precision's trials are not told
    assert built.line == ("warm start from search search-r1 of reward on tiny (NVIDIA H100 80GB HBM3; same data): "
                          "trial 0 = its recommendation; 2 earlier trials told to the sampler; fp16-pure left out "
                          "(crashed 2 of 2 there)")
    assert built.tags() == {WARM_START_TAG: "r1"}


def test_earlier_trials_none_of_which_learned_are_not_told_to_the_sampler_but_their_speeds_count():
    unlearned = [trial(0, "fp32", learned=False), trial(1, "fp32", lr=2e-3, learned=False),
                 trial(2, "bf16-pure", "diverged", lr=5e-3), trial(3, "fp32", "pruned", lr=4e-3)]
    built = warm.build([source(unlearned)], HERE, space(), n_trials=12)
    assert len(built.priors) == 4 and built.to_tell() == [] and len(built.measured_here()) == 4
    assert ("no recommendation of theirs to run first; their 4 trials not told to the sampler (none of them learned: "
            "tied at 0, they rank nothing)") in built.line, built.line
    # one that learned gives them a ranking: all of them are told
    some = warm.build([source([*unlearned, trial(4, "fp32", lr=3e-3)])], HERE, space(), n_trials=12)
    assert len(some.to_tell()) == 5 and "5 earlier trials told to the sampler" in some.line


def test_other_data_runs_the_pick_and_tells_the_sampler_but_its_speeds_are_not_measured_here():
    trials = [trial(0, "fp32", lr=2e-3), trial(1, "fp32", lr=4e-3), trial(2, "fp32", lr=1e-3)]
    built = warm.build([source(trials, recommended=trials[0], data="sha256:abc")], HERE, space(), n_trials=12,
                       after_first=True)
    assert built.picks and [r["number"] for r in built.priors] == [0, 1, 2] and built.other_data == 3
    assert "other data" in built.line and "trial 1 = its recommendation" in built.line  # after a --from trial 0
    assert "3 earlier trials told to the sampler (all on other data)" in built.line
    assert built.measured_here() == []  # tokens/s of other rows: not this data's speeds
    # one search on this data, one on other data: only the first one's trials are speeds measured here
    mixed = warm.build([source(trials, recommended=trials[0]), source(trials[:1], data="sha256:abc", run_id="r2")],
                       HERE, space(), n_trials=12)
    assert len(mixed.priors) == 4 and mixed.other_data == 1 and len(mixed.measured_here()) == 3
    assert "4 earlier trials told to the sampler (1 on other data)" in mixed.line


def test_other_data_whose_rows_are_of_alike_lengths_has_its_speeds_reused_and_the_line_says_why():
    trials = [trial(0, "fp32", lr=2e-3), trial(1, "fp32", lr=4e-3), trial(2, "fp32", lr=1e-3)]
    here = dataclasses.replace(HERE, lengths="p10=11,p50=13,p90=13,n=256")
    alike = warm.build([source(trials, recommended=trials[0], data="sha256:abc", lengths="p10=11,p50=12,p90=13,n=256")],
                       here, space(), n_trials=12)
    assert len(alike.measured_here()) == 3 and alike.other_data == 3
    alike.speeds_reused = True  # as tuner.search._prepare sets it (tuner.search._staging.speed_known)
    assert ("their speeds reused (no speed stage; other data, its rows' token lengths alike: p10/p50/p90 11/13/13 "
            "here, 11/12/13 there)") in warm.describe(alike, here)
    for lengths in ("p10=11,p50=13,p90=40,n=256", ""):  # a long tail there; a search from before profiles were kept
        other = warm.build([source(trials, recommended=trials[0], data="sha256:abc", lengths=lengths)], here, space(),
                           n_trials=12)
        assert other.measured_here() == [] and other.picks and len(other.priors) == 3
    # without a profile here, only the same data's speeds count
    assert warm.build([source(trials, data="sha256:abc", lengths=here.lengths)], HERE, space(), 12).measured_here() == []


def test_a_recommendation_outside_the_space_is_not_run_and_the_search_says_why():
    outside = trial(0, "fp32", lr=0.3)
    built = warm.build([source([outside], recommended=outside)], HERE, space(), n_trials=12)
    assert built.picks == [] and not built.priors
    assert built.notes == ["the recommendation of search-r1 is not run first: trial 0's params lie outside this space"]


def test_told_line_says_when_the_old_pick_fails_here():
    built = warm.WarmStart(sources=[source([])], picks=[{"learning_rate": 1e-3}])
    failed = trial(0, "fp32", "diverged", reason="loss is nan at step 3")
    assert warm.told_line(failed, built) == ("warm start: trial 0, the earlier recommendation, failed here (diverged: "
                                             "loss is nan at step 3); the search goes on exploring")
    assert "runs here" in warm.told_line(trial(0, "fp32"), built)
    assert "stopped early" in warm.told_line(trial(0, "fp32", "pruned"), built)
    assert warm.told_line(trial(1, "fp32"), built) is None  # not a pick


def test_the_earlier_recommendation_is_confirmed_beside_its_own_trial_until_it_fails_here():
    from tuner.search import _confirm as confirm

    built = warm.WarmStart(sources=[source([])], picks=[{"learning_rate": 1e-3}, {"learning_rate": 2e-3}])
    params = trial(0, "fp32")["params"]
    held = {**trial(0, "fp32", progress_p_value=1e-6), "seed": 0}
    assert warm.to_confirm_first([], {}, built) is None  # not started
    assert warm.to_confirm_first([], {1: params}, built) is None  # the second pick is not confirmed ahead
    assert warm.to_confirm_first([], {0: params}, built) == {"number": 0, "params": params}  # running: beside it
    assert warm.to_confirm_first([held], {}, built) is held  # ended here, stable and learning
    assert warm.to_confirm_first([{**held, "status": "diverged"}], {}, built) is None  # failed here: no more runs
    assert warm.to_confirm_first([{**held, "learned": False}], {}, built) is None
    assert warm.to_confirm_first([{**held, "confirms": 0}], {}, built) is None  # a confirmation run is not the pick's
    assert warm.to_confirm_first([held], {0: params}, warm.WarmStart(sources=[source([])])) is None  # no pick
    # its confirmation run failed while its trial still runs (or ran on): no second confirmation run
    diverged_beside = {**held, "status": "diverged", "seed": 1, "confirms": 0}
    assert warm.to_confirm_first([], {0: params}, built, [diverged_beside]) is None
    assert warm.to_confirm_first([held], {}, built, [diverged_beside]) is None
    assert warm.to_confirm_first([], {0: params}, built, [{**diverged_beside, "status": "ok"}]) is not None
    assert warm.to_confirm_first([], {0: params}, built, [{**diverged_beside, "confirms": 5}]) is not None  # another's
    said: list[str] = []
    # the search's trials run 20 steps, as the earlier pick's trial here
    schedule = confirm.Schedule(TrialSpec(trainer="sft", params={}, max_steps=20, seed=0), seeds=2, top=2, timeout=60,
                                announce=said.append)
    jobs = [schedule.first({"number": 0, "params": params}, "the earlier recommendation") for _ in range(3)]
    assert [(j["number"], j["spec"]["seed"], j["spec"]["params"]) for j in jobs[:2]] == [(0, 1, params), (0, 2, params)]
    assert jobs[2] is None
    assert said == ["confirming trial 0, the earlier recommendation, on 2 more seeds beside it, ahead of the other "
                    "trials"]
    # those were the schedule's early runs: no other trial is confirmed before the search's trials have ended ...
    other = {**trial(1, "fp32", lr=2e-3, progress_p_value=1e-6), "seed": 0, "tokens_per_second": 2000.0}
    assert schedule.next(Ledger([held, other]), final=False) is None and schedule.first(other, "another") is None
    # ... and at the end the pick is not confirmed again (its runs are out: wait for them); a trial that beat it is
    # confirmed as in any search
    assert schedule.next(Ledger([held]), final=True) == confirm.WAIT
    assert schedule.next(Ledger([held, other]), final=True)["number"] == 1


def test_a_trial_that_beats_the_earlier_recommendation_here_is_confirmed_next_ahead_of_the_other_trials():
    from tuner.search import _confirm as confirm

    built = warm.WarmStart(sources=[source([])], picks=[{"learning_rate": 1e-3}])
    held = {**trial(0, "fp32", progress_p_value=1e-6), "seed": 0}  # 1000 tokens/s x 0.2
    better = {**trial(2, "fp32", lr=2e-3, progress_p_value=1e-6), "seed": 0, "tokens_per_second": 1500.0}
    worse = {**trial(1, "fp32", lr=5e-4, progress_p_value=1e-6), "seed": 0, "tokens_per_second": 500.0}
    assert warm.challenger([held, worse], built) is None  # the earlier recommendation is still the best
    assert warm.challenger([held, worse, better], built) is better
    assert warm.challenger([worse, better], built) is None  # the earlier recommendation still runs
    assert warm.challenger([{**held, "status": "diverged"}, better], built) is None  # it failed here: a cold search's way
    assert warm.challenger([{**held, "learned": False}, better], built) is None
    failed_run = {**held, "status": "diverged", "seed": 1, "confirms": 0}
    assert warm.challenger([held, better], built, [failed_run]) is None
    assert warm.challenger([held, better, {**better, "number": 3, "confirms": 0}], built) is better  # runs aren't trials
    assert warm.challenger([held, better], warm.WarmStart(sources=[source([])])) is None  # no pick
    # a warm search's schedule hands out the earlier recommendation's runs, then the challenger's, then no third's
    said: list[str] = []
    schedule = confirm.Schedule(TrialSpec(trainer="sft", params={}, max_steps=20, seed=0), seeds=2, top=2, timeout=60, announce=said.append, ahead=2)
    assert schedule.most_runs == 8
    runs = [schedule.first(held, "the earlier recommendation") for _ in range(2)]
    runs += [schedule.first(better, "which beats the earlier recommendation here") for _ in range(3)]
    assert [(j["number"], j["spec"]["seed"]) for j in runs[:4]] == [(0, 1), (0, 2), (2, 1), (2, 2)] and runs[4] is None
    assert schedule.first({**worse, "tokens_per_second": 9000.0}, "another") is None
    assert said == ["confirming trial 0, the earlier recommendation, on 2 more seeds, ahead of the other trials",
                    "confirming trial 2, which beats the earlier recommendation here, on 2 more seeds, ahead of the "
                    "other trials"]
    # at the end its runs count: confirmed, it is the recommendation and nothing more runs
    ran = [{**better, "seed": s, "confirms": 2} for s in (1, 2)] + [{**held, "seed": s, "confirms": 0} for s in (1, 2)]
    assert schedule.next(Ledger([held, worse, better, *ran]), final=True) is None
    assert confirm.judge(confirm.candidates([held, worse, better], 2, ran), ran)[0]["number"] == 2


def test_priors_come_first_in_the_study_and_this_search_still_numbers_from_0():
    import optuna

    told = [trial(0, "fp32", lr=2e-3), trial(1, "bf16-pure", "diverged", lr=5e-3), trial(2, "fp32", lr=0.3)]
    study = sampling.make_study("tpe", 0, 12, None, "warm", first=[{"precision": "fp32", "learning_rate": 2e-3}],
                                priors=[(space(), told)])
    assert sampling.prior_count(study) == 2  # lr 0.3 lies outside the space: not told
    prior = study.trials[1]
    assert prior.state == optuna.trial.TrialState.COMPLETE and prior.constraints == {"stable": 2.0}  # infeasible, as told then
    proposer = sampling.Proposer(study, space(), "tpe", 12)
    first, params = proposer.ask()
    assert proposer.number(first) == 0 and params["learning_rate"] == 2e-3  # the pick, enqueued, is trial 0


def test_a_resumed_warm_study_never_re_runs_the_earlier_trials():
    told = [trial(0, "fp32", lr=2e-3), trial(1, "fp32", lr=4e-3)]
    study = sampling.make_study("random", 0, 12, None, "resumed", priors=[(space(), told)])
    proposer = sampling.Proposer(study, space(), "random", 12)
    done, params = proposer.ask()
    proposer.tell(done, {**trial(0, "fp32"), "params": params})
    sampling.reconcile(study, {0: {**trial(0, "fp32"), "params": params}})
    assert [t for t in study.trials if t.state.name == "WAITING"] == []  # nothing enqueued again


def test_a_warm_search_on_the_same_data_runs_half_the_default_trials_and_says_so():
    trials = [trial(0, "fp32", lr=2e-3), trial(1, "fp32", lr=4e-3)]
    built = warm.build([source(trials, recommended=trials[0])], HERE, space(), n_trials=12)
    assert built.budget(12) == 4 and "4 trials instead of 12" in warm.describe(built, HERE)
    assert built.budget(3) == 3  # never fewer than the picks and two more
    # other data of the same task: its trials are told to the sampler too, and count toward the budget
    other = warm.build([source(trials, recommended=trials[0], data="sha256:abc")], HERE, space(), n_trials=12)
    assert other.budget(12) == 4 and "4 trials instead of 12" in warm.describe(other, HERE)


def test_a_warm_search_falls_back_to_the_default_trials_only_when_every_pick_failed_here():
    trials = [trial(0, "fp32", lr=2e-3), trial(1, "fp32", lr=4e-3)]
    built = warm.build([source(trials, recommended=trials[0])], HERE, space(), n_trials=12)
    assert built.budget(12) == 4
    pick = {**trial(0, "fp32", lr=2e-3), "status": "diverged", "learned": False}
    assert warm.fell_back([], built) is None  # the pick still runs
    assert warm.fell_back([pick], built) == 12
    assert "runs the default 12 trials" in warm.fallback_line(12, built)
    assert warm.fell_back([{**pick, "status": "ok", "learned": False}], built) == 12  # stable, learned nothing
    assert warm.fell_back([{**pick, "status": "ok", "learned": True}], built) is None  # it did well here
    assert warm.fell_back([{**pick, "status": "pruned"}], built) is None  # others beat it: nothing wrong with it
    assert warm.fell_back([{**pick, "confirms": 0}], built) is None  # a confirmation re-run is not the pick's trial
    held = {**pick, "status": "ok", "learned": True}
    assert warm.fell_back([held], built, demoted={0}) == 12  # held here, demoted on its confirmation seeds
    # where the earlier speeds count as measured here, it goes back to a cold search's learning stage: the default
    # less the speed stage it need not run (tuner.search._prepare sets ``fallback``)
    built.fallback = 7
    assert warm.fell_back([pick], built) == 7 and built.fallback_trials() == 7
    assert ("the earlier recommendation failed here; the search runs 7 trials, as a cold search explores the learning "
            "knobs (its default 12 less the 5 of its speed stage: the speeds are known here) (the 4 it planned kept)"
            ) in warm.fallback_line(7, built)
    # a search whose budget the earlier trials did not cut (none of them told: here, none fits the space) has
    # nothing to go back to
    outside = [trial(0, "fp32", lr=0.3), trial(1, "fp32", lr=0.5)]
    uncut = warm.build([source(outside, recommended=trials[0])], HERE, space(), n_trials=12)
    assert uncut.picks and not uncut.priors and uncut.budget(12) == 12 and warm.fell_back([pick], uncut) is None
    assert "their outcomes not told to the sampler (none fits this space)" in uncut.line


@pytest.mark.parametrize("trainer", ["grpo", "dpo", "kto", "reward", "sft"])
def test_a_warm_search_whose_speeds_are_known_falls_back_to_a_cold_searchs_learning_stage(trainer):
    """The shipped spaces: a cold search of 12 spends its first trials timing system configs with the learning knobs
    pinned (tuner.search._staging); a warm one that knows the speeds goes back to the other trials' count."""
    from tuner.config.space import load_space
    from tuner.search import _prepare
    from tuner.search._staging import Stages

    shipped = load_space(trainer=trainer)
    speed = Stages.for_space(shipped, 12).speed_trials
    assert 3 <= speed < 8  # MIN_SPEED_TRIALS, 40% of 12
    found = warm.WarmStart(sources=[source([])], picks=[{}], trials=(4, 12), speeds_reused=True)
    assert _prepare._fallback(found, shipped) == 12 - speed
    assert _prepare._fallback(dataclasses.replace(found, speeds_reused=False), shipped) == 0  # speeds measured again
    assert _prepare._fallback(dataclasses.replace(found, trials=None), shipped) == 0  # budget not cut
    assert _prepare._fallback(dataclasses.replace(found, trials=(8, 12)), shipped) == 0  # not more than it planned
    assert _prepare._fallback(found, parse_space(load_yaml(SPACE.replace("fixed: {", "fixed: {precision: fp32, ")
                                                          .replace("  precision: {type: categorical, choices: [fp32, bf16-pure, fp16-pure]}\n", "")),
                                                "space.yaml")) == 0  # no speed knob searched: no speed stage


def test_a_grpo_search_under_another_reward_is_on_other_data(tmp_path):
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text("def length(completions, **kwargs):\n    return [len(c) for c in completions]\n")
    plain = warm.fingerprint(None, "grpo")
    assert plain == warm.fingerprint(None, "grpo", ["builtin"]) == "builtin:grpo"  # the built-in reward: as before
    mine = warm.fingerprint(None, "grpo", [f"{rewards}:length"])
    assert mine.startswith("builtin:grpo+rewards:") and mine != plain
    assert warm.fingerprint(None, "grpo", [f"{rewards}:length"]) == mine  # the same reward: the same data
    assert warm.fingerprint(None, "grpo", [f"{rewards}:other"]) != mine  # another function of the file
    rewards.write_text("def length(completions, **kwargs):\n    return [-len(c) for c in completions]\n")
    assert warm.fingerprint(None, "grpo", [f"{rewards}:length"]) != mine  # the function's file changed
    assert warm.fingerprint(None, "grpo", ["think_format_reward"]) != plain  # a TRL reward by name


@pytest.mark.parametrize("model, expected", [
    ("Qwen/Qwen2.5-0.5B", ("qwen/qwen2.5-{size}", 5e8)),
    ("Qwen/Qwen2.5-1.5B-Instruct", ("qwen/qwen2.5-{size}-instruct", 1.5e9)),
    ("HuggingFaceTB/SmolLM2-135M", ("huggingfacetb/smollm2-{size}", 1.35e8)),
    ("/models/Llama-3.1-8B", ("llama-3.1-{size}", 8e9)),  # a local folder by its name
    ("microsoft/phi-2", None),  # no size in the name
    ("/models/tiny", None),
])
def test_a_model_family_and_size_are_read_from_the_size_in_its_name(model, expected):
    assert warm.family(model) == expected


def test_another_size_of_the_family_runs_its_pick_first_and_tells_nothing_else():
    here = dataclasses.replace(HERE, model="Qwen/Qwen2.5-1.5B")
    smaller = [batch_trial(0, 8, "oom"), batch_trial(1, 8, "oom"), batch_trial(2, 4),
               batch_trial(3, 4, "crashed", "fp16-pure"), batch_trial(4, 4, "crashed", "fp16-pure")]
    small = warm.Source("r1", "search-r1", "grpo", dataclasses.replace(HERE, model="Qwen/Qwen2.5-0.5B"),
                        {"trials": smaller, "recommended": smaller[2]})
    assert small.kin(here) and not small.matches(here)
    assert not small.kin(dataclasses.replace(here, model="Qwen/Qwen2.5-1.5B-Instruct"))  # instruct: another family
    assert not small.kin(dataclasses.replace(here, hardware="cpu"))
    built = warm.build([small], here, space_with_batches(), n_trials=12)
    assert built.picks == [{"per_device_train_batch_size": 4, "precision": "fp32", "learning_rate": 1e-3}]  # as it is
    assert built.priors == [] and built.budget(12) == 12  # nothing told, the budget not cut
    assert built.left_out == {"fp16-pure": "crashed 2 of 2 there"}  # a precision this hardware cannot run
    assert sorted(built.batches_left_out) == [8, 16]  # a smaller model ran out of memory there: this one would too
    assert built.line.startswith("warm start from search search-r1 of reward on Qwen2.5-0.5B (another size of "
                                 "Qwen2.5-1.5B's family) (")
    assert "their outcomes not told to the sampler (another model size)" in built.line
    # a larger model's out-of-memory trials say nothing of a smaller one's
    large = dataclasses.replace(small, was=dataclasses.replace(HERE, model="Qwen/Qwen2.5-7B"))
    assert warm.build([large], here, space_with_batches(), n_trials=12).batches_left_out == {}
