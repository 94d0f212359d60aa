"""The search report: pure computations on hand-made trial records (one real search on the tiny model, reported and
plotted, is tests/e2e/report/test_report_e2e.py)."""

from __future__ import annotations

from tuner.report import document as report
from tuner.report._analysis import breakdown, hints, importances, lr_band, pareto_front

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def trial(number, status="ok", step=None, tokens=1000.0, progress=0.2, reason="", **params):
    params = {"precision": "fp32", "learning_rate": 1e-3, "use_peft": False, **params}
    # "learned" is the trial's own learning judgement (tuner.verdicts.learning); here: ok and clearly more than 1% progress
    return {"number": number, "params": params, "status": status, "reason": reason, "stopped_at_step": step,
            "steps_run": step or 8, "tokens_per_second": tokens, "progress": progress if status == "ok" else None,
            "learned": status == "ok" and progress is not None and progress > 0.01, "max_steps": 8, "run_id": None}


def rows_by(rows, dimension):
    return {r.value: r for r in rows if r.dimension == dimension}


# -- breakdown --------------------------------------------------------------------------------------


def test_lr_band_is_the_decade_and_a_power_of_ten_opens_its_own():
    assert lr_band(3e-4) == "1e-4..1e-3"
    # 1e-3 is slightly below 0.001 in binary; it still belongs to 1e-3..1e-2
    assert lr_band(1e-3) == "1e-3..1e-2"
    assert lr_band(0.3) == "1e-1..1e0"
    assert lr_band(1.0) == "1e0..1e1"


def test_breakdown_counts_statuses_and_median_failed_step_per_value():
    records = [
        trial(0, "diverged", 2, precision="fp16-pure"),
        trial(1, "diverged", 4, precision="fp16-pure"),
        trial(2, "crashed", 7, precision="fp16-pure"),
        trial(3, "ok", precision="fp16-pure"),
        trial(4, "ok", precision="bf16-mixed"),
        trial(5, "ok", precision="bf16-mixed", progress=0.0),  # stable but not learning
        trial(6, "collapsed", 5, precision="bf16-mixed", learning_rate=0.3),
    ]
    rows = breakdown(records)
    precision = rows_by(rows, "precision")
    # rows follow tuner's precision order, not first appearance
    assert list(precision) == ["bf16-mixed", "fp16-pure"]
    fp16 = precision["fp16-pure"]
    assert (fp16.trials, fp16.ok, fp16.learned, fp16.failed) == (4, 1, 1, 3)
    assert fp16.statuses["diverged"] == 2 and fp16.statuses["crashed"] == 1
    assert fp16.median_failed_step == 4  # median of 2, 4, 7
    bf16 = precision["bf16-mixed"]
    assert (bf16.trials, bf16.ok, bf16.learned, bf16.failed, bf16.median_failed_step) == (3, 2, 1, 1, 5)
    assert fp16.sentence() == "fp16-pure: 3 of 4 trials failed (2 diverged, 1 crashed; median step 4)"
    assert bf16.sentence() == "bf16-mixed: 1 of 3 trials collapsed (median step 5), 1 stable but not learning"

    bands = rows_by(rows, "learning_rate")
    assert list(bands) == ["1e-3..1e-2", "1e-1..1e0"]
    assert (bands["1e-3..1e-2"].trials, bands["1e-1..1e0"].trials) == (6, 1)
    # use_peft is False everywhere: a constant explains nothing and gets no rows
    assert not rows_by(rows, "LoRA")


def test_breakdown_shows_lora_on_off_and_conditional_params_only_where_set():
    records = [trial(0, use_peft=True, lora_r=8), trial(1, use_peft=True, lora_r=16),
               trial(2, "diverged", 3, use_peft=True, lora_r=16), trial(3), trial(4, gradient_accumulation_steps=8)]
    rows = breakdown(records)
    assert {v: r.trials for v, r in rows_by(rows, "LoRA").items()} == {"off": 2, "on": 3}
    assert {v: r.trials for v, r in rows_by(rows, "lora_r").items()} == {"8": 1, "16": 2}
    # a 0-failure value reads as "0 of N failed"
    assert rows_by(rows, "lora_r")["8"].sentence() == "8: 0 of 1 failed"
    # gradient_accumulation_steps is missing from four trials: only the one that set it is grouped
    assert not rows_by(rows, "gradient_accumulation_steps")


