"""What a user who runs the search's recommendation for long meets: whole ``tuner search`` runs, each pick run at its
trial length and at 25x it on seeds the search never saw.

    python -m bench.horizon.horizon_picks --seeds 0,1,2,3                 # 5 trainers x 4 searches on the tiny model
    python -m bench.horizon.horizon_picks --seeds 0,1,2,3 --resume        # go on where a stopped run left off
    python -m bench.horizon.horizon_picks --render bench/recorded/horizon-picks.json.gz --results bench/RESULTS.md
    python -m bench.horizon.horizon_picks --render A.json.gz B.json.gz     # recordings of one model, pooled
    python -m bench.horizon.horizon_picks --model tiny-pretrained --seeds 0,1 --output bench/recorded/horizon-picks-pretrained.json.gz

For each trainer and search seed S, ``tuner search --trainer T --model tiny --seed S`` runs in a fresh store (so no
warm start from another search) with every other option at its default: the shipped space, its trials and steps.
Its recommendation is read back from the store's search.json as ``tuner export`` reads it
(tuner.stores.run_reader.load_search). The pick then runs as ``tuner trial`` runs it (bench.horizon.horizon._trial) on
the two seeds after the last one the search used (its trials' and its confirmations': S, S+1, S+2 by default), at
the trial length it was recommended at and at ``--factor`` times that; each long run is classified by
bench.horizon.horizon.classify. A pick fails by 25x when a long run on either seed failed (failed late, failed early or
regressed); the issue's target: at most 1 pick in 20. A search that recommends nothing is recorded as such, not
as a pick.

The record is written after every search (``--resume`` skips the searches it already holds), with each run's
per-step history as bench/horizon/horizon.py keeps it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from bench.common.results import today  # noqa: E402
from bench.horizon.horizon import FAILED, SECTION, TRAINERS, _ratio, _trial, classify, load, save  # noqa: E402

if TYPE_CHECKING:
    from tuner.records import SearchSummary

OUTPUT = REPO / "bench" / "recorded" / "horizon-picks.json.gz"
SUBSECTION = "### The search's own picks, run 25x their trial (python -m bench.horizon.horizon_picks)"


def subsection(model: str, trainers: tuple[str, ...] = TRAINERS) -> str:
    """The RESULTS.md subsection a recording of ``model``'s picks renders into: one per model, and one more per set
    of trainers recorded apart (``trainers``: a re-recording of some of them after a change that only they meet)."""
    if model == "tiny" and tuple(trainers) == TRAINERS:
        return SUBSECTION
    if tuple(trainers) == TRAINERS:
        return (f"### The search's own picks on the {model} model, run 25x their trial "
                f"(python -m bench.horizon.horizon_picks --model {model})")
    return (f"### The search's own {', '.join(t.upper() if t != 'reward' else t for t in trainers)} picks on the "
            f"{model} model, run 25x their trial (python -m bench.horizon.horizon_picks --model {model} "
            f"--trainers {','.join(trainers)})")


def trainers_of(data: dict[str, Any]) -> tuple[str, ...]:
    """The trainers a recording holds searches of, in TRAINERS' order."""
    return tuple(t for t in TRAINERS if any(r["trainer"] == t for r in data["searches"]))

FRESH_SEEDS = 2  # seeds per pick beyond the search's own: as many as a search confirms on
TARGET = 1 / 20  # the bound on the share of recommended configs that fail by 25x the trial length
SEARCH_TIMEOUT = 1800.0  # seconds: a default search on the tiny model takes ~1 min on 2 busy cores


@dataclass(frozen=True)
class Pick:
    """A search's recommendation as this bench runs it again."""

    trial: int  # the recommended trial's number in its search
    params: dict[str, Any]  # its config, as the search ran it (the space's fixed values included)
    steps: int  # the trial length it was recommended at (20, or a longer rung's)
    search_seeds: list[int]  # every seed the search trained with: its trials', its longer rungs', its confirmations'
    risk: str  # the forecast on it at the trial length, as the search recorded it ("" for none)
    progress: float | None
    tokens_per_second: float | None

    def fresh_seeds(self, n: int = FRESH_SEEDS) -> list[int]:
        """The ``n`` seeds after the last the search used: none of them trained or confirmed this config."""
        last = max(self.search_seeds)
        return list(range(last + 1, last + 1 + n))


def pick_of(search: SearchSummary) -> Pick | None:
    """The recommendation of a search.json, or None when the search recommended nothing."""
    best = search.get("recommended")
    if not best:
        return None
    records = [best, *(r for key in ("trials", "extensions", "confirmations", "remeasures")
                       for r in search.get(key) or [])]
    seeds = {r["seed"] for r in records if r.get("seed") is not None}
    seeds |= set((best.get("confirmation") or {}).get("seeds") or [])
    return Pick(trial=int(best["number"]), params=dict(best["params"]),
                steps=int(best.get("steps_run") or best["max_steps"]), search_seeds=sorted(seeds),
                risk=best.get("risk") or "", progress=best.get("progress"),
                tokens_per_second=best.get("tokens_per_second"))


