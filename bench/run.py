"""The benchmark, one command: tuner against plain Ray Tune + ASHA, side by side, in one run.

    python -m bench                  # full run (CPU: about 10-15 minutes), writes bench/RESULTS.md
    python -m bench --quick          # tiny budget, about a minute: checks the harness, not the figures
    python bench/run.py --output /tmp/RESULTS.md

What it runs, each timed piece in its own fresh Python process (so neither side inherits the
other's imports, Ray session or environment):

1. the anchor, bench/anchor_asha.py: Ray Tune + ASHA over {fp16, bf16, fp32 weights} x {lr 1e-4, 0.3};
2. tuner on the same grid (bench/grid.yaml), alternating with 1: anchor, tuner, anchor, tuner ...;
   each round also runs tuner with its confirmation re-runs off, the same six trials as the anchor;
3. one reference search per trainer (reward, GRPO; shipped spaces, random sampler), then TPE vs
   random on a nearest-measured-config lookup built from it (bench/efficiency.py);
4. per-trial overhead, from the trial records of 2 and 3.

Raw numbers go to a JSON file beside the Markdown (bench/results.json by default).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # `python bench/run.py`: make `import bench` work like `python -m bench`
    sys.path.insert(0, str(REPO))

from bench import report  # noqa: E402


@dataclass(frozen=True)
class Budget:
    max_steps: int  # optimizer steps per grid trial, both sides
    rounds: int  # anchor/tuner alternations for the wall-time figure
    reward_reference_trials: int  # real trials in the reward reference search (0: use the grid's trials)
    reward_reference_steps: int  # optimizer steps per reward reference trial
    grpo_reference_trials: int
    grpo_reference_steps: int
    seeds: int  # sampler seeds per sampler on the lookup
    search_budget: int  # trials per simulated search on the lookup
    grid_confirm_seeds: int | None = None  # tuner's confirmation re-runs on the grid; None: tuner's default
    grid_dtypes: tuple[str, ...] = ("float16", "bfloat16", "float32")  # weight dtypes of the grid, both sides


# Full: about 10-12 minutes on a 2-core CPU. GRPO trials generate text every step, so its
# reference trials are shorter (12 steps still cover the guard's 5-step zero-reward-std rule).
FULL = Budget(max_steps=20, rounds=3, reward_reference_trials=40, reward_reference_steps=20,
              grpo_reference_trials=24, grpo_reference_steps=12, seeds=10, search_budget=30)
# Quick: just enough of every piece that each table row is produced (the smoke test).
# Its reward "reference" is the grid's own trials (reward_reference_trials=0), which saves a Ray start.
QUICK = Budget(max_steps=4, rounds=1, reward_reference_trials=0, reward_reference_steps=4,
               grpo_reference_trials=1, grpo_reference_steps=4, seeds=5, search_budget=6, grid_confirm_seeds=0,
               grid_dtypes=("float16",))
REFERENCE_SEED = 0  # the reference searches' sampler and trial seed
GRID_SEED = 42  # tuner's trial seed on the grid: Trainer's default seed, which the anchor keeps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget: checks the harness, not the figures")
    parser.add_argument("--output", default=str(REPO / "bench" / "RESULTS.md"), help="the Markdown report")
    parser.add_argument("--workdir", default=None, help="stores, logs and raw runs (default: a temp dir, removed)")
    parser.add_argument("--rounds", type=int, default=None, help="anchor/tuner alternations (default 3; quick 1)")
    args = parser.parse_args(argv)

    budget = QUICK if args.quick else FULL
    if args.rounds:
        budget = Budget(**{**asdict(budget), "rounds": args.rounds})
    output = Path(args.output).resolve()
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = _command(argv)
    started = time.perf_counter()
    machine_before = report.machine()
    try:
        results = _run(budget, workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results.update(command=command, quick=args.quick, budget=asdict(budget), machine=machine_before,
                   load_after=report.load_average(), versions=report.versions(), total_seconds=time.perf_counter() - started)
    output.parent.mkdir(parents=True, exist_ok=True)
    raw = output.with_name("results.json") if output.name == "RESULTS.md" else output.with_suffix(".json")
    raw.write_text(json.dumps(_slim(results), indent=1, default=str))
    output.write_text(report.render(results))
    print(f"wrote {output} and {raw} in {results['total_seconds']:.0f}s")
    return 0


def _slim(results: dict[str, Any]) -> dict[str, Any]:
    """The raw numbers without the reference trials' per-step histories (most of the bytes; no figure
    is read from them once the report is written)."""
    slim = json.loads(json.dumps(results, default=str))
    for reference in slim["references"].values():
        if reference in [r["tuner"] for r in slim["rounds"]]:
            continue
        for record in reference["records"]:
            record.pop("history", None)
    return slim


def _command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    launcher = "python -m bench" if __package__ not in (None, "") else "python bench/run.py"
    return " ".join([launcher, *args])


def _run(budget: Budget, workdir: Path) -> dict[str, Any]:
    from tuner.models import resolve_model

    resolve_model("tiny")  # built once here, so no timed run pays for it
    if budget.rounds > 1:  # the first timed run should not be the one that reads the libraries from disk
        _python(["-c", "import torch, transformers, trl, ray.tune, mlflow, optuna"], workdir / "warmup.log")

    grid_space = _grid_space(budget, workdir)
    dtypes = ["--dtypes", ",".join(budget.grid_dtypes)]
    confirm = [] if budget.grid_confirm_seeds is None else ["--confirm-seeds", str(budget.grid_confirm_seeds)]
    rounds = []
    for i in range(1, budget.rounds + 1):
        anchor = _timed(["-m", "bench.anchor_asha", "--max-steps", str(budget.max_steps), *dtypes,
                         "--workdir", str(workdir / f"anchor-{i}")], workdir, f"anchor-{i}")
        tuner = _timed(["-m", "bench.tuner_search", "--trainer", "reward", "--space", grid_space, "--sampler", "grid",
                        "--max-steps", str(budget.max_steps), "--seed", str(GRID_SEED),
                        "--store", str(workdir / f"tuner-{i}"), *confirm], workdir, f"tuner-{i}")
        entry = {"round": i, "anchor": anchor, "tuner": tuner}
        if budget.grid_confirm_seeds is None:  # the same six trials as the anchor, nothing re-run
            entry["tuner_no_confirm"] = _timed(
                ["-m", "bench.tuner_search", "--trainer", "reward", "--space", grid_space, "--sampler", "grid",
                 "--max-steps", str(budget.max_steps), "--seed", str(GRID_SEED), "--confirm-seeds", "0",
                 "--store", str(workdir / f"tuner-no-confirm-{i}")], workdir, f"tuner-no-confirm-{i}")
        rounds.append(entry)

    # Both reference searches in one process: they are not timed against anything.
    plan = [(t, n, steps) for t, n, steps in (("reward", budget.reward_reference_trials, budget.reward_reference_steps),
                                             ("grpo", budget.grpo_reference_trials, budget.grpo_reference_steps)) if n]
    references = _timed(["-m", "bench.tuner_search", "--seed", str(REFERENCE_SEED), "--store", str(workdir / "reference"),
                         *[f"--reference={t}:{n}:{steps}" for t, n, steps in plan]], workdir, "references")
    references.pop("process_seconds")
    if not budget.reward_reference_trials:  # quick: the grid's own trials stand in for the reward reference
        references["reward"] = {**rounds[0]["tuner"], "process_seconds": rounds[0]["tuner"]["process_seconds"]}
    references = {t: references[t] for t in ("reward", "grpo")}

    efficiency = {}
    for trainer, ref in references.items():
        efficiency[trainer] = _efficiency(trainer, ref, budget)
    return {"rounds": rounds, "references": references, "efficiency": efficiency}


def _grid_space(budget: Budget, workdir: Path) -> str:
    """bench/grid.yaml, narrowed to the budget's weight dtypes (the quick run's smaller grid)."""
    import yaml

    from bench.anchor_asha import DTYPES, PRECISION_OF_DTYPE

    path = REPO / "bench" / "grid.yaml"
    if tuple(budget.grid_dtypes) == DTYPES:
        return str(path)
    space = yaml.safe_load(path.read_text())
    space["params"]["precision"]["choices"] = [PRECISION_OF_DTYPE[d] for d in budget.grid_dtypes]
    narrowed = workdir / "grid.yaml"
    narrowed.write_text(yaml.safe_dump(space, sort_keys=False))
    return str(narrowed)


def _efficiency(trainer: str, reference: dict[str, Any], budget: Budget) -> dict[str, Any]:
    from bench.efficiency import compare
    from tuner.space import load_space

    # the space as the reference search ran it: precisions this machine cannot run are dropped
    space = load_space(None, trainer).without_precisions(reference.get("dropped_precisions") or [])
    started = time.perf_counter()
    result = compare(space, reference["records"], seeds=list(range(budget.seeds)), budget=budget.search_budget,
                     max_steps=reference["max_steps"])
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
