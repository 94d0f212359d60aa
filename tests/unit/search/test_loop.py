"""The search loop's pieces on made-up records: the ledger (one entry per run, its kind from its record), how a free
slot is served (ahead phases, the sampler's trials, then the first phase with a job), and how starts compose
(tuner.search.ledger, tuner.search.loop, tuner.search.start). Real searches are tests/e2e/search/."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import optuna

from tuner.config.space import parse_space
from tuner.records import new_record
from tuner.report.progress import Progress
from tuner.search._sampling import Proposer, make_sampler
from tuner.search.ledger import FINISHED, WAIT, Kind, Ledger, kind_of
from tuner.search.loop import Rules, Search
from tuner.search.start import ColdStart, FromConfig, Starts, WarmStart, starts
from tuner.trial import TrialSpec

SPACE = parse_space({"trainer": "sft", "params": {"learning_rate": {"type": "categorical", "choices": [1e-4, 2e-4]}}})
BASE = TrialSpec(trainer="sft", params={}, max_steps=8, seed=0)


def record(number: int, **extra: Any) -> dict[str, Any]:
    return {"number": number, "status": "ok", "params": {"learning_rate": 1e-4}, "seed": 0, "max_steps": 8, **extra}


def test_the_ledger_holds_one_entry_per_run_and_reads_its_kind_from_its_record():
    ledger = Ledger([record(0)])
    ledger.told(record(1, run_id=None))  # the sampler hears first ...
    assert [r["number"] for r in ledger.trials()] == [0, 1] and not ledger.runs[1].recorded
    ledger.add(record(1, run_id="abc"))  # ... then the driver logs the same run: replaced, not added
    assert len(ledger.trials()) == 2 and ledger.trials()[1]["run_id"] == "abc" and ledger.runs[1].recorded
    for extra, kind in [({"confirms": 1}, Kind.CONFIRMATION), ({"extends": 1}, Kind.RUNG), ({"anchors": 1}, Kind.TWIN),
                        ({"remeasures": 1, "pair": 0}, Kind.REMEASURE)]:
        run = ledger.add(record(7 if kind is Kind.TWIN else 1, **extra))
        assert kind_of(run.record) is run.kind is kind and run.of == 1
    assert [r["number"] for r in ledger.contenders()] == [0, 1, 1, 7]  # trials, then the rung and the twin
    assert len(ledger.confirmations()) == len(ledger.remeasures()) == 1


class Toy:
    """A phase that hands out ``jobs`` in turn once every trial has ended, WAIT while asked before."""

    def __init__(self, jobs: list[Any]) -> None:
        self.jobs, self.asked = jobs, []

    @property
    def most_runs(self) -> int:
        return len(self.jobs)

    def next(self, ledger: Ledger, final: bool) -> Any:
        self.asked.append(final)
        return self.jobs.pop(0) if final and self.jobs else None


def search_of(phases: list[Any], ahead: list[Any] = (), planned: int = 2) -> Search:
    study = optuna.create_study(sampler=make_sampler("random", 0, planned), direction="maximize")
    return Search(Proposer(study, SPACE, "random", planned), Ledger(planned=planned), Rules(BASE, 60.0), phases,
                  Progress(planned, lambda line: None), ahead=ahead)


def test_a_free_slot_gets_the_samplers_trials_then_the_first_phase_with_a_job_then_finished():
    waits, toy = Toy([WAIT]), Toy([{"number": 0, "spec": BASE}])
    search = search_of([Toy([]), waits, toy])
    assert search.most_runs == 2 + 1 + 1  # the trials and every phase's most
    trials = [search.suggest(f"t{i}") for i in range(2)]
    assert [job["number"] for job in trials] == [0, 1]
    assert search.suggest("t2") is None  # trials still out: no phase hands out a job before they end
    for i, job in enumerate(trials):
        search.told(f"t{i}", new_record({"status": "ok"}, number=job["number"], params={}, max_steps=8, seed=0))
    assert search.suggest("t3") is None  # the second phase WAITs: the third is not asked
    assert toy.asked == [False]
    assert search.suggest("t4") == {"number": 0, "spec": BASE}  # the waiting phase is done: the next one's job
    assert search.suggest("t5") == FINISHED
    assert search.progress.total == 3  # the toy's job counted in the progress, a WAIT not


def test_an_ahead_phase_goes_before_the_samplers_next_trial():
    search = search_of([], ahead=[SimpleNamespace(most_runs=1, next=lambda ledger, final: {"number": 9})])
    assert search.suggest("t0") == {"number": 9}


def test_starts_compose_with_trial_0_first_and_the_warm_fallback_before_the_speed_pairs():
    source = SimpleNamespace(set_env=lambda: None, path="their.yaml", text="x", notes=[], to_dict=lambda: {})
    warm = SimpleNamespace(picks=[{"learning_rate": 2e-4}], pick_numbers=lambda: range(1, 2), tags=lambda: {"w": "1"},
                           speeds_reused=False, to_tell=lambda: [], line="warm line", notes=[], trials=None)
    first = {"learning_rate": 1e-4}
    start = starts(None, warm=warm, source=source, first=first, origins=["model: m"])
    assert isinstance(start, Starts) and [type(p) for p in start.parts] == [WarmStart, FromConfig]
    assert start.first_points(grid=False) == [first, {"learning_rate": 2e-4}]  # --from's trial 0, then the picks
    assert start.first_points(grid=True) == [first]  # a grid holds the picks already
    assert start.first_alone and start.confirm_ahead == 2 and {0, 1} <= start.keep(12)
    assert start.tags() == {"w": "1"} and start.run_params() == {"search_space": None}
    assert start.opening_lines(SPACE)[0] == "warm line"
    assert isinstance(starts(None), ColdStart) and not starts(None).first_points(grid=False)
