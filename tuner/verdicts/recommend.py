"""Choose the recommended config and write it as a YAML that TRL's own CLI accepts unchanged.

The objective: **learning speed = progress x tokens/s**, the learning effect of the trial (its mean
improvement per step over its starting level: reward units for GRPO, a fraction of the starting loss
for the others; tuner.verdicts.learning) times its measured training throughput: of two trials at the same
tokens/s, the one that got to the same level sooner scores higher. Only trials that stayed ``ok`` and
learned (the last third significantly better than the start, tuner.verdicts.learning) score;
the same number is told to Optuna, so the sampler optimises what is recommended. If no trial
qualifies, nothing is recommended and the most common failure reasons are shown instead.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tuner.config.precision import PRECISIONS
from tuner.config.trainers import Adapter, lora_config_kwargs, split_params
from tuner.errors import TunerError
from tuner.records import Status, TrialRecord, is_ok
from tuner.verdicts.forecast import VERIFY_FACTOR, said  # VERIFY_FACTOR: the length the horizon line asks to verify
from tuner.verdicts.learning import ALPHA, MIN_EFFECT

# A config the forecast puts at risk (tuner.verdicts.forecast) is recommended only when no config without risk
# learns at least this share as fast ...
SAFE_SHARE = 0.9
# ... or, when its failure is projected at a step of the run the forecast looked to, its share of that run: the
# steps it is expected to learn for, up to PROJECTED_EARLY x the projected step (on bench/horizon/horizon.py's records the
# projections came 1-4x early; GRPO's reward-spread ones on the tiny pretrained model 5-14x). A GRPO config projected
# to lose its reward spread near step 103 of a 1,500-step run counts for 0.14 of its speed: its anchored twin
# (tuner.search._anchor), which pays ~20% of tokens/s for the reference model and held those 1,500 steps, goes first.
PROJECTED_EARLY = 2

RULE = (f"highest learning speed (progress x tokens/s; progress: the improvement over the trial's starting level, "
        f"averaged over its steps) among trials that stayed ok and learned (the last third better than the start with "
        f"one-sided p < {ALPHA:g}, by at least {MIN_EFFECT:g}), confirmed ok on every confirmation seed and "
        f"learning on them (each progress > 0, together p < {ALPHA:g}); diverged, collapsed, crashed and oom trials "
        f"are never recommended; a trial the forecast puts at risk (on its own seed or a confirmation's) only when "
        f"no trial without risk learns {SAFE_SHARE:g}x as fast, or {PROJECTED_EARLY:g}x its projected failure step's "
        f"share of the run the forecast looked to, when that is less")


def horizon(best: TrialRecord, file: str = "recommended.yaml") -> str:
    """What a recommendation's verdict covers, and the command that extends it: "held 20 steps on seeds 0, 1, 2
    (...); forecast: no risk signal projects a failure through step 500; nothing is measured beyond step 20: tuner verify
    recommended.yaml --steps 500 before a long run"."""
    steps = int(best.get("steps_run") or best.get("max_steps") or 0)
    seeds = {best.get("seed"), *((best.get("confirmation") or {}).get("seeds") or [])} - {None}
    on = f" on seed{'s' if len(seeds) != 1 else ''} {', '.join(str(s) for s in sorted(seeds))}" if seeds else ""
    # a risk rung (tuner.search._extend) ran the first steps of a longer run, which its forecast looked to
    long = int(best.get("schedule_steps") or VERIFY_FACTOR * steps)
    of = f" of a {long}-step run's schedule" if best.get("schedule_steps") else ""
    forecast = said(str(best.get("risk") or "")) or f"no risk signal projects a failure through step {long}"
    return (f"horizon: held {steps} steps{of}{on}; forecast: {forecast}; nothing is measured beyond step {steps}: "
            f"tuner verify {file} --steps {long} before a long run")


def learned(trial: Mapping[str, Any]) -> bool:
    """The trial's own learning judgement (tuner.verdicts.learning.judge_learning), as recorded."""
    return bool(trial.get("learned"))


