"""The benchmark, one command: tuner against a hand-written Ray Tune + OptunaSearch (TPE) + ASHA search.

    python -m bench                  # the run bench/RESULTS.md holds (see FULL for its budget and time)
    python -m bench --quick          # tiny budget, a few minutes: checks the harness, not the figures
    python bench/headline/run.py --output /tmp/RESULTS.md

What it runs, each piece in its own fresh Python process (so neither side inherits the other's imports, Ray
session or environment):

1. per trainer (reward, GRPO; the shipped spaces, the tiny model): the speed reference (bench/headline/reference.py):
   every combination of the speed knobs, the learning knobs at a safe value, as real tuner trials; and a
   random-sampler reference of real trials over the whole space for the sampler-efficiency lookup;
2. the headline, per seed and trainer: the anchor (bench/headline/anchor_asha.py: Ray Tune + OptunaSearch TPE + ASHA,
   then its pick on 2 more seeds) and tuner (bench/headline/tuner_search.py: prepare + run_search, TPE, its top
   candidates confirmed on 2 more seeds), the same seed, trial budget and steps; which side runs first
   alternates from seed to seed. Each side's pick is judged by bench/headline/headline.py;
3. trials to target, tuner's default sampler (through tuner.search.Proposer) vs random, on the lookup
   built from the random reference (bench/headline/efficiency.py);
4. tuner's slot time outside trial processes, from the headline's tuner searches.

Raw numbers go to bench/recorded/results.json, or beside the Markdown when it is written elsewhere (``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # `python bench/headline/run.py`: make `import bench` work like `python -m bench`
    sys.path.insert(0, str(REPO))

from bench.common import results as common  # noqa: E402
from bench.headline import report  # noqa: E402


@dataclass(frozen=True)
class Budget:
    seeds: int  # headline seeds per trainer; seed i runs both sides with seed i
    trainers: tuple[str, ...]  # shipped spaces in the headline and the efficiency figures
    trials: dict[str, int]  # trials per search, both sides (tuner's confirmation runs come on top, as the anchor's)
    max_steps: dict[str, int]  # optimizer steps per trial, both sides
    confirm_seeds: int  # more seeds each side's pick runs on (3 seeds in all)
    speed_steps: int  # optimizer steps per speed-reference trial (tokens/s is measured after 2 warm-up steps)
    speed_knobs: tuple[str, ...] | None  # the speed knobs the reference crosses (None: bench.headline.reference.SPEED_KNOBS)
    lookup: dict[str, tuple[int, int]]  # trainer -> (trials, steps) of the random reference behind the lookup; its
    # trials run max_steps[trainer] steps whatever steps says (learning is judged at the search's trial length)
    lookup_seeds: int  # sampler seeds per sampler on the lookup
    search_budget: int  # trials per simulated search on the lookup
    notes: tuple[str, ...] = field(default=())  # what this budget cuts from the issue's, said in RESULTS.md
    # import the libraries once in a process of their own before anything is timed (so no timed run pays for a
    # cold disk cache); off for --quick, whose figures mean nothing: it was ~15 s of the smoke test's time
    warm_up: bool = True


# The budget: 5 seeds per side and space, 12 trials (tuner's default) of 20 steps. On this 2-core CPU
# (shared with other work) it does not fit the ~25 minutes the run may take; REDUCED is what ran.
FULL = Budget(seeds=5, trainers=("reward", "grpo"), trials={"reward": 12, "grpo": 12},
              max_steps={"reward": 20, "grpo": 20}, confirm_seeds=2, speed_steps=10, speed_knobs=None,
              lookup={"reward": (40, 20), "grpo": (24, 20)}, lookup_seeds=10, search_budget=30)
REDUCED = replace(FULL, trials={"reward": 6, "grpo": 6}, max_steps={"reward": 20, "grpo": 12}, speed_steps=6,
                  lookup={"reward": (30, 20), "grpo": (20, 12)},
                  notes=("6 trials per search instead of 12, on both sides",
                         "GRPO trials of 12 optimizer steps instead of 20, on both sides (the lookup's GRPO reference too)",
                         "speed reference trials of 6 steps (tokens/s over steps 3-6) instead of 10"))
# Quick: just enough of every piece that each table row is produced (the smoke test): 2 trials a side (each side's
# pick still runs on 2 more seeds) and 4 random reference trials behind the lookups (2 rounds of 2 at a time, not 3).
QUICK = Budget(seeds=1, trainers=("reward",), trials={"reward": 2}, max_steps={"reward": 6}, confirm_seeds=2,
               speed_steps=4, speed_knobs=("precision",), lookup={"reward": (4, 6)}, lookup_seeds=3, search_budget=6,
               notes=("quick: a harness check",), warm_up=False)
BUDGETS = {"full": FULL, "reduced": REDUCED}
REFERENCE_SEED = 0  # the reference trials' seed (and the random reference's sampler seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget: checks the harness, not the figures")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="reduced",
                        help="full: the issue's budget; reduced (default): what fits ~25 min on a 2-core CPU")
    parser.add_argument("--seeds", type=int, default=None, help="headline seeds (default: the budget's)")
    parser.add_argument("--output", default=str(common.RESULTS), help="the Markdown report")
    parser.add_argument("--workdir", default=None, help="stores, logs and raw runs (default: a temp dir, removed)")
    parser.add_argument("--render", default=None, metavar="RESULTS_JSON",
                        help="run nothing: write the Markdown again from a run's raw numbers (after a layout change)")
    parser.add_argument("--lookups", action="store_true",
                        help="with --render: run the trials-to-target lookups again on the run's own references "
                             "and write them into RESULTS_JSON (no training; after a change of the sampler or lookup)")
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        results["rendered_by"] = _command(argv)
        if args.lookups:
            results.update(_lookups(results["speed_references"], results["lookup_references"],
                                    Budget(**{**results["budget"], "trainers": tuple(results["budget"]["trainers"])})))
            results["lookups_by"] = {"command": results["rendered_by"], "versions": common.versions()}
            Path(args.render).write_text(json.dumps(results, indent=1, default=str))
        report.write_results(Path(args.output), results)
        print(f"wrote {args.output} from {args.render}")
        return 0

    budget = QUICK if args.quick else BUDGETS[args.budget]
    if args.seeds:
        budget = replace(budget, seeds=args.seeds)
    output = Path(args.output).resolve()
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = _command(argv)
    started = time.perf_counter()
    machine_before = common.machine()
    try:
        results = _run(budget, workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results.update(command=command, quick=args.quick, budget=asdict(budget), budget_name="quick" if args.quick else args.budget,
                   full_budget=asdict(FULL), machine=machine_before, load_after=common.load_average(),
                   versions=common.versions(), total_seconds=time.perf_counter() - started)
    output.parent.mkdir(parents=True, exist_ok=True)
    raw = _raw(output)
    raw.write_text(json.dumps(_slim(results), indent=1, default=str))
    report.write_results(output, results)
    print(f"wrote {output} and {raw} in {results['total_seconds']:.0f}s")
    return 0


def _raw(output: Path) -> Path:
    """Where the raw numbers of a run written to ``output`` go: bench/recorded/results.json for bench/RESULTS.md,
    else results.json beside a RESULTS.md, else the Markdown's name as .json."""
    if output == common.RESULTS.resolve():
        return common.RECORDED / "results.json"
    return output.with_name("results.json") if output.name == "RESULTS.md" else output.with_suffix(".json")


