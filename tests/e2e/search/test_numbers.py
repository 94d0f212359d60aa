"""A search numbers its trials 0, 1, 2, ... in the order they ran (tuner.search._sampling.NUMBER_ATTR), whatever the
Optuna study's own numbers are: proposals drawn again, priors and reserved numbers take study numbers too. The study's
number is kept as a tag; a store written before (trials numbered by the study) still resumes after its numbers: one
built here, and one the old code wrote (tests/data/search/old-store-optuna-numbers.tar.gz)."""

from __future__ import annotations

import sqlite3
import tarfile

import optuna
import pytest
from helpers import (
    DATA,
    expected_exit_code,
    load_search,
    local_uri,
    parent_and_trial_runs,
    run_search_in,
    runs_of,
    store_client,
    tuner_command,
)

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


# A store the code before commit 4dd10ab wrote (trials numbered by the study), its driver SIGKILLed mid-search: made by
# tests/data/search/record_old_store.py (how, and what it holds, in its docstring), recorded in /tmp/tuner-old-store.
OLD_STORE = DATA / "search" / "old-store-optuna-numbers.tar.gz"
RECORDED_ROOT = "/tmp/tuner-old-store"


def extract_old_store(root) -> None:
    """The recorded store unpacked in ``root``, its absolute paths moved there. MLflow and tuner wrote the recorded
    root into mlflow.db: the experiments' artifact_location (file:///tmp/tuner-old-store/store/artifacts), each run's
    artifact_uri, the search run's params search_space (/tmp/tuner-old-store/space.yaml, which --resume reads again)
    and tuner.model of the trial runs (a model folder of the recording machine, read by nothing here), and its tag
    tuner.study_storage (sqlite:////tmp/tuner-old-store/store/optuna.db, where --resume finds the study). Every
    occurrence of the root in those four columns is replaced with ``root``; nothing else is changed (optuna.db and the
    artifacts hold no path that a resume reads)."""
    with tarfile.open(OLD_STORE) as tar:
        tar.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # 3.12+ asks
    con = sqlite3.connect(root / "store" / "mlflow.db")
    try:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("params", "value"),
                              ("tags", "value")):
            con.execute(f"UPDATE {table} SET {column} = REPLACE({column}, ?, ?)", (RECORDED_ROOT, str(root)))
        con.commit()
        assert not con.execute("SELECT COUNT(*) FROM tags WHERE value LIKE ?", (f"%{RECORDED_ROOT}%",)).fetchone()[0]
    finally:
        con.close()


@pytest.mark.slow
def test_an_old_store_numbered_by_the_study_resumes_after_its_highest_number(tmp_path, tiny_model, spawn):
    root = (tmp_path / "old").resolve()
    extract_old_store(root)
    store = root / "store"
    client = store_client(local_uri(store))
    (parent,), before = parent_and_trial_runs(client, "old")
    assert parent.info.status == "RUNNING"
    # What was recorded: trials 0, 1 and 3 finished, 2 and 4 to 23 proposals drawn again, 24 in flight (its trial run
    # left RUNNING with no verdict by the kill); the study numbers its trials with gaps and knows no tuner.number.
    kept = {run.info.run_id: int(run.data.tags[TRIAL_NUMBER_TAG]) for run in before if run.info.status == "FINISHED"}
    assert sorted(kept.values()) == [0, 1, 3]
    (cut_short,) = [run for run in before if run.info.status == "RUNNING"]
    assert cut_short.data.tags[TRIAL_NUMBER_TAG] == "24"
    study = optuna.load_study(study_name=parent.data.tags["tuner.study"], storage=f"sqlite:///{store / 'optuna.db'}")
    (in_flight,) = study.get_trials(states=[optuna.trial.TrialState.RUNNING])
    assert in_flight.number == 24 and in_flight.params
    assert not any(sampling.NUMBER_ATTR in t.user_attrs for t in study.trials)
    asked = int(parent.data.params["trials"])
    assert asked == 6

    code, out = spawn.run(tuner_command("search", "--resume", "old", "--store", str(store)), "resume")

    (after_parent,), trials = parent_and_trial_runs(store_client(local_uri(store)), "old")
    # the same search run went on and finished
    assert after_parent.info.run_id == parent.info.run_id and after_parent.info.status == "FINISHED", out[-4000:]
    assert f"run {parent.info.run_id}" in out, out[-4000:]
    _, search = load_search(local_uri(store), "old")
    assert code == expected_exit_code(search), out[-4000:]
    numbers = {run.info.run_id: int(run.data.tags[TRIAL_NUMBER_TAG]) for run in trials}
    # as many trials as the search asked for, each with a number of its own
    assert len(trials) == asked and len(set(numbers.values())) == asked, sorted(numbers.values())
    # the trials finished before the kill are kept, with their study numbers; the cut-short run is gone
    assert {run_id: numbers.get(run_id) for run_id in kept} == kept
    assert cut_short.info.run_id not in numbers
    # the new trials are numbered after the highest old number (24, the trial in flight), one after another
    new = sorted((numbers[run.info.run_id], run) for run in trials if run.info.run_id not in kept)
    assert [number for number, _ in new] == [25, 26, 27], sorted(numbers.values())
    # the trial in flight ran again, first, with its params
    rerun = new[0][1]
    assert {k: str(v) for k, v in in_flight.params.items()} == {k: rerun.data.params[k] for k in in_flight.params}
    for _, run in new:
        assert run.data.tags["tuner.status"] == "ok", run.data.tags
        assert int(run.data.tags[OPTUNA_NUMBER_TAG]) > 24
    # every point of the six once, and the search's record agrees with its runs
    assert len({(run.data.params["precision"], run.data.params["gradient_accumulation_steps"]) for run in trials}) == 6
    assert sorted(r["number"] for r in search["trials"]) == [0, 1, 3, 25, 26, 27]
    assert {r["run_id"] for r in search["trials"]} == set(numbers)