def objective(trial: Mapping[str, Any]) -> float:
    """Learning speed: progress x tokens/s for an ok trial that learned, else 0. A config twice as fast that
    learns half as much per step scores the same: both get as far in the same wall time. ``trial``: a record, or a
    trial's result summary."""
    speed, progress = trial.get("tokens_per_second"), trial.get("progress")
    if not is_ok(trial) or not learned(trial) or not speed or progress is None:
        return 0.0
    return float(progress) * float(speed)


def speed_so_far(trial: Mapping[str, Any]) -> float:
    """The objective without its gate, for a trial still running (successive halving compares trials by it at
    the same step): progress x tokens/s, negative when the metric got worse; 0 before both are measured."""
    speed, progress = trial.get("tokens_per_second"), trial.get("progress")
    if not speed or progress is None:
        return 0.0
    return float(progress) * float(speed)


def at_risk(trial: Mapping[str, Any]) -> bool:
    return bool(trial.get("risk"))


def risk_weight(trial: Mapping[str, Any]) -> float:
    """What an at-risk trial's learning speed counts for against a safe trial's: SAFE_SHARE, or the share of the run
    its forecast looked to (``schedule_steps``, else VERIFY_FACTOR x its steps) that it is expected to learn for,
    PROJECTED_EARLY x its projected failure step, when that is less; 1.0 for a trial without risk."""
    if not at_risk(trial):
        return 1.0
    step, steps = trial.get("risk_step"), int(trial.get("max_steps") or 0)
    run = int(trial.get("schedule_steps") or VERIFY_FACTOR * steps)
    if not step or run <= 0:
        return SAFE_SHARE  # a level (float16 weights, activations near the top): no step projected
    return min(SAFE_SHARE, PROJECTED_EARLY * float(step) / run)


