"""The anchor: what users write today to sweep a reward model, plain Ray Tune + ASHA.

    python -m bench.anchor_asha --out anchor.json [--max-steps 20]

Grid {float16, bfloat16, float32 weights} x {learning rate 1e-4, 0.3}; TRL's RewardTrainer at
batch 8 on tuner's tiny model and built-in preference pairs. A TrainerCallback reports
``{"loss", "grad_norm"}`` to Tune at every logged step; ASHA (metric "loss", mode "min") cuts
trials at its rungs; the pick is the trial with the lowest last reported loss.

Trainer defaults are kept, ``logging_nan_inf_filter=True`` above all: that is what users have,
and it rewrites a NaN loss as the running mean (0.0 when logging every step). The few settings
changed from the defaults, each for a reason a user would share:

- ``logging_steps=1``: ASHA needs a report per step to act within 20 steps (TRL's default is 10).
- ``save_strategy="no"``: no checkpoint at the end; tuner writes none, and timing is about search.
- ``report_to="none"``: the user reports to Tune by the callback.
- ``max_length=64``: the same as tuner's grid space (bench/grid.yaml); the pairs are shorter anyway.
- ``bf16=False``: TRL turns bf16 autocast on by default; the grid's precision is the weights' dtype
  alone, as in tuner's ``fp16-pure``/``bf16-pure``/``fp32``. (Left on, a CPU run stops with "Your
  setup doesn't support bf16/gpu".)
- ``use_cpu=True`` on a machine without CUDA, as that same error message tells users to set.

Ray is started with the same ``ray.init`` arguments tuner uses, so both sides get the same
cluster (2 CPUs here, 1 CPU per trial, so 2 trials at a time); everything else is Tune's defaults
(a fresh worker process per trial, ``reuse_actors=False``).

Each trial also appends its log rows to a JSONL file, before reporting them, so the per-step
history survives ASHA stopping the trial; the driver reads those files afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.history import first_nonfinite_step, last_value, wasted_steps

DTYPES = ("float16", "bfloat16", "float32")
LEARNING_RATES = (1e-4, 0.3)
# tuner's precision names for the same weight dtypes (bench/grid.yaml)
PRECISION_OF_DTYPE = {"float16": "fp16-pure", "bfloat16": "bf16-pure", "float32": "fp32"}
GRACE_PERIOD = 2  # ASHA's first rung: small, so it can act inside a 20-step trial
BATCH_SIZE = 8


def train_reward_model(config: dict[str, Any]) -> None:
    """The Tune trainable: one RewardTrainer run, reporting each logged step to Tune."""
    started = time.time()  # before the heavy imports: a fresh Tune worker pays for them per trial
    import torch
    from ray import tune
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import RewardConfig, RewardTrainer

    from tuner.data import builtin_dataset

    class ReportToTune(TrainerCallback):
        def __init__(self, log_path: Path):
            self.log_path = log_path

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:  # the end-of-training summary has train_loss instead
                return
            row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                   "time": time.time(), "trainable_started": started}
            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            tune.report({"loss": logs["loss"], "grad_norm": logs.get("grad_norm", math.nan)})

    path = config["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=getattr(torch, config["dtype"]))
    args = RewardConfig(
        output_dir=tempfile.mkdtemp(prefix="anchor-"),
        per_device_train_batch_size=BATCH_SIZE,
        learning_rate=config["learning_rate"],
        max_steps=config["max_steps"],
        max_length=64,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=not torch.cuda.is_available(),
    )
    log_path = Path(config["log_dir"]) / f"{config['dtype']}-lr{config['learning_rate']:g}.jsonl"
    trainer = RewardTrainer(model=model, args=args, train_dataset=builtin_dataset("reward"),
                            processing_class=tokenizer, callbacks=[ReportToTune(log_path)])
    trainer.train()


def ray_init_kwargs() -> dict[str, Any]:
    # The same as tuner.search._init_ray for a local run, so the two sides get the same cluster.
    return dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=os.cpu_count())


def run_anchor(max_steps: int = 20, workdir: str | None = None, dtypes: tuple[str, ...] = DTYPES) -> dict[str, Any]:
    """Run the sweep; returns per-trial records, the pick, and the time from ray.init to the pick.
    ``dtypes`` narrows the grid (the harness's --quick run uses float16 only)."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from tuner.models import resolve_model

    workdir = Path(workdir or tempfile.mkdtemp(prefix="bench-anchor-"))
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model("tiny")

    started = time.perf_counter()
    ray.init(**ray_init_kwargs())
    try:
        scheduler = ASHAScheduler(metric="loss", mode="min", max_t=max_steps, grace_period=min(GRACE_PERIOD, max_steps))
        tuner = tune.Tuner(
            train_reward_model,
            param_space={
                "dtype": tune.grid_search(list(dtypes)),
                "learning_rate": tune.grid_search(list(LEARNING_RATES)),
                "max_steps": max_steps, "model_path": model_path, "log_dir": str(log_dir),
            },
            tune_config=tune.TuneConfig(scheduler=scheduler),
            run_config=tune.RunConfig(name="anchor", storage_path=str(workdir / "ray"), verbose=0),
        )
        results = tuner.fit()
        best = results.get_best_result(metric="loss", mode="min", scope="last")
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()

    trials = []
    for result in results:
        config = result.config
        log_path = log_dir / f"{config['dtype']}-lr{config['learning_rate']:g}.jsonl"
        history = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
        steps_run = len(history)
        # the log row is written at the end of each optimizer step, as tuner's step times are taken
        to_first_step = history[0]["time"] - history[0]["trainable_started"] if history else None
        trials.append({
            "precision": PRECISION_OF_DTYPE[config["dtype"]], "dtype": config["dtype"],
            "learning_rate": config["learning_rate"], "steps_run": steps_run,
            "stopped_by_asha": result.error is None and steps_run < max_steps,
            "error": None if result.error is None else f"{type(result.error).__name__}: {str(result.error)[:200]}",
            "first_nonfinite_step": first_nonfinite_step(history),
            "wasted_steps": wasted_steps(history, steps_run),
            "last_loss": last_value(history, "loss"), "last_grad_norm": last_value(history, "grad_norm"),
            "seconds_to_first_step": to_first_step,
            "history": history,
        })
    trials.sort(key=lambda t: (DTYPES.index(t["dtype"]), t["learning_rate"]))
    picked = {"precision": PRECISION_OF_DTYPE[best.config["dtype"]], "dtype": best.config["dtype"],
              "learning_rate": best.config["learning_rate"], "last_loss": best.metrics.get("loss")}
    return {"side": "anchor", "seconds": seconds, "max_steps": max_steps, "grace_period": GRACE_PERIOD,
            "trials": trials, "picked": picked}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="write the records here (JSON)")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--workdir", default=None, help="Ray storage and trial logs (default: a new temp dir)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="weight dtypes of the grid, comma-separated")
    args = parser.parse_args(argv)
    dtypes = tuple(args.dtypes.split(","))
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes: unknown dtype {unknown[0]!r}; choose from {', '.join(DTYPES)}")
    outcome = run_anchor(args.max_steps, args.workdir, dtypes)
    Path(args.out).write_text(json.dumps(outcome, indent=1))
    print(f"anchor: picked {outcome['picked']} in {outcome['seconds']:.1f}s")


if __name__ == "__main__":
    main()