def _search(trainer: str, seed: int, model: str, folder: Path, echo) -> dict[str, Any]:
    """One default ``tuner search`` in its own store, and its recommendation read back from that store."""
    from tuner.stores import mlflow_store, run_reader

    experiment = f"picks-{trainer}-s{seed}"
    store = folder / "store"
    command = [sys.executable, "-m", "tuner.cli", "search", "--trainer", trainer, "--model", model, "--seed", str(seed),
               "--store", str(store), "--experiment", experiment]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=SEARCH_TIMEOUT,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    row: dict[str, Any] = {"trainer": trainer, "search_seed": seed, "experiment": experiment,
                           "exit_code": done.returncode, "search_seconds": round(time.perf_counter() - started, 1),
                           "pick": None, "runs": []}
    try:
        run, search = run_reader.load_search(mlflow_store.default_tracking_uri(store), experiment)
    except Exception as e:  # noqa: BLE001 - a search that ended before it wrote its summary: recorded, not a pick
        row["error"] = f"{type(e).__name__}: {e}"
        row["output_tail"] = (done.stdout + done.stderr).strip().splitlines()[-20:]
        echo(f"[picks] {experiment}: no search summary (exit {done.returncode}): {row['error']}")
        return row
    row["run_id"] = run.info.run_id
    row["statuses"] = sorted(str(r.get("status")) for r in search.get("trials") or [])
    pick = pick_of(search)
    if pick is None:
        echo(f"[picks] {experiment}: recommended nothing (exit {done.returncode}) [{row['search_seconds']:.0f} s]")
        return row
    row["pick"] = dataclasses.asdict(pick)
    echo(f"[picks] {experiment}: trial {pick.trial} at {pick.steps} steps on seeds {pick.search_seeds}: "
         f"{_params(pick.params)} [{row['search_seconds']:.0f} s]")
    return row


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={float(f'{v:.3g}') if isinstance(v, float) else v}" for k, v in sorted(params.items()))


def run_pick(row: dict[str, Any], model_path: str, factor: int, root: Path, echo) -> None:
    """The pick on each fresh seed, at its trial length and ``factor`` times it; outcomes into ``row["runs"]``."""
    pick = Pick(**row["pick"])
    for seed in pick.fresh_seeds():
        name = f"{row['experiment']}-seed{seed}"
        short = _trial(row["trainer"], pick.params, model_path, pick.steps, seed, root, name + "-short")
        long = _trial(row["trainer"], pick.params, model_path, pick.steps * factor, seed, root, name + "-long")
        # the long run is what the user meets, whatever the short run on this seed did: both are run, and a failure
        # within the trial's length counts as "failed early"
        outcome = classify({**short, "steps_run": pick.steps}, long)
        row["runs"].append({"seed": seed, "short": short, "long": long, "outcome": outcome})
        echo(f"[picks] {name}: {short['status']} at {pick.steps} (learned: {short['learned']}), "
             f"{long['status']} at {pick.steps * factor} (stopped at {long['stopped_at_step']}, learned: "
             f"{long['learned']}): {outcome}")


def run(trainers: list[str], seeds: list[int], model: str, factor: int, output: Path, resume: bool, command: str,
        echo=print) -> dict[str, Any]:
    from bench.common import results as common
    from tuner.inputs.models import resolve_model

    data: dict[str, Any] = load(output) if resume and output.exists() else {
        "model": model, "factor": factor, "fresh_seeds_per_pick": FRESH_SEEDS, "invocations": [], "searches": []}
    if (data["model"], data["factor"]) != (model, factor):
        raise SystemExit(f"--resume: {output} holds {data['model']} at {data['factor']}x, not {model} at {factor}x")
    done = {(r["trainer"], r["search_seed"]) for r in data["searches"]}
    invocation = {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "machine": common.machine(), "versions": common.versions(), "seconds": 0}
    data["invocations"].append(invocation)
    model_path = resolve_model(model)  # built once, before the searches and trials share it
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the picks' runs: one thread each, as a search's trials
    started = time.perf_counter()
    for trainer in trainers:
        for seed in seeds:
            if (trainer, seed) in done:
                continue
            with tempfile.TemporaryDirectory(prefix=f"bench-picks-{trainer}-{seed}-") as tmp:
                began = time.perf_counter()
                row = _search(trainer, seed, model, Path(tmp), echo)
                if row["pick"] is not None:
                    run_pick(row, model_path, factor, Path(tmp), echo)
                row["seconds"] = round(time.perf_counter() - began, 1)
            data["searches"].append(row)
            invocation["seconds"] = round(time.perf_counter() - started)
            save(data, output)  # after every search: a stopped run keeps what it measured
    return data


