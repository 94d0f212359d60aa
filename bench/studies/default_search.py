"""The embedded default, as a new user runs it: `tuner search` with no arguments, on N seeds.

    python -m bench.studies.default_search --seeds 10          # ~1-3 min per seed on 2 cores
    python -m bench.studies.default_search --model tiny-pretrained --out bench/recorded/pretrained_search.json   # the pretrained path

For each seed, in a fresh folder (so a fresh ./mlflow store): `tuner search --seed S` (the README's first
command, plus the seed), then `tuner export --experiment grpo-tiny -o recommended.yaml`, then
`trl grpo --config recommended.yaml` for 2 steps on the built-in data saved as jsonl. Reports per seed:
exit code, wall time, the recommended trial, whether export and TRL ran; and the share of seeds with a
confirmed recommendation. Writes the figures to bench/recorded/default_search.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common.results import RECORDED
from tuner.config.trainers import adapter

OUT = RECORDED / "default_search.json"


def _run(command: list[str], cwd: Path, timeout: float) -> tuple[int, str, float]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - started


def one_seed(seed: int, folder: Path, timeout: float, model: str = "tiny") -> dict:
    from tuner.inputs.data import builtin_dataset

    tuner = [sys.executable, "-m", "tuner.cli"]
    code, output, seconds = _run([*tuner, "search", "--seed", str(seed), "--model", model,
                                  "--experiment", "bench"], folder, timeout)
    picked = re.search(r"recommended: trial (\d+): (\d+) tokens/s, progress ([-+0-9.]+), (\d+) steps", output)
    # the search's own trials that ran every step (not confirmation or longer re-runs, whose number is followed by
    # "seed 1" or "x60 steps"; not pruned): "[  3/12] trial   7 ok ... progress +0.412 learned"
    first_rung = re.findall(r"\] trial +\d+ (ok) .*progress +[-+0-9.]+ (learned|not learned)", output)
    row = {"seed": seed, "model": model, "search_exit": code, "search_seconds": round(seconds, 1),
           "recommended_trial": int(picked.group(1)) if picked else None,
           "progress": float(picked.group(3)) if picked else None,
           "recommended_steps": int(picked.group(4)) if picked else None,
           "first_rung_trials": len(first_rung),
           "first_rung_learned": sum(learned == "learned" for _, learned in first_rung),
           "longer_rungs": re.findall(r"re-running the best (\d+) .* for (\d+) steps", output),
           "statuses": dict(collections.Counter(re.findall(r"\] trial +\d+ (?:seed \d+ )?(\w+)", output))),
           "tail": output.strip().splitlines()[-12:]}
    if picked is None:
        return row
    code, output, _ = _run([*tuner, "export", "--experiment", "bench", "-o", "recommended.yaml"], folder, 300)
    row["export_exit"] = code
    if code != 0:
        row["export_output"] = output[-600:]
        return row
    data = folder / "data"
    data.mkdir(exist_ok=True)
    builtin_dataset(adapter("grpo")).to_json(str(data / "train.jsonl"))
    import torch

    # The export carries no use_cpu (it is for the machine you train on); on this CPU machine say it, as a user would.
    on_cpu = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    code, output, seconds = _run([str(Path(sys.executable).with_name("trl")), "grpo", "--config", "recommended.yaml", "--dataset_name", str(data),
                                  "--max_steps", "2", "--output_dir", str(folder / "trl-out"), "--report_to", "none",
                                  *on_cpu], folder, 600)
    row["trl_exit"], row["trl_seconds"] = code, round(seconds, 1)
    if code != 0:
        row["trl_output"] = output[-1200:]
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per search")
    parser.add_argument("--model", default="tiny", help="--model of every search (tiny-pretrained: the pretrained path)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        with tempfile.TemporaryDirectory(prefix=f"tuner-default-{seed}-") as folder:
            row = one_seed(seed, Path(folder), args.timeout, args.model)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    recommended = [r for r in rows if r["recommended_trial"] is not None]
    trained = [r for r in recommended if r.get("trl_exit") == 0]
    seconds = sorted(r["search_seconds"] for r in rows)
    first = sum(r["first_rung_trials"] for r in rows)
    learned = sum(r["first_rung_learned"] for r in rows)
    longer = [r for r in recommended if r["recommended_steps"] and r["recommended_steps"] > 20]
    print(f"recommended a confirmed config in {len(recommended)}/{len(rows)} seeds ({len(longer)} after longer rungs); "
          f"export + trl grpo ran in {len(trained)}/{len(recommended)}; search wall time median "
          f"{seconds[len(seconds) // 2]:.0f}s, max {seconds[-1]:.0f}s; first-rung trials that learned: "
          f"{learned}/{first}")


if __name__ == "__main__":
    main()
