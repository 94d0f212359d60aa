"""The learning judgement's error rates, measured on recorded real trials
(tests/data/verdicts/calibration/histories.json, written by `python -m tests.data.verdicts.calibration.record`: the
embedded tiny model, every trainer, 20 steps, 40 seeds per kind; the record module's docstring says how each kind is
made and which trainers have no ``regresses``).

- ``cannot_learn`` (learning rate 1e-7) is judged learned in at most 5% of seeds.
- ``fast_solver`` (the metric at its ceiling/floor within the first steps) and ``slow_learner`` (a steady,
  modest improvement all along) are judged learned in at least 95% of seeds.
- ``regresses`` (learns, then falls back to about its start) is rarely judged learned (bound below).
- GRPO: of a fast solver and a slow learner of the same seed and system config, the one that reached the reward
  ceiling first ranks first; every trial whose reward reaches 1.0 and stays there is judged learned.

`pytest -s tests/unit/verdicts/test_learning_calibration.py` prints every rate and the table in docs/how-a-search-works.md.
"""

import functools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import DATA

from tuner.config.trainers import adapter
from tuner.verdicts.learning import judge_learning
from tuner.verdicts.recommend import recommend

RECORDED = json.loads((DATA / "verdicts" / "calibration" / "histories.json").read_text())
TRIALS = RECORDED["trials"]
TRAINERS = sorted({t["trainer"] for t in TRIALS})
KINDS = ("cannot_learn", "fast_solver", "slow_learner", "regresses")
LEARNING_KINDS = ("fast_solver", "slow_learner")
CEILING = 1.0  # the tiny GRPO task's reward: every word of every completion a real word
# Regresses: at most this share judged learned. The kind's trials rise well above their start and end with their
# last third about where they began (median gain +0.03 reward for GRPO, -6% loss for SFT; both checked below), but
# the end is noisy and a few seeds keep part of what they learned (ending ~0.2 better than their start, p < 0.01):
# those are rightly judged learned. Recorded: 2/39 (GRPO) and 2/40 (SFT), 5%. 15% leaves room for re-recording: at
# 40 seeds a true 5% rate reaches 7/40 with probability 0.3%. A rule that read how far the trial got along the way
# instead of where it ended fails it: by its peak (74 of the 79 rose 0.1 above their start) nearly all would be
# learned, by the effect alone (the mean improvement over the whole trial, >= MIN_EFFECT) 40 of the 79.
REGRESSES_AT_MOST = 0.15


@functools.cache
def judged() -> tuple[tuple[dict, object], ...]:
    """Every recorded trial with its judgement (tuner.verdicts.learning.judge_learning)."""
    return tuple((trial, judge_learning(adapter(trial["trainer"]), trial["history"])) for trial in TRIALS)


