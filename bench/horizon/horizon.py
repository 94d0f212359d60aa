"""Ground truth for the forecast: configs run to the search's trial length and to 25x it, side by side, and how the
forecast at the trial length did on the long runs' outcomes.

    python -m bench.horizon.horizon                                  # 5 trainers x 4 configs, seed 0, 20 and 500 steps
    python -m bench.horizon.horizon --trainers grpo,sft --configs 8 --seeds 0,1 --model tiny-pretrained --short 60
    python -m bench.horizon.horizon --render bench/recorded/horizon.json      # the summary again, from the recorded runs

For each trainer, configs are drawn by Optuna's RandomSampler from the shipped space (as bench/headline/reference.py
draws them, the precisions this machine cannot run left out) and run as ``tuner trial`` runs them, each in its
own process: first ``--short`` steps (the search's trial), then, for each config that was ``ok`` there,
``--factor`` times as many. Every long run is classified:

- ``held``: ok to its last step, and learned if the short run learned;
- ``failed late``: stopped by the guard (diverged, collapsed) or crashed after the short run's length;
- ``regressed``: ok, but the short run learned and the long one did not (its last third no better than its start);
- ``failed early``: stopped within the trial's length (its learning-rate schedule spans the long run's steps).

All but ``held`` count as failures of the long run.

The forecast is the short run's own (``risk`` in its result: tuner.verdicts.forecast at the trial length, as the
search sees it). Recall: late failures (failed late or regressed) flagged at risk; precision: flags that came
true. Every long run's per-step history is kept (the keys the forecast and the learning test read) so a later rule
can be fitted and judged offline (``forecast_again``) without re-running them.

A flag is what the search acts on: the best trial at risk gets a risk rung (tuner.search._extend.risk_rung_steps), the
first steps of the long run its forecast looked to, on that run's learning-rate schedule. Where the recorded long run
is that run (``--factor`` 25, the forecast's horizon), its first N steps are the rung of N steps, step for step
(TrialSpec.schedule_steps; checked in tests/training/trial/test_trial_training.py), so the search's verdict after the
rung is read off the record (``after_rung``): the rung failed, or its forecast still puts it at risk. Precision and
recall are given for the flags at the trial length and after their rungs. A recorded set counts as held out
(its ``held_out`` key, set by hand with its ``role``) only while no rule was changed after its runs were seen;
``--render`` pools the held-out sets, and separately every set given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from bench.common.results import today  # noqa: E402

OUTPUT = REPO / "bench" / "recorded" / "horizon.json.gz"  # per-step histories: gzip keeps them ~1/6 the size
SECTION = "## Stable for how long: the forecast against runs 25x the trial (issue 33)"
TRAINERS = ("grpo", "dpo", "kto", "reward", "sft")
KEEP = ("step", "loss", "reward", "reward_std", "reward_groups", "frac_reward_zero_std", "grad_norm", "learning_rate",
        "headroom", "headroom_site", "weight_norm", "update_ratio", "update_lost", "loss_scale", "step_skipped",
        "kl", "entropy", "rewards/margins", "weights_fp16")


def _trial(trainer: str, params: dict[str, Any], model: str, steps: int, seed: int, root: Path, name: str,
           seconds_per_step: float = 3.0) -> dict[str, Any]:
    from tuner.trial import TrialSpec, run_trial_isolated

    spec = TrialSpec(trainer=trainer, params=params, model=model, max_steps=steps, seed=seed)
    started = time.perf_counter()
    result = run_trial_isolated(spec, root / name, timeout=max(600, seconds_per_step * steps))
    summary = result.summary()
    summary["status"] = str(summary["status"].value if hasattr(summary["status"], "value") else summary["status"])
    return {**{k: summary.get(k) for k in ("status", "reason", "stopped_at_step", "steps_run", "progress",
                                           "progress_p_value", "learned", "risk", "risk_signal", "risk_step",
                                           "tokens_per_second", "device")},
            "seconds": round(time.perf_counter() - started, 1),
            "history": [{k: _short(row[k]) for k in KEEP if k in row} for row in result.history]}


def _short(value):
    """5 significant digits: the histories stay small enough to keep in the repository."""
    return float(f"{value:.5g}") if isinstance(value, float) else value


# What a user who starts the long run from a config ok at the trial length meets: a failure. "failed early": the
# long run failed within the trial's length, since its learning-rate schedule spans 25x the steps (a linear decay
# over 500 steps is still near its peak at step 16, where the 20-step trial's had decayed).
FAILED = ("failed late", "failed early", "regressed")
CANDIDATES = "learned at the trial length"


def classify(short: dict[str, Any], long: dict[str, Any]) -> str:
    if long["status"] != "ok":
        return "failed late" if (long.get("stopped_at_step") or 0) > short["steps_run"] else "failed early"
    if short.get("learned") and not long.get("learned"):
        return "regressed"
    return "held"


def run(trainers: list[str], configs: int, seeds: list[int], model: str, short: int, factor: int, workers: int,
        config_seed: int = 17, echo=print, precisions: list[str] | None = None,
        partial: str | Path | None = None, seconds_per_step: float = 3.0) -> dict[str, Any]:
    """``precisions``: draw only these (fp16-mixed alone on a GPU, say); ``partial``: the rows so far, written after
    each config (a lent machine's run cut short keeps what it measured); ``seconds_per_step``: a run is killed as
    crashed past this many seconds a step (at least 600 s): 3 fits the tiny models, a real model on a CPU core
    under load needs tens."""
    from bench.common import results as common
    from bench.headline.reference import random_configs, shipped_space
    from tuner.inputs import models
    from tuner.inputs.models import TINY_MODEL, resolve_model
    from tuner.search.driver import SearchOptions, prepare

    os.environ["OMP_NUM_THREADS"] = "1"  # one thread per trial, as a search runs them (bench/headline/reference.py)
    path = resolve_model(model)
    root = Path(tempfile.mkdtemp(prefix="bench-horizon-"))
    # the space a search of this model samples: a pretrained model's ranges (the spaces' ``pretrained:``) for any
    # model but the random tiny one; a real model's (one tuner does not build) exactly as `tuner search --model M
    # --trainer T` prepares it on this machine (on a CPU: small steps, float16 weights left out)
    def space(trainer: str):
        if models.is_built_here(model):
            drawn = shipped_space(trainer).for_model(pretrained=model != TINY_MODEL)
        else:
            drawn = prepare(SearchOptions(model=model, trainer=trainer, store=str(root / "unused-store"))).space
        return drawn.without_precisions([p for p in drawn.precisions() if p not in precisions]) if precisions else drawn

    jobs = [(trainer, i, params, seed) for trainer in trainers
            for i, params in enumerate(random_configs(space(trainer), configs, seed=config_seed))
            for seed in seeds]
    started = time.perf_counter()
    done: list[dict[str, Any]] = []
    lock = threading.Lock()

    def both(job) -> dict[str, Any]:
        trainer, i, params, seed = job
        name = f"{trainer}-{i}-s{seed}"
        first = _trial(trainer, params, path, short, seed, root, name + "-short", seconds_per_step)
        row = {"trainer": trainer, "config": i, "seed": seed, "params": params, "short": first, "long": None}
        if first["status"] == "ok":
            row["long"] = _trial(trainer, params, path, short * factor, seed, root, name + "-long", seconds_per_step)
            row["outcome"] = classify(first, row["long"])
        else:
            row["outcome"] = f"not ok at {short}"
        flag = f"at risk ({first['risk_signal']})" if first.get("risk") else "no risk"
        echo(f"[horizon] {name}: {first['status']} at {short}, {flag}; {row['outcome']}"
             + (f" ({row['long']['status']} at step {row['long']['stopped_at_step']})" if row["long"] else "")
             + f" [{time.perf_counter() - started:.0f} s]")
        if partial:
            with lock:
                done.append(row)
                save({"partial": True, "model": model, "short": short, "long": short * factor, "runs": done}, partial)
        return row

    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(both, jobs))
    devices = sorted({r[k]["device"] for r in rows for k in ("short", "long") if r[k] and r[k].get("device")})
    return {"command": None, "machine": common.machine(), "versions": common.versions(), "model": model,
            "devices": devices, "precisions": precisions,
            "short": short, "long": short * factor, "factor": factor, "seeds": seeds, "configs_per_trainer": configs,
            "config_seed": config_seed,
            "seconds": round(time.perf_counter() - started), "runs": rows,
            "summary": summarize(judged_again({"runs": rows, "short": short, "long": short * factor}))}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per trainer and in all: late failures among configs ok at the trial length, and the forecast's recall and
    precision on them."""
    def table(group: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in group if r["long"] is not None]
        late = [r for r in ok if r["outcome"] in FAILED]
        flagged = [r for r in ok if r["short"].get("risk")]
        hits = [r for r in late if r["short"].get("risk")]
        out = {"runs": len(group), "ok_at_trial_length": len(ok), "late_failures": len(late),
               "late_failure_steps": sorted(r["long"].get("stopped_at_step") or r["long"]["steps_run"] for r in late),
               "flagged": len(flagged), "flagged_and_failed": len(hits),
               "recall": round(len(hits) / len(late), 3) if late else None,
               "precision": round(len(hits) / len(flagged), 3) if flagged else None,
               "outcomes": {o: sum(r["outcome"] == o for r in group) for o in sorted({r["outcome"] for r in group})}}
        if ok and all(r.get("rung_read") for r in ok):  # the search's verdict once each flag had its risk rung
            kept = [r for r in flagged if r["after_rung"]]
            true = [r for r in kept if r["outcome"] in FAILED]
            out.update(after_rung=len(kept), after_rung_true=len(true),
                       after_rung_recall=round(len(true) / len(late), 3) if late else None,
                       after_rung_precision=round(len(true) / len(kept), 3) if kept else None)
        return out

    trainers = sorted({r["trainer"] for r in rows})
    # The search's candidates: ok and learning at the trial length; a flag on a config that does not learn moves no
    # recommendation, a miss or a false flag here does.
    return {"all": table(rows), CANDIDATES: table([r for r in rows if r["short"].get("learned")]),
            **{t: table([r for r in rows if r["trainer"] == t]) for t in trainers}}


def forecast_again(data: dict[str, Any]) -> dict[str, Any]:
    """The forecast re-run offline on each short run's recorded history (today's rules on yesterday's runs), and
    each flag's risk rung read off its long run where that is the rung's run."""
    return summarize(judged_again(data))


def judged_again(data: dict[str, Any]) -> list[dict[str, Any]]:
    from tuner.verdicts.forecast import horizon_steps

    rungs = data["long"] == horizon_steps(data["short"])  # the long run is the one the forecast looked to
    rows = []
    for r in data["runs"]:
        row = {**r, "short": {**r["short"], "risk": _risk_again(r)}, "rung_read": rungs}
        if rungs and row["long"] is not None and row["short"]["risk"]:
            row["after_rung"] = after_rung(row)
        rows.append(row)
    return rows


def after_rung(run: dict[str, Any]) -> str:
    """The search's verdict on a flagged run after its risk rung, read off the long run's first steps: why it stays
    flagged (the rung failed, or still at risk), or "" (cleared)."""
    from tuner.search import risk_rung_steps
    from tuner.verdicts.forecast import forecast

    short, long = run["short"], run["long"]
    risks = _risks(run)
    steps, schedule = risk_rung_steps({"max_steps": short["steps_run"], "risk_step": risks[0].step if risks else None})
    stopped = long.get("stopped_at_step") or long["steps_run"]
    if long["status"] != "ok" and stopped <= steps:
        return f"its {steps}-step rung {long['status']} at step {stopped}"
    history = [row for row in long["history"] if row.get("step", 0) <= steps]
    again = forecast(with_fp16_share(history, run["params"]), run["trainer"], run["params"].get("precision", "fp32"),
                     schedule)
    return f"still at risk after its {steps}-step rung: {again[0]}" if again else ""


def _risk_again(run: dict[str, Any]) -> str:
    risks = _risks(run)
    return str(risks[0]) if risks else ""


def _risks(run: dict[str, Any]) -> list:
    from tuner.verdicts.forecast import forecast, horizon_steps

    short = run["short"]
    return forecast(with_fp16_share(short["history"], run["params"]), run["trainer"],
                    run["params"].get("precision", "fp32"), horizon_steps(short["steps_run"] or 1))


def on_the_long_schedule(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each recorded config as if its trial had been the long run's first ``short`` steps, on the long run's
    learning-rate schedule (TrialSpec.schedule_steps: step for step the same run,
    tests/training/trial/test_trial_training.py), read off the record: ``caught`` when the long run stopped within
    those steps (the trial would not have been ok), else the forecast on those steps. Configs not ok at the trial
    length as recorded have no long run and are left out (on their own shorter schedule they failed already; the long
    one keeps the learning rate higher)."""
    from tuner.verdicts.forecast import forecast

    rows = []
    for r in data["runs"]:
        long = r["long"]
        if long is None:
            continue
        stopped = long.get("stopped_at_step") or long["steps_run"]
        history = [row for row in long["history"] if row.get("step", 0) <= data["short"]]
        peak = max((row.get("learning_rate") or 0.0 for row in long["history"]), default=0.0)
        at_end = history[-1].get("learning_rate") if history else None
        caught = long["status"] != "ok" and stopped <= data["short"]
        risks = [] if caught else forecast(with_fp16_share(history, r["params"]), r["trainer"],
                                           r["params"].get("precision", "fp32"), data["long"])
        rows.append({"trainer": r["trainer"], "config": r["config"], "seed": r["seed"], "outcome": r["outcome"],
                     "failed": r["outcome"] in FAILED, "caught": caught, "risk": str(risks[0]) if risks else "",
                     "lr_share": (at_end / peak) if at_end is not None and peak else None,
                     "recorded_risk": _risk_again(r)})
    return rows


def long_schedule_lines(sets: list[dict[str, Any]], title: str) -> list[str]:
    """The held-out recall and precision as recorded (the trial on a schedule of its own) beside the same configs
    with the trial as the long run's first steps (``on_the_long_schedule``)."""
    rows = [row for data in sets for row in on_the_long_schedule(data)]
    late = [r for r in rows if r["failed"]]

    def figures(flag, among):
        flagged = [r for r in among if flag(r)]
        hits = [r for r in flagged if r["failed"]]
        failed = [r for r in among if r["failed"]]
        return (f"{len(failed)} | {len(flagged)} | {_ratio(len(hits) / len(failed) if failed else None)} | "
                f"{_ratio(len(hits) / len(flagged) if flagged else None)}")

    uncaught = [r for r in rows if not r["caught"]]
    warming = [r for r in uncaught if r["lr_share"] is not None and r["lr_share"] < 0.5]
    short = sets[0]["short"]
    return [f"**{title}** (config seeds {', '.join(str(d.get('config_seed')) for d in sets)}):", "",
            "| the trial | ok at the trial length | failed in the long run | flagged at risk | recall | precision |",
            "| --- | --- | --- | --- | --- | --- |",
            f"| its own {short}-step schedule (as recorded) | {len(rows)} | "
            + figures(lambda r: bool(r["recorded_risk"]), rows) + " |",
            f"| the long run's first {short} steps | {len(uncaught)} | "
            + figures(lambda r: bool(r["risk"]), uncaught) + " |", "",
            f"On the long schedule, {sum(r['caught'] for r in rows)} of the {len(late)} failures stop within the "
            f"trial. At step {short}, {len(warming)} of the other {len(uncaught)} runs are below half the long "
            f"run's peak learning rate, still in a warmup given as a share of the run (a tenth of {sets[0]['long']} "
            f"steps is {sets[0]['long'] // 10}); {sum(r['failed'] for r in warming)} of them failed, "
            f"{sum(r['failed'] and bool(r['recorded_risk']) and not r['risk'] for r in warming)} flagged as recorded "
            "and not on the long schedule."]


def with_fp16_share(history: list[dict[str, Any]], params: dict[str, Any]) -> list[dict[str, Any]]:
    """Runs recorded before tuner.trial.signals read ``weights_fp16`` get it from their config, as the reading gives
    it on the tiny model: 1.0 for an fp16-pure full fine-tune, 0 otherwise (PEFT keeps its adapters in float32; a
    reward model's float16 score head is 0.2% of its trainable weights)."""
    if any("weights_fp16" in row for row in history):
        return history
    share = 1.0 if params.get("precision") == "fp16-pure" and not params.get("use_peft") else 0.0
    return [{**row, "weights_fp16": share} if "weight_norm" in row else row for row in history]


def load(path: str | Path) -> dict[str, Any]:
    """A recorded run, gzip'd (.gz) or not."""
    import gzip

    path = Path(path)
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        return json.load(f)


def save(data: dict[str, Any], path: str | Path) -> None:
    import gzip

    path = Path(path)
    text = json.dumps(data, separators=(",", ":"), default=str) + "\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def lines(data: dict[str, Any]) -> list[str]:
    out = [f"`{today(data.get('command'))}` on {data['machine'].get('cpu')} ({data['machine'].get('cpus')} cores), "
           f"{data['machine'].get('date')}: {data['model']} model, {data['configs_per_trainer']} configs per trainer "
           f"from the shipped spaces (config seed {data.get('config_seed', 17)}), seeds {data['seeds']}, {data['short']} "
           f"steps and {data['long']} "
           f"({data['factor']}x); {data['seconds']} s." + (f" Role: {data['role']}." if data.get("role") else ""), "",
           "| trainer | runs | ok at the trial length | of those, failed in the long run (steps) | flagged at risk | recall | precision | after the risk rungs: flagged, recall, precision | outcomes |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in data["summary"].items():
        out.append(f"| {name} | {t['runs']} | {t['ok_at_trial_length']} | {t['late_failures']} "
                   f"{t['late_failure_steps'] or ''} | {t['flagged']} | {_ratio(t['recall'])} | "
                   f"{_ratio(t['precision'])} | {_after(t)} | {t['outcomes']} |")
    return out


def _after(t: dict[str, Any]) -> str:
    if "after_rung" not in t:
        return "not read (the long run is not the forecast's horizon)"
    return f"{t['after_rung']}, {_ratio(t['after_rung_recall'])}, {_ratio(t['after_rung_precision'])}"


def pooled(sets: list[dict[str, Any]], title: str = "Held-out sets together") -> list[str]:
    """Sets together, today's rules re-run on them: over the held-out sets, the forecast's held-out recall and
    precision; over every set, the pooled figures (fitting sets included, so not held-out figures)."""
    rows = []
    for data in sets:
        rows += judged_again(data)
    summary = summarize(rows)
    seeds = ", ".join(str(d.get("config_seed")) for d in sets)
    out = [f"**{title}** (config seeds {seeds}; today's rules):", "",
           "| configs | ok at the trial length | failed in the long run | flagged at risk | recall | precision | after the risk rungs: flagged, recall, precision |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("all", CANDIDATES):
        t = summary[name]
        out.append(f"| {name} | {t['ok_at_trial_length']} | {t['late_failures']} | {t['flagged']} | "
                   f"{_ratio(t['recall'])} | {_ratio(t['precision'])} | {_after(t)} |")
    return out


def _by_model(loaded: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Recorded sets grouped by model, kind of device and the precisions drawn, in the order given, each with its
    name ("tiny model", "tiny model on a GPU", "tiny-pretrained model, drawn only in fp16-pure"): sets are pooled only
    within a group (a GPU's kernels are not a CPU's; a set drawn in some precisions alone holds more of their failures
    than the spaces draw)."""
    def key(data: dict[str, Any]) -> tuple[str, str, str]:
        return data["model"], _where(data), ", ".join(data.get("precisions") or [])

    keys = dict.fromkeys(key(data) for data in loaded)
    return [(f"{model} model" + (" on a GPU" if where == "cuda" else "") + (f", drawn only in {drawn}" if drawn else ""),
             [data for data in loaded if key(data) == (model, where, drawn)]) for model, where, drawn in keys]


def _where(data: dict[str, Any]) -> str:
    """"cuda" for a set whose trials ran on a GPU, else "cpu" (sets recorded before devices were kept: the CPU)."""
    return "cuda" if any(str(d).startswith("cuda") for d in data.get("devices") or []) else "cpu"


def _ratio(value) -> str:
    return "undefined (none)" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.horizon.horizon", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:5]))
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    parser.add_argument("--configs", type=int, default=4, help="configs per trainer (default %(default)s)")
    parser.add_argument("--seeds", default="0", help="comma-separated (default %(default)s)")
    parser.add_argument("--config-seed", type=int, default=17,
                        help="the RandomSampler's seed that draws the configs (default %(default)s: the set the "
                             "forecast's thresholds were checked on; another seed draws a held-out set)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--short", type=int, default=20, help="the trial length (default %(default)s)")
    parser.add_argument("--factor", type=int, default=25, help="the long run, in trial lengths (default %(default)s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds-per-step", type=float, default=3.0,
                        help="a run is killed as crashed past this many seconds a step, at least 600 s (default 3: "
                             "the tiny models; a real model on a CPU needs tens)")
    parser.add_argument("--precisions", help="comma-separated: draw only these (e.g. fp16-mixed on a GPU)")
    parser.add_argument("--partial", help="write the rows so far here after each config")
    parser.add_argument("--output", default=str(OUTPUT))
    parser.add_argument("--render", metavar="JSON", nargs="+", help="print the summary of recorded runs (the "
                        "forecast re-run offline on their short histories, with today's rules) and stop")
    parser.add_argument("--results", metavar="MD", help="with --render: also put it into this RESULTS.md as the "
                                                         "section " + SECTION.removeprefix("## "))
    parser.add_argument("--long-schedule", action="store_true", help="with --render: the held-out sets' recall "
                        "and precision with each trial read as the long run's first steps (on_the_long_schedule), "
                        "beside the recorded trials'; printed only")
    args = parser.parse_args(argv)
    if args.render:
        loaded = [load(path) for path in args.render]
        groups = _by_model(loaded)
    if args.render and args.long_schedule:
        for name, every in groups:
            held_out = [data for data in every if data.get("held_out")]
            if held_out:
                print("\n".join(long_schedule_lines(
                    held_out, f"Held-out sets, {name}, the trial on its own schedule and on the long run's")), "")
        return 0
    if args.render:
        out: list[str] = []
        for path, data in zip(args.render, loaded):
            data["summary"] = forecast_again(data)
            out += [f"**`{Path(path).name}`**: " + lines(data)[0], *lines(data)[1:], ""]
        for name, every in groups:
            held_out = [data for data in every if data.get("held_out")]
            if held_out:
                out += [*pooled(held_out, f"Held-out sets together, {name}"), ""]
            if len(every) > 1:
                out += [*pooled(every, f"Every set together, {name}, fitting sets included (not held-out "
                                       "figures)"), ""]
        print("\n".join(out))
        if args.results:
            from bench.common.results import replace_section

            replace_section(Path(args.results), SECTION, out[:-1])
        return 0
    data = run(args.trainers.split(","), args.configs, [int(s) for s in args.seeds.split(",")], args.model,
               args.short, args.factor, args.workers, config_seed=args.config_seed,
               precisions=args.precisions.split(",") if args.precisions else None, partial=args.partial,
               seconds_per_step=args.seconds_per_step)
    data["command"] = " ".join(["python -m bench.horizon.horizon", *(sys.argv[1:] if argv is None else argv)])
    save(data, args.output)
    print("\n".join(lines(data)))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