def ranked(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The trials that qualify (objective > 0), best first: by learning speed, except that a trial at risk goes
    behind every trial without risk that learns at least its ``risk_weight`` (SAFE_SHARE or less) as fast; a trial
    whose longer rung
    (tuner.search._extend) failed does not qualify, nor does that rung."""
    failed_longer = {t.get("extends") for t in trials if t.get("extends") is not None and not is_ok(t)}
    candidates = [t for t in trials if objective(t) > 0 and t.get("number") not in failed_longer]
    return sorted(candidates, key=lambda t: (objective(t) * risk_weight(t), not at_risk(t)),
                  reverse=True)


def recommend(trials: list[TrialRecord]) -> TrialRecord | None:
    """The best trial record (``status``, ``params``, ``tokens_per_second``, ``progress`` ...), or None."""
    order = ranked(trials)
    return order[0] if order else None


def failure_summary(trials: list[TrialRecord], top: int = 3, longer: Sequence[TrialRecord] = ()) -> str:
    """Why nothing qualified: counts per status and the most common reasons; ``longer``: the longer rungs
    (tuner.search._extend), whose failure takes a trial that was ok and learning out of the running."""
    statuses = collections.Counter(t.get("status") for t in trials)
    not_learning = sum(1 for t in trials if is_ok(t) and not learned(t))
    reasons = collections.Counter(
        (t.get("guard_signal") or t.get("status"), _reason_kind(t)) for t in trials if not is_ok(t))
    lines = [f"No stable config that learns found in {len(trials)} trials: "
             + ", ".join(f"{n} {s}" for s, n in statuses.most_common())
             + (f" ({not_learning} ok but not significantly better than at their start)" if not_learning else "") + "."]
    for (signal, example), n in reasons.most_common(top):
        lines.append(f"  {n} x {signal}: e.g. {example}")
    for rung in (r for r in longer if not is_ok(r) and r.get("extends") is not None):
        lines.append(f"  trial {rung.get('extends')} was ok but failed on its run of {rung.get('max_steps')} steps: "
                     f"{rung.get('status')} ({rung.get('reason') or 'no reason given'})")
    causes = collections.Counter(t.get("guard_signal") or t.get("status") for t in trials if not is_ok(t))
    causes.update({"not_learning": not_learning} if not_learning else {})
    advice = [ADVICE[cause] for cause, _ in causes.most_common() if cause in ADVICE]
    for line in dict.fromkeys(advice):  # the most common cause's advice first, each once
        lines.append(f"Advice: {line}")
    return "\n".join(lines)


# What to change, per failure cause: advice follows from what the trials showed, never a generic guess.
ADVICE = {
    "non_finite": "numbers went NaN/inf: search lower learning rates, or fp32/bf16 instead of fp16 weights",
    "loss_explosion": "the loss blew up: search lower learning rates or a smaller max_grad_norm",
    "grad_explosion": "gradients blew up: search lower learning rates or a smaller max_grad_norm",
    "skipped_steps": "fp16 gradients overflow every step: use bf16 or fp32",
    "loss_scale_collapse": "the fp16 GradScaler collapsed: use bf16 or fp32",
    "zero_grad": "no gradient reaches the trainable weights: check which parameters are trainable (LoRA targets)",
    "zero_reward_std": ("every completion of a group got the same reward and it never rose: the reward gives GRPO no "
                        "signal on this data; check the reward function on a few completions, or raise temperature / "
                        "num_generations"),
    "no_update": ("the optimizer moves no weight: updates are below bf16/fp16 weight precision (search higher "
                  "learning rates or fp32/-mixed precision) or LoRA targets match no layer"),
    "process_died": "trial processes died: see the crash reasons with tuner report (they rarely depend on the config)",
    Status.CRASHED: "trials raised errors: see the crash reasons with tuner report (they rarely depend on the config)",
    Status.OOM: "out of memory: search smaller per_device_train_batch_size, activation_checkpointing on, or LoRA",
    Status.TOO_BIG: ("configs too big for this machine were not run (the memory plan): narrow the space to LoRA, "
                     "smaller per_device_train_batch_size or activation_checkpointing on, or use a bigger GPU"),
    Status.INVALID: "TRL rejected the combinations: see the reasons above and narrow the space",
    "not_learning": "stable trials did not learn within the step budget: search higher learning rates or raise --max-steps",
}


def _reason_kind(trial: TrialRecord) -> str:
    return (trial.get("reason") or "").split(" at step")[0][:120]


def trl_config(entry: Adapter, params: dict[str, Any], model: str, *, reward_funcs: list[str] | None = None,
               dataset: str | None = None) -> dict[str, Any]:
    """TRL CLI config: TrainingArguments/trainer-config fields plus ModelConfig (+ script) fields. Never
    ``use_cpu``: the file is for the machine the user trains on (tuner.report.export decides what else is left out)."""
    split = split_params(params)
    config: dict[str, Any] = {"model_name_or_path": model}
    if dataset:
        config["dataset_name"] = dataset
    config["dtype"] = PRECISIONS[split.precision].weight_dtype
    if split.use_peft:
        lora = lora_config_kwargs(entry, split.lora)
        config.update(use_peft=True, lora_r=lora["r"], lora_alpha=lora["lora_alpha"],
                      lora_dropout=lora["lora_dropout"], lora_task_type=lora["task_type"])
        targets = lora["target_modules"]
        config["lora_target_modules"] = [targets] if isinstance(targets, str) else list(targets)
    # Both flags, always: TRL's configs turn bf16 on when it is left out, so an fp32 or "-pure"
    # export would otherwise train under bf16 autocast, which is not the run tuner measured.
    config.update(PRECISIONS[split.precision].flags)
    config.update(split.config)
    # tuner measured with the nan/inf filter off; keep it off so a NaN loss stays visible.
    config["logging_nan_inf_filter"] = False
    if entry.uses_reward_funcs:
        config["reward_funcs"] = list(reward_funcs or ["tuner.inputs.rewards.builtin_reward"])
    return {k: v for k, v in config.items() if v is not None}


def render(config: dict[str, Any], fmt: str, header: str = "") -> str:
    if fmt == "json":
        return json.dumps(config, indent=2) + "\n"
    if fmt != "yaml":
        raise TunerError(f"unknown export format {fmt!r}; choose yaml or json")
    comment = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return comment + yaml.safe_dump(config, sort_keys=False)
