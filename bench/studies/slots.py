"""Slot time outside trial processes, with the node's trial launcher (tuner.trial.launcher) and without it, side by
side in one run: the same tuner search (shipped space, tuner's defaults) alternately with TUNER_TRIAL_LAUNCHER=on
and off, each in a fresh Python process.

    python -m bench.studies.slots                                  # 3 pairs of reward searches; writes bench/recorded/slots.json
    python -m bench.studies.slots --pairs 5 --trainer grpo --max-steps 12
    python -m bench.studies.slots --lengths 20,60,120 --out /tmp/lengths.json  # the default mode alone, by trial length
    python -m bench.studies.slots --model tiny-pretrained --trainer grpo --lengths 20 --pairs 1 --out bench/recorded/slots_pretrained.json
        # trials of realistic length: the tiny pretrained model, whose searches extend the best third of their
        # trials to 60 and then 180 steps (tuner.search._extend)
    python -m bench.studies.slots --switch TUNER_CONFIRM_BESIDE_RUNGS --model tiny-pretrained --trainer grpo --pairs 3
        # a lone rung's confirmation seeds beside it (on) or after it (off), side by side

Per search: its wall (``run_search``: Ray start to the recommendation), the whole call (``prepare`` included), and
(search wall x concurrency - trial process seconds) / (search wall x concurrency), as ``slot_share`` (below) computes
it for these searches and for the headline's (bench/headline/report.py; tuner.search._execution stops pruned trials before
they report a process time: their MLflow run's open time counts).
Medians per mode and the ratio on/off. Both modes have the other changes that came with the launcher (stores
opened while Ray starts, free slots confirming the best trial so far): this isolates the launcher alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common.results import RECORDED, REPO, fmt, met, read_recorded, today

OUT = RECORDED / "slots.json"
PRETRAINED = RECORDED / "slots_pretrained.json"  # trials of realistic length: the target line's run
# What "on" and "off" switch (--switch): the node's trial launcher (tuner.trial.launcher.SWITCH), or confirmation runs
# beside a rung that runs alone (tuner.search._confirm.BESIDE_SWITCH)
LAUNCHER, BESIDE = "TUNER_TRIAL_LAUNCHER", "TUNER_CONFIRM_BESIDE_RUNGS"
TARGET = 0.2  # slot time outside trial processes / (search wall x concurrency): at most (issue 38)
FIGURES = ("search_wall_seconds", "seconds", "slot_share_outside", "slot_share_outside_with_prepare", "outside_ends",
           "outside_idle", "outside_handoff")


def slot_share(run: dict[str, Any]) -> dict[str, Any]:
    """(search wall x concurrency - trial process seconds) / (search wall x concurrency) for one tuner search.
    A trial stopped by successive halving reports no process wall time: it counts with its MLflow run's
    duration (trial start to verdict as the driver saw them, a little longer than its process), and
    ``measured_only`` leaves such trials out (counts them as 0: an upper bound on the share)."""
    trials = [*run["records"], *run.get("confirmations", []), *run.get("extensions", [])]
    capacity = run["concurrency"] * run["search_wall_seconds"]
    measured = sum(t.get("wall_seconds") or 0.0 for t in trials)
    estimated = sum(t.get("run_seconds") or 0.0 for t in trials if not t.get("wall_seconds"))
    return {"capacity": capacity, "inside": measured + estimated,
            "share": max(0.0, 1.0 - (measured + estimated) / capacity) if capacity else None,
            "measured_only": max(0.0, 1.0 - measured / capacity) if capacity else None,
            "without_wall": sum(1 for t in trials if not t.get("wall_seconds"))}


def one_search(mode: str, trainer: str, trials: int, max_steps: int, seed: int, model: str | None = None,
               switch: str = LAUNCHER) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-slots-{mode}-"))
    out = folder / "search.json"
    env = {**os.environ, switch: mode}
    subprocess.run([sys.executable, "-m", "bench.headline.tuner_search", "--out", str(out), "--trainer", trainer,
                    "--trials", str(trials), "--max-steps", str(max_steps), "--seed", str(seed),
                    "--store", str(folder / "store"), *(["--model", model] if model else [])], check=True, env=env, stdout=subprocess.DEVNULL,
                   cwd=REPO)
    run = json.loads(out.read_text())
    share = slot_share(run)
    return {**slot_parts(folder, run),"mode": mode, "seed": seed, "max_steps": max_steps, "search_wall_seconds": run["search_wall_seconds"],
            "seconds": run["seconds"], "concurrency": run["concurrency"], "slot_share_outside": share["share"],
            # the same over the whole call, prepare included: what the user waits for
            "slot_share_outside_with_prepare": 1 - share["inside"] / (run["seconds"] * run["concurrency"]),
            "trials": len(run["records"]), "confirmations": len(run.get("confirmations", [])),
            "steps_run": sorted(int(r.get("steps_run") or 0) for r in [*run["records"], *run.get("confirmations", []),
                                                                       *run.get("extensions", [])]),
            "trial_process_seconds": share["inside"], "without_wall": share["without_wall"],
            "recommended": (run.get("recommended") or {}).get("number")}


def slot_parts(folder: Path, run: dict[str, Any]) -> dict[str, float]:
    """Where the slot time outside trial processes went, as shares of search wall x concurrency, from the search's
    MLflow runs' start and end times: ``outside_ends`` before its first trial run opened (Ray start, the stores) and
    after its last one closed (results, shutdown); ``outside_idle`` slots with no trial run open in between (a rung or
    a confirmation waiting on fewer trials than slots); ``outside_handoff`` trial runs open outside their process
    (the hand-off to the trial's child process, the driver's MLflow writes). They add up to the slot share."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder}/store/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=5000)]
    parent = max((r for r in runs if not r.data.tags.get("mlflow.parentRunId")), key=lambda r: r.info.start_time)
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id and r.info.end_time]
    if not kids:
        return {}
    concurrency, capacity = run["concurrency"], run["search_wall_seconds"] * run["concurrency"]
    processes = sum(t.get("wall_seconds") or 0.0 for t in [*run["records"], *run.get("confirmations", []),
                                                            *run.get("extensions", [])])
    opened = sum((k.info.end_time - k.info.start_time) / 1000 for k in kids)
    events = sorted([(k.info.start_time / 1000, 1) for k in kids] + [(k.info.end_time / 1000, -1) for k in kids])
    idle, open_, last = 0.0, 0, events[0][0]
    for when, change in events:
        idle += max(0, concurrency - open_) * (when - last)
        open_, last = open_ + change, when
    span = events[-1][0] - events[0][0]
    return {"outside_ends": (capacity - span * concurrency) / capacity, "outside_idle": idle / capacity,
            "outside_handoff": (opened - processes) / capacity}