# -- the summary ----------------------------------------------------------------------------------------------


def pooled_recordings(recordings: list[dict[str, Any]]) -> dict[str, Any]:
    """Recordings of one model at one factor as one: their invocations in turn, each (trainer, search seed) once,
    from the last recording that holds it (a re-recording after a change replaces the earlier one)."""
    first = recordings[0]
    for data in recordings[1:]:
        if (data["model"], data["factor"]) != (first["model"], first["factor"]):
            raise SystemExit(f"--render: recordings of {first['model']} at {first['factor']}x and of "
                             f"{data['model']} at {data['factor']}x cannot be pooled")
    searches = {(r["trainer"], r["search_seed"]): r for data in recordings for r in data["searches"]}
    return {**first, "invocations": [inv for data in recordings for inv in data["invocations"]],
            "searches": sorted(searches.values(), key=lambda r: (TRAINERS.index(r["trainer"]), r["search_seed"]))}


def pick_outcome(row: dict[str, Any]) -> str | None:
    """A search's pick in one word: None (nothing recommended), "held" (every long run held), or the first failure
    of its long runs (bench.horizon.horizon.FAILED)."""
    if row["pick"] is None:
        return None
    failures = [r["outcome"] for r in row["runs"] if r["outcome"] in FAILED]
    return failures[0] if failures else "held"


def upper_bound(failed: int, n: int, confidence: float = 0.95) -> float | None:
    """One-sided Clopper-Pearson upper bound on a failure share seen as ``failed`` of ``n``: with 0 of 20, 0.139."""
    from scipy.stats import beta

    if n == 0:
        return None
    return 1.0 if failed >= n else float(beta.ppf(confidence, failed + 1, n - failed))


