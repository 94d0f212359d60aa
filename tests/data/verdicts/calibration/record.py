"""Record the real tiny-model trial histories that calibrate the learning judgement (tuner.verdicts.learning).

    python -m tests.data.verdicts.calibration.record         # every trainer and kind: ~8 min on 2 cores
    python -m tests.data.verdicts.calibration.record --trainers grpo --kinds fast_solver --seeds 3 --out /tmp/probe.json

(from the repository's root; it writes histories.json beside itself, the data tests/unit/verdicts reads.)

Four kinds of trial per trainer, on the embedded tiny model and built-in data (fp32, batch 8, 20 steps, a
constant learning rate unless the kind says otherwise), each made by its settings in KINDS:

- ``cannot_learn``: learning rate 1e-7. The weights move, too little to change the loss or reward in 20 steps:
  any trend the judgement sees there is noise from batches and sampling. Should be judged learned in <= 5%.
- ``fast_solver``: a learning rate at which the metric reaches its ceiling or floor early: GRPO's reward 1.0
  by step 3-10, the losses most of the way to their floor within the first 3-6 steps, flat after that.
- ``slow_learner``: a learning rate at which the metric improves steadily but modestly all along.
  Both learning kinds should be judged learned in >= 95%.
- ``regresses``: learns, then falls back to about its starting level by the end (its last third no better than
  its start), so it should not be judged learned. Made by what makes real trials do it: GRPO with a strong KL
  penalty (``beta`` 1: as the reward rises the penalty pulls the policy back to the reference model); SFT with a
  learning rate that ramps up over the whole trial (warm-up of 20 steps) to a peak too high to keep (0.8): it
  learns while the rate is small and loses it when it is large. Left out where no setting did it reliably in 20
  steps: DPO and the reward model (their loss falls to ~0 at any rate that learns, where the gradient vanishes and
  nothing brings it back: ramps to 1-10 stay at 0, weight decay only slows them, higher rates make the reward
  model diverge) and KTO (ramps to 0.6-1.0: about half the seeds regress, the rest keep most of what they
  learned or collapse, which the guard stops).

KTO computes its KL term from a precomputed, sequential pass over the data (TRL 1.16 requires
``train_sampling_strategy="sequential"``), so its batches do not depend on the seed and every seed of the
built-in data trains the same trial. Each KTO seed here therefore trains on the built-in rows drawn with that
seed (``tuner.inputs.data.builtin_dataset(adapter("kto"), seed=seed)``), which gives independent trials.

Only trials that ended ``ok`` are kept (the guard stops some that diverge or collapse; the search never judges
those for learning); how many were dropped per kind is printed and stored.
tests/unit/verdicts/test_learning_calibration.py replays the kept ones through judge_learning and measures both error
rates per trainer and kind.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections import Counter
from pathlib import Path

from tuner.config.trainers import adapter

CANNOT_LEARN = 1e-7
# The learning rate ramps from 0 to its peak over the whole trial: small while the trial learns, too high by the end.
RAMP = {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 20}
# Each kind's settings over the base params (fp32, batch 8, constant learning rate), chosen by short experiments
# on this model (20 steps); the comment says what the kind's trials do there.
KINDS: dict[str, dict[str, dict]] = {
    "grpo": {
        "cannot_learn": {"learning_rate": CANNOT_LEARN},
        "fast_solver": {"learning_rate": 0.2},  # reward ~0.3 -> 1.0 by step 3-10 (median 5), held there
        "slow_learner": {"learning_rate": 0.02},  # ~0.3 rising all along: 1.0 at step 13-20 or not at all
        "regresses": {"learning_rate": 0.2, "beta": 1.0},  # +0.1-0.45 mid-trial, back to ~its start (~0.3) by the end
    },
    "dpo": {
        "cannot_learn": {"learning_rate": CANNOT_LEARN},
        "fast_solver": {"learning_rate": 0.1},  # loss 0.69 -> < 0.03 by step 4, ~0 after
        "slow_learner": {"learning_rate": 1e-4},  # 0.69 -> 0.55, a little each step
    },
    "kto": {
        "cannot_learn": {"learning_rate": CANNOT_LEARN},
        "fast_solver": {"learning_rate": 0.1},  # 0.5 -> ~0.15 by step 3-5, ~0.06 at the end
        "slow_learner": {"learning_rate": 3e-4},  # 0.5 -> 0.435, a little each step
    },
    "reward": {
        "cannot_learn": {"learning_rate": CANNOT_LEARN},
        "fast_solver": {"learning_rate": 0.01},  # 0.69 -> < 0.05 by step 5-6, ~0 after (with single-step blips)
        "slow_learner": {"learning_rate": 3e-5},  # 0.69 -> 0.54, a little each step
    },
    "sft": {
        "cannot_learn": {"learning_rate": CANNOT_LEARN},
        "fast_solver": {"learning_rate": 0.03},  # 6.0 -> < 4.0 by step 4-7 (the data's floor is ~3), ~3.1 at the end
        "slow_learner": {"learning_rate": 1e-4},  # 6.0 -> 5.75, a little each step
        "regresses": {"learning_rate": 0.8, **RAMP},  # 6.0 -> ~4.2 at step 4, back to 5-9 (median 6.5) by the end
    },
}
# Seeds per kind: one trial moves a rate by 2.5% at 40, so the 5% bounds are measured, not rounded to.
SEEDS = {"cannot_learn": 40, "fast_solver": 40, "slow_learner": 40, "regresses": 40}
# What the judgement (tuner.verdicts.learning) and the guard (tuner.verdicts.guard) read, so the file stays small.
KEPT = ("step", "loss", "reward", "reward_std", "reward_groups", "grad_norm", "learning_rate", "frac_reward_zero_std",
        "params_changed")
OUT = Path(__file__).with_name("histories.json")


def params(trainer: str, learning_rate: float) -> dict:
    base = {"precision": "fp32", "learning_rate": learning_rate, "per_device_train_batch_size": 8,
            "lr_scheduler_type": "constant", "warmup_steps": 0}
    if trainer == "grpo":
        base.update(num_generations=4, max_completion_length=12, temperature=1.0)
    else:
        base.update(max_length=64)
    return base


def kind_params(trainer: str, kind: str) -> dict:
    settings = dict(KINDS[trainer][kind])
    return {**params(trainer, settings.pop("learning_rate")), **settings}


def _compact(value):
    """8 significant digits: the logged values are float32, so nothing is lost, and the file stays small."""
    return float(f"{value:.8g}") if isinstance(value, float) and math.isfinite(value) else value


def main(argv=None) -> None:
    import torch

    from tuner.inputs.data import builtin_dataset
    from tuner.trial import TrialSpec, run_trial

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=None, help="seeds per kind (default: SEEDS)")
    parser.add_argument("--max-steps", type=int, default=20, help="the default search's trial length")
    parser.add_argument("--trainers", nargs="+", default=list(KINDS))
    parser.add_argument("--kinds", nargs="+", default=list(SEEDS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    # One thread: the tiny model's steps are too small to share, and on a busy machine threads waiting for each
    # other make a trial 5-10x slower.
    torch.set_num_threads(1)
    began = time.perf_counter()
    records, dropped, counts = [], Counter(), Counter()
    with tempfile.TemporaryDirectory(prefix="tuner-calibration-") as scratch:
        for trainer in args.trainers:
            for kind in [k for k in args.kinds if k in KINDS[trainer]]:
                for seed in range(args.seeds if args.seeds is not None else SEEDS[kind]):
                    started = time.perf_counter()
                    dataset = None
                    if trainer == "kto":  # see the docstring: KTO's batches do not depend on the seed
                        dataset = f"{scratch}/kto-{seed}.jsonl"
                        if not Path(dataset).exists():
                            builtin_dataset(adapter("kto"), seed=seed).to_json(dataset)
                    spec = TrialSpec(trainer=trainer, params=kind_params(trainer, kind), max_steps=args.max_steps,
                                     seed=seed, dataset=dataset)
                    result = run_trial(spec)
                    counts[trainer, kind] += 1
                    p_value = result.progress_p_value
                    print(f"{trainer:6} {kind:12} seed {seed:2}: {result.status:9} progress "
                          f"{result.progress if result.progress is None else round(result.progress, 3)} "
                          f"p={p_value if p_value is None else float(f'{p_value:.2g}')} learned={result.learned} "
                          f"({time.perf_counter() - started:.1f}s)", flush=True)
                    if result.status != "ok":
                        dropped[trainer, kind] += 1
                        continue
                    history = [{k: _compact(row[k]) for k in KEPT if k in row} for row in result.history]
                    records.append({"trainer": trainer, "kind": kind, "seed": seed, "params": spec.params,
                                    "data_seed": seed if dataset else 0, "tokens_per_second":
                                    _compact(result.tokens_per_second), "history": history})
    minutes = (time.perf_counter() - began) / 60
    summary = {f"{t}/{k}": {"run": n, "dropped": dropped[t, k]} for (t, k), n in counts.items()}
    args.out.write_text(json.dumps({"max_steps": args.max_steps, "recorded": summary, "minutes": round(minutes, 1),
                                    "trials": records}, indent=0, allow_nan=True) + "\n")
    for key, value in summary.items():
        print(f"{key:20} kept {value['run'] - value['dropped']:2}/{value['run']} (dropped {value['dropped']})")
    print(f"wrote {len(records)} histories to {args.out} in {minutes:.1f} min")


if __name__ == "__main__":
    main()
