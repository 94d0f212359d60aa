"""The forecast (tuner.verdicts.forecast) on the recorded ground truth of bench/horizon/horizon.py: configs from the shipped
spaces run 20 steps and 500, their per-step histories kept (bench/recorded/horizon-seed*.json.gz). The forecast is re-run
offline on each 20-step history, as the search would see it."""

import math

import pytest
from helpers import BENCH_RECORDED

from bench.horizon.horizon import FAILED, forecast_again, judged_again, load, with_fp16_share
from tuner.verdicts.forecast import SATURATED, forecast, horizon_steps

SETS = sorted(BENCH_RECORDED.glob("horizon-seed*.json.gz"))


@pytest.fixture(scope="module", params=SETS, ids=lambda p: p.name)
def recorded(request):
    return load(request.param)


def test_the_recorded_sets_are_there_and_whole():
    assert len(SETS) >= 3
    for path in SETS:
        data = load(path)
        assert data["long"] == 25 * data["short"] and data["runs"]
        assert all(r["long"] is None or r["long"]["steps_run"] > 0 for r in data["runs"])


def _risks(run):
    short = run["short"]
    return forecast(with_fp16_share(short["history"], run["params"]), run["trainer"],
                    run["params"].get("precision", "fp32"), horizon_steps(short["steps_run"]))


def test_every_float16_weights_flag_came_true_but_two_low_learning_rate_configs(recorded):
    # the fp16_weights rule (every trainable weight float16, no float32 master copy): on the first nine sets each of
    # its flags came true (15), on configs that learned at the trial length or not. Set 59's SFT config 3, a full
    # fine-tune at lr 1.5e-5 (cosine), held 500 steps on both seeds: the first fp16-pure full fine-tune that did;
    # held-out set 103's DPO config 4 (lr 2.5e-5, cosine) held on both seeds too.
    for run in recorded["runs"]:
        if run["long"] is None:
            continue
        if any(r.signal == "fp16_weights" for r in _risks(run)):
            if (recorded["config_seed"], run["trainer"], run["config"]) in ((59, "sft", 3), (103, "dpo", 4)):
                assert run["outcome"] == "held" and run["params"]["learning_rate"] < 3e-5
                continue
            assert run["outcome"] in FAILED, (run["trainer"], run["config"], run["outcome"])


