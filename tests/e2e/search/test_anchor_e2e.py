"""The anchored twin (tuner.search._anchor) in a real GRPO search on the tiny model: its fading best is run again with
the KL penalty on, and the recommendation follows the rule (the rules themselves are tests/unit/search/test_anchor.py)."""

from __future__ import annotations

import pytest

from tuner.stores.tags import ANCHORED_TAG, ANCHORS_TAG
from tuner.verdicts import recommend

# A real search on the tiny model whose one GRPO trial (beta 0) is at risk by reward_spread: a reward of the user's
# (a real GRPO reward function, as --reward-funcs takes one) whose groups lose their spread a quarter at a time (a
# quarter of the groups every 10 calls, never all of them) while the reward, after a jump at call 6, holds below its
# best. Every trial process counts its own calls, so the twin meets the same rewards.
FADING_REWARD = """\
CALLS = [0]


def fading(prompts=None, completions=None, **kwargs):
    call = CALLS[0]
    CALLS[0] += 1
    groups = len(completions) // 4
    level = 0.2 if call < 6 else (0.7 if call % 7 == 0 else 0.55)
    without_spread = min(groups - 1, groups * call // 40)
    rewards = []
    for group in range(groups):
        rewards += [level] * 4 if group < without_spread else [level - 0.2, level + 0.2] * 2
    return rewards
"""
FADING_SPACE = """\
trainer: grpo
fixed:
  max_completion_length: 8
  num_generations: 4
  per_device_train_batch_size: 16
  gradient_accumulation_steps: 1
  precision: fp32
  learning_rate: 1.0e-3
  use_peft: false
params:
  beta: {type: categorical, choices: [0.0, 0.04]}
"""


@pytest.mark.slow
def test_a_real_grpo_search_runs_the_anchored_twin_of_its_fading_best_and_recommends_by_the_rule(tmp_path, tiny_model):
    from tuner.search import driver as search
    from tuner.stores import mlflow_store
    from tuner.stores.run_reader import trial_runs

    root = tmp_path / "anchor"
    root.mkdir()
    (root / "space.yaml").write_text(FADING_SPACE)
    (root / "fading.py").write_text(FADING_REWARD)
    echoed: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.syspath_prepend(str(root))
        prepared = search.prepare(search.SearchOptions(
            store=str(root / "mlflow"), search_space="space.yaml", experiment="anchor", sampler="grid", trials=1,
            max_steps=30, seed=0, confirm_seeds=1, confirm_top=2, budget=0, reward_funcs=["fading:fading"]))
        outcome = search.run_search(prepared, echo=echoed.append)
    (first,) = outcome.records
    assert first["params"]["beta"] == 0.0, "the grid's first point: the test needs beta 0 first"
    assert first["status"] == "ok" and first["learned"] and first["risk_signal"] == "reward_spread"
    (twin,) = [r for r in outcome.search["extensions"] if "anchors" in r]
    assert twin["anchors"] == first["number"] and twin["number"] not in (r["number"] for r in outcome.records)
    assert twin["params"] == {**first["params"], "beta": 0.04}
    assert (twin["seed"], twin["max_steps"]) == (first["seed"], first["max_steps"])
    assert twin["status"] == "ok" and not twin["risk"]  # the same fading, with the KL penalty on: no such risk
    assert any(f"trying its config with the KL penalty on (beta 0.04) as trial {twin['number']}" in line
               for line in echoed)
    # the recommendation is the rule's: the first of the ranking that its confirmation kept
    order = [r["number"] for r in recommend.ranked([*outcome.records, twin])]
    confirmed = [c["number"] for c in outcome.search["candidates"] if c["confirmed"]]
    assert outcome.recommended is not None and outcome.recommended["number"] == next(
        n for n in order if n in confirmed)
    # its MLflow run says what it is; a --resume would run it again after the search's own trials
    runs = trial_runs(mlflow_store.default_tracking_uri(root / "mlflow"), outcome.parent_run_id)
    tagged = [r for r in runs if r.data.tags.get(ANCHORED_TAG) == "true"]
    assert [r.data.tags.get(ANCHORS_TAG) for r in tagged] == [str(first["number"])]
