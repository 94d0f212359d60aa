"""bench/RESULTS.md from the raw results of one run: the machine, the versions, then the figures.

Every figure is a count or a ratio measured in the same run; seconds are shown beside their
ratio only so a reader can tell a 2 s difference from a 2 min one.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "ray", "optuna", "mlflow")
BAD_PICK = ("fp16-pure", 0.3)  # the docs/failures.md failure: fp16 weights at learning rate 0.3 go NaN


# -- the machine ----------------------------------------------------------------------------------


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    memory = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA install means no usable GPU here
        gpu = None
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "platform": platform.platform(),
            "python": platform.python_version(), "cpu": cpu, "cpus": os.cpu_count(), "memory": memory, "gpu": gpu,
            "load_before": load_average()}


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["tuner"] = _git_revision()
    return found


def _git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "tuner"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes in tuner/' if dirty else ''}" if head else "unknown"


# -- figures ---------------------------------------------------------------------------------------


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _quantile(values, q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _config(precision: str | None, lr: float | None) -> str:
    return "nothing" if precision is None else f"{precision} lr={lr:g}"


def _is_bad(precision: str | None, lr: float | None) -> bool:
    return (precision, lr) == BAD_PICK


def tuner_trials(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Search trials and confirmation re-runs: every trial tuner ran."""
    return [*run["records"], *run.get("confirmations", [])]


def tuner_pick(run: dict[str, Any]) -> tuple[str | None, float | None]:
    best = run.get("recommended")
    if not best:
        return None, None
    return best["params"].get("precision", "fp32"), best["params"].get("learning_rate")


def guard_status(run: dict[str, Any], precision: str | None, lr: float | None) -> str:
    """What tuner's guard said about a config in the same round (its search trial)."""
    for r in run["records"]:
        if r["params"].get("precision") == precision and r["params"].get("learning_rate") == lr:
            where = f" at step {r['stopped_at_step']}" if r["status"] != "ok" else ""
            learned = "" if r["status"] != "ok" else (" (learned)" if (r.get("progress") or 0) > 0.01 else " (not learning)")
            return f"{r['status']}{where}{learned}"
    return "-"


def grid_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    anchor_wall = [r["anchor"]["process_seconds"] for r in rounds]
    tuner_wall = [r["tuner"]["process_seconds"] for r in rounds]
    anchor_inner = [r["anchor"]["seconds"] for r in rounds]
    tuner_inner = [r["tuner"]["seconds"] for r in rounds]
    plain_wall = [r["tuner_no_confirm"]["process_seconds"] for r in rounds if "tuner_no_confirm" in r]
    summary = {
        "plain_wall": plain_wall, "plain_ratio": _median(plain_wall) / _median(anchor_wall) if plain_wall else None,
        "plain_picks": [tuner_pick(r["tuner_no_confirm"]) for r in rounds if "tuner_no_confirm" in r],
        "anchor_wall": anchor_wall, "tuner_wall": tuner_wall, "anchor_inner": anchor_inner, "tuner_inner": tuner_inner,
        "wall_ratio": _median(tuner_wall) / _median(anchor_wall),
        "inner_ratio": _median(tuner_inner) / _median(anchor_inner),
        "rounds": [],
    }
    for r in rounds:
        a, t = r["anchor"], r["tuner"]
        a_pick = (a["picked"]["precision"], a["picked"]["learning_rate"])
        t_pick = tuner_pick(t)
        t_all = tuner_trials(t)
        summary["rounds"].append({
            "anchor_pick": a_pick, "tuner_pick": t_pick,
            "anchor_pick_guard": guard_status(t, *a_pick),
            "anchor_wasted": sum(x["wasted_steps"] for x in a["trials"]),
            "tuner_wasted": sum(x["wasted_steps"] for x in t_all),
            "anchor_nonfinite": sum(x["first_nonfinite_step"] is not None for x in a["trials"]),
            "tuner_nonfinite": sum(x["first_nonfinite_step"] is not None for x in t_all),
            "anchor_steps": sum(x["steps_run"] for x in a["trials"]),
            "tuner_steps": sum(int(x.get("steps_run") or 0) for x in t_all),
            "anchor_trials": len(a["trials"]), "tuner_trials": len(t["records"]),
            "tuner_confirmations": len(t.get("confirmations", [])),
            "anchor_asha_stopped": sum(bool(x["stopped_by_asha"]) for x in a["trials"]),
            "tuner_stopped": sum(x["status"] != "ok" for x in t_all),
        })
    return summary