def results_row(headline: float | None, searches: int, path: Path = PRETRAINED) -> str:
    """The slot time's line of ``python -m bench``'s Targets table: judged on the run on the tiny pretrained model
    recorded at ``path`` (trials of realistic length: its rungs), the headline's median of ``searches`` tiny-model
    searches beside it; on the headline's alone while that run has not been recorded."""
    realistic = read_recorded(path)
    if realistic is not None:  # trials of realistic length: the tiny pretrained model's rungs (bench.studies.slots --model)
        figure = realistic["summary"][str(realistic["max_steps"])]
        return (f"| slot time outside trial processes / (search wall x concurrency), tuner's searches on the tiny"
                f" pretrained model (rungs of 20, 60 and 180 steps), median of {len(realistic['runs'])} <= {TARGET} |"
                f" {figure['slot_share_outside']:.2f} ({_parts_text(figure)}; `{today(realistic['command'])}`, {realistic['date']});"
                f" the headline's tiny-model searches (trials of 1-2 s): {fmt(headline, '.2f')} |"
                f" {met(figure['slot_share_outside'] <= TARGET)} |")
    return (f"| slot time outside trial processes / (search wall x concurrency), median of {searches} tuner searches <= {TARGET} |"
            f" {fmt(headline, '.2f')} (tiny-model trials of 1-2 s: `python -m bench.studies.slots --model tiny-pretrained` has not"
            f" been run) | {met(None if headline is None else headline <= TARGET)} |")


def _parts_text(figure: dict[str, Any]) -> str:
    if "outside_ends" not in figure:
        return "not split"
    return (f"before the first trial and after the last {figure['outside_ends']:.2f}, slots idle while a rung or"
            f" confirmation ran fewer trials than slots {figure['outside_idle']:.2f}, hand-off and MLflow writes"
            f" {figure['outside_handoff']:.2f}")

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--trainer", default="reward")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--model", default=None, help="tuner's --model (default: the tiny model)")
    parser.add_argument("--lengths", help="comma-separated step budgets: instead of on/off pairs, the default mode "
                                          "alone at each budget, --pairs rounds in alternating order (the share by "
                                          "trial length)")
    parser.add_argument("--switch", choices=[LAUNCHER, BESIDE], default=LAUNCHER,
                        help="the environment variable the on/off pairs set (default: the trial launcher's)")
    args = parser.parse_args(argv)
    started, load_before = time.time(), os.getloadavg()
    runs = []
    if args.lengths:
        lengths = [int(steps) for steps in args.lengths.split(",")]
        for round_ in range(args.pairs):
            for steps in (lengths if round_ % 2 == 0 else lengths[::-1]):
                runs.append(one_search("on", args.trainer, args.trials, steps, seed=round_, model=args.model))
                print(json.dumps(runs[-1]), flush=True)
        summary = {str(steps): {key: statistics.median(r[key] for r in runs if r["max_steps"] == steps and key in r)
                                for key in FIGURES if any(key in r for r in runs)} for steps in lengths}
        _write(args, argv, started, load_before, summary, runs)
        return
    for pair in range(args.pairs):
        for mode in (("on", "off") if pair % 2 == 0 else ("off", "on")):  # alternate which goes first
            runs.append(one_search(mode, args.trainer, args.trials, args.max_steps, seed=pair, model=args.model,
                                   switch=args.switch))
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for mode in ("on", "off"):
        summary[mode] = {key: statistics.median(r[key] for r in runs if r["mode"] == mode and key in r)
                         for key in FIGURES if any(key in r for r in runs)}
    summary["ratio_on_off"] = {key: summary["on"][key] / summary["off"][key] for key in summary["on"]}
    _write(args, argv, started, load_before, summary, runs)


def _write(args, argv, started: float, load_before, summary: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    result = {"command": "python -m bench.studies.slots " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
              "minutes": round((time.time() - started) / 60, 1),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
              "load_before": load_before, "load_after": os.getloadavg(),
              "switch": args.switch, "trainer": args.trainer, "model": args.model or "tiny", "trials": args.trials, "max_steps": args.max_steps,
              "summary": summary, "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