# -- hints ------------------------------------------------------------------------------------------


def precision_split(n_fp16, n_fp32, fp16_status="diverged"):
    fp16 = [trial(i, fp16_status, 3, precision="fp16-pure") for i in range(n_fp16)]
    fp32 = [trial(100 + i, precision="fp32") for i in range(n_fp32)]
    return fp16 + fp32


def test_failure_hint_names_the_counts_and_the_remedy():
    found = hints(precision_split(3, 4))
    assert "stability: every fp16-pure trial diverged (3 of 3) and no fp32 trial did (0 of 4): use fp32" in found


def test_no_hint_without_enough_trials_on_each_side():
    # 2 fp16-pure trials are an anecdote at the default minimum of 3 per side
    assert hints(precision_split(2, 4)) == []
    assert hints(precision_split(4, 2)) == []
    # the same data speaks when the caller lowers the minimum
    assert any("fp16-pure" in h for h in hints(precision_split(2, 4), min_count=2))


def test_no_failure_hint_when_rates_are_close():
    records = precision_split(3, 3)
    records[3]["status"], records[4]["status"] = "diverged", "diverged"  # fp32: 2 of 3 diverged too
    assert not [h for h in hints(records) if "diverged" in h]


def test_progress_and_speed_hints_compare_medians_of_stable_trials():
    slow_clip = [trial(i, tokens=1000, progress=0.12, max_grad_norm=0.3) for i in range(5)]
    fast_clip = [trial(10 + i, tokens=1500, progress=0.17, max_grad_norm=1.0) for i in range(6)]
    found = hints(slow_clip + fast_clip)
    assert ("learning: stable trials with max_grad_norm 0.3 made 29% less progress than with max_grad_norm 1 "
            "(median +0.120 vs +0.170, 5 vs 6 trials)") in found
    assert ("speed: stable trials with max_grad_norm 1 ran 50% faster than with max_grad_norm 0.3 "
            "(median 1500 vs 1000 tokens/s, 6 vs 5 trials)") in found
    # one hint per finding: the faster side and the slower-learning side speak, not their mirrors
    assert len(found) == 2


def test_no_progress_or_speed_hint_for_small_differences():
    a = [trial(i, tokens=1000, progress=0.16, max_grad_norm=0.3) for i in range(4)]
    b = [trial(10 + i, tokens=1100, progress=0.17, max_grad_norm=1.0) for i in range(4)]
    assert hints(a + b) == []


def test_stable_but_not_learning_is_a_failure_hint_of_its_own():
    tiny_lr = [trial(i, learning_rate=1e-6, progress=0.001) for i in range(3)]
    good_lr = [trial(10 + i, learning_rate=1e-3, progress=0.2) for i in range(3)]
    (found,) = [h for h in hints(tiny_lr + good_lr) if "did not learn" in h]
    assert found.startswith("learning: every trial with learning_rate in 1e-6..1e-5 did not learn")
    assert "(3 of 3)" in found and "(0 of 3)" in found


def test_a_value_that_fails_more_but_runs_faster_is_a_trade_off_never_avoid_beside_faster():
    # The report: "avoid activation_checkpointing off" beside "activation_checkpointing off ran 38% faster".
    off = [trial(i, tokens=1380, activation_checkpointing=False) for i in range(4)]
    off += [trial(10 + i, "diverged", 3, activation_checkpointing=False) for i in range(4)]
    on = [trial(20 + i, tokens=1000, activation_checkpointing=True) for i in range(5)]
    found = hints(off + on)
    assert found == [
        "stability: 4 of 8 trials with activation_checkpointing off diverged and no trial with "
        "activation_checkpointing on did (0 of 5): more stable with activation_checkpointing on, but "
        "activation_checkpointing off ran faster (see speed)",
        "speed: stable trials with activation_checkpointing off ran 38% faster than with activation_checkpointing on "
        "(median 1380 vs 1000 tokens/s, 4 vs 5 trials)"]