def anchor_step_seconds(trial: dict[str, Any], warmup: int = 2) -> float | None:
    """Mean step time after the warm-up steps, from the anchor's log timestamps (tuner's definition)."""
    rows = [r for r in trial["history"] if r["step"] > warmup and "time" in r]
    if len(rows) < 2:
        return None
    return (rows[-1]["time"] - rows[0]["time"]) / (rows[-1]["step"] - rows[0]["step"])


def step_time_ratios(rounds: list[dict[str, Any]]) -> list[float]:
    """tuner's steady-state step time over the anchor's, per config both ran past the warm-up, per round:
    what tuner's per-step work (the guard's callback, unfiltered logging) costs on the same config."""
    ratios = []
    for r in rounds:
        for x in r["anchor"]["trials"]:
            anchor = anchor_step_seconds(x)
            for t in r["tuner"]["records"]:
                same = (t["params"].get("precision"), t["params"].get("learning_rate")) == (x["precision"], x["learning_rate"])
                if same and anchor and t.get("samples_per_second") and (t.get("steps_run") or 0) >= 4:
                    batch = int(t["params"].get("per_device_train_batch_size", 8)) * int(t["params"].get("gradient_accumulation_steps", 1))
                    ratios.append(batch / t["samples_per_second"] / anchor)
    return ratios


def overhead(results: dict[str, Any]) -> dict[str, Any]:
    """Per-trial overhead of tuner's trials (grid rounds and reference searches) and the anchor's."""
    runs = [r[key] for r in results["rounds"] for key in ("tuner", "tuner_no_confirm") if key in r]
    # a quick run's reward reference is round 1's grid search itself: count each search once
    runs += [ref for ref in results["references"].values() if not any(ref["records"] == run["records"] for run in runs)]
    trials = [t for run in runs for t in tuner_trials(run)]
    shares, train_total, wall_total = [], 0.0, 0.0
    for t in trials:
        sps, steps, wall, params = t.get("samples_per_second"), t.get("steps_run") or 0, t.get("wall_seconds"), t.get("params") or {}
        if not sps or steps < 3 or not wall:
            continue
        batch = int(params.get("per_device_train_batch_size", 8)) * int(params.get("gradient_accumulation_steps", 1))
        train = steps * batch / sps  # steady-state step time (after the warm-up steps) x steps run
        shares.append(max(0.0, 1.0 - train / wall))
        train_total += train
        wall_total += wall
    slots = []
    for run in runs:
        inside = sum(t.get("wall_seconds") or 0.0 for t in tuner_trials(run))
        capacity = run["concurrency"] * run["search_wall_seconds"]
        if capacity > 0:
            slots.append(max(0.0, 1.0 - inside / capacity))
    first_tuner = [t.get("seconds_to_first_step") for t in trials]
    first_anchor = [t.get("seconds_to_first_step") for r in results["rounds"] for t in r["anchor"]["trials"]]
    return {
        "trials": len(trials), "timed_trials": len(shares),
        "tuner_first_step_median": _median(first_tuner), "tuner_first_step_p90": _quantile(first_tuner, 0.9),
        "anchor_first_step_median": _median(first_anchor), "anchor_first_step_p90": _quantile(first_anchor, 0.9),
        "anchor_trials": sum(x is not None for x in first_anchor),
        "overhead_share_median": _median(shares), "overhead_share_pooled": 1 - train_total / wall_total if wall_total else None,
        "outside_trial_share_median": _median(slots), "runs": len(slots),
        "step_time_ratio_median": _median(step_time_ratios(results["rounds"])),
        "step_time_pairs": len(step_time_ratios(results["rounds"])),
    }