def summarize(searches: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trainer and pooled ("all"): searches, picks, picks the search's forecast put at risk, picks ok on every
    fresh seed at the trial length, picks that failed by the long run (and how, and at which steps), runs, and the
    failure share against TARGET."""
    def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
        picks = [r for r in rows if r["pick"] is not None]
        failed = [r for r in picks if pick_outcome(r) in FAILED]
        runs = [run for r in picks for run in r["runs"]]
        return {"searches": len(rows), "picks": len(picks), "at_risk": sum(bool(r["pick"]["risk"]) for r in picks),
                "ok_at_trial_length": sum(all(run["short"]["status"] == "ok" for run in r["runs"]) for r in picks),
                "failed": len(failed), "how": {o: sum(pick_outcome(r) == o for r in failed) for o in FAILED},
                "failed_at_steps": sorted(run["long"].get("stopped_at_step") or run["long"]["steps_run"]
                                          for r in failed for run in r["runs"] if run["outcome"] in FAILED),
                "runs": len(runs), "runs_failed": sum(run["outcome"] in FAILED for run in runs),
                "share": round(len(failed) / len(picks), 3) if picks else None,
                "upper_95": round(bound, 3) if (bound := upper_bound(len(failed), len(picks))) is not None else None}

    trainers = [t for t in TRAINERS if any(r["trainer"] == t for r in searches)]
    return {**{t: table([r for r in searches if r["trainer"] == t]) for t in trainers}, "all": table(searches)}


def lines(data: dict[str, Any]) -> list[str]:
    searches = data["searches"]
    summary = summarize(searches)
    seeds = sorted({r["search_seed"] for r in searches})
    steps = sorted({r["pick"]["steps"] for r in searches if r["pick"]})
    out = []
    for inv in data["invocations"]:
        machine = inv["machine"]
        out.append(f"`{today(inv['command'])}` at tuner {inv['versions'].get('tuner')} on {machine.get('cpu')} "
                   f"({machine.get('cpus')} cores), {inv['date']}: {inv['seconds']} s.")
    out += ["", f"Per trainer, `tuner search --trainer T --model {data['model']} --seed S` for S in {seeds}, every "
                f"other option at its default, each in a fresh store; each pick run on the {data['fresh_seeds_per_pick']}"
                f" seeds after the search's own, at its trial length ({', '.join(map(str, steps))} steps) and "
                f"{data['factor']}x it. A pick fails when a long run on either seed failed.", "",
            "| trainer | searches | picks | recommended at risk | ok at the trial length (both seeds) | picks failed "
            f"by {data['factor']}x (failed late / early / regressed) | at step | share failed (95% upper bound) | "
            "runs failed |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in summary.items():
        how = " / ".join(str(t["how"][o]) for o in FAILED)
        share = "none" if t["share"] is None else f"{t['share']:.2f} ({_ratio(t['upper_95'])})"
        out.append(f"| {name} | {t['searches']} | {t['picks']} | {t['at_risk']} | {t['ok_at_trial_length']} | "
                   f"{t['failed']} ({how}) | "
                   f"{', '.join(map(str, t['failed_at_steps'])) or '-'} | {share} | {t['runs_failed']} of {t['runs']} |")
    picked = [r["pick"]["params"] for r in searches if r["pick"]]
    if picked:
        precisions = Counter(str(p.get("precision")) for p in picked)
        rates = sorted(float(p["learning_rate"]) for p in picked)
        out += ["", f"The picks: {', '.join(f'{n} {name}' for name, n in precisions.most_common())}; "
                    f"{sum(bool(p.get('use_peft')) for p in picked)} with LoRA; learning rates {rates[0]:.2g} to "
                    f"{rates[-1]:.2g}."]
    pooled = summary["all"]
    if pooled["picks"]:
        met = "met" if pooled["failed"] / pooled["picks"] <= TARGET else "not met"
        bound = pooled["upper_95"]
        holds = (f"rules out a failure share above {bound:.3f} (one-sided 95%, Clopper-Pearson): the target holds at "
                 "that confidence" if bound <= TARGET else
                 f"rules out only a failure share above {bound:.2f} (one-sided 95%, Clopper-Pearson), not one above "
                 f"{TARGET:.2f}")
        out += ["", f"**{pooled['failed']} of {pooled['picks']} picks failed by {data['factor']}x the trial length** "
                    f"(share {pooled['share']:.2f}; the issue's target, at most 1 in 20: {met} on these picks). "
                    f"{pooled['failed']} of {pooled['picks']} {holds}."]
    for r in searches:
        if r["pick"] is None:
            out.append(f"- {r['trainer']} seed {r['search_seed']}: recommended nothing (exit {r['exit_code']}"
                       + (f"; {r['error']}" if r.get("error") else "") + ").")
        for run in r["runs"]:
            if run["outcome"] in FAILED:
                long = run["long"]
                risk = f" (recommended at risk: {r['pick']['risk']})" if r["pick"].get("risk") else ""
                out.append(f"- {r['trainer']} seed {r['search_seed']}, trial {r['pick']['trial']} "
                           f"({_params(r['pick']['params'])}){risk}, on seed {run['seed']}: {run['outcome']}, "
                           f"{long['status']} at step {long.get('stopped_at_step')}: {long.get('reason') or 'no reason'}.")
    return out


def replace_subsection(path: Path, section: str, title: str, lines: list[str]) -> None:
    """Put a ``### title`` subsection into ``section`` of a Markdown file, in place of its last version or at the
    section's end (bench.common.results.replace_section keeps it when the section is written again)."""
    text = path.read_text() if path.exists() else ""
    new = "\n".join([title, "", *lines]) + "\n"
    if section not in text:
        text = text.rstrip("\n") + "\n\n" + section + "\n\n" + new
    else:
        before, _, after = text.partition(section)
        body, sep, rest = after.partition("\n## ")
        if title in body:
            head, _, tail = body.partition(title)
            others = tail.split("\n### ", 1)
            body = head + new + ("\n### " + others[1] if len(others) > 1 else "")
        else:
            body = body.rstrip("\n") + "\n\n" + new
        text = before + section + body + ("\n## " + rest if sep else "")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.horizon.horizon_picks", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:6]))
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    parser.add_argument("--seeds", default="0,1,2,3", help="the searches' seeds, comma-separated (default %(default)s)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--factor", type=int, default=25, help="the long run, in trial lengths (default %(default)s)")
    parser.add_argument("--output", default=str(OUTPUT))
    parser.add_argument("--resume", action="store_true", help="keep the searches --output holds; run the others")
    parser.add_argument("--render", metavar="JSON", nargs="+", help="print the summary of a recorded run and stop; "
                        "several recordings of one model are pooled (``pooled_recordings``: each search once, the newest)")
    parser.add_argument("--results", metavar="MD", help="with --render: also put it into this RESULTS.md, as the "
                        "subsection " + SUBSECTION.removeprefix("### ") + " (another model's: its own) of "
                        + SECTION.removeprefix("## "))
    args = parser.parse_args(argv)
    if args.render:
        if args.results and len(args.render) > 1:
            parser.error("--results takes one recording: a pooled one is printed, for a section written by hand")
        data = pooled_recordings([load(path) for path in args.render])
        out = lines(data)
        print("\n".join(out))
        if args.results:
            replace_subsection(Path(args.results), SECTION, subsection(data["model"], trainers_of(data)), out)
        return 0
    command = " ".join(["python -m bench.horizon.horizon_picks", *(sys.argv[1:] if argv is None else argv)])
    data = run(args.trainers.split(","), [int(s) for s in args.seeds.split(",")], args.model, args.factor,
               Path(args.output), args.resume, command)
    print("\n".join(lines(data)))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
