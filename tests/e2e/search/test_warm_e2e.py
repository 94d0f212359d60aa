"""Warm start (tuner.search._warm) in real searches: a second search in the same store finds the first, runs its
recommendation as trial 0 and says so; --warm-start none and another trainer start cold; other data of alike lengths
reuses the speeds; a pick that fails here sends the search back to the default trials; two sizes of one family (the
rules on made-up searches are tests/unit/search/test_warm.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import CONFIRM_SPACE, SFT_SPACE, Finished, mlflow_client, run_search_in, runs_of

from tuner.search import _sampling as sampling
from tuner.search.start import ColdStart, WarmStart
from tuner.stores.tags import (
    DATA_TAG,
    HARDWARE_TAG,
    LENGTHS_TAG,
    STUDY_STORAGE_TAG,
    STUDY_TAG,
    WARM_BUDGET_TAG,
    WARM_FALLBACK_TAG,
    WARM_START_TAG,
)

# -- real searches in one store --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_searches(tmp_path_factory, tiny_model) -> tuple[Finished, Finished]:
    """A search of the reward model, then a second one in the same store and another experiment (3 trials on 2
    slots: one trial left to run when its trial 0 ends)."""
    root = tmp_path_factory.mktemp("warm")
    options = {"trainer": "reward", "trials": 2, "max_steps": 8, "seed": 0, "confirm_seeds": 0}
    first = run_search_in(root, CONFIRM_SPACE, experiment="first", **options)
    second = run_search_in(root, CONFIRM_SPACE, experiment="second", **{**options, "trials": 3, "confirm_seeds": 1})
    return first, second


@pytest.mark.slow
def test_a_second_search_runs_the_first_ones_recommendation_as_trial_0_and_says_so(two_searches):
    first, second = two_searches
    assert isinstance(first.prepared.start, ColdStart)  # an empty store: a cold start, said nothing
    assert not any(line.startswith("warm start") for line in first.echoed)
    best = first.outcome.recommended
    assert best is not None
    run_name = mlflow_client(first).get_run(first.outcome.parent_run_id).info.run_name
    line = next(line for line in second.echoed if line.startswith("warm start from"))
    assert line.startswith(f"warm start from search {run_name} of reward on tiny (cpu; same data): trial 0 = its "
                           "recommendation; 2 earlier trials told to the sampler")
    trial0 = next(r for r in second.outcome.records if r["number"] == 0)
    assert trial0["params"]["learning_rate"] == best["params"]["learning_rate"]
    # it runs to its end here: successive halving never stops the earlier recommendation on a few noisy steps
    assert trial0["status"] != "pruned" and (trial0["status"] != "ok" or trial0["steps_run"] == 8), trial0
    # how it did here is said, whichever way it went
    said = [line for line in second.echoed if line.startswith("warm start: trial 0, the earlier recommendation, ")]
    assert len(said) == 1, (trial0["status"], trial0.get("reason"))
    assert ("runs here" in said[0]) == (trial0["status"] == "ok" and trial0["learned"]), said
    # it is confirmed beside its own trial: its run on seed 1 starts before the search's other trials (3 trials on 2
    # slots; a trial number may be skipped, tuner.search._sampling.ask)
    started = {r.info.run_name: r.info.start_time for r in runs_of(second, "trial")}
    others = [t for name, t in started.items() if name.startswith("trial-") and name != "trial-000"]
    assert len(others) == 2 and started["confirm-000-seed1"] < min(others), (started, second.echoed)
    assert ("confirming trial 0, the earlier recommendation, on 1 more seeds beside it, ahead of the other trials"
            in second.echoed)
    tags = mlflow_client(second).get_run(second.outcome.parent_run_id).data.tags
    # the earlier trials come first in the study, told as priors; this search's trials number from 0 after them
    import optuna

    study = optuna.load_study(study_name=tags[STUDY_TAG], storage=tags[STUDY_STORAGE_TAG])
    assert [sampling.PRIOR_ATTR in t.user_attrs for t in study.trials[:3]] == [True, True, False]
    by_number = {t.user_attrs[sampling.NUMBER_ATTR]: t for t in study.trials[2:] if sampling.NUMBER_ATTR in t.user_attrs}
    assert sorted(by_number) == sorted(record["number"] for record in second.outcome.records)
    for record in second.outcome.records:
        assert by_number[record["number"]].params["learning_rate"] == record["params"]["learning_rate"]
    assert tags[WARM_START_TAG] == first.outcome.parent_run_id
    assert tags[HARDWARE_TAG] == "cpu" and tags[DATA_TAG] == "builtin:reward"
    assert second.outcome.recommended is not None and second.outcome.candidates  # confirmed here, on seed 1


@pytest.mark.slow
@pytest.mark.parametrize("case", ["none", "other-trainer"])
def test_none_and_another_trainer_start_cold(case, two_searches, monkeypatch):
    from tuner.search import driver

    root: Path = two_searches[0].root
    (root / "sft.yaml").write_text(SFT_SPACE)
    monkeypatch.chdir(root)
    if case == "none":
        options = driver.SearchOptions(search_space=str(root / "space.yaml"), warm_start="none")
    else:
        options = driver.SearchOptions(search_space=str(root / "sft.yaml"))
    prepared = driver.prepare(dataclasses.replace(options, store=str(root / "mlflow"), trials=2))
    assert isinstance(prepared.start, ColdStart)


@pytest.mark.slow
def test_other_data_of_alike_lengths_reuses_the_earlier_speeds_and_longer_rows_do_not(two_searches, monkeypatch):
    import json

    from tuner.config.trainers import adapter
    from tuner.inputs import lengths
    from tuner.inputs.data import builtin_dataset
    from tuner.search import _staging, driver

    first, second = two_searches
    root: Path = first.root
    tags = mlflow_client(second).get_run(second.outcome.parent_run_id).data.tags
    assert tags[LENGTHS_TAG] == lengths.data_profile(adapter("reward"), None, second.prepared.model_path) != ""
    rows = builtin_dataset(adapter("reward"), seed=1).to_list()  # other rows of the same task
    longer = [{**row, "chosen": " ".join([row["chosen"]] * 4)} for row in rows]
    monkeypatch.chdir(root)
    for name, data, reused in (("alike.jsonl", rows, True), ("longer.jsonl", longer, False)):
        (root / name).write_text("".join(json.dumps(row) + "\n" for row in data))
        options = driver.SearchOptions(search_space=str(root / "space.yaml"), dataset=str(root / name))
        prepared = driver.prepare(dataclasses.replace(options, store=str(root / "mlflow")))
        built = prepared.start.warm
        assert built and built.picks and built.priors and built.other_data == len(built.priors), name
        if reused:  # every prior ran on rows of these lengths: their speeds are this data's
            assert len(built.measured_here()) == len(built.priors)
            assert built.speeds_reused == _staging.speed_known(built.measured_here())
            assert ("other data, its rows' token lengths alike" in built.line) == built.speeds_reused, built.line
        else:
            assert built.measured_here() == [] and not built.speeds_reused and "speeds reused" not in built.line


FLOAT_SPACE = CONFIRM_SPACE.replace("{type: categorical, choices: [1.0e-3, 2.0e-3]}",
                                    "{type: float, low: 1.0e-3, high: 2.0e-3, log: true}")


@pytest.mark.slow
def test_a_warm_search_that_confirms_nothing_goes_back_to_the_default_trials(two_searches, monkeypatch):
    # every run on the confirmation seed diverges (a real NaN for the guard, TUNER_FAULT): nothing this warm search
    # runs can be confirmed, so once its 3 trials and their confirmations are done it runs the default 4, as a cold
    # search explores, instead of ending with no recommendation
    from tuner.search import _prepare

    first = two_searches[0]
    monkeypatch.setenv("TUNER_FAULT", "nan@2")
    monkeypatch.setenv("TUNER_FAULT_WHEN", "seed=6")
    monkeypatch.setattr(_prepare, "DEFAULT_TRIALS", 4)
    root: Path = first.root
    (root / "float.yaml").write_text(FLOAT_SPACE)
    fourth = run_search_in(root, search_space=str(root / "float.yaml"), experiment="fourth", trainer="reward",
                           max_steps=8, seed=5, confirm_seeds=1, warm_start=first.outcome.parent_run_id)
    assert fourth.prepared.start.warm.trials == (3, 4)
    said = "\n".join(fourth.echoed)
    # the pick may fail on this seed itself (diverged, or stable without learning): then that is said when it ends.
    # Held and learned, it is demoted when its run beside it, on seed 6, ends: the search falls back then, not only
    # once its other trials have ended with nothing confirmed.
    pick = next(r for r in fourth.outcome.records if r["number"] == 0)
    failed = pick["status"] != "ok" or not pick["learned"]
    why = ("the earlier recommendation failed here" if failed else
           "trial 0, the earlier recommendation, held on this search's seed and was demoted on its confirmation seeds "
           "(seed 6: diverged at step")
    assert f"warm start: {why}" in said and "; the search runs the default 4 trials" in said, said
    assert sorted(r["number"] for r in fourth.outcome.records) == [0, 1, 2, 3]
    assert fourth.outcome.recommended is None  # the 4th trial's confirmation fails too
    tags = mlflow_client(fourth).get_run(fourth.outcome.parent_run_id).data.tags
    assert tags[WARM_FALLBACK_TAG] == "4"


@pytest.mark.slow
def test_a_pick_that_diverges_here_sends_the_warm_search_back_to_the_default_trials(two_searches, monkeypatch):
    from tuner.search import _prepare

    first = two_searches[0]
    pick = first.outcome.recommended["params"]["learning_rate"]
    # the earlier recommendation diverges here (its weights poisoned after step 2: a real NaN for the guard)
    monkeypatch.setenv("TUNER_FAULT", "nan@2")
    monkeypatch.setenv("TUNER_FAULT_WHEN", f"learning_rate={pick!r}")
    monkeypatch.setattr(_prepare, "DEFAULT_TRIALS", 4)  # warm: 3 trials (its pick and two more); back to 4
    root: Path = first.root
    (root / "float.yaml").write_text(FLOAT_SPACE)  # the store's own folder: the first search is found there
    third = run_search_in(root, search_space=str(root / "float.yaml"), experiment="third", trainer="reward",
                          max_steps=8, seed=3, confirm_seeds=0, warm_start=first.outcome.parent_run_id)
    assert third.prepared.n_trials == 3 and third.prepared.start.warm.trials == (3, 4)
    said = "\n".join(third.echoed)
    assert "warm start: trial 0, the earlier recommendation, failed here (diverged" in said, said
    assert "warm start: the earlier recommendation failed here; the search runs the default 4 trials" in said, said
    numbers = sorted(r["number"] for r in third.outcome.records)
    assert numbers == [0, 1, 2, 3], numbers  # the trials already run kept, one more run: 4 in all
    client = mlflow_client(third)
    tags = client.get_run(third.outcome.parent_run_id).data.tags
    assert tags[WARM_FALLBACK_TAG] == "4" and tags[WARM_BUDGET_TAG] == "3/4"  # --resume goes on with 4
    # A driver that died before its pick ended (no fallback tag yet; the run left RUNNING): the resumed search cuts
    # the default again from the same searches, so that a pick failing after the resume still falls back.
    from tuner.search import _resume

    run_id = third.outcome.parent_run_id
    client.update_run(run_id, status="RUNNING")
    resumed, _ = _resume.resume_options(dataclasses.replace(third.prepared.options, resume="third"))
    assert resumed.trials == 4  # after the fallback: its default
    client.delete_tag(run_id, WARM_FALLBACK_TAG)
    with monkeypatch.context() as mp:
        mp.chdir(root)
        again = _prepare.prepare_resume(dataclasses.replace(third.prepared.options, resume="third"))
    assert again.options.trials is None and again.options.warm_start == first.outcome.parent_run_id
    assert again.n_trials == 3 and again.start.warm.trials == (3, 4), (again.n_trials, again.start.warm.trials)


@pytest.mark.slow
def test_two_real_searches_on_two_sizes_of_one_family(tmp_path, tiny_model):
    """Two folders named as a hub names sizes (the tiny model in each: the rule reads the family and size from the
    name), a real search on each in one store: the second, with nothing of its own model, starts from the first's
    recommendation as trial 0, tells the sampler nothing, keeps its budget, and says whose family it is."""
    import shutil

    models = {size: tmp_path / "models" / f"TinyQwen-{size}" for size in ("1M", "3M")}
    for folder in models.values():
        shutil.copytree(tiny_model, folder)
    options = {"trainer": "reward", "trials": 2, "max_steps": 8, "seed": 0, "confirm_seeds": 0}
    small = run_search_in(tmp_path, CONFIRM_SPACE, experiment="small", model=str(models["1M"]), **options)
    large = run_search_in(tmp_path, CONFIRM_SPACE, experiment="large", model=str(models["3M"]), **options)
    best = small.outcome.recommended
    assert best is not None, small.echoed
    assert isinstance(large.prepared.start, WarmStart) and large.prepared.start.warm.picks, large.echoed
    line = next(line for line in large.echoed if line.startswith("warm start from"))
    assert "TinyQwen-1M (another size of TinyQwen-3M's family)" in line, line
    assert "their outcomes not told to the sampler (another model size)" in line, line
    assert large.prepared.start.warm.priors == [] and large.prepared.n_trials == 2
    trial0 = next(r for r in large.outcome.records if r["number"] == 0)
    assert trial0["params"]["learning_rate"] == best["params"]["learning_rate"]  # as it is (same ranges every size)
    # a search on the smaller size again finds its own model's search first, not the other size's: what the search
    # prepares (its warm start's line, which the search echoes as it starts: the large one's above), not run again
    from tuner.search import driver

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        again = driver.prepare(driver.SearchOptions(
            store=str(tmp_path / "mlflow"), search_space=str(tmp_path / "space.yaml"), experiment="small-again",
            model=str(models["1M"]), **{**options, "trials": 1}))
    line = again.start.warm.line
    assert line.startswith("warm start from") and "another size" not in line and "TinyQwen-1M" in line, line