def test_hints_never_contradict_each_other(tmp_path):
    # The rule, over many mixes of outcomes: each hint says what it is about; no hint says "avoid X" or "use Y"
    # where another says X ran faster or Y failed.
    import itertools
    import random

    rng = random.Random(0)
    statuses = ["ok", "ok", "diverged", "crashed", "not learning"]
    for case in range(300):
        records = []
        for i in range(rng.randint(6, 16)):
            status = rng.choice(statuses)
            fast = rng.random() < 0.5
            records.append(trial(i, "ok" if status == "not learning" else status, 3, tokens=1500 if fast else 1000,
                                 progress=0.001 if status == "not learning" else 0.2,
                                 activation_checkpointing=rng.random() < 0.5, precision=rng.choice(["fp32", "bf16-pure"])))
        found = hints(records)
        assert all(h.split(": ", 1)[0] in ("stability", "learning", "speed") for h in found), found
        faster = [h.split(" ran ")[0].removeprefix("speed: stable trials with ") for h in found if h.startswith("speed")]
        for h, x in itertools.product(found, faster):
            assert f"avoid {x}" not in h, (h, found)
        names = {**{p: ("precision", p) for p in ("fp32", "bf16-pure")},
                 **{f"activation_checkpointing {'on' if v else 'off'}": ("activation_checkpointing", v)
                    for v in (True, False)}}
        for h in found:
            if ": use " in h:  # "use Y" only where every trial with Y learned: no other hint can say Y failed
                key, value = names[h.rsplit(": use ", 1)[1]]
                assert all(report.outcome(r) == "learned" for r in records if r["params"].get(key) == value), h


def test_crash_reasons_are_counted_per_distinct_reason():
    records = [trial(0, "crashed", 2, reason="process killed by SIGFPE (Floating point exception)"),
               trial(1, "crashed", None, reason="process killed by SIGFPE (Floating point exception)"),
               trial(2, "oom", 4, reason="OutOfMemoryError: CUDA out of memory at step 4"),
               trial(3, "oom", 6, reason="OutOfMemoryError: CUDA out of memory at step 6"),
               trial(4, "crashed", 1, reason="timed out after 1800 s (--trial-timeout)"),
               trial(5, "diverged", 3, reason="loss is nan at step 3"), trial(6)]
    assert report.crash_reasons(records) == [
        (2, "crashed", "process killed by SIGFPE (Floating point exception)"),
        (2, "oom", "OutOfMemoryError: CUDA out of memory"),
        (1, "crashed", "timed out after 1800 s (--trial-timeout)")]
    text = report.build_report({"trainer": "reward", "model": "tiny", "trials": records}).text()
    section = text.split("Crash reasons\n-------------\n", 1)[1].split("\n\n", 1)[0]
    assert section.splitlines() == ["- 2 trials crashed: process killed by SIGFPE (Floating point exception)",
                                    "- 2 trials ran out of memory: OutOfMemoryError: CUDA out of memory",
                                    "- 1 trial crashed: timed out after 1800 s (--trial-timeout)"]
    assert "no trial crashed or ran out of memory" in report.build_report({"trials": [trial(0)]}).text()


def test_results_table_never_says_none_and_cuts_reasons_at_a_word():
    from tuner.report.progress import REASON_WIDTH, results_table

    long = ("ValueError: the batch size per device (8) times the gradient accumulation steps (4) must be divisible "
            "by num_generations (3) | see the docs")
    records = [trial(0, "crashed", None, reason="process killed by SIGSEGV (Segmentation fault)"),
               trial(1, "diverged", 4, reason="loss is nan at step 4"), trial(2, "invalid", None, reason=long),
               trial(3)]
    table = results_table(records)
    assert "None" not in table
    rows = {int(line.split("|")[1]): [c.strip() for c in line.split(" | ")] for line in table.splitlines()[2:]}
    assert rows[0][2] == "-" and rows[1][2] == "4" and rows[2][2] == "" and rows[3][2] == ""
    reason = table.splitlines()[4].rsplit(" | ", 1)[1].removesuffix(" |")
    assert reason.endswith("…") and len(reason) <= REASON_WIDTH + 1  # the | in the reason is escaped as \|
    cut = reason.removesuffix("…").replace("\\|", "|")
    assert long.startswith(cut) and long[len(cut)] == " "  # cut where a word ends, never inside one


# -- Pareto front and importances -------------------------------------------------------------------