def _loss_ratio(history):
    # the loss's median over the last quarter of its readings (at least 3) over its first two steps' mean
    losses = [row["loss"] for row in history if isinstance(row.get("loss"), (int, float)) and math.isfinite(row["loss"])]
    recent = sorted(losses[-max(len(losses) // 4, 3):])
    return recent[len(recent) // 2] / (sum(losses[:2]) / 2)


def test_the_margin_losses_the_headroom_rule_spares_held_and_every_float16_one_that_failed_was_far_from_saturated():
    # headroom's false flags were set 47's reward config 5 (lr 0.043, cosine) and set 89's reward config 3 (lr 0.028,
    # constant), both seeds each: fp16-pure LoRA reward models whose activations grew ~25-30% a step over 20 steps and
    # levelled off at 1e-3-3e-2 of float16's range, as their loss fell to 1e-5 of its start and their gradient with
    # it. The SATURATED clause (fitted on these two sets, which are fitting sets since) spares a margin loss at 1% of
    # its start. On every recorded set: the four runs above are the saturated float16 ones with grown activations,
    # all held; every float16 margin-loss run that failed by step 500 sat at >= 0.3x its start at step 20 (30x over
    # the clause). Three bf16-mixed LoRA reward models at lr 0.16-0.44 failed from lower (3e-21, 3e-18 and 0.12x: a
    # loss near 0 between spikes, the guard's 20x crossed at steps 18-33): the clause does not make a run safe, and
    # in bfloat16 there is no headroom to spare. The one false headroom flag left is held-out set 101's SFT config 2
    # (fp16-pure LoRA at lr 0.18, not a margin loss), cleared by its risk rung.
    false, float16_failed, other_failed, spared = [], [], [], []
    for path in SETS:
        data = load(path)
        for run in data["runs"]:
            if run["long"] is None:
                continue
            key = (data["config_seed"], run["trainer"], run["config"], run["seed"])
            if run["outcome"] not in FAILED and any(r.signal == "headroom" for r in _risks(run)):
                false.append(key)
            if run["trainer"] not in ("reward", "dpo", "kto"):
                continue
            ratio = _loss_ratio(run["short"]["history"])
            float16 = run["params"]["precision"].startswith("fp16")
            if run["outcome"] in FAILED:
                (float16_failed if float16 else other_failed).append((ratio, key))
            elif ratio <= SATURATED and float16 and max((row["headroom"] for row in run["short"]["history"]
                                                         if row.get("headroom")), default=0) >= 1e-3:
                spared.append(key)
    assert false == [(101, "sft", 2, 3)]
    assert sorted(spared) == [(47, "reward", 5, 3), (47, "reward", 5, 4), (89, "reward", 3, 3), (89, "reward", 3, 4)]
    assert float16_failed and min(ratio for ratio, _ in float16_failed) >= 30 * SATURATED
    assert sorted(key for ratio, key in other_failed if ratio < 30 * SATURATED) == [
        (89, "reward", 4, 4), (97, "reward", 2, 3), (103, "reward", 4, 3)]


def _figures(runs):
    ok = [r for r in runs if r["long"] is not None]
    failed = [r for r in ok if r["outcome"] in FAILED]
    flagged = [r for r in ok if _risks(r)]
    return len(failed), len(flagged), sum(r["outcome"] in FAILED for r in flagged)


def test_on_the_held_out_sets_four_flags_in_five_came_true_and_three_failures_in_five_were_flagged():
    # the sets recorded after the rules were frozen (their "held_out" key): 43, recorded after the grad_norm rule was
    # removed, 53, after the headroom analysis changed nothing, 61, recorded while a headroom reach was tried and
    # judged by the rules shipped (the reach reverted on set 59 before 61 was seen), 79, after the risk rung and the
    # rule for grown activations (which flags nothing at 20 steps on 43-61), 83, with no rule changed since 79 (the
    # SATURATED clause, fitted on 47 and 89 since, changes no flag on it), and 97, 101 and 103, recorded together
    # after SATURATED. 383 configs ok at 20 steps, 20 failed by step 500, 12 flagged (recall 0.60, under the issue's
    # 0.8); 15 flags, 12 came true (precision 0.80). The misses are mostly runs with no trend at 20 steps: reward
    # models at lr 0.17-0.44 whose loss crossed the guard's 20x at steps 5-41 of the long run's schedule (set 97's
    # configs 2 and 3 on both seeds, 103's config 4), an SFT LoRA config at lr 0.11 whose gradient norm exploded at
    # step 24, a KTO config whose gradient vanished at step 251. The figures the docs give.
    held_out = [load(path) for path in SETS if load(path).get("held_out")]
    assert sorted(data["config_seed"] for data in held_out) == [43, 53, 61, 79, 83, 97, 101, 103]
    runs = [r for data in held_out for r in data["runs"]]
    assert len([r for r in runs if r["long"] is not None]) == 383
    assert _figures(runs) == (20, 15, 12)  # failed, flagged, flags that came true
    # after the risk rungs (read off the long runs): 14 flags stay, 12 true; set 101's SFT headroom flag cleared by its
    # rung; set 103's DPO full fine-tune in fp16-pure at lr 2.5e-5 (fp16_weights, a level) stays on both seeds
    kept = [r for data in held_out for r in judged_again(data) if r.get("after_rung")]
    assert len(kept) == 14 and sum(r["outcome"] in FAILED for r in kept) == 12
    assert sorted((r["trainer"], r["config"]) for r in kept if r["outcome"] not in FAILED) == [("dpo", 4)] * 2


def test_over_every_recorded_set_most_failures_were_flagged_and_no_unflagged_candidate_failed():
    # the ten sets recorded by 2026-11-27 04:25 together (config seeds 17-59), fitting sets included (not held-out
    # figures): 27 late failures among 431 configs ok at 20 steps, 23 flagged (recall 0.85), 25 flags, 23 came true
    # (precision 0.92; the 2 false: set 59's fp16-pure SFT config at lr 1.5e-5). Over the candidates (ok and learned
    # at 20 steps): 14 failures, all flagged, 14 flags; the 276 unflagged candidates, none failed by step 500.
    runs = [r for path in SETS if load(path)["config_seed"] <= 59 for r in load(path)["runs"]]
    assert len([r for r in runs if r["long"] is not None]) == 431
    assert _figures(runs) == (27, 25, 23)
    candidates = [r for r in runs if r["short"].get("learned")]
    assert _figures(candidates) == (14, 14, 14)
    unflagged = [r for r in candidates if r["long"] is not None and not _risks(r)]
    assert len(unflagged) == 276 and not [r for r in unflagged if r["outcome"] in FAILED]


def test_of_the_candidates_no_risk_flagged_at_20_steps_five_in_544_failed_by_step_500():
    # What a user starting from a config the search could recommend (ok, learned, no risk at 20 steps) meets, over
    # every set (config seeds 17-103): 544 such runs, 5 failed by step 500 (0.9%; the issue asks at most 1 in 20): set
    # 79's GRPO config 4 on seed 4 (fp32, lr 0.25: its reward at 1.0 from step 7, collapsed at step 61; its other seed
    # collapsed within 20 steps), set 89's reward config 4 on seed 4 (bf16-mixed LoRA, lr 0.165: loss 36x its scale
    # at step 33), set 97's reward configs 2 and 3 (bf16-mixed LoRA, lr 0.36: loss over 20x at steps 18 and 5 of the
    # long run's schedule) and set 103's KTO config 5 (fp16-pure LoRA, lr 0.0087: no gradient from step 249); none
    # had a trend at 20 steps.
    runs = [(data["config_seed"], r) for data in map(load, SETS) for r in data["runs"]]
    unflagged = [(seed, r) for seed, r in runs if r["long"] is not None and r["short"].get("learned") and not _risks(r)]
    failed = sorted((seed, r["trainer"], r["config"], r["seed"]) for seed, r in unflagged if r["outcome"] in FAILED)
    assert len(unflagged) == 544 and failed == [(79, "grpo", 4, 4), (89, "reward", 4, 4), (97, "reward", 2, 3),
                                                (97, "reward", 3, 4), (103, "kto", 5, 4)]


def test_the_summary_counts_what_the_runs_say(recorded):
    summary = forecast_again(recorded)["all"]
    ok = [r for r in recorded["runs"] if r["long"] is not None]
    assert summary["ok_at_trial_length"] == len(ok)
    assert summary["late_failures"] == sum(r["outcome"] in FAILED for r in ok)
    assert summary["flagged_and_failed"] <= min(summary["flagged"], summary["late_failures"])


def test_a_gradient_norm_rising_from_near_zero_on_a_config_that_does_not_learn_is_no_risk():
    # config seed 37 (a fitting set), SFT config 0 on seeds 3 and 4: fp32 at lr 6e-3, its loss rising from step 1,
    # its gradient norm from 0.007 to 0.3 (40x) over 20 steps; both held 500 steps. The grad_norm rule (removed)
    # flagged both: on the fitting sets it flagged 6 runs, 4 that failed (all 4 flagged by fp16_weights too), and these 2.
    data = load(BENCH_RECORDED / "horizon-seed37.json.gz")
    runs = [r for r in data["runs"] if r["trainer"] == "sft" and r["config"] == 0]
    assert len(runs) == 2
    for run in runs:
        assert run["outcome"] == "held" and not run["short"]["learned"]
        grad = [row["grad_norm"] for row in run["short"]["history"] if "grad_norm" in row]
        assert min(grad[-6:]) >= 10 * sorted(grad[:4])[2]
        assert _risks(run) == []


def test_on_the_fitting_sets_every_flag_came_true():
    # config seeds 17, 23, 29 and 37, the sets the rules were written and changed on: 12 late failures among the
    # configs ok at 20 steps, 9 flagged, 9 flags (11 with the grad_norm rule, its 2 extra flags false)
    runs = [r for path in SETS if load(path).get("config_seed", 17) in (17, 23, 29, 37)
            for r in load(path)["runs"] if r["long"] is not None]
    flagged = [r for r in runs if _risks(r)]
    failed = [r for r in runs if r["outcome"] in FAILED]
    assert len(failed) == 12 and len(flagged) == 9
    assert all(r["outcome"] in FAILED for r in flagged)


def _log_slope(points):
    xs, ys = [s for s, _ in points], [math.log(v) for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


@pytest.fixture
def before_saturated(monkeypatch):
    """The rules as they were before the SATURATED clause (2026-11-27 12:00): the analyses the docs give of them."""
    import tuner.verdicts.forecast as forecast_module

    monkeypatch.setattr(forecast_module, "SATURATED", -1.0)  # no loss is at or below -1x its start


def test_the_headroom_flags_true_and_false_look_alike_at_the_trial_length(before_saturated):
    # docs/horizon.md, "The headroom rule's false flags, and the clause that spares them" (the rules before
    # SATURATED): the late failures headroom caught alone (no other
    # rule flagged them) are fp16-pure LoRA configs, like the false flags, so exempting LoRA adapters loses them; and
    # every headroom flag at 20 steps grew slower over the second half of its 5 readings than over the first, the
    # failures caught alone included, so "growth not slowing" cannot drop the false flags and keep those failures
    alone, slowing = [], []
    for path in SETS:
        data = load(path)
        if data["config_seed"] > 61:
            continue  # the analysis of the sets recorded by 2026-11-27 04:44; a later set's flags are judged below
        for run in data["runs"]:
            if run["long"] is None or not any(r.signal == "headroom" for r in _risks(run)):
                continue
            points = [(row["step"], row["headroom"]) for row in run["short"]["history"] if row.get("headroom")]
            half = (len(points) + 1) // 2
            slowing.append((data["config_seed"], _log_slope(points[-half:]) / _log_slope(points[:half])))
            if run["outcome"] in FAILED and [r.signal for r in _risks(run)] == ["headroom"]:
                assert run["params"]["precision"] == "fp16-pure" and run["params"]["use_peft"]
                alone.append((data["config_seed"], run["trainer"], run["config"]))
    # set 59 (recorded later) added one more, on both seeds: a GRPO LoRA config at lr 0.03, growing ~20% a step to
    # ~1e-3-3e-3 of float16's range at step 20 like set 47's false flags, which failed at steps 118 and 188
    # and held-out set 61 one more on both seeds (fp16-pure LoRA, lr 0.027), failed at steps 69 and 92
    assert sorted(alone) == [(17, "kto", 3), (29, "grpo", 3), (59, "grpo", 1), (59, "grpo", 1), (61, "grpo", 3),
                             (61, "grpo", 3)]
    # the other sets' flags all slowed (the second half's rate under 0.6x the first's), true and false alike; set 59's
    # two failures sped up (the second half's rate over 1x the first's)
    # (set 61's two slowed: 0.37 and 0.24)
    assert len(slowing) == 9 and max(r for seed, r in slowing if seed != 59) < 0.6
    assert min(r for seed, r in slowing if seed == 59) > 1


@pytest.mark.parametrize("clause", ["with SATURATED", "before it"])
def test_after_their_risk_rungs_no_true_flag_was_cleared(clause, request):
    # What the search does with a flag (tuner.search._extend.risk_rung_steps): the best trial at risk runs the first
    # steps of the 500-step run its forecast looked to, on that run's schedule, to twice the projected step (at least
    # 60): a recorded long run's first N steps are that rung, step for step. Over the eleven sets recorded by
    # 2026-11-27 04:44 (config seeds 17-61), before the SATURATED clause: 29 flags, 25 came true; after the rungs 27
    # stay, all 25 true ones among them (10 of them failed on the rung itself), and set 47's two headroom flags were
    # cleared (their activations levelled off at 1.2e-3 of float16's range from step 55; rungs of 92 and 102 steps).
    # With the clause those two are not flagged at all: 27 flags, 25 true, all kept. The other two false flags are
    # fp16_weights', a level no rung clears (set 59's SFT config 3).
    if clause == "before it":
        request.getfixturevalue("before_saturated")
    rows = [r for path in SETS if load(path)["config_seed"] <= 61 for r in judged_again(load(path))]
    flagged = [r for r in rows if r["long"] is not None and r["short"]["risk"]]
    assert len(flagged) == (27 if clause == "with SATURATED" else 29)
    assert sum(r["outcome"] in FAILED for r in flagged) == 25
    kept = [r for r in flagged if r["after_rung"]]
    assert len(kept) == 27 and sum(r["outcome"] in FAILED for r in kept) == 25
    assert sum("rung" in r["after_rung"] and "still at risk" not in r["after_rung"] for r in kept) == 10
    cleared = sorted((r["trainer"], r["config"], r["seed"]) for r in flagged if not r["after_rung"])
    assert cleared == ([] if clause == "with SATURATED" else [("reward", 5, 3), ("reward", 5, 4)])
    assert all(r["outcome"] == "held" for r in flagged if not r["after_rung"])


PRETRAINED = sorted(BENCH_RECORDED.glob("horizon-pretrained-seed*.json.gz"))


def test_on_the_tiny_pretrained_model_no_learning_config_failed_late_and_fp16_weights_is_every_flag():
    # bench/horizon/horizon.py on the tiny pretrained model, configs from the pretrained ranges, every set held out: config
    # seeds 71 and 73 run 20 steps and 1,000 (50x), 113, 127 and 137 run 20 and 500 (25x, the forecast's horizon).
    # 235 ok at 20 steps, 9 failed in their long run, 12 flagged, 7 of them true: recall 0.78, precision 0.58, all by
    # fp16_weights. Its 5 false flags are fp16-pure full fine-tunes at low learning rates: set 127's (a GRPO config
    # at 5.3e-7 whose updates rounded away, a reward model at 2.1e-5 cosine on both seeds, as set 59's SFT and set
    # 103's DPO configs on the tiny model) and set 137's reward model at 1.55e-5 constant, which learned and held on
    # both seeds. The misses: GRPO without a KL penalty collapsing as its groups lose their reward spread (at step 327
    # of 1,000 in set 73, 454 of 500 in set 127; the seeds 11-13 pattern), with no trend at 20 steps. The 57
    # configs that learned within 20 steps all held.
    sets = {data["config_seed"]: data for data in map(load, PRETRAINED)}
    assert sorted(sets) == [71, 73, 113, 127, 137]
    runs = []
    for seed, data in sets.items():
        factor = 25 if seed in (113, 127, 137) else 50
        assert data["model"] == "tiny-pretrained" and data["long"] == factor * data["short"] and data["held_out"]
        runs += data["runs"]
    ok = [r for r in runs if r["long"] is not None]
    assert len(ok) == 235 and _figures(ok) == (9, 12, 7)
    assert {_risks(r)[0].signal for r in ok if _risks(r)} == {"fp16_weights"}  # the reward models': headroom too
    assert _figures(sets[113]["runs"]) == (2, 2, 2)  # both its failures flagged, no false flag
    assert _figures(sets[127]["runs"]) == (3, 5, 2)  # 3 false flags, the GRPO collapse missed
    assert _figures(sets[137]["runs"]) == (0, 2, 0)  # the set recorded last: no failure, 2 false flags
    false = [(seed, r["trainer"]) for seed, data in sets.items() for r in data["runs"]
             if r["long"] is not None and _risks(r) and r["outcome"] not in FAILED]
    assert sorted(false) == [(127, "grpo"), (127, "reward"), (127, "reward"), (137, "reward"), (137, "reward")]
    missed = [r for r in ok if r["outcome"] in FAILED and not _risks(r)]
    assert {r["trainer"] for r in missed} == {"grpo"} and all(r["params"].get("beta") == 0.0 for r in missed)
    learned = [r for r in ok if r["short"].get("learned")]
    assert len(learned) == 57 and not [r for r in learned if r["outcome"] in FAILED]


def test_read_as_the_long_run_s_first_steps_early_failures_are_caught_and_flags_lost_are_in_warmup():
    # bench.horizon.horizon.on_the_long_schedule: each held-out config's trial read as the first 20 steps of its 500-step run
    # (the same run step for step). A run that stopped within them is caught; the flags lost against the recorded
    # trials are all on configs still warming up at step 20 (warmup a share of the run, below half the peak there).
    from bench.horizon.horizon import on_the_long_schedule

    rows = [row for data in map(load, SETS) if data.get("held_out") for row in on_the_long_schedule(data)]
    caught = [r for r in rows if r["caught"]]
    assert caught and all(r["failed"] and r["outcome"] == "failed early" for r in caught)
    lost = [r for r in rows if r["failed"] and r["recorded_risk"] and not r["caught"] and not r["risk"]]
    assert lost and all(r["lr_share"] < 0.5 for r in lost)
    hits = sum(r["failed"] and bool(r["risk"]) for r in rows if not r["caught"])
    failed = sum(r["failed"] for r in rows if not r["caught"])
    recorded = sum(r["failed"] and bool(r["recorded_risk"]) for r in rows) / sum(r["failed"] for r in rows)
    assert hits / failed < recorded  # the reading RESULTS reports: no gain in recall from the long schedule
