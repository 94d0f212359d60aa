"""Record the real tiny-model trial histories that calibrate the learning judgement (tuner.learning).

    python -m tests.calibration.record                 # every trainer, both kinds, 20 seeds: ~10 min on 2 cores
    python -m tests.calibration.record --seeds 3 --trainers grpo --out /tmp/probe.json

Two kinds of trial per trainer, on the embedded tiny model and built-in data:
- ``cannot_learn``: learning rate 1e-7 (fp32, constant schedule): the weights move, too little to change the
  loss or reward in 20 steps. Any trend the judgement sees there is noise from batches and sampling.
- ``learns``: a learning rate that clearly learns on this model (fp32, constant schedule).
tests/test_learning_calibration.py replays them through judge_learning and measures both error rates.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# The learning rate each trainer clearly learns with on the tiny model in 20 steps (fp32, batch 8).
LEARNS = {"grpo": 3e-2, "dpo": 1e-3, "kto": 1e-3, "reward": 1e-3, "sft": 1e-3}
CANNOT_LEARN = 1e-7
# Only what the judgement and the guard read is kept, so the file stays small.
KEPT = ("step", "loss", "reward", "grad_norm", "frac_reward_zero_std")
OUT = Path(__file__).with_name("histories.json")


def params(trainer: str, learning_rate: float) -> dict:
    base = {"precision": "fp32", "learning_rate": learning_rate, "per_device_train_batch_size": 8,
            "lr_scheduler_type": "constant", "warmup_steps": 0}
    if trainer == "grpo":
        base.update(num_generations=4, max_completion_length=12, temperature=1.0)
    else:
        base.update(max_length=64)
    return base


def main(argv=None) -> None:
    from tuner.trial import TrialSpec, run_trial

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--max-steps", type=int, default=20, help="the default search's trial length")
    parser.add_argument("--trainers", nargs="+", default=list(LEARNS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    records = []
    for trainer in args.trainers:
        for kind, learning_rate in (("cannot_learn", CANNOT_LEARN), ("learns", LEARNS[trainer])):
            for seed in range(args.seeds):
                started = time.perf_counter()
                spec = TrialSpec(trainer=trainer, params=params(trainer, learning_rate), max_steps=args.max_steps,
                                 seed=seed)
                result = run_trial(spec)
                history = [{k: row[k] for k in KEPT if k in row} for row in result.history]
                records.append({"trainer": trainer, "kind": kind, "seed": seed, "params": spec.params,
                                "status": result.status, "history": history})
                print(f"{trainer:6} {kind:12} seed {seed:2}: {result.status:9} progress "
                      f"{result.progress if result.progress is None else round(result.progress, 3)} "
                      f"p={result.progress_p_value} learned={result.learned} ({time.perf_counter() - started:.1f}s)",
                      flush=True)
    args.out.write_text(json.dumps({"max_steps": args.max_steps, "trials": records}, indent=0, allow_nan=True) + "\n")
    print(f"wrote {len(records)} histories to {args.out}")


if __name__ == "__main__":
    main()