def test_pareto_front_keeps_stable_non_dominated_trials_fastest_first():
    records = [
        trial(0, tokens=3000, progress=0.1),
        trial(1, tokens=2000, progress=0.3),
        trial(2, tokens=1000, progress=0.5),
        trial(3, tokens=1500, progress=0.2),  # beaten by trial 1 on both
        trial(4, tokens=2000, progress=0.25),  # ties trial 1 on speed, less progress: dominated
        trial(5, "diverged", 2, tokens=9000),  # unstable: never on the front
        trial(6, tokens=None, progress=0.9),  # no speed measured: cannot be placed
    ]
    assert [r["number"] for r in pareto_front(records)] == [0, 1, 2]
    assert pareto_front([]) == []


def test_importance_says_not_enough_when_it_cannot_judge():
    few = [trial(0, "diverged", 2, precision="fp16-pure"), trial(1), trial(2)]
    assert importances(few, "is stable").note.startswith("not enough trials")
    all_ok = [trial(i, precision=p) for i, p in enumerate(["fp32", "bf16-mixed"] * 3)]
    result = importances(all_ok, "is stable")
    assert result.values == {} and result.note.startswith("not enough variation: every trial was stable")
    same_params = [trial(i, "diverged" if i % 2 else "ok", 3) for i in range(6)]
    assert importances(same_params, "is stable").note.startswith("not enough variation: every param")


def test_importance_ranks_the_param_that_decides_stability_first():
    records = []
    for i in range(12):
        precision = ("fp16-pure", "fp32", "bf16-mixed")[i % 3]
        records.append(trial(i, "diverged" if precision == "fp16-pure" else "ok", 3, precision=precision,
                             learning_rate=[1e-4, 3e-4, 1e-3, 3e-3][i % 4],
                             tokens=1000 + 10 * i, use_peft=i % 2 == 0, **({"lora_r": 8} if i % 2 == 0 else {})))
    stable = importances(records, "is stable")
    assert next(iter(stable.values)) == "precision"
    assert abs(sum(stable.values.values()) - 1.0) < 1e-6
    # lora_r exists only with LoRA on; it is still judged ("absent" is a value of its own)
    assert "lora_r" in stable.values
    assert importances(records, "tokens/s").values


# -- rendering and plots on hand-made records -------------------------------------------------------


def test_text_report_is_aligned_and_says_what_it_could_not_compute():
    records = precision_split(3, 4)
    text = report.build_report({"trainer": "reward", "model": "tiny", "trials": records,
                                "recommended": records[3]}).text()
    assert "precision: fp32: 0 of 4 failed; fp16-pure: 3 of 3 trials diverged (median step 3)" in text
    # every trial ran at 1000 tokens/s: nothing to attribute, and the report says so
    assert "tokens/s: not enough variation: every trial measured the same tokens/s (7 trials)" in text
    assert "every fp16-pure trial diverged (3 of 3)" in text
    assert "recommended: trial 100" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dimension"))
    table = lines[start:lines.index("", start)]
    # every numeric column is right-aligned under its header, so all table lines end at the same column
    assert len(table) == 3 and len({len(line) for line in table}) == 1


def plotted_points(fig) -> int:
    return sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections)


def test_plots_render_every_trial_including_non_finite_steps(tmp_path):
    import matplotlib.image

    from tuner.report import _plots as plots

    records = precision_split(3, 3) + [trial(7, "collapsed", 5, precision="fp32", learning_rate=0.3)]
    records[0]["params"]["learning_rate"] = 0.3
    # the other trials share two cells; stacked markers must still all be drawn
    fig = plots.stability_map(records)
    assert plotted_points(fig) == len(records)
    histories = {r["number"]: [{"step": 1, "loss": 0.69, "grad_norm": 3.0},
                               {"step": 2, "loss": 4.4, "grad_norm": 80.0},
                               {"step": 3, "loss": float("nan"), "grad_norm": float("inf")}] for r in records}
    rep = report.build_report({"trials": records, "recommended": records[3]})
    paths = plots.save_all(rep, histories, tmp_path / "plots")
    assert [p.name for p in paths] == ["stability_map.png", "speed_vs_progress.png", "curves.png"]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(path).shape[0] > 100
