"""Longer rungs (tuner.search._extend): when no stable trial learned within --max-steps, the best third of them run again
with 3x the steps, within the step budget; then confirmation at that length. The rules, on made-up records; real
searches that take a longer rung are tests/e2e/search/test_extend_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.search import _extend as extend
from tuner.search import driver as search
from tuner.search._extend import Extension
from tuner.search.ledger import WAIT, Ledger
from tuner.trial import TrialSpec

BASE = TrialSpec(trainer="reward", params={}, max_steps=20, seed=0)


def record(number: int, *, steps: int = 20, status: str = "ok", progress: float = 0.0, learned: bool = False,
           speed: float = 1000.0, **extra) -> dict[str, Any]:
    return {"number": number, "status": status, "max_steps": steps, "seed": 0, "params": {"learning_rate": number},
            "progress": progress, "learned": learned, "tokens_per_second": speed, **extra}


def test_the_best_third_of_stable_trials_get_3x_the_steps_and_the_next_rung_waits_for_them():
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lambda line: None)
    records = [record(n, progress=0.001 * n) for n in range(6)] + [record(9, status="diverged", progress=1.0)]
    jobs = [plan.next(Ledger(records), final=True), plan.next(Ledger(records), final=True)]
    # the two (6 / 3) with the highest learning speed so far, at 60 steps; the diverged trial never
    assert [(j["number"], j["spec"]["max_steps"]) for j in jobs] == [(5, 60), (4, 60)]
    assert jobs[0]["spec"]["params"] == {"learning_rate": 5} and jobs[0]["timeout"] == pytest.approx(300)
    assert plan.next(Ledger(records), final=True) == WAIT  # its runs are out: the next rung depends on them
    done = [record(5, steps=60, progress=0.002, extends=5), record(4, steps=60, progress=0.003, extends=4)]
    job = plan.next(Ledger([*records, *done]), final=True)
    assert (job["number"], job["spec"]["max_steps"]) == (4, 180)  # best third of the 60-step runs: 1


def test_the_strongest_evidence_of_learning_goes_first_not_the_luckiest_start():
    # Seen on the tiny pretrained model at 20 steps: a trial at lr 1e-6 with a lucky 2-step start had the highest
    # learning speed so far (+0.26, p 0.2); those at 3e-5, which learn within 60 steps, had less (p ~0.03).
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lambda line: None)
    records = [record(0, progress=0.26, progress_p_value=0.2, speed=6000),
               record(1, progress=0.2, progress_p_value=0.03, speed=9000),
               record(2, progress=0.1, progress_p_value=0.04, speed=9000),
               *[record(n, progress=0.01 * n, progress_p_value=0.5, speed=9000) for n in range(3, 6)]]
    jobs = [plan.next(Ledger(records), final=True), plan.next(Ledger(records), final=True)]
    assert [j["number"] for j in jobs] == [1, 2]
    # without a p-value (too few steps to judge), a trial comes after those with one
    assert extend.closest_to_learning(record(7, progress=1.0)) > extend.closest_to_learning(records[3])


def test_a_pretrained_model_is_not_halved_inside_its_first_rung_unless_asked():
    from tuner.config.options import SearchOptions

    assert search.halves(SearchOptions()) and not search.halves(SearchOptions(sampler="grid"))
    assert not search.halves(SearchOptions(model="tiny-pretrained"))
    assert not search.halves(SearchOptions(model="Qwen2.5-0.5B"))
    assert search.halves(SearchOptions(model="tiny-pretrained", prune=True))
    assert not search.halves(SearchOptions(prune=False))
    # the slow-trial stop stays on for a pretrained model
    assert search.prunes(SearchOptions(model="tiny-pretrained"))


def test_a_rung_is_run_in_full_before_the_next_is_chosen_even_when_one_of_its_runs_ends_first():
    # Seen on the pretrained model: 3 trials announced for 60 steps, 2 slots; the first 60-step run ended before the
    # third was handed out, and the rung above was then chosen from that one run alone: the third never ran.
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lambda line: None)
    records = [record(n, progress=0.001 * n) for n in range(7)]  # 7 stable: the best 3 at 60 steps
    first, second = plan.next(Ledger(records), final=True), plan.next(Ledger(records), final=True)
    done = [record(first["number"], steps=60, progress=0.01, extends=first["number"])]
    third = plan.next(Ledger([*records, *done]), final=True)
    assert [(j["number"], j["spec"]["max_steps"]) for j in (first, second, third)] == [(6, 60), (5, 60), (4, 60)]
    assert plan.next(Ledger([*records, *done]), final=True) == WAIT  # two of the rung still out
    done += [record(n, steps=60, progress=0.001 * n, extends=n) for n in (5, 4)]
    job = plan.next(Ledger([*records, *done]), final=True)
    assert (job["number"], job["spec"]["max_steps"]) == (6, 180)  # from all three: the best one


def test_nothing_is_extended_once_a_trial_learned_or_the_budget_is_spent():
    plan = Extension(BASE, budget_steps=100, timeout=100, announce=lambda line: None)
    learned = [record(0, progress=0.3, learned=True), record(1)]
    assert plan.next(Ledger(learned), final=True) is None  # confirmation's turn
    records = [record(n) for n in range(6)]
    job = plan.next(Ledger(records), final=True)
    assert job["spec"]["max_steps"] == 60
    # a second 60-step run would spend 120 > 100: wait for the one out there, then nothing more
    assert plan.next(Ledger(records), final=True) == WAIT
    assert plan.next(Ledger([*records, record(job["number"], steps=60, extends=job["number"])]), final=True) is None
    assert Extension(BASE, budget_steps=0, timeout=1).next(Ledger(records), final=True) is None  # --budget 0: off


def test_default_budget_fits_two_rungs_of_the_default_search():
    budget = extend.default_budget(12, 20)
    assert budget >= 4 * 60 + 2 * 180  # the best 4 of 12 at 60 steps, then the best 2 of those at 180


# -- a best trial the forecast puts at risk (tuner.verdicts.forecast) ----------------------------------

RISK = "at risk: activations in decoder layer 1 at 0.4% of float16's range, growing 28% a step: overflow expected near step 62"


def test_a_config_at_risk_is_not_recommended_over_a_safe_one_that_learns_nine_tenths_as_fast():
    from tuner.verdicts import recommend as rec

    risky = record(1, progress=0.10, learned=True, risk=RISK)
    close = record(2, progress=0.095, learned=True)  # 0.95x as fast, no risk
    slow = record(3, progress=0.05, learned=True)  # half as fast, no risk
    assert rec.recommend([risky, close, slow])["number"] == 2
    assert rec.recommend([risky, slow])["number"] == 1  # nothing safe comes close: the risk is said, not hidden
    assert [t["number"] for t in rec.ranked([slow, risky, close])] == [2, 1, 3]


def test_the_best_trial_at_risk_gets_a_longer_rung_and_its_verdict_decides():
    from tuner.verdicts import recommend as rec

    lines = []
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lines.append)
    records = [record(1, progress=0.10, learned=True, risk=RISK), record(2, progress=0.05, learned=True)]
    job = plan.next(Ledger(records), final=True)
    # 3x its steps (no step projected here), of the 500-step run's schedule (25x its 20) that its forecast looked to
    assert (job["number"], job["spec"]["max_steps"], job["spec"]["schedule_steps"]) == (1, 60, 500)
    assert job["extra"] == {"extends": 1, "schedule_steps": 500}
    assert "trial 1 is the best so far but at risk: activations" in lines[0]
    assert plan.next(Ledger(records), final=True) == WAIT  # confirmation waits for the longer rung's verdict
    # the risk came true at step 62: trial 1 is out, its rung too, and confirmation goes on with trial 2
    failed = [record(1, steps=60, status="diverged", extends=1)]
    assert plan.next(Ledger([*records, *failed]), final=True) is None
    assert rec.recommend([*records, *failed])["number"] == 2
    # or the longer rung held without risk: that run, with 3x the evidence, is the best
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lines.append)
    plan.next(Ledger(records), final=True)
    held = [record(1, steps=60, progress=0.10, learned=True, extends=1)]
    assert plan.next(Ledger([*records, *held]), final=True) is None
    best = rec.recommend([*records, *held])
    assert (best["number"], best["max_steps"], best.get("risk")) == (1, 60, None)


def test_a_risk_rung_runs_past_the_projected_failure_within_the_run_it_looked_to():
    # overflow projected near step 62: the rung runs to twice that, the first 124 steps of the 500-step run
    assert extend.risk_rung_steps(record(1, risk=RISK, risk_step=62)) == (124, 500)
    assert extend.risk_rung_steps(record(1, risk=RISK, risk_step=12)) == (60, 500)  # never under 3x its steps
    assert extend.risk_rung_steps(record(1, risk=RISK, risk_step=400)) == (500, 500)  # at most the whole run
    # a rung that is still at risk: its own schedule's run again, not 25x the rung
    assert extend.risk_rung_steps(record(1, steps=124, risk=RISK, risk_step=300, schedule_steps=500)) == (500, 500)
    lines = []
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lines.append)
    job = plan.next(Ledger([record(1, progress=0.1, learned=True, risk=RISK, risk_step=62)]), final=True)
    assert (job["spec"]["max_steps"], job["spec"]["schedule_steps"], job["timeout"]) == (124, 500, pytest.approx(620))
    assert "re-running it for 124 steps of a 500-step run's schedule" in lines[0]
    # nothing longer to run: a rung already as long as the run it looked to
    whole = record(1, steps=500, progress=0.1, learned=True, risk=RISK, risk_step=450, schedule_steps=500)
    assert Extension(BASE, budget_steps=10_000, timeout=1, announce=lines.append).next(Ledger([whole]), final=True) is None


def test_no_risk_rung_when_the_budget_is_spent_or_the_best_is_safe():
    records = [record(1, progress=0.10, learned=True, risk=RISK)]
    assert Extension(BASE, budget_steps=50, timeout=1, announce=lambda line: None).next(Ledger(records), final=True) is None
    safe = [record(1, progress=0.10, learned=True)]
    assert Extension(BASE, budget_steps=1000, timeout=1, announce=lambda line: None).next(Ledger(safe), final=True) is None


def test_a_rung_that_runs_alone_is_confirmed_beside_itself_and_those_runs_count_only_at_its_length():
    from tuner.search import _confirm as confirm

    said: list[str] = []
    schedule = confirm.Schedule(BASE, seeds=2, top=2, timeout=100, announce=said.append)
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=said.append, beside=schedule)
    records = [record(n, progress=0.001 * n, progress_p_value=0.5) for n in range(3)]
    assert plan.most_runs == 16 * 3  # each rung's run with its 2 confirmation seeds
    rung = plan.next(Ledger(records), final=True)
    assert (rung["number"], rung["spec"]["max_steps"], rung["extra"]) == (2, 60, {"extends": 2})  # 3 / 3: alone
    # the other slots, which would idle while it runs: its confirmation runs at its length, then nothing more
    beside = [plan.next(Ledger(records), final=True) for _ in range(3)]
    assert [(j["number"], j["spec"]["seed"], j["spec"]["max_steps"], j["extra"]) for j in beside[:2]] == [
        (2, 1, 60, {"confirms": 2}), (2, 2, 60, {"confirms": 2})]
    assert beside[2] == WAIT
    assert said[-1] == "trial 2's 60-step run leaves a slot free: confirming it on 2 more seeds beside it (they count if it learns)"
    # it learned at 60 steps, and so did its seeds: confirmed with the runs it already had, none handed out again
    learned = dict(progress=0.3, progress_p_value=1e-4, learned=True)
    longer = record(2, steps=60, extends=2, **learned)
    seeds = [record(2, steps=60, confirms=2, **{**learned, "seed": s}) for s in (1, 2)]
    ledger = Ledger([*records, longer, *seeds])
    assert plan.next(ledger, final=True) is None  # a trial learned: no more rungs (it has no risk)
    assert schedule.next(ledger, final=True) is None  # its runs are in: confirmed, nothing more to run
    best, (verdict,) = confirm.judge(confirm.candidates(ledger.contenders(), 2, ledger.confirmations()),
                                     ledger.confirmations())
    assert best["max_steps"] == 60 and verdict.confirmed and verdict.seeds == [0, 1, 2]
    # Runs of a trial at another length are not its confirmation: its 20-step seeds do not confirm its 60-step rung
    assert not confirm.confirms(record(2, steps=20, confirms=2), longer) and confirm.confirms(seeds[0], longer)


def test_without_a_schedule_beside_it_a_lone_rung_leaves_the_slots_to_wait():
    plan = Extension(BASE, budget_steps=1000, timeout=100, announce=lambda line: None)
    records = [record(n, progress=0.001 * n, progress_p_value=0.5) for n in range(3)]
    assert plan.next(Ledger(records), final=True)["extra"] == {"extends": 2}
    assert plan.next(Ledger(records), final=True) == WAIT
