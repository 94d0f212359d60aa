"""Longer rungs (tuner.search._extend) in real searches on the tiny model: a search too short to show learning
recommends after a longer rung, and a trial at risk gets its risk rung (the rules are tests/unit/search/test_extend.py)."""

from __future__ import annotations

import pytest
from helpers import CONFIRM_SPACE

from tuner.report.summary import summary_text
from tuner.search import driver as search
from tuner.stores import mlflow_store, run_reader
from tuner.verdicts import recommend


# The reward model at learning rates that learn clearly within 12 steps (helpers.CONFIRM_SPACE); a 4-step
# rung can show no learning at all (the judgement needs tuner.verdicts.learning.MIN_STEPS = 6 values), so only a longer rung
# can recommend.
def longer_space() -> str:
    return CONFIRM_SPACE


def run_in(root, **options) -> tuple[search.SearchOutcome, list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "space.yaml").write_text(longer_space())
    echoed: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        prepared = search.prepare(search.SearchOptions(store=str(root / "mlflow"), search_space="space.yaml",
                                                       experiment="longer", sampler="grid", max_steps=4, seed=0,
                                                       confirm_seeds=1, confirm_top=1, **options))
        return search.run_search(prepared, echo=echoed.append), echoed


@pytest.mark.slow
def test_a_search_too_short_to_show_learning_recommends_after_a_longer_rung(tmp_path, tiny_model):
    outcome, echoed = run_in(tmp_path / "longer")
    assert all(r["status"] == "ok" and not r["learned"] for r in outcome.records)  # 4 steps: no verdict
    extensions = outcome.search["extensions"]
    # the best third of 2 stable trials (1) ran again for 12 steps, and learned there
    assert [(e["extends"], e["max_steps"]) for e in extensions] == [(extensions[0]["number"], 12)]
    assert any("re-running the best 1" in line and "for 12 steps" in line for line in echoed)
    best = outcome.recommended
    assert best is not None and best["max_steps"] == 12 and best["learned"]
    # confirmed at its own length, on another seed
    assert best["confirmation"]["confirmed"] and outcome.search["confirmations"][0]["max_steps"] == 12
    runs = run_reader.trial_runs(mlflow_store.default_tracking_uri(tmp_path / "longer" / "mlflow"), outcome.parent_run_id)
    longer = [r for r in runs if r.data.tags.get("tuner.extension") == "true"]
    assert len(longer) == 1 and longer[0].data.tags["tuner.extends"] == str(best["number"])


# A real trial at risk: a full fine-tune in fp16-pure (its trainable weights float16, tuner.verdicts.forecast's
# fp16_weights rule, a level that needs no trend) at a learning rate it survives for 12 steps on the tiny model
# (ok on seeds 0-2 at 1e-4; 3e-4 diverged on seed 2 and 1e-3 within 5 steps: a 3-10x margin).
FP16_SPACE = """\
trainer: reward
fixed:
  per_device_train_batch_size: 8
  use_peft: false
  max_length: 64
  precision: fp16-pure
params:
  learning_rate: {type: categorical, choices: [1.0e-4]}
"""


@pytest.mark.slow
def test_a_real_trial_at_risk_gets_its_longer_rung_and_the_risk_is_said(tmp_path, tiny_model):
    root = tmp_path / "risk"
    root.mkdir()
    (root / "space.yaml").write_text(FP16_SPACE)
    echoed: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        prepared = search.prepare(search.SearchOptions(store=str(root / "mlflow"), search_space="space.yaml",
                                                       experiment="risk", sampler="grid", max_steps=12, seed=0,
                                                       confirm_seeds=1, confirm_top=1))
        outcome = search.run_search(prepared, echo=echoed.append)
    (first,) = [r for r in outcome.records if r["max_steps"] == 12 and "confirms" not in r]
    assert first["status"] == "ok" and first["risk_signal"] == "fp16_weights"
    assert "trainable weights are float16" in first["risk"]
    # the best trial is at risk: it runs again for 3x its steps (a risk rung, or a learning rung: both are 36)
    rungs = outcome.search["extensions"]
    assert [(e["extends"], e["max_steps"]) for e in rungs][:1] == [(first["number"], 36)]
    best = outcome.recommended
    if rungs[0]["status"] != "ok":  # the risk came true on the longer rung: nothing, and the summary says why
        assert best is None
        assert f"trial {first['number']} was ok but failed on its run of 36 steps" in summary_text(outcome)
    else:  # nothing safe to prefer: if it is recommended at all, its risk is said, not hidden
        assert best is None or (best.get("risk") and "forecast: at risk: " + best["risk"] in recommend.horizon(best))
