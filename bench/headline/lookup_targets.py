"""The trials-to-target lookups under the target before issue 38 (within 5% of one best alone) and today's (never
empty: at least ``MIN_TARGETS`` stable, learning reference trials), on one pair of references, no training:

    python -m bench.headline.lookup_targets --results bench/recorded/results.json --trainer grpo
    python -m bench.headline.lookup_targets --lookup lookup-grpo.json --speed speed-grpo.json   # bench.headline.reference's outputs

Prints per lookup and target: the target set's size and members, hits and median trials to the first hit per
sampler; then, on the nearest-trial lookup, each stable, learning reference trial as the one target alone: what the
old target was whenever noise made that trial's single tokens/s reading the best.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.headline.efficiency import MIN_TARGETS, NearestMeasured, compare, simulate
from bench.headline.reference import shipped_space


def before_after(trainer: str, lookup: dict[str, Any], speed: dict[str, Any], seeds: int = 10,
                 budget: int = 30) -> list[str]:
    space = shipped_space(trainer)
    records = lookup["records"]
    lines = []
    for name, reference in (("factored", speed), ("nearest-trial", None)):
        for label, k in (("before (within 5% of one best)", 0), (f"after (at least {MIN_TARGETS})", MIN_TARGETS)):
            e = compare(space, records, list(range(seeds)), budget, lookup["max_steps"], speed_reference=reference,
                        min_targets=k)
            s = e["samplers"]
            ratio = (s["tpe"]["median_trials_to_hit"] / s["random"]["median_trials_to_hit"]) if s else None
            floor = f", floor {e['floor_ratio']:.2f}x the best combination" if e.get("floor_ratio") else ""
            lines.append(f"{name}, {label}: target set {len(e['target_set'])} {[t['number'] for t in e['target_set']]}"
                         f"{floor}; " + "; ".join(f"{n} {x['hit']}/{seeds} found, median {x['median_trials_to_hit']:g}"
                                                  for n, x in s.items())
                         + f"; tpe / random {'-' if ratio is None else f'{ratio:.2f}'}")
    nearest = NearestMeasured(space, records)
    for number in [r["number"] for r in records if r["status"] == "ok" and r.get("learned")]:
        found = {}
        for sampler in ("tpe", "random"):
            hits = [simulate(space, nearest, sampler, seed, budget, lambda o, n=number: o["number"] == n,
                             lookup["max_steps"])["first_hit"] for seed in range(seeds)]
            found[sampler] = (f"{sum(h is not None for h in hits)}/{seeds} found, median"
                              f" {statistics.median(h or budget + 1 for h in hits):g}")
        lines.append(f"nearest-trial, trial {number} alone the target: " + "; ".join(f"{n} {v}" for n, v in found.items()))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="a bench run's results.json (its references)")
    parser.add_argument("--trainer", default="grpo")
    parser.add_argument("--lookup", type=Path, help="bench.headline.reference --kind random's output")
    parser.add_argument("--speed", type=Path, help="bench.headline.reference --kind speed's output")
    args = parser.parse_args(argv)
    if args.results:
        results = json.loads(args.results.read_text())
        lookup, speed = results["lookup_references"][args.trainer], results["speed_references"][args.trainer]
    else:
        lookup, speed = json.loads(args.lookup.read_text()), json.loads(args.speed.read_text())
    print("\n".join(before_after(lookup.get("trainer", args.trainer), lookup, speed)))


if __name__ == "__main__":
    main()
