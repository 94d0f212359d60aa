"""The headline: wall time until a config is in hand, tuner vs the anchor (pure: records in, verdicts out).

A side has a config **in hand** when its own pick

1. has run on 3 seeds (the search run and 2 confirmation runs) and was stable on each, judged by the side's
   own results: for tuner, its confirmation verdict (status ok and learned on every seed, its recommendation
   rule); for the anchor, its own logs (no non-finite loss or grad_norm, no error: ``anchor_asha.judge_run``);
2. trains within ``WITHIN`` (5%) of the best stable tokens/s of the speed reference (bench/headline/reference.py): the
   pick's speed is the one the reference measured for the pick's combination of speed knobs, so both sides'
   picks are timed in the same block of measurements, under the same load, as the best they are held to.

The time to in hand is the side's measured time (tuner: ``prepare`` + ``run_search``; the anchor: ``ray.init``
to its last confirmation run) when it ends with a config in hand, and never (infinity) when it does not.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

WITHIN = 0.05
STABLE_ANCHOR = ("ok", "stopped")  # stopped: ASHA cut the search run of the pick, stable as far as it ran
INF = math.inf


# -- the speed reference ----------------------------------------------------------------------------


def _key(params: dict[str, Any], crossed: list[str]) -> tuple:
    def value(k):
        v = params.get(k, False) if k == "use_peft" else params.get(k)
        # 0 and 0.0 are one value (a space's choice 0.0, a pin of 0): compared as numbers, not as their repr
        return repr(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
    return tuple(value(k) for k in crossed)


def best_stable(reference: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest reference trial that ended ok (the guard never fired)."""
    ok = [r for r in reference["records"] if r["status"] == "ok" and r.get("tokens_per_second")]
    return max(ok, key=lambda r: r["tokens_per_second"]) if ok else None


def speed_of(reference: dict[str, Any], params: dict[str, Any]) -> dict[str, Any] | None:
    """The reference trial of ``params``' combination of the crossed speed knobs (None: not measured)."""
    crossed = reference["crossed"]
    key = _key(params, crossed)
    return next((r for r in reference["records"] if _key(r["params"], crossed) == key), None)


def speed_verdict(reference: dict[str, Any], params: dict[str, Any] | None) -> dict[str, Any]:
    best = best_stable(reference)
    match = speed_of(reference, params) if params else None
    tps = match.get("tokens_per_second") if match else None
    ratio = tps / best["tokens_per_second"] if tps and best else None
    return {"reference_tokens_per_second": tps, "reference_status": match["status"] if match else None,
            "speed_ratio": ratio, "fast_enough": ratio is not None and ratio >= 1.0 - WITHIN}


# -- each side's verdict ------------------------------------------------------------------------------


