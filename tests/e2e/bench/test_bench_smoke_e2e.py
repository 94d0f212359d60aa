"""The benchmark harness (bench/) end to end: one --quick run writes every table (its pure pieces on made-up records
are tests/unit/bench/test_bench_smoke.py)."""

import json

import pytest

from bench.studies.slots import slot_share

# The targets of issue 38: every line met, not met, not resolvable here (noise band) or not built (as in
# tests/unit/bench/test_bench_smoke.py).
VERDICTS = ("**met**", "**not met**", "**not resolvable here** (noise band ", "not built")


def _target_rows(section: str) -> list[str]:
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| target |")]


def _verdict_of(row: str) -> str | None:
    last = row.rstrip(" |").rsplit(" | ", 1)[-1]
    return next((v for v in VERDICTS if last.startswith(v)), None)


# -- the whole harness, on a tiny budget ------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_writes_every_table(tmp_path):
    from bench.headline.run import main

    output = tmp_path / "RESULTS.md"
    assert main(["--quick", "--output", str(output)]) == 0
    text = output.read_text()
    assert text.index("## Targets (issue 38)") < text.index("## Headline")  # the targets come first
    for row in ("| reward | tuner |", "| reward | anchor (Ray Tune + OptunaSearch TPE + ASHA) |",
                "| reward | **tuner / anchor** |", "| all | **tuner / anchor** |",
                "| reward | tpe (tuner's default, staged) |", "| reward | random |", "| reward | **tpe / random** |"):
        assert row in text, row
    targets = text[text.index("## Targets"):text.index("## Headline")]
    assert targets.count("| tuner's success rate >= 9/10") == 1
    # time, speed, steps after divergence, success, warm start, trials to target (reward, 2 lookups), slot
    assert len(_target_rows(targets)) == 8 and all(_verdict_of(row) for row in _target_rows(targets)), targets
    assert "(factored lookup: speed from the speed reference;" in targets and "(nearest-trial lookup;" in targets
    assert "GPU: " in text and "command: `" in text
    raw = json.loads((tmp_path / "results.json").read_text())
    (pair,) = raw["headline"]
    assert pair["order"] == ["anchor", "tuner"] and pair["trainer"] == "reward"
    # the speed reference crossed what it says: one trial per precision this machine runs
    speed = raw["speed_references"]["reward"]
    assert speed["crossed"] == ["precision"]
    assert sorted(r["params"]["precision"] for r in speed["records"]) == sorted({r["params"]["precision"] for r in speed["records"]})
    anchor, tuner = pair["anchor"], pair["tuner"]
    assert len(anchor["records"]) == 2 and len(tuner["records"]) == 2  # the same trial budget (bench.headline.run.QUICK's)
    if anchor["pick"] is not None:  # its pick ran on 2 more seeds, each judged from its own logs
        assert sorted(c["seed"] for c in anchor["confirmations"]) == [1, 2]
        assert pair["verdicts"]["anchor"]["runs"] == 3
    for side in ("tuner", "anchor"):
        v = pair["verdicts"][side]
        assert v["in_hand"] == (v["stable"] and v["fast_enough"])
    share = slot_share(tuner)
    assert 0.0 <= share["share"] <= share["measured_only"] <= 1.0