# -- the Markdown ----------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    m, v, b = results["machine"], results["versions"], results["budget"]
    grid = grid_summary(results["rounds"])
    over = overhead(results)
    n = len(results["rounds"])
    lines = [
        "# Benchmark: tuner vs plain Ray Tune + ASHA",
        "",
        "Written by the harness in bench/ (see bench/README.md); every figure below comes from the one run described here.",
        "",
        f"- command: `{results['command']}`" + (" (quick: a harness check with a tiny budget, not figures to quote)" if results["quick"] else ""),
        f"- date: {m['date']}; total time {results['total_seconds'] / 60:.1f} min",
        f"- machine: {m['cpu']}, {m['cpus']} CPU cores, {m['memory']} memory, {m['platform']}, Python {m['python']}",
        f"- GPU: {m['gpu'] or 'none. The GPU machine was not available to this task: every figure is from the CPU'}",
        f"- load average (1, 5, 15 min) before: {m['load_before']}; after: {results['load_after']}"
        " (the CPU was shared with other work: seconds are noisy, ratios from alternating runs less so)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- budget: {b['max_steps']} optimizer steps per grid trial, {n} alternating round(s) of anchor then tuner; "
        + (f"reference searches of {b['reward_reference_trials']} reward trials of {b['reward_reference_steps']} steps and "
           if b["reward_reference_trials"] else "the grid's trials as the reward reference, a reference search of ")
        + f"{b['grpo_reference_trials']} GRPO trials of {b['grpo_reference_steps']} steps; "
        f"{b['seeds']} seeds x {b['search_budget']} trials per sampler on the lookup",
        "",
        "## Summary",
        "",
        f"The grid is {{{', '.join(b.get('grid_dtypes') or ['float16', 'bfloat16', 'float32'])} weights}} x {{learning rate 1e-4, 0.3}},"
        " RewardTrainer at batch 8 on the tiny model."
        " Anchor: Ray Tune + ASHA (loss, min, grace period 2), Trainer defaults (nan/inf filter on), pick = lowest last"
        " reported loss. tuner: `prepare` + `run_search` on bench/grid.yaml, grid sampler, its own defaults"
        + (" (including re-running the top candidates on more seeds before recommending)."
           if b.get("grid_confirm_seeds") is None else f" but {b['grid_confirm_seeds']} confirmation seeds."),
        "",
        "| figure | anchor (Ray Tune + ASHA) | tuner | tuner / anchor |",
        "|---|---|---|---|",
    ]
    rs = grid["rounds"]
    picks_a = "; ".join(_config(*r["anchor_pick"]) for r in rs)
    picks_t = "; ".join(_config(*r["tuner_pick"]) for r in rs)
    ok_a = sum(not _is_bad(*r["anchor_pick"]) for r in rs)
    ok_t = sum(r["tuner_pick"][0] is not None and not _is_bad(*r["tuner_pick"]) for r in rs)
    lines += [
        f"| picked config (per round) | {picks_a} | {picks_t} | |",
        f"| rounds whose pick is not fp16-pure lr=0.3 | {ok_a}/{n} | {ok_t}/{n} | |",
        f"| tuner's guard on the anchor's pick (same round) | {'; '.join(r['anchor_pick_guard'] for r in rs)} | | |",
        f"| trials with a non-finite loss or grad_norm (per round) | {_per(rs, 'anchor_nonfinite')} | {_per(rs, 'tuner_nonfinite')} | |",
        f"| wasted steps after the first non-finite step (per round) | {_per(rs, 'anchor_wasted')} | {_per(rs, 'tuner_wasted')} | |",
        f"| trials run (per round) | {_per(rs, 'anchor_trials')} | "
        + " ".join(f"{r['tuner_trials']}+{r['tuner_confirmations']}" for r in rs) + " (search + confirmation) | |",
        f"| trials stopped early (per round) | {_per(rs, 'anchor_asha_stopped')} by ASHA | {_per(rs, 'tuner_stopped')} by the guard | |",
        f"| optimizer steps run (per round) | {_per(rs, 'anchor_steps')} | {_per(rs, 'tuner_steps')} | "
        f"{sum(r['tuner_steps'] for r in rs) / max(1, sum(r['anchor_steps'] for r in rs)):.2f} |",
        f"| wall time of the whole process, median of {n} (s) | {_fmt(_median(grid['anchor_wall']))} | "
        f"{_fmt(_median(grid['tuner_wall']))} | **{grid['wall_ratio']:.2f}** |",
        *([f"| wall time, tuner with confirmation off (the anchor's trials, nothing re-run), median of {n} (s) | {_fmt(_median(grid['anchor_wall']))} | "
           f"{_fmt(_median(grid['plain_wall']))} | **{grid['plain_ratio']:.2f}** |",
           f"| picked config, tuner with confirmation off (per round) | | {'; '.join(_config(*p) for p in grid['plain_picks'])} | |"]
          if grid["plain_wall"] else []),
        f"| wall time per trial run, median (s) | {_fmt(_median(a / r['anchor_trials'] for a, r in zip(grid['anchor_wall'], rs)))} | "
        f"{_fmt(_median(t / (r['tuner_trials'] + r['tuner_confirmations']) for t, r in zip(grid['tuner_wall'], rs)))} | |",
        f"| time from ray.init / prepare to the pick, median of {n} (s) | {_fmt(_median(grid['anchor_inner']))} | "
        f"{_fmt(_median(grid['tuner_inner']))} | {grid['inner_ratio']:.2f} |",
        f"| trial start to first optimizer step, median (s) | {_fmt(over['anchor_first_step_median'])} | "
        f"{_fmt(over['tuner_first_step_median'])} | "
        + (f"{over['tuner_first_step_median'] / over['anchor_first_step_median']:.2f}" if over["anchor_first_step_median"] and over["tuner_first_step_median"] else "-")
        + " |",
        "",
        "Run order: " + ", ".join(
            f"anchor {r['round']} ({r['anchor']['process_seconds']:.0f} s), tuner {r['round']} ({r['tuner']['process_seconds']:.0f} s)"
            + (f", tuner without confirmation {r['round']} ({r['tuner_no_confirm']['process_seconds']:.0f} s)"
               if "tuner_no_confirm" in r else "") for r in results["rounds"]) + ".",
        "",
        "## Search efficiency: TPE vs random",
        "",
        "Trials until the first config within 5% of the best stable tokens/s (stable = status ok and learned, the"
        " recommendation rule) that a real reference search found, and until the first config in the fastest quarter"
        " of its stable trials (a target less at the mercy of one noisy tokens/s reading on a shared CPU). Running dozens of real searches per sampler does"
        " not fit a 2-core CPU, so each sampler ran on a **lookup built from the real reference trials**: a suggested"
        " config gets the measured outcome of the nearest measured config (one per differing categorical value, one"
        " per decade of learning rate). The samplers, the space's `suggest` and `tell` (with tuner's stability"
        " constraint) are tuner's own; only the training is replaced by the lookup. 'Unstable' is an outcome of"
        " diverged, collapsed, crashed or oom.",
        "",
        "| trainer | sampler | seeds | found within budget | median trials to first within-5% config | median trials to first top-quarter config | unstable share, 1st half | unstable share, 2nd half |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for trainer, eff in results["efficiency"].items():
        for sampler in ("tpe", "random"):
            s = eff["samplers"].get(sampler)
            if s is None:
                lines.append(f"| {trainer} | {sampler} | {len(eff['seeds'])} | - | no stable config in the reference search | - | - | - |")
                continue
            lines.append(f"| {trainer} | {sampler} | {len(eff['seeds'])} | {s['hit']}/{len(s['runs'])} | "
                         f"{_trials(s['median_trials_to_hit'], eff['budget'])} | "
                         f"{_trials(s['median_trials_to_top_quartile'], eff['budget'])} ({s['top_quartile_hit']}/{len(s['runs'])} found) | "
                         f"{s['unstable_first_half']:.2f} | {s['unstable_second_half']:.2f} |")
    per_seed = [f"{trainer} {sampler}: " + " ".join(_fmt(r["first_hit"], "d") for r in s["runs"])
                for trainer, eff in results["efficiency"].items() for sampler, s in eff["samplers"].items()]
    if per_seed:
        lines += ["", "Trials to the first within-5% config, per seed (- = not within the budget): "
                  + "; ".join(per_seed) + "."]
    lines += ["", "Reference searches (real trials, random sampler, seed 0):", ""]
    for trainer, eff in results["efficiency"].items():
        ref = results["references"][trainer]
        counts = ", ".join(f"{k} {n_}" for k, n_ in sorted(eff["reference_statuses"].items()))
        best = eff["best"]
        best_text = "no stable, learning config" if best is None else (
            f"best trial {best['number']} at {best['tokens_per_second']:.0f} tokens/s "
            f"({_describe(best['params'])}); {len(eff['targets'])} trial(s) within 5%, "
            f"{len(eff.get('top_quartile', []))} in the top quarter")
        lines.append(f"- {trainer}: {eff['reference_trials']} trials in {ref['process_seconds']:.0f} s ({counts}); {best_text}")
    lines += [
        "",
        "## Per-trial overhead (tuner)",
        "",
        f"From {over['trials']} tuner trials of this run (grid searches with their confirmation re-runs, and the reference searches).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| trial start to first optimizer step, median / p90 (s) | {_fmt(over['tuner_first_step_median'], '.2f')} / {_fmt(over['tuner_first_step_p90'], '.2f')} |",
        f"| the anchor's trainable start to first step, median / p90 (s) | {_fmt(over['anchor_first_step_median'], '.2f')} / {_fmt(over['anchor_first_step_p90'], '.2f')} |",
        f"| tuner's share of a trial's wall time not spent in training steps, median ({over['timed_trials']} trials) | {_fmt(over['overhead_share_median'], '.2f')} |",
        f"| the same, pooled over all trial time | {_fmt(over['overhead_share_pooled'], '.2f')} |",
        f"| steady-state step time, tuner / anchor, same config and round, median of {over['step_time_pairs']} pairs | {_fmt(over['step_time_ratio_median'], '.2f')} |",
        f"| share of trial-slot time (concurrency x search wall) outside any trial process, median of {over['runs']} searches | {_fmt(over['outside_trial_share_median'], '.2f')} |",
        "",
        "How these are measured: 'trial start' is the start of tuner's trial function in its (forkserver) child"
        " process, and for the anchor the start of its Tune trainable in a fresh Ray worker, which imports torch and"
        " TRL there; the first step is the end of optimizer step 1. Training-step time is steps run x the steady-state"
        " step time (batch / samples per second after tuner's 2 warm-up steps), so the slower first steps count as"
        " overhead; that share includes building the model, tokenizing the data and building the TRL trainer, which"
        " any TRL run pays too. The step-time ratio compares the same config's steps after the warm-up (the anchor's"
        " from its log timestamps): what tuner adds per step (the guard's callback, logging every step). The slot share covers Ray start-up and scheduling, the hand-off to the trial's child process,"
        " MLflow logging in the driver, and slots left idle while the last trials of a batch finish.",
        "",
        "## Trials of round 1",
        "",
        "| config | anchor: steps run | anchor: first non-finite step | anchor: last loss / grad_norm | tuner: status | tuner: steps run | tuner: first non-finite step | tuner: tokens/s |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    a, t = results["rounds"][0]["anchor"], results["rounds"][0]["tuner"]
    by_config = {(r["params"].get("precision"), r["params"].get("learning_rate")): r for r in t["records"]}
    for x in a["trials"]:
        r = by_config.get((x["precision"], x["learning_rate"]), {})
        asha = " (ASHA stop)" if x["stopped_by_asha"] else ""
        status = r.get("status", "-") + (f" at step {r['stopped_at_step']}" if r.get("status") not in (None, "ok") else "")
        lines.append(
            f"| {_config(x['precision'], x['learning_rate'])} | {x['steps_run']}{asha} | {_fmt(x['first_nonfinite_step'], 'd')} | "
            f"{_fmt(x['last_loss'], '.4g')} / {_fmt(x['last_grad_norm'], '.4g')} | {status} | {r.get('steps_run', '-')} | "
            f"{_fmt(r.get('first_nonfinite_step'), 'd')} | {_fmt(r.get('tokens_per_second'), '.0f')} |")
    if t.get("confirmations"):
        lines += ["", "tuner's confirmation re-runs in round 1: " + "; ".join(
            f"trial {c['confirms']} seed {c['seed']}: {c['status']}"
            + (f" at step {c['stopped_at_step']}" if c["status"] != "ok" else "") for c in t["confirmations"]) + "."]
    lines += [
        "",
        "## Method notes",
        "",
        "- Each timed piece runs in a fresh Python process, anchor and tuner alternating; the wall time is the whole"
        " process (imports, Ray start and stop, every trial, the pick). Both sides start Ray with the same arguments"
        f" ({m['cpus']} CPUs, 1 CPU per trial), so both run {m['cpus']} trials at a time.",
        "- The anchor keeps Trainer's defaults except logging_steps=1 (so ASHA sees every step), save_strategy=no,"
        " report_to=none, bf16=False (TRL turns bf16 autocast on by default; the grid's precision is the weights' dtype"
        " alone) and use_cpu on a CPU. Its nan/inf filter is on, so its logged loss stays finite; its non-finite steps"
        " are found from grad_norm. tuner runs the grid with trial seed 42, Trainer's default seed, which the anchor uses.",
        "- A wasted step is an optimizer step run after the trial's first step with a non-finite loss or grad_norm."
        " tuner's per-step histories are read back from each trial's MLflow result.json artifact.",
        "- ASHA decides at rungs from whichever trials have reported so far, so which trials it stops depends on"
        " which of the 2 concurrent trials reaches a rung first: the anchor's pick can differ between rounds.",
    ]
    if results["quick"]:
        lines += ["- This was a --quick run: the budget is too small for the figures to mean anything."]
    real_model = load_real_model()
    if real_model is not None:
        lines += ["", *real_model_section(real_model)]
    return "\n".join(lines) + "\n"


# -- the real model's shape (bench/real_model.py) ---------------------------------------------------

REAL_MODEL_JSON = REPO / "bench" / "real_model.json"


def load_real_model(path: Path = REAL_MODEL_JSON) -> dict[str, Any] | None:
    """bench/real_model.py's figures, when a run wrote them: their section is rendered with every run of the bench."""
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def real_model_section(data: dict[str, Any]) -> list[str]:
    """The Markdown section of one ``python -m bench.real_model`` run (its own command, date and machine)."""
    m, s, model, gpu = data["machine"], data["search"], data["model"], data["gpu"]
    plan = s.get("plan")
    on_gpu = bool(m.get("gpu"))
    lines = [
        "## A real model's shape: Qwen2.5-0.5B (issue 10)",
        "",
        f"Written from `bench/real_model.json` by `{data['command']}` ({data['date']}; {data['total_seconds']:.0f} s in all),"
        f" not by `python -m bench`: its own run on {m['cpu']}, {m['cpus']} CPU cores, {m['memory']} memory,"
        f" load average (1, 5, 15 min) before {m['load_before']}, after {data.get('load_after', '-')}"
        " (seconds on a shared CPU move with its load: compare them within one run; peak memory is steadier); "
        + ", ".join(f"{k} {v}" for k, v in data["versions"].items() if k in ("torch", "transformers", "trl", "ray", "tuner"))
        + ".",
        "",
        f"- GPU: {m['gpu'] if on_gpu else 'none. No GPU was available in this session: the GPU figures (trials packed per GPU, tokens/s of the pick vs TRL defaults) were not measured'}",
        f"- model: {model['name']} (`bench/shapes.py`: Qwen2.5-0.5B's config numbers, seeded random {model['dtype']}"
        f" weights, the tiny tokenizer), {model['parameters'] / 1e6:.0f}M parameters;"
        + (f" building it (config, random init, save) takes {model['build_seconds']:.1f} s"
           + (" (timed on a fresh copy; the run used the one already built)" if model["reused"] else "")
           if model.get("build_seconds") is not None else " already built (build not timed)"),
        f"- search: {s['trainer']}, {s['trials']} trials of {s['max_steps']} steps, seed {s['seed']}, {s['space_note']};"
        f" `prepare` {s['prepare_seconds']:.0f} s, `run_search` {s['run_seconds']:.0f} s; statuses: "
        + ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
        + ("; recommended: trial " + str(s["recommended"]) if s.get("recommended") is not None
           else "; nothing recommended (2 steps are too few for the learning test; not what this measures)"),
    ]
    space = s.get("space") or {}
    if space:
        lines.append("- the space: fixed " + ", ".join(f"{k}={v}" for k, v in (space.get("fixed") or {}).items())
                     + "; searched " + ", ".join(space.get("params") or {}))
    if plan:
        lines.append(
            f"- memory plan (search.json): {plan['concurrent']} trial(s) at once on {plan['device']}"
            + (f", {plan['gpus_per_trial']:g} GPU each" if plan.get("gpus_per_trial") else "")
            + f", bounded by {plan['limit']}; largest estimate of the space ~{plan['per_trial_mb']} MB per trial"
            + (f", budget {plan['budget_mb']} MB per trial" if plan.get("budget_mb") else ""))
    else:
        lines.append(f"- memory plan: {s.get('plan_note') or 'not recorded'}")
    lines += [
        f"- trials that really ran at once (their MLflow runs' start/end times): {_fmt(s.get('max_overlap'), 'd')}"
        f" (the search's concurrency: {_fmt(s.get('concurrency'), 'd')})",
        f"- memory of the search's process tree (Ray, workers, trials; sum of RSS, sampled each second): peak"
        f" {s['process_tree_peak_mb']} MB; the whole machine's memory in use: {s['machine_in_use_before_mb']} MB before,"
        f" {s['machine_in_use_peak_mb']} MB at peak (other work on the machine included)",
        "",
        "| trial | config | status | trial start to end of step 1 (s) | set-up before step 1 (s) | step 1 (s) | later steps, mean (s) | tokens/s | peak memory (MB) | estimate (MB) | peak / estimate |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in data["trials"]:
        lines.append(_real_model_row(str(t["number"]), t))
    lines += [
        "",
        "Set-up is tuner's `seconds_to_first_step` (trial start in its child process to the end of optimizer step 1)"
        " less TRL's own `step_time` of step 1; a step's time is TRL's `step_time` (generation, scoring and the"
        " update); tokens/s is tuner's (the steps after its 2 warm-up steps, or with 2 steps the second alone). Peak"
        " memory is the trial's: on a CPU its process's peak resident set, on a GPU `torch.cuda.max_memory_allocated`;"
        " the estimate is `tuner.memory`'s for the trial's params, made before it trains (GRPO's assumes 512-token"
        " prompts; the built-in prompts are ~50 tokens, so the activation term is an over-estimate here).",
    ]
    if gpu.get("measured"):
        lines += [
            "",
            f"Each config alone on the whole {'GPU' if gpu.get('device') == 'cuda' else 'CPU (a harness check: --compare on)'}"
            f" for {s['max_steps']} steps, in this order (the pick: {gpu['pick']}):",
            "",
            "| config | params | status | trial start to end of step 1 (s) | later steps, mean (s) | tokens/s | peak memory (MB) | estimate (MB) |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in gpu["runs"]:
            lines.append(f"| {r['config']} | `{_short_params(r['params'])}` | {r['status']} | {_fmt(r['seconds_to_first_step'])} |"
                         f" {_fmt(r['step_seconds'], '.2f')} | {_fmt(r['tokens_per_second'], '.0f')} |"
                         f" {_fmt(r['peak_memory_mb'], '.0f')} | {_fmt(r['memory_estimate_mb'], '.0f')} |")
        lines += ["", f"tokens/s of the pick / TRL defaults: **{_fmt(gpu.get('pick_over_trl_defaults'), '.2f')}**"
                  " (TRL defaults = GRPOConfig with nothing set: fp32 weights under bf16 autocast, batch 8, 8"
                  " generations of up to 512 tokens, activation checkpointing on)."]
    else:
        lines += ["", f"GPU comparison: {gpu.get('note')}."]
    return lines


def _real_model_row(name: str, t: dict[str, Any]) -> str:
    status = t["status"] + (f" ({t['reason']})" if t.get("reason") else "")
    return (f"| {name} | `{_short_params(t['params'])}` | {status} | {_fmt(t['seconds_to_first_step'])} |"
            f" {_fmt(t['setup_seconds'])} | {_fmt(t['first_step_seconds'])} | {_fmt(t['step_seconds'])} |"
            f" {_fmt(t['tokens_per_second'], '.1f')} | {_fmt(t['peak_memory_mb'], '.0f')} |"
            f" {_fmt(t['memory_estimate_mb'], '.0f')} | {_fmt(t['peak_over_estimate'], '.2f')} |")


def _short_params(params: dict[str, Any] | None) -> str:
    keys = ("precision", "learning_rate", "per_device_train_batch_size", "num_generations", "max_completion_length",
            "use_peft", "lora_r", "activation_checkpointing")
    short = {"learning_rate": "lr", "per_device_train_batch_size": "bs", "num_generations": "gen",
             "max_completion_length": "len", "use_peft": "lora", "lora_r": "r", "activation_checkpointing": "ckpt"}
    parts = []
    for k in keys:
        if k in (params or {}):
            v = params[k]
            parts.append(f"{short.get(k, k)}={v:.2g}" if isinstance(v, float) else f"{short.get(k, k)}={v}")
    return " ".join(parts) or "TRL defaults"


def _trials(median: float, budget: int) -> str:
    # a search that never found one counts as budget + 1 in the median
    return f"> {budget}" if median > budget else f"{median:g}"


def _per(rounds: list[dict[str, Any]], key: str) -> str:
    return " ".join(str(r[key]) for r in rounds)


def _describe(params: dict[str, Any]) -> str:
    keys = ("precision", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "use_peft")
    short = {"learning_rate": "lr", "per_device_train_batch_size": "bs", "gradient_accumulation_steps": "ga",
             "use_peft": "lora"}
    parts = []
    for k in keys:
        if k in params:
            value = params[k]
            parts.append(f"{short.get(k, k)}={value:.2g}" if isinstance(value, float) else f"{short.get(k, k)}={value}")
    return " ".join(parts)
