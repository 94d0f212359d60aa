"""GRPO's KL anchor against the late loss of reward spread: a search's pick run 25x its trial, with beta 0 and 0.04.

    python -m bench.horizon.anchor                                   # the pretrained GRPO pick of search seed 1, seeds 4-7
    python -m bench.horizon.anchor --pick 0 --seeds 3,4              # search seed 0's pick (180 -> 4,500 steps: ~20 min a run)
    python -m bench.horizon.anchor --render bench/recorded/anchor.json.gz --results bench/RESULTS.md   # its summary, into RESULTS

bench/horizon/horizon_picks.py ran the tiny pretrained model's default GRPO searches and their picks 25x: both picks (fp32,
dapo, beta 0) lost their reward spread late and the guard stopped every long run at steps 1097-1451. This bench runs
a recorded pick (``--pick``: its search seed) as it was recommended and with the KL penalty to the reference
turned on (``beta`` 0.04, TRL's default before 0.19 and the shipped space's other choice), nothing else changed, at
its trial length and at ``--factor`` times it, on each seed, as ``tuner trial`` runs them (bench.horizon.horizon._trial).
Each row is a bench/horizon/horizon.py row (trainer, config: the beta, seed, params, short, long, outcome), so its
per-step histories replay through today's guard and forecast offline (bench.horizon.horizon.judged_again,
tuner.verdicts.guard.first_verdict).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from bench.horizon.horizon import _trial, classify, judged_again, load, save, summarize  # noqa: E402

PICKS = REPO / "bench" / "recorded" / "horizon-picks-pretrained.json.gz"
OUTPUT = REPO / "bench" / "recorded" / "anchor.json.gz"
TITLE = "### GRPO's KL anchor, 25x (python -m bench.horizon.anchor)"  # its subsection of RESULTS.md's "Stable for how long"
BETAS = (0.0, 0.04)


def recorded_pick(search_seed: int, picks: Path = PICKS) -> dict[str, Any]:
    """The GRPO pick of the recorded search with ``search_seed``: its params and trial length."""
    for search in load(picks)["searches"]:
        if search["trainer"] == "grpo" and search["search_seed"] == search_seed and search.get("pick"):
            return search["pick"]
    raise SystemExit(f"{picks} holds no GRPO pick of search seed {search_seed}")


def run(search_seed: int, seeds: list[int], factor: int, echo=print) -> dict[str, Any]:
    from bench.common import results as common

    os.environ["OMP_NUM_THREADS"] = "1"
    pick = recorded_pick(search_seed)
    short = int(pick["steps"])
    root = Path(tempfile.mkdtemp(prefix="bench-anchor-"))
    started = time.perf_counter()
    rows = []
    for beta in BETAS:
        params = {**pick["params"], "beta": beta}
        for seed in seeds:
            name = f"beta{beta:g}-s{seed}"
            first = _trial("grpo", params, "tiny-pretrained", short, seed, root, name + "-short")
            row = {"trainer": "grpo", "config": f"beta {beta:g}", "seed": seed, "params": params, "short": first,
                   "long": None}
            if first["status"] == "ok":
                row["long"] = _trial("grpo", params, "tiny-pretrained", short * factor, seed, root, name + "-long")
                row["outcome"] = classify(first, row["long"])
            else:
                row["outcome"] = f"not ok at {short}"
            long = row["long"] or {}
            echo(f"[anchor] {name}: {first['status']} at {short}; {row['outcome']} ({long.get('status')} at step "
                 f"{long.get('stopped_at_step')}) [{time.perf_counter() - started:.0f} s]")
            rows.append(row)
    return {"command": None, "machine": common.machine(), "versions": common.versions(), "model": "tiny-pretrained",
            "search_seed": search_seed, "short": short, "long": short * factor, "factor": factor, "seeds": seeds,
            "seconds": round(time.perf_counter() - started), "runs": rows}


def spread(history: list[dict[str, Any]], last: int = 300) -> tuple[float, float]:
    """The mean share of groups without reward spread and the mean reward over the ``last`` steps of a history."""
    rows = [r for r in history if isinstance(r.get("frac_reward_zero_std"), (int, float))][-last:]
    if not rows:
        return float("nan"), float("nan")
    return (sum(r["frac_reward_zero_std"] for r in rows) / len(rows),
            sum(r.get("reward") or 0.0 for r in rows) / len(rows))


def _replayed(history: list[dict[str, Any]], run_steps: int, keep_kl: bool) -> str:
    """A long run's history through today's guard (``keep_kl`` False: as if it had no KL penalty, which is the
    guard before the anchor's exemption): its verdict and step, or how far it held."""
    from tuner.config.trainers import adapter
    from tuner.verdicts.guard import Guard

    guard = Guard(adapter("grpo"))
    guard.run_steps = run_steps
    for row in history:
        row = row if keep_kl else {k: v for k, v in row.items() if k != "kl"}
        verdict = guard.observe(row["step"], row)
        if verdict is not None:
            return f"{verdict.status.value} at step {verdict.step}"
    return f"ok through {history[-1]['step'] if history else 0}"


def lines(data: dict[str, Any]) -> list[str]:
    """The recorded runs with today's guard (replayed on the long run's history) and today's forecast."""
    from tuner.verdicts.forecast import forecast

    out = [f"GRPO pick of search seed {data['search_seed']} on the {data['model']} model, {data['short']} and "
           f"{data['long']} steps, seeds {', '.join(map(str, data['seeds']))}:", "",
           "| beta | seed | long run as recorded | with today's guard | today's guard without the anchor's exemption "
           "| no spread, last 300 steps | reward, last 300 | forecast at the trial length | the forecast without the "
           "anchor's exemption |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in judged_again(data):
        long = row["long"]
        if long is None:
            out.append(f"| {row['params']['beta']:g} | {row['seed']} | not ok at {data['short']} | | | | | | |")
            continue
        today, unanchored = (_replayed(long["history"], data["long"], keep_kl) for keep_kl in (True, False))
        share, reward = spread(long["history"])
        risk = row["short"]["risk"]
        bare = [{k: v for k, v in r.items() if k != "kl"} for r in row["short"]["history"]]
        unanchored_risk = forecast(bare, "grpo", row["params"]["precision"], data["long"])
        out.append(f"| {row['params']['beta']:g} | {row['seed']} | {long['status']} at step {long['stopped_at_step']} "
                   f"| {today} | {unanchored} | {share:.2f} | {reward:.2f} | "
                   f"{'at risk (' + risk[:40] + '...)' if risk else 'none'} | "
                   f"{'at risk (' + unanchored_risk[0].signal + ')' if unanchored_risk else 'none'} |")
    summary = summarize(judged_again(data))["all"]
    out += ["", f"Failed by the long run (as recorded): {summary['late_failures']} of {summary['ok_at_trial_length']}; "
                f"flagged at the trial length: {summary['flagged']}, of them failed: {summary['flagged_and_failed']}."]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pick", type=int, default=1, help="the recorded search seed whose pick to run (default 1)")
    parser.add_argument("--seeds", default="4,5,6,7", help="comma-separated (default %(default)s)")
    parser.add_argument("--factor", type=int, default=25)
    parser.add_argument("--output", default=str(OUTPUT))
    parser.add_argument("--render", metavar="JSON", help="print the summary of a recorded run and stop")
    parser.add_argument("--results", metavar="MD", help="with --render: also put it into this RESULTS.md")
    args = parser.parse_args(argv)
    if args.render:
        out = lines(load(args.render))
        print("\n".join(out))
        if args.results:
            from bench.horizon.horizon import SECTION
            from bench.horizon.horizon_picks import replace_subsection

            replace_subsection(Path(args.results), SECTION, TITLE, out)
        return 0
    data = run(args.pick, [int(s) for s in args.seeds.split(",")], args.factor)
    data["command"] = "python -m bench.horizon.anchor " + " ".join(argv if argv is not None else sys.argv[1:])
    save(data, args.output)
    print("\n".join(lines(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