def _slim(results: dict[str, Any]) -> dict[str, Any]:
    """The raw numbers without per-step histories and logs (most of the bytes; no figure is read from them once
    the report is written)."""
    slim = json.loads(json.dumps(results, default=str))

    def drop(runs):
        for run in runs:
            run.pop("log", None)
            for record in [*run.get("records", []), *run.get("confirmations", [])]:
                record.pop("history", None)

    drop([p[side] for p in slim["headline"] for side in ("tuner", "anchor")])
    drop(list(slim["speed_references"].values()) + list(slim["lookup_references"].values()))
    return slim


def _command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    launcher = "python -m bench" if __package__ not in (None, "") else "python bench/headline/run.py"
    return " ".join([launcher, *args])


def _run(budget: Budget, workdir: Path) -> dict[str, Any]:
    from bench.headline import headline
    from tuner.inputs.models import resolve_model

    resolve_model("tiny")  # built once here, so no timed run pays for it
    if budget.warm_up:
        _python(["-c", "import torch, transformers, trl, ray.tune, mlflow, optuna"], workdir / "warmup.log")

    speed, lookup = {}, {}
    for trainer in budget.trainers:
        knobs = ["--knobs", ",".join(budget.speed_knobs)] if budget.speed_knobs else []
        speed[trainer] = _timed(["-m", "bench.headline.reference", "--trainer", trainer, "--kind", "speed", "--max-steps",
                                 str(budget.speed_steps), "--seed", str(REFERENCE_SEED), *knobs], workdir, f"speed-{trainer}")
        # learning judged at the search's trial length: the lookup's trials run the headline's steps
        trials, steps = budget.lookup[trainer][0], budget.max_steps[trainer]
        lookup[trainer] = _timed(["-m", "bench.headline.reference", "--trainer", trainer, "--kind", "random", "--trials",
                                  str(trials), "--max-steps", str(steps), "--seed", str(REFERENCE_SEED)],
                                 workdir, f"lookup-{trainer}")

    pairs = []
    for i in range(budget.seeds):
        for trainer in budget.trainers:
            order = ("anchor", "tuner") if i % 2 == 0 else ("tuner", "anchor")
            runs = {side: _side(side, trainer, i, budget, workdir) for side in order}
            pair = {"seed": i, "trainer": trainer, "order": list(order), **runs}
            pair["verdicts"] = {"tuner": headline.tuner_verdict(runs["tuner"], speed[trainer]),
                                "anchor": headline.anchor_verdict(runs["anchor"], speed[trainer])}
            pairs.append(pair)

    return {"speed_references": speed, "lookup_references": lookup, "headline": pairs,
            **_lookups(speed, lookup, budget)}


