"""bench/horizon/horizon_picks.py's pure parts: a search's pick read from its search.json, the seeds it is run on, a pick's
outcome, the bound on the failure share, and its RESULTS subsection kept when bench/horizon/horizon.py writes its section."""

import pytest

from bench.common.results import replace_section
from bench.horizon.horizon_picks import (
    Pick,
    pick_of,
    pick_outcome,
    pooled_recordings,
    replace_subsection,
    summarize,
    upper_bound,
)


def _record(number, seed, **extra):
    return {"number": number, "seed": seed, "params": {"learning_rate": 1e-3, "precision": "fp32"},
            "max_steps": 20, "steps_run": 20, "status": "ok", **extra}


def _search(recommended):
    return {"trainer": "sft", "recommended": recommended,
            "trials": [_record(n, 0) for n in range(3)],
            "confirmations": [_record(1, 1, confirms=1), _record(1, 2, confirms=1)], "extensions": []}


def test_a_pick_is_the_recommended_record_and_its_fresh_seeds_follow_every_seed_the_search_used():
    best = _record(1, 0, confirmation={"seeds": [0, 1, 2]}, risk="", progress=0.3, tokens_per_second=900.0)
    pick = pick_of(_search(best))
    assert pick == Pick(trial=1, params=best["params"], steps=20, search_seeds=[0, 1, 2], risk="", progress=0.3,
                        tokens_per_second=900.0)
    # the search trained on 0 (its trials) and confirmed on 1 and 2: the pick runs on 3 and 4
    assert pick.fresh_seeds() == [3, 4]


def test_a_pick_from_a_longer_rung_keeps_that_rung_s_length():
    best = _record(4, 5, max_steps=60, steps_run=60, extends=4)
    search = {**_search(best), "extensions": [best]}
    assert pick_of(search).steps == 60
    assert pick_of(search).fresh_seeds(1) == [6]  # seed 5 (the rung, and the search's seed) is the last used


def test_a_search_that_recommended_nothing_has_no_pick():
    assert pick_of(_search(None)) is None


def _row(trainer, outcomes):
    return {"trainer": trainer, "search_seed": 0, "pick": None if outcomes is None else {"trial": 1, "risk": ""},
            "runs": [{"seed": 3 + i, "short": {"status": "ok"},
                      "long": {"status": "ok" if o == "held" else "diverged", "stopped_at_step": 40, "steps_run": 40},
                      "outcome": o} for i, o in enumerate(outcomes or [])]}


def test_a_pick_fails_when_a_long_run_on_either_seed_failed():
    assert pick_outcome(_row("sft", ["held", "failed late"])) == "failed late"
    assert pick_outcome(_row("sft", ["held", "held"])) == "held"
    assert pick_outcome(_row("sft", None)) is None
    summary = summarize([_row("sft", ["held", "failed late"]), _row("sft", ["held", "held"]), _row("dpo", None)])
    assert summary["all"]["searches"] == 3 and summary["all"]["picks"] == 2 and summary["all"]["failed"] == 1
    assert summary["all"]["how"]["failed late"] == 1 and summary["all"]["failed_at_steps"] == [40]
    assert summary["dpo"]["picks"] == 0 and summary["dpo"]["share"] is None


def test_the_upper_bound_is_clopper_pearson():
    # 0 failures of 20: 1 - 0.05 ** (1 / 20), the "rule of three" region
    assert upper_bound(0, 20) == pytest.approx(1 - 0.05 ** (1 / 20))
    assert upper_bound(1, 20) == pytest.approx(0.2161, abs=1e-4)
    assert upper_bound(0, 0) is None


def test_the_subsection_is_replaced_in_place_and_survives_its_section_being_written_again(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# R\n\n## A\n\nold a\n\n## B\n\nb\n")
    replace_subsection(path, "## A", "### picks", ["first"])
    replace_subsection(path, "## A", "### picks", ["second"])
    assert path.read_text() == "# R\n\n## A\n\nold a\n\n### picks\n\nsecond\n\n## B\n\nb\n"
    # bench/horizon/horizon.py writes its section again: the subsection another run wrote stays at its end
    replace_section(path, "## A", ["new a"])
    assert path.read_text() == "# R\n\n## A\n\nnew a\n\n### picks\n\nsecond\n\n## B\n\nb\n"


def test_recordings_pooled_hold_each_search_once_the_newest_and_every_invocation():
    def recording(model, searches, command):
        return {"model": model, "factor": 25, "fresh_seeds_per_pick": 2, "invocations": [{"command": command}],
                "searches": [{"trainer": t, "search_seed": s, "pick": None, "from": command} for t, s in searches]}

    old = recording("tiny-pretrained", [("grpo", 0), ("dpo", 0), ("grpo", 1)], "before")
    new = recording("tiny-pretrained", [("grpo", 1), ("sft", 2)], "after")
    data = pooled_recordings([old, new])
    assert [c["command"] for c in data["invocations"]] == ["before", "after"]
    assert [(r["trainer"], r["search_seed"], r["from"]) for r in data["searches"]] == [
        ("grpo", 0, "before"), ("grpo", 1, "after"), ("dpo", 0, "before"), ("sft", 2, "after")]
    with pytest.raises(SystemExit, match="cannot be pooled"):
        pooled_recordings([old, recording("tiny", [("dpo", 3)], "elsewhere")])
