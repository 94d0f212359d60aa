"""A search numbers its trials 0, 1, 2, ... in the order they ran (tuner.search._sampling.NUMBER_ATTR), whatever the
Optuna study's own numbers are: proposals drawn again, priors and reserved numbers take study numbers too. The study's
number is kept as a tag; a store written before (trials numbered by the study) still resumes after its numbers."""

from __future__ import annotations

import optuna
import pytest
from helpers import run_search_in, runs_of

from tuner.config.space import parse_space
from tuner.records import Status, new_record
from tuner.search import _sampling as sampling
from tuner.stores.tags import OPTUNA_NUMBER_TAG, TRIAL_NUMBER_TAG

FOUR_POINTS = """\
trainer: reward
fixed:
  learning_rate: 0.01
  max_length: 64
params:
  precision: {type: categorical, choices: [fp32, bf16-pure]}
  gradient_accumulation_steps: {type: categorical, choices: [1, 2]}
"""

SPACE = parse_space({"trainer": "reward", "params": {
    "learning_rate": {"type": "categorical", "choices": [0.01, 0.1, 1.0]}}})


def ok(params: dict, number: int) -> dict:
    return new_record({"status": Status.OK, "tokens_per_second": 100.0}, number=number, params=params, max_steps=4,
                      seed=0)


def redraw(study) -> None:
    """What ``sampling.ask`` does with a proposal that repeats an earlier trial: the study number is used up."""
    trial = study.ask()
    trial.set_user_attr("tuner.skipped", "proposed the params of an earlier trial; drawn again")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_numbers_skip_no_value_when_the_study_draws_again():
    proposer = sampling.Proposer(sampling.make_study("random", 0, 3, None, "numbers"), SPACE, "random", 3)
    numbers = []
    for _ in range(3):
        trial, params = proposer.ask()
        numbers.append((proposer.number(trial), trial.number))
        proposer.tell(trial, ok(params, proposer.number(trial)))
        redraw(proposer.study)
        redraw(proposer.study)
    assert [ours for ours, _ in numbers] == [0, 1, 2]
    assert all(study >= 3 * i for i, (_, study) in enumerate(numbers))  # the study's numbers count the redraws
    assert proposer.number(proposer.study.ask()) == 3  # asked again: the same number each time it is asked
    # a resumed search goes on after its own highest number, not the study's
    again = sampling.Proposer(proposer.study, SPACE, "random", 3)
    assert again.next_number == 4


def test_a_store_numbered_by_the_study_goes_on_after_its_highest_number():
    # A study written before the search kept numbers of its own: trials 0 and 1 told, 2 a redraw, 3 in flight
    # when the driver died. Its resume re-runs trial 3's params and numbers new trials after 3.
    study = sampling.make_study("random", 0, 6, None, "old")
    for value in (0.01, 0.1):
        study.enqueue_trial({"learning_rate": value})
        trial = study.ask()
        SPACE.suggest(trial)
        study.tell(trial, 1.0)
    redraw(study)
    study.enqueue_trial({"learning_rate": 1.0})
    running = study.ask()
    SPACE.suggest(running)
    recorded = {0: ok({"learning_rate": 0.01}, 0), 1: ok({"learning_rate": 0.1}, 1)}
    sampling.reconcile(study, recorded)
    assert study.trials[3].state == optuna.trial.TrialState.FAIL  # in flight: failed, its params queued again
    proposer = sampling.Proposer(study, SPACE, "random", 6)
    trial, params = proposer.ask()
    assert params == {"learning_rate": 1.0} and proposer.number(trial) == 4


@pytest.mark.slow
def test_a_search_over_four_points_numbers_its_trials_0_to_3(tmp_path, tiny_model):
    finished = run_search_in(tmp_path, FOUR_POINTS, sampler="tpe", trials=4, seed=0, concurrency=1, confirm_seeds=0,
                             max_steps=4, budget=0)
    records = sorted(finished.outcome.records, key=lambda r: r["number"])
    assert [r["number"] for r in records] == [0, 1, 2, 3]
    assert len({repr(sorted(r["params"].items())) for r in records}) == 4  # the four points, each once
    runs = {int(run.data.tags[TRIAL_NUMBER_TAG]): run.data.tags for run in runs_of(finished, "trial")}
    assert sorted(runs) == [0, 1, 2, 3]
    study_numbers = [int(runs[n][OPTUNA_NUMBER_TAG]) for n in range(4)]
    assert study_numbers == sorted(study_numbers) and study_numbers[0] == 0, study_numbers
    assert "trial   3" in "\n".join(finished.echoed)