def _lookups(speed: dict[str, Any], lookup: dict[str, Any], budget: Budget) -> dict[str, Any]:
    """Trials to target on both lookups (bench/headline/efficiency.py): "efficiency" the nearest-trial one, "efficiency_factored"
    speed from the speed reference."""
    return {"efficiency": {t: _efficiency(t, lookup[t], budget) for t in budget.trainers},
            "efficiency_factored": {t: _efficiency(t, lookup[t], budget, speed[t]) for t in budget.trainers}}


def _side(side: str, trainer: str, seed: int, budget: Budget, workdir: Path) -> dict[str, Any]:
    name = f"{side}-{trainer}-{seed}"
    common = ["--trainer", trainer, "--seed", str(seed), "--trials", str(budget.trials[trainer]),
              "--max-steps", str(budget.max_steps[trainer]), "--confirm-seeds", str(budget.confirm_seeds)]
    if side == "anchor":
        return _timed(["-m", "bench.headline.anchor_asha", *common, "--workdir", str(workdir / name)], workdir, name)
    return _timed(["-m", "bench.headline.tuner_search", *common, "--sampler", "tpe", "--store", str(workdir / name)], workdir, name)


def _efficiency(trainer: str, reference: dict[str, Any], budget: Budget,
                speed: dict[str, Any] | None = None) -> dict[str, Any]:
    from bench.headline.efficiency import compare
    from bench.headline.reference import shipped_space

    started = time.perf_counter()
    result = compare(shipped_space(trainer), reference["records"], seeds=list(range(budget.lookup_seeds)),
                     budget=budget.search_budget, max_steps=reference["max_steps"], speed_reference=speed)
    result["seconds"] = time.perf_counter() - started
    return result


def _timed(args: list[str], workdir: Path, name: str) -> dict[str, Any]:
    """Run one piece in a fresh Python process; its JSON, plus the wall time of the whole process."""
    out = workdir / f"{name}.json"
    print(f"[bench] {name} ...", flush=True)
    started = time.perf_counter()
    _python([*args, "--out", str(out)], workdir / f"{name}.log")
    seconds = time.perf_counter() - started
    result = json.loads(out.read_text())
    result["process_seconds"] = seconds
    print(f"[bench] {name}: {seconds:.1f}s", flush=True)
    return result


def _python(args: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"python {' '.join(args)} exited with {done.returncode}; last lines of {log}:\n{tail}")


if __name__ == "__main__":
    sys.exit(main())