def rates() -> dict[tuple[str, str], tuple[int, int]]:
    """(trainer or "all", kind) -> (trials judged learned, trials)."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for trial, learning in judged():
        for key in ((trial["trainer"], trial["kind"]), ("all", trial["kind"])):
            counts[key][0] += learning.learned
            counts[key][1] += 1
    return {key: (hits, n) for key, (hits, n) in counts.items()}


def metric_values(trial: dict) -> list[float]:
    metric = "reward" if trial["trainer"] == "grpo" else "loss"
    return [row[metric] for row in trial["history"] if metric in row and math.isfinite(row[metric])]


def first_at_ceiling(trial: dict) -> float:
    """The first step whose mean reward is the ceiling (inf if none)."""
    return next((row["step"] for row in trial["history"] if row.get("reward", 0.0) >= CEILING - 1e-9), math.inf)


def table() -> str:
    """The table in docs/how-a-search-works.md: per trainer and kind, trials judged learned / trials, and the settings that made them."""
    from tests.data.verdicts.calibration.record import KINDS as SETTINGS

    measured = rates()
    heads = {"cannot_learn": "cannot learn", "fast_solver": "fast solver", "slow_learner": "slow learner",
             "regresses": "learns, then regresses"}
    lines = ["| trainer | " + " | ".join(heads[kind] for kind in KINDS) + " |",
             "| --- |" + " ---: |" * len(KINDS)]

    def setting(trainer, kind):
        params = dict(SETTINGS[trainer][kind])
        text = f"lr {params.pop('learning_rate'):g}"
        if params.pop("lr_scheduler_type", None) == "constant_with_warmup":
            text += f" ramped over {params.pop('warmup_steps')} steps"
        return ", ".join([text, *(f"{k} {v:g}" for k, v in params.items())]).replace("e-0", "e-")

    for trainer in TRAINERS:
        cells = []
        for kind in KINDS:
            if (trainer, kind) not in measured:
                cells.append("not recorded")
                continue
            hits, n = measured[trainer, kind]
            cells.append(f"{hits}/{n} ({setting(trainer, kind)})")
        lines.append(f"| {trainer} | " + " | ".join(cells) + " |")
    bounds = {"cannot_learn": "at most 5%", "fast_solver": "at least 95%", "slow_learner": "at least 95%",
              "regresses": f"at most {REGRESSES_AT_MOST:.0%}"}
    cells = [f"**{measured['all', kind][0]}/{measured['all', kind][1]}** (bound: {bounds[kind]})" for kind in KINDS]
    lines.append("| **all** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_recording_covers_every_trainer_and_kind_with_enough_seeds():
    from tuner.config.trainers import ADAPTERS

    assert set(TRAINERS) == set(ADAPTERS)
    measured = rates()
    for trainer in TRAINERS:
        assert all((trainer, kind) in measured for kind in ("cannot_learn", *LEARNING_KINDS)), trainer
    for key, counted in RECORDED["recorded"].items():
        trainer, kind = key.split("/")
        kept = counted["run"] - counted["dropped"]
        assert measured.get((trainer, kind), (0, 0))[1] == kept, key
        # 40 seeds: one false "learned" moves a rate by 2.5%, so the 5% bounds are measured, not rounded to.
        assert counted["run"] >= 40, key
        # The guard stopped at most 1 in 10 of a kind: a setting it mostly stops would calibrate on survivors.
        assert counted["dropped"] <= 0.1 * counted["run"], key
    # Every kept trial (the recorder keeps only trials that ended ok) ran its full length: the judgement saw all steps.
    assert all(len(t["history"]) == RECORDED["max_steps"] for t in TRIALS)
    # GRPO rows carry what the test's per-step noise reads.
    assert all("reward_std" in row and row.get("reward_groups") == 2.0
               for t in TRIALS if t["trainer"] == "grpo" for row in t["history"])


@pytest.mark.parametrize("trainer", [*TRAINERS, "all"])
def test_a_trial_that_cannot_learn_is_rarely_called_learned(trainer):
    hits, n = rates()[(trainer, "cannot_learn")]
    print(f"\n{trainer}: cannot learn (lr 1e-7) judged learned in {hits}/{n} = {hits / n:.1%} of seeds")
    assert hits / n <= 0.05


@pytest.mark.parametrize("kind", LEARNING_KINDS)
@pytest.mark.parametrize("trainer", [*TRAINERS, "all"])
def test_fast_solvers_and_slow_learners_are_almost_always_called_learned(trainer, kind):
    hits, n = rates()[(trainer, kind)]
    misses = [(t["seed"], round(j.effect, 3), round(j.gain, 3), float(f"{j.p_value:.2g}")) for t, j in judged()
              if t["kind"] == kind and trainer in ("all", t["trainer"]) and not j.learned]
    print(f"\n{trainer}: {kind} judged learned in {hits}/{n} = {hits / n:.1%} of seeds; not learned "
          f"(seed, effect, gain, p): {misses}")
    assert hits / n >= 0.95


@pytest.mark.parametrize("trainer", sorted({t["trainer"] for t in TRIALS if t["kind"] == "regresses"}) + ["all"])
def test_a_trial_that_learns_and_then_regresses_is_rarely_called_learned(trainer):
    trials = [(t, j) for t, j in judged() if t["kind"] == "regresses" and trainer in ("all", t["trainer"])]
    hits = sum(j.learned for _, j in trials)
    print(f"\n{trainer}: learns then regresses judged learned in {hits}/{len(trials)} = {hits / len(trials):.1%}; "
          f"median gain of the last third {statistics.median(j.gain for _, j in trials):+.3f}, median effect "
          f"{statistics.median(j.effect for _, j in trials):+.3f}")
    assert hits / len(trials) <= REGRESSES_AT_MOST
    # The kind is what it says: nearly every trial rose clearly above its start at some point (its best 3-step
    # mean at least 10% of the start's loss / 0.1 of reward better), and on average it ends about where it began.
    risen = sum(peak_gain(t) >= 0.1 for t, _ in trials)
    print(f"rose 0.1 above their start at some point: {risen}/{len(trials)}")
    assert risen >= 0.8 * len(trials)
    assert abs(statistics.median(j.gain for _, j in trials)) <= 0.1


def peak_gain(trial: dict) -> float:
    """The best 3-step mean's improvement over the start (the first 2 steps), in the effect's units."""
    values = metric_values(trial)
    start = statistics.fmean(values[:2])
    direction, scale = (1, 1.0) if trial["trainer"] == "grpo" else (-1, abs(start))
    return max(direction * (statistics.fmean(values[i:i + 3]) - start) / scale for i in range(len(values) - 2))


def grpo_pairs() -> list[tuple[tuple[dict, object], tuple[dict, object]]]:
    """(fast solver, slow learner) of each GRPO seed recorded as both: the same system config, so the same tokens/s."""
    by_seed = defaultdict(dict)
    for trial, learning in judged():
        if trial["trainer"] == "grpo" and trial["kind"] in LEARNING_KINDS:
            by_seed[trial["seed"]][trial["kind"]] = (trial, learning)
    return [(pair["fast_solver"], pair["slow_learner"]) for _, pair in sorted(by_seed.items()) if len(pair) == 2]


def test_grpo_fast_solvers_reach_the_ceiling_early_and_slow_learners_late():
    # The recorded kinds are the cases the issue names: ceiling by step 3-10, or a steady climb that gets there late.
    fast = [first_at_ceiling(t) for t, _ in judged() if t["trainer"] == "grpo" and t["kind"] == "fast_solver"]
    slow = [first_at_ceiling(t) for t, _ in judged() if t["trainer"] == "grpo" and t["kind"] == "slow_learner"]
    early = sum(step <= 10 for step in fast)
    print(f"\nGRPO fast solvers at the ceiling by step 10: {early}/{len(fast)}; slow learners at it by step 10: "
          f"{sum(step <= 10 for step in slow)}/{len(slow)}, ever: {sum(step < math.inf for step in slow)}/{len(slow)}")
    assert early >= 0.9 * len(fast)
    assert sum(step <= 10 for step in slow) <= 0.1 * len(slow)


def test_of_two_grpo_trials_at_similar_speed_the_one_at_the_ceiling_first_ranks_first():
    pairs = []  # (the trial at the ceiling first, the other), each with its judgement
    for fast, slow in grpo_pairs():
        if first_at_ceiling(fast[0]) != first_at_ceiling(slow[0]):
            pairs.append((fast, slow) if first_at_ceiling(fast[0]) < first_at_ceiling(slow[0]) else (slow, fast))

    def ranks_first(first, second, slower: float) -> bool:
        """Ranked as the search ranks them (tuner.verdicts.recommend: progress x tokens/s over ok trials that learned), with
        the trial at the ceiling first given ``slower`` times the other's tokens/s. The two share their system config,
        so their speed is the same; the recorded tokens/s of a shared CPU swing with other load and are not used."""
        speeds = ((first, 1000.0 * slower, "first"), (second, 1000.0, "second"))
        records = [{"status": "ok", "learned": j.learned, "progress": j.effect, "tokens_per_second": speed,
                    "name": name} for (_, j), speed, name in speeds]
        best = recommend(records)
        return best is not None and best["name"] == "first"

    higher_effect = sum(first[1].effect > second[1].effect for first, second in pairs)
    ranked = {slower: sum(ranks_first(first, second, slower) for first, second in pairs) for slower in (1.0, 0.95, 0.9)}
    ratios = sorted(second[1].effect / first[1].effect for first, second in pairs)
    print(f"\nGRPO seed pairs (fast solver, slow learner) with different first steps at the ceiling: {len(pairs)}; "
          f"the first at the ceiling has the higher effect in {higher_effect}/{len(pairs)} (the other's effect is "
          f"{statistics.median(ratios):.2f}x its, median; largest {ratios[-1]:.2f}x) and ranks first at the same "
          f"tokens/s in {ranked[1.0]}/{len(pairs)}, at 5% fewer in {ranked[0.95]}/{len(pairs)}, at 10% fewer in "
          f"{ranked[0.9]}/{len(pairs)}")
    assert len(pairs) >= 30
    assert higher_effect >= 0.95 * len(pairs)
    assert ranked[1.0] >= 0.95 * len(pairs)


def test_every_grpo_trial_whose_reward_reaches_the_ceiling_and_stays_there_is_judged_learned():
    # Every kind, every seed: reached 1.0 at some step and its last third averages at least 0.95 (held, with at most
    # a stray step below).
    held = [(t, j) for t, j in judged() if t["trainer"] == "grpo" and first_at_ceiling(t) < math.inf
            and statistics.fmean(metric_values(t)[-(RECORDED["max_steps"] // 3):]) >= 0.95]
    missed = [(t["kind"], t["seed"], j.describe()) for t, j in held if not j.learned]
    print(f"\nGRPO trials at the ceiling and held there: {len(held)}, judged learned: {len(held) - len(missed)}")
    assert len(held) >= 40
    assert not missed


def test_the_docs_table_is_the_one_measured_on_the_recorded_runs():
    text = table()
    print("\n" + text)
    assert text.count("\n") == len(TRAINERS) + 2
    # the docs quote these rates: a change to the learning test or to the recordings must update them
    page = (Path(__file__).resolve().parents[3] / "docs" / "how-a-search-works.md").read_text()
    assert text in page


def test_a_dpo_trial_at_the_floor_from_step_2_is_judged_learned():
    # Recorded with `tests.data.verdicts.calibration.record`'s settings for DPO at learning rate 3 (seed 0): 10 of 15 ok seeds look
    # like this, the loss ~0 from the first update on. Before the start was exempted from despiking it was judged from a
    # start of 4e-25 (step 1's 0.693 taken for a spike): effect 0, not learned.
    loss = [0.69314718, 4.1180363e-25, 0.0, 5.0980889e-15] + [0.0] * 16
    learning = judge_learning(adapter("dpo"), [{"step": i, "loss": v} for i, v in enumerate(loss, start=1)])
    assert learning.learned and learning.effect > 0.9
