"""The anchored twin (tuner.search._anchor): a GRPO best whose reward spread fades with beta 0 is tried again with the
KL penalty on, as a trial of its own, and goes first only by the recommendation's own rule. A real GRPO search that
runs the twin is tests/e2e/search/test_anchor_e2e.py."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from tuner.config.space import load_space, parse_space
from tuner.search._anchor import Anchor, anchored_beta
from tuner.search._sampling import Proposer
from tuner.search.ledger import WAIT, Ledger
from tuner.stores.tags import ANCHORED_TAG, ANCHORS_TAG
from tuner.trial import TrialSpec
from tuner.verdicts import recommend

SPACE = load_space(None, "grpo").for_model(pretrained=True)
BASE = TrialSpec(trainer="grpo", params={}, max_steps=20, seed=0)
FADING = ("groups without reward spread rose from 0.24 to 0.85 over 180 steps while the reward held: at this rate "
          "no group has any near step 225, and GRPO stops learning (collapse)")


def record(number: int, *, beta: float = 0.0, steps: int = 180, speed: float = 6000.0, progress: float = 0.2,
           risk: str = "", signal: str | None = None, **extra) -> dict[str, Any]:
    return {"number": number, "status": "ok", "max_steps": steps, "seed": 0, "learned": True, "progress": progress,
            "tokens_per_second": speed, "risk": risk, "risk_signal": signal,
            "params": {"precision": "fp32", "learning_rate": 4e-5 + number * 1e-6, "beta": beta, "loss_type": "dapo"},
            **extra}


@pytest.fixture
def proposer():
    study = optuna.create_study(direction="maximize")
    for _ in range(3):  # three search trials asked before: the twin's number comes after them
        study.tell(study.ask(), 1.0)
    return Proposer(study, SPACE, "random", 3)


def test_a_fading_best_with_beta_0_gets_its_twin_with_the_kl_penalty_on_as_a_trial_of_its_own(proposer):
    said: list[str] = []
    anchor = Anchor(SPACE, proposer.reserve, BASE, timeout=100, announce=said.append)
    best = record(1, risk=FADING, signal="reward_spread", schedule_steps=4500, extends=1)
    runs = [record(0, progress=0.05), best]
    job = anchor.next(Ledger(runs), final=True)
    assert job["spec"]["params"] == {**best["params"], "beta": 0.04}  # nothing else changed
    assert (job["spec"]["seed"], job["spec"]["max_steps"], job["spec"]["schedule_steps"]) == (0, 180, 4500)
    assert job["number"] == 3 and job["keep"] and job["extra"] == {"anchors": 1, "schedule_steps": 4500}
    assert job["tags"][ANCHORED_TAG] == "true" and job["tags"][ANCHORS_TAG] == "1"
    assert job["timeout"] == pytest.approx(100 * 180 / 20)
    # its number is the study's, told FAIL at once: the sampler passes it by and no later trial takes it
    reserved = proposer.study.trials[3]
    assert reserved.state == optuna.trial.TrialState.FAIL and "anchored twin of trial 1" in reserved.user_attrs[
        "tuner.skipped"]
    assert proposer.number(proposer.study.ask()) == 4
    assert said and "trial 1 is the best so far but groups without reward spread" in said[0] and "beta 0.04" in said[0]
    # while it runs nothing else is handed out for it; once it is recorded, nothing more: one twin per search
    assert anchor.next(Ledger(runs), final=True) == WAIT
    twin = record(3, beta=0.04, anchors=1)
    assert anchor.next(Ledger([*runs, twin]), final=True) is None


@pytest.mark.parametrize("case", ["no risk", "another risk", "already anchored", "not grpo", "beta fixed",
                                  "twin already run", "nothing learned"])
def test_no_twin_where_the_kl_penalty_is_not_the_question(proposer, case):
    space = SPACE
    runs = [record(1, risk=FADING, signal="reward_spread")]
    if case == "no risk":
        runs = [record(1)]
    elif case == "another risk":
        runs = [record(1, risk="activations in decoder layer 1 reached 37% of float16's range", signal="headroom")]
    elif case == "already anchored":
        runs = [record(1, beta=0.04, risk=FADING, signal="reward_spread")]
    elif case == "not grpo":
        space = load_space(None, "dpo")
    elif case == "beta fixed":  # the user's beta is theirs
        space = parse_space({"trainer": "grpo", "params": {"learning_rate": {"type": "float", "low": 1e-6,
                                                                             "high": 1e-4, "log": True}},
                             "fixed": {"beta": 0.0}})
    elif case == "twin already run":
        runs = [*runs, {**record(2), "params": {**runs[0]["params"], "beta": 0.04}}]
    elif case == "nothing learned":
        runs = [{**runs[0], "learned": False}]
    anchor = Anchor(space, proposer.reserve, BASE, timeout=100, announce=lambda line: None)
    assert anchor.next(Ledger(runs), final=True) is None
    assert len(proposer.study.trials) == 3  # no number reserved


def test_the_twin_beta_is_the_spaces_smallest_positive_one():
    def space(beta: dict) -> Any:
        return parse_space({"trainer": "grpo", "params": {"beta": beta}})

    assert anchored_beta(SPACE) == 0.04
    assert anchored_beta(space({"type": "categorical", "choices": [0.0, 0.1, 0.01]})) == 0.01
    assert anchored_beta(space({"type": "categorical", "choices": [0.0]})) is None
    assert anchored_beta(space({"type": "float", "low": 0.0, "high": 0.02})) == 0.02
    assert anchored_beta(space({"type": "float", "low": 0.1, "high": 0.5})) == 0.1


def test_the_twin_goes_first_only_learning_at_least_the_safe_share_as_fast():
    best = record(1, risk=FADING, signal="reward_spread")
    near = record(3, beta=0.04, progress=0.2 * 0.95, anchors=1)
    slow = record(3, beta=0.04, progress=0.2 * 0.8, anchors=1)
    assert recommend.recommend([best, near])["number"] == 3
    assert recommend.recommend([best, slow])["number"] == 1  # recommended with its risk said, as before


def test_a_risk_seen_only_on_confirmation_seeds_ranks_the_config_at_risk_and_calls_for_its_twin(proposer):
    # Seen on the tiny pretrained model (default GRPO search, seed 1): trial 5's 60-step rung showed no risk on seed 1,
    # and the reward-spread risk on both confirmation seeds; it was recommended at risk without its twin being tried.
    from tuner.search._confirm import candidates, with_seen_risk

    rung = record(5, steps=60, extends=5)
    safe = record(7, steps=60, progress=0.2 * 0.95, extends=7)
    confirmations = [record(5, steps=60, confirms=5, seed=s, risk=FADING, signal="reward_spread") for s in (2, 3)]
    assert [c["number"] for c in candidates([rung, safe], 2)] == [5, 7]  # by its own run alone: no risk, first
    assert [c["number"] for c in candidates([rung, safe], 2, confirmations)] == [7, 5]  # at risk on its seeds
    # another length of the same trial is another run: its confirmations do not count for it
    assert not with_seen_risk([record(5, steps=20)], confirmations)[0]["risk"]
    job = Anchor(SPACE, proposer.reserve, BASE, timeout=100, announce=lambda line: None).next(
        Ledger([rung, *confirmations]), final=True)  # the risk its confirmation seeds showed, read from the ledger
    assert job["extra"]["anchors"] == 5 and job["spec"]["params"]["beta"] == 0.04 and job["spec"]["max_steps"] == 60


def test_a_failure_projected_early_in_the_run_weighs_the_trial_down_by_the_share_it_is_expected_to_learn_for():
    # the pretrained GRPO search seed 1: trial 5 (60 steps, beta 0) projected to lose its spread near step 103 of the
    # 1,500-step run its forecast looked to; its twin paid ~20% of tokens/s for the reference model
    early = record(5, steps=60, risk=FADING, signal="reward_spread", risk_step=103, speed=9148, progress=0.293)
    twin = record(12, steps=60, beta=0.04, speed=7576 * 0.95, progress=0.293, anchors=5)
    assert recommend.risk_weight(early) == pytest.approx(2 * 103 / 1500)
    assert recommend.recommend([early, twin])["number"] == 12
    # projected late, or a level with no step: the 0.9 of before
    late = {**early, "risk_step": 1400}
    level = {**early, "risk_step": None}
    assert recommend.risk_weight(late) == recommend.risk_weight(level) == recommend.SAFE_SHARE
    assert recommend.recommend([late, twin])["number"] == 5  # 0.79x as fast: below the 0.9 a late risk asks
    # a risk rung's run is the one its forecast looked to: its schedule's length
    rung = {**early, "max_steps": 180, "schedule_steps": 500, "risk_step": 200}
    assert recommend.risk_weight(rung) == pytest.approx(0.8)
    assert recommend.risk_weight(twin) == 1.0