def tuner_verdict(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    pick = run.get("recommended")
    runs = []
    if pick:
        runs = [pick, *sorted((c for c in run.get("confirmations", []) if c.get("confirms") == pick["number"]),
                              key=lambda c: c.get("seed", 0))]
    confirmed = bool(pick) and bool((pick.get("confirmation") or {}).get("confirmed", False))
    stable = confirmed and len(runs) >= 3 and all(r["status"] == "ok" and r.get("learned") for r in runs)
    return _verdict("tuner", run, pick["params"] if pick else None, runs, stable, reference,
                    statuses=[_status(r) for r in runs], learned=[bool(r.get("learned")) for r in runs])


def anchor_verdict(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    pick = run.get("pick")
    runs = []
    if pick:
        search_run = next((r for r in run["records"] if r["trial_id"] == pick["trial_id"]), None)
        runs = [r for r in [search_run, *run.get("confirmations", [])] if r is not None]
    stable = bool(pick) and len(runs) >= 3 and all(r["status"] in STABLE_ANCHOR for r in runs)
    return _verdict("anchor", run, pick["params"] if pick else None, runs, stable, reference,
                    statuses=[_status(r) for r in runs], learned=[bool(r.get("learned")) for r in runs])


def _status(record: dict[str, Any]) -> str:
    where = record.get("first_nonfinite_step") or record.get("stopped_at_step")
    return record["status"] if record["status"] in ("ok", "stopped", "pruned") or not where else f"{record['status']}@{where}"


def _verdict(side: str, run: dict[str, Any], params: dict[str, Any] | None, runs: list[dict[str, Any]], stable: bool,
             reference: dict[str, Any], **extra: Any) -> dict[str, Any]:
    speed = speed_verdict(reference, params)
    own = [r.get("tokens_per_second") for r in runs if r.get("tokens_per_second")]
    in_hand = stable and speed["fast_enough"]
    # stable and learning on its 3 seeds, both sides judged by tuner's learning test (tuner's stable already asks
    # it; the anchor's learned flags are the test run on its own logged metric)
    stable_learning = stable and len(extra.get("learned") or []) >= 3 and all(extra["learned"])
    return {"side": side, "seed": run.get("seed"), "params": params, "runs": len(runs), "stable": stable,
            "stable_learning": stable_learning,
            **speed, "own_tokens_per_second": statistics.median(own) if own else None, "in_hand": in_hand,
            "seconds": run["seconds"], "process_seconds": run.get("process_seconds"),
            "time_to_in_hand": run["seconds"] if in_hand else INF, **extra}


# -- the summary ----------------------------------------------------------------------------------------


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b with infinities: inf/inf is undefined (None), x/inf is 0, inf/x is inf."""
    if a is None or b is None or (math.isinf(a) and math.isinf(b)) or b == 0:
        return None
    if math.isinf(b):
        return 0.0
    return a / b


def summarize(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side: successes, median time to in hand (a seed without one counts as never), median run time;
    and tuner / anchor of both medians. ``pairs``: [{"tuner": verdict, "anchor": verdict}, ...]."""
    out: dict[str, Any] = {"n": len(pairs)}
    for side in ("tuner", "anchor"):
        verdicts = [p[side] for p in pairs]
        out[side] = {"successes": sum(v["in_hand"] for v in verdicts), "stable": sum(v["stable"] for v in verdicts),
                     "fast_enough": sum(v["fast_enough"] for v in verdicts),
                     "median_time_to_in_hand": median(v["time_to_in_hand"] for v in verdicts),
                     # the same without the speed rule: a pick stable on its 3 seeds, however fast
                     "median_time_to_stable": median(v["seconds"] if v["stable"] else INF for v in verdicts),
                     # ... and learning on each of them (tuner's learning test on the side's own logged metric)
                     "stable_learning": sum(_stable_learning(v) for v in verdicts),
                     "median_time_to_stable_learning": median(v["seconds"] if _stable_learning(v) else INF
                                                              for v in verdicts),
                     "median_speed_ratio": median(v.get("speed_ratio") for v in verdicts),
                     "median_seconds": median(v["seconds"] for v in verdicts),
                     "median_process_seconds": median(v.get("process_seconds") for v in verdicts)}
    out["time_ratio"] = ratio(out["tuner"]["median_time_to_in_hand"], out["anchor"]["median_time_to_in_hand"])
    out["stable_time_ratio"] = ratio(out["tuner"]["median_time_to_stable"], out["anchor"]["median_time_to_stable"])
    out["stable_learning_time_ratio"] = ratio(out["tuner"]["median_time_to_stable_learning"],
                                              out["anchor"]["median_time_to_stable_learning"])
    out["seconds_ratio"] = ratio(out["tuner"]["median_seconds"], out["anchor"]["median_seconds"])
    out["process_ratio"] = ratio(out["tuner"]["median_process_seconds"], out["anchor"]["median_process_seconds"])
    return out


def _stable_learning(v: dict[str, Any]) -> bool:
    # verdicts recorded before "stable_learning" existed: the same rule from their own fields
    if "stable_learning" in v:
        return bool(v["stable_learning"])
    return bool(v["stable"]) and len(v.get("learned") or []) >= 3 and all(v["learned"])


# -- the speed reference's noise --------------------------------------------------------------------------

NOISE_QUANTILES = (0.05, 0.95)  # the band a ratio of two medians of 3 readings falls in, of 20 draws 18
NOISE_DRAWS = 4000


def speed_noise(references: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How far apart the speed reference's repeated readings of one combination lie, and so how finely a pick's
    speed over the best can be told on this machine.

    Every combination the reference ran on 3 seeds (bench/headline/reference.py's contenders) gives its readings over their
    median; pooled over ``references``, they are the machine's noise: ``single`` the lowest and highest of them (a
    single reading's spread), ``ratio`` the ``NOISE_QUANTILES`` of the ratio of two medians of 3 readings drawn from
    them (seeded): what a pick exactly as fast as the best reads, pick's median over best's median. A ratio below 1
    by less than ``1 - ratio[0]`` cannot be told from noise; a 5% bar is resolvable only when ``ratio[0] >= 0.95``.
    None when no combination was read more than once."""
    import random

    relative = [x / r["tokens_per_second"] for ref in references for r in ref["records"]
                if len(r.get("tokens_per_second_runs") or []) > 1 and r.get("tokens_per_second")
                for x in r["tokens_per_second_runs"]]
    if not relative:
        return None
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(relative, k=3)) / statistics.median(rng.choices(relative, k=3))
                    for _ in range(NOISE_DRAWS))
    low, high = (ratios[min(len(ratios) - 1, int(q * len(ratios)))] for q in NOISE_QUANTILES)
    return {"readings": len(relative), "single": (min(relative), max(relative)), "ratio": (low, high),
            "resolves": low >= 1.0 - WITHIN}


def speed_judgement(speed_ratio: float | None, noise: dict[str, Any] | None) -> str | None:
    """A pick's speed over the best against the 5% bar, as this machine can tell it: "fast" (>= 0.95), "noise"
    (below 0.95 but within what a pick as fast as the best reads here: not resolvable), "slow" (below the noise
    band: slower than noise explains), None (no speed)."""
    if speed_ratio is None:
        return None
    if speed_ratio >= 1.0 - WITHIN:
        return "fast"
    if noise is not None and speed_ratio >= noise["ratio"][0]:
        return "noise"
    return "slow"

