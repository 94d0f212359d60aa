"""The anchor: what a user writes today to search a TRL trainer's config, Ray Tune + OptunaSearch (TPE) + ASHA.

    python -m bench.headline.anchor_asha --out anchor.json --trainer reward --seed 0 --trials 12 --max-steps 20

A hand-written ``tune.Tuner``: ``OptunaSearch`` (Optuna's TPE, seeded with ``--seed``, as tuner's sampler is)
over the trainer's shipped search space (search_spaces/<trainer>.yaml, sampled through the space's own
define-by-run ``suggest``, less the precisions this machine cannot run, as tuner drops them), ``ASHAScheduler``,
``--trials`` trials of ``--max-steps`` optimizer steps, plain TRL trainers with their defaults on tuner's tiny
model and built-in data (GRPO: tuner's built-in reward). Each trial reports its logged metric to Tune every
step (reward models: ``loss``, min; GRPO: ``reward``, max); the pick is the best trial by that metric at its
last report. Then, as a careful user would before training with it, the pick is run on 2 more seeds
(``--seed`` + 1, + 2; tuner's confirmation seeds) in a second Tune run; the time measured ends there.

No guard: Trainer's defaults are kept, ``logging_nan_inf_filter=True`` above all, which logs a NaN loss as the
running mean (0.0 when logging every step). The settings changed from TRL's defaults, each for a reason a user
would share:

- ``logging_steps=1``: ASHA needs a report per step to act within 20 steps (TRL's default is 10);
- ``save_strategy="no"``, ``report_to="none"``: no checkpoints, the user reports to Tune by the callback;
- ``seed``: the trial's seed (TRL's default is 42 for every trial), and ``transformers.set_seed`` before the
  model is built, so a reward model's new score head is the same for the same seed, as in tuner's trials;
- ``use_cpu=True`` on a machine without CUDA, as TRL's error message tells users to set;
- the space's params: ``precision`` as the weights' dtype plus TRL's ``bf16``/``fp16`` autocast flags,
  ``use_peft``/``lora_*`` as a PEFT ``LoraConfig``, every other param as the TRL config field of that name.

Ray is started with the same ``ray.init`` arguments tuner uses (this machine's CPUs, 1 CPU per trial, so as many
trials at a time as tuner runs); everything else is Tune's defaults (a fresh worker process per trial).
Each trial appends its log rows to a JSONL file before reporting them, so the per-step history survives ASHA
stopping the trial; the driver reads those files afterwards and judges each run from them (``judge_run``).
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

from bench.headline.history import first_nonfinite_step, last_value, wasted_steps
from tuner.config.trainers import adapter

# The metric each trainer's user watches: what TRL logs as the training objective.
METRIC = {"grpo": ("reward", "max")}
DEFAULT_METRIC = ("loss", "min")
CONFIRM_SEEDS = 2
# precision -> (weights dtype, bf16 autocast, fp16 autocast): what the space's precision names mean in TRL terms
PRECISION = {"fp32": ("float32", False, False), "bf16-mixed": ("float32", True, False),
             "fp16-mixed": ("float32", False, True), "bf16-pure": ("bfloat16", False, False),
             "fp16-pure": ("float16", False, False)}
LORA_TASK = {"reward": "SEQ_CLS"}  # every other trainer here is a causal LM


def metric_of(trainer: str) -> tuple[str, str]:
    return METRIC.get(trainer, DEFAULT_METRIC)


def grace_period(max_steps: int) -> int:
    # ASHA's first rung a quarter of the way in: early enough to save time, late enough that the loss moved
    return max(1, max_steps // 4)


def train(config: dict[str, Any], run: dict[str, Any]) -> None:
    """The Tune trainable: one plain TRL run, reporting each logged step to Tune."""
    started = time.time()  # before the heavy imports: a fresh Tune worker pays for them per trial
    import torch
    import trl
    from ray import tune
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
        set_seed,
    )

    from tuner.inputs.data import builtin_dataset
    from tuner.inputs.rewards import builtin_reward

    trainer_name, metric = run["trainer"], metric_of(run["trainer"])[0]
    params = dict(config)
    seed = int(params.pop("seed", run["seed"]))
    log_path = Path(run["log_dir"]) / f"{tune.get_context().get_trial_id()}.jsonl"

    class ReportToTune(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:  # the end-of-training summary has train_loss instead
                return
            row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                   "time": time.time(), "trainable_started": started}
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            tune.report({metric: logs.get(metric, math.nan), "step": state.global_step})

    dtype, bf16, fp16 = PRECISION[params.pop("precision", "fp32")]
    use_peft = bool(params.pop("use_peft", False))
    lora = {k: params.pop(k) for k in list(params) if k.startswith("lora_")}
    args = getattr(trl, {"reward": "RewardConfig", "grpo": "GRPOConfig"}[trainer_name])(
        output_dir=tempfile.mkdtemp(prefix="anchor-"), max_steps=run["max_steps"], seed=seed,
        logging_steps=1, save_strategy="no", report_to="none", bf16=bf16, fp16=fp16,
        use_cpu=not torch.cuda.is_available(), **params)
    set_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(run["model_path"])
    if trainer_name == "reward":
        model = AutoModelForSequenceClassification.from_pretrained(run["model_path"], num_labels=1,
                                                                   dtype=getattr(torch, dtype))
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        model = AutoModelForCausalLM.from_pretrained(run["model_path"], dtype=getattr(torch, dtype))
    peft_config = None
    if use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type=LORA_TASK.get(trainer_name, "CAUSAL_LM"), r=lora.get("lora_r", 16),
                                 lora_alpha=lora.get("lora_alpha", 32), lora_dropout=lora.get("lora_dropout", 0.05),
                                 target_modules=lora.get("lora_target_modules", "all-linear"))
    kwargs = {"reward_funcs": [builtin_reward]} if trainer_name == "grpo" else {}
    trainer = getattr(trl, {"reward": "RewardTrainer", "grpo": "GRPOTrainer"}[trainer_name])(
        model=model, args=args, train_dataset=builtin_dataset(adapter(trainer_name)), processing_class=tokenizer,
        peft_config=peft_config, callbacks=[ReportToTune()], **kwargs)
    trainer.train()


class DefineByRun:
    """OptunaSearch's define-by-run space: the shipped space's params (fixed ones included), sampled on the trial
    Tune hands over. The returned values replace the captured ones, so a choice such as [q_proj, v_proj] arrives
    as the list it is. A class, not a closure: Tune pickles the searcher with its space."""

    def __init__(self, space, seed: int):
        self.space, self.seed = space, seed

    def __call__(self, trial) -> dict[str, Any]:
        return {**self.space.suggest(trial), "seed": self.seed}


def ray_init_kwargs() -> dict[str, Any]:
    # The same as tuner.search._execution.init_ray for a local run, so the two sides get the same cluster.
    return dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=os.cpu_count())


def judge_run(trainer: str, history: list[dict[str, Any]], error: str | None, max_steps: int) -> dict[str, Any]:
    """A run's status from its own logs: ``diverged`` at the first non-finite loss or grad_norm (what the
    anchor's own results show; TRL's filter hides a NaN loss, its grad_norm does not), ``crashed`` when the
    trial raised (GRPO sampling from NaN probabilities raises), ``stopped`` when ASHA cut it, else ``ok``.
    ``learned``: tuner's learning test on the run's logged metric, shown beside the status, not part of it."""
    from tuner.verdicts.learning import judge_learning

    first = first_nonfinite_step(history)
    steps = len(history)
    if error:
        status = "crashed"
    elif first is not None:
        status = "diverged"
    elif steps < max_steps:
        status = "stopped"
    else:
        status = "ok"
    learning = judge_learning(adapter(trainer), history) if history else None
    return {"status": status, "steps_run": steps, "first_nonfinite_step": first,
            "wasted_steps": wasted_steps(history, steps), "error": error,
            "learned": bool(learning and learning.learned), "progress": learning.effect if learning else None,
            "last_metric": last_value(history, metric_of(trainer)[0]), "last_grad_norm": last_value(history, "grad_norm"),
            "seconds_to_first_step": history[0]["time"] - history[0]["trainable_started"] if history else None}


def _records(results, trainer: str, log_dir: Path, max_steps: int) -> list[dict[str, Any]]:
    records = []
    for result in results:
        trial_id = (result.metrics or {}).get("trial_id")  # none: the trial raised before its first report
        path = log_dir / f"{trial_id}.jsonl"
        history = [json.loads(line) for line in path.read_text().splitlines()] if trial_id and path.exists() else []
        error = None if result.error is None else f"{type(result.error).__name__}: {str(result.error)[:300]}"
        params = {k: v for k, v in result.config.items() if k != "seed"}
        records.append({"trial_id": trial_id, "params": params, "seed": result.config.get("seed"),
                        **judge_run(trainer, history, error, max_steps), "history": history})
    return records


def _tokens_per_second(record: dict[str, Any]) -> float | None:
    from tuner.trial.measure import samples_per_step, throughput

    times = [(int(r["step"]), float(r["time"])) for r in record["history"] if "time" in r]
    return throughput(record["history"], times, 2, samples_per_step(record["params"]))[0]


def run_anchor(trainer: str = "reward", seed: int = 0, trials: int = 12, max_steps: int = 20,
               workdir: str | None = None, confirm_seeds: int = CONFIRM_SEEDS) -> dict[str, Any]:
    """The search, the pick, its confirmation runs; the time from ray.init to the last confirmation run."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from bench.headline.reference import shipped_space
    from tuner.inputs.models import resolve_model

    workdir = Path(workdir or tempfile.mkdtemp(prefix="bench-anchor-"))
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    space = shipped_space(trainer)
    metric, mode = metric_of(trainer)
    run = {"trainer": trainer, "model_path": resolve_model("tiny"), "max_steps": max_steps, "seed": seed,
           "log_dir": str(log_dir)}

    started = time.perf_counter()
    ray.init(**ray_init_kwargs())
    try:
        searcher = OptunaSearch(space=DefineByRun(space, seed), metric=metric, mode=mode, seed=seed)
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=max_steps, grace_period=grace_period(max_steps))
        results = tune.Tuner(
            tune.with_parameters(train, run=run),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=trials,
                                        metric=metric, mode=mode),
            run_config=tune.RunConfig(name="anchor", storage_path=str(workdir / "ray"), verbose=0),
        ).fit()
        search_seconds = time.perf_counter() - started
        try:
            best = results.get_best_result(metric=metric, mode=mode, scope="last")
        except RuntimeError:  # no trial reported a finite metric: nothing to pick
            best = None
        confirmations = None
        if best is not None and confirm_seeds:
            picked = {k: v for k, v in best.config.items() if k != "seed"}
            confirmations = tune.Tuner(
                tune.with_parameters(train, run=run),
                param_space={**picked, "seed": tune.grid_search([seed + i for i in range(1, confirm_seeds + 1)])},
                run_config=tune.RunConfig(name="anchor-confirm", storage_path=str(workdir / "ray"), verbose=0),
            ).fit()
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()

    trials_run = _records(results, trainer, log_dir, max_steps)
    pick = None
    if best is not None:
        best_id = best.metrics.get("trial_id")
        pick = next((t for t in trials_run if t["trial_id"] == best_id), None)
    confirmation_runs = _records(confirmations, trainer, log_dir, max_steps) if confirmations is not None else []
    for record in [*trials_run, *confirmation_runs]:
        record["tokens_per_second"] = _tokens_per_second(record)
    return {"side": "anchor", "trainer": trainer, "seed": seed, "trials": trials, "max_steps": max_steps,
            "metric": metric, "mode": mode, "grace_period": grace_period(max_steps), "seconds": seconds,
            "search_seconds": search_seconds, "records": trials_run,
            "pick": None if pick is None else {"trial_id": pick["trial_id"], "params": pick["params"]},
            "confirmations": confirmation_runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="write the records here (JSON)")
    parser.add_argument("--trainer", default="reward", choices=("reward", "grpo"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--confirm-seeds", type=int, default=CONFIRM_SEEDS)
    parser.add_argument("--workdir", default=None, help="Ray storage and trial logs (default: a new temp dir)")
    args = parser.parse_args(argv)
    outcome = run_anchor(args.trainer, args.seed, args.trials, args.max_steps, args.workdir, args.confirm_seeds)
    Path(args.out).write_text(json.dumps(outcome, indent=1, default=str))
    print(f"anchor: picked {outcome['pick']} in {outcome['seconds']:.1f}s")


if __name__ == "__main__":
    main()
