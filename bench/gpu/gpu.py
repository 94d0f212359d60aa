"""On one GPU, in one go: the headline command on the Qwen2.5-0.5B shape, the speed claim against TRL's defaults,
the early-warning signals' cost, and fp16-mixed's GradScaler.

    source bench/gpu/gpu_env.sh && python -m bench.gpu.gpu      # on the GPU machine -> bench/recorded/gpu.json (and $OUT/gpu.json)
    python -m bench.gpu.gpu --dry                           # on a CPU: the tiny model, every stage in ~1 min: the plumbing
    python -m bench.gpu.gpu --render bench/recorded/gpu.json         # the "On a GPU" section of bench/RESULTS.md, again

A GPU is lent here for ~15 minutes in all, on a machine with no network that starts bare, so this is one script
that runs every stage in turn within ``--budget-seconds`` (a stage that would not fit is skipped and says so) and
writes the JSON after each stage: a run cut short keeps what it measured.

1. ``search``: tuner's search (``prepare`` + ``run_search``, as ``tuner search --model Qwen2.5-0.5B --trainer grpo``
   runs it) on the Qwen2.5-0.5B shape (bench/studies/shapes.py: its published config, seeded random weights, built on the
   machine; GRPO's reward: ``hash_reward`` below, since a random model scores 0 on the built-in task), for GRPO and
   for DPO, with the shipped spaces (fp16-mixed included) and the memory plan deciding how
   many trials share the GPU. Per trial: status, tokens/s, peak GPU memory against the estimate; per search: the
   plan, trials at once (their MLflow runs' overlap), wall time, the pick (bench.studies.real_model).
2. ``speed``: GRPO's pick against TRL's defaults at the shipped space's generation lengths (``precision:
   bf16-mixed`` with nothing else set, as ``trl grpo`` trains, plus the space's ``fixed:`` values; TRL's own
   256-token completions would make tokens/s a figure of the sampler's length, not of the config), alternating
   A B C, ``--repeats`` times, same data and seed, one trial at a time on the whole GPU, in this process (the model
   files in the page cache: each run pays its load, not an interpreter's start). C is the pick with the signals off.
   The headline is the median tokens/s of A over B (the issue's goal: at least 1.5x).
3. ``signals``: the pick's step time with tuner.trial.signals on (every 5th step) over off: A over C above.
4. ``fp16``: the pick in fp16-mixed: the GradScaler's scale each step, its back-offs, and the headroom readings.
5. ``signals``: the signals' cost alone (issue 33: at most 5% of a step), on GRPO's pick and on DPO's (no generation:
   the readings are a larger share of its step), in pairs on then off, the order swapped each pair (on off, off on,
   ...), after one discarded warm-up run each. ``signal_steps`` steps a run, read on step 1 and every 5th: of the
   steps timed (after 2 warm-up steps), one in five is a sampled step, as in a long run. The figure: the median over
   pairs of tokens/s off over on (tuner's tokens/s, the steps after the 2 warm-up steps), and for GRPO also of TRL's
   mean step time on over off.

    REUSE=bench/recorded/gpu.json STAGES=signals bash bench/gpu/gpu_run.sh   # the signals' cost alone, on an earlier run's picks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from bench.common.results import today  # noqa: E402

OUTPUT = REPO / "bench" / "recorded" / "gpu.json"
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "## On a GPU: the headline command and the speed claim (issue 37)"
# The GPU run's sizes: what fits ~5 minutes on one H100 with the machine's start and a rerun in 15 minutes.
GPU = {"trials": 4, "max_steps": 8, "repeats": 3, "speed_steps": 10, "signal_pairs": 4, "signal_steps": 12}
DRY = {"trials": 2, "max_steps": 3, "repeats": 1, "speed_steps": 3, "signal_pairs": 1, "signal_steps": 6}
STAGES = ("search", "speed", "fp16", "signals")
SEED = 4  # the search's seed (bench.studies.real_model.SEED: TPE's first draws cover both ends of the memory plan)
# GRPO's reward on the shaped model. Its weights are random: every completion scores 0 on the built-in task, every
# group has no reward spread, and the guard rightly stops each trial as collapsed at step 5 (the first GPU run,
# 2026-11-26: all 4 GRPO trials). A reward with spread on any text lets the trials run their steps, as a pretrained
# model's would: a hash of the completion's token ids, in [0, 1) (its text will not do: the shape's 151,936-token
# vocabulary is mostly outside the tiny tokenizer's, so most completions decode to ""; the second GPU run's trials
# collapsed on a text hash). It measures speed and memory, not learning.
REWARD = "bench.gpu.gpu:hash_reward"


def hash_reward(completions, **kwargs) -> list[float]:
    """A reward in [0, 1) from each completion's token ids (CRC-32; its text where TRL passes no ids): spread
    within every group, whatever the model."""
    import zlib

    ids = kwargs.get("completion_ids")
    if ids is not None and len(ids) == len(completions):
        return [zlib.crc32(str(list(map(int, i))).encode()) / 2**32 for i in ids]

    def text(completion) -> str:
        if isinstance(completion, list):  # conversational: the messages' contents
            return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
        return str(completion)

    return [zlib.crc32(text(c).encode()) / 2**32 for c in completions]


class Clock:
    """Seconds since the start, against the budget: a stage runs only when its estimate fits what is left."""

    def __init__(self, budget: float):
        self.started, self.budget = time.perf_counter(), budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.budget


def _search(trainer: str, sizes: dict[str, int], model: str | None, store: Path, dry: bool,
            echo: Callable[[str], None]) -> dict[str, Any]:
    from bench.studies import real_model

    space = str(REPO / "tuner" / "search_spaces" / f"{trainer}.yaml") if dry else None
    figures = real_model.run(trainer=trainer, trials=sizes["trials"], max_steps=sizes["max_steps"], seed=SEED,
                             model=model, search_space=space, store=store / trainer, compare="off", time_build=False,
                             echo=echo, reward_funcs=[REWARD] if trainer == "grpo" and not dry else None)
    return {"model": figures["model"], "search": figures["search"], "trials": figures["trials"],
            "seconds": figures["total_seconds"]}


def _pick(search: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The search's recommendation, else its fastest ok trial (8 steps of a random-weight model rarely learn)."""
    number = search["search"].get("recommended")
    ok = [t for t in search["trials"] if t["status"] == "ok" and t.get("tokens_per_second")]
    chosen = next((t for t in search["trials"] if t["number"] == number), None) if number is not None else None
    if chosen is not None:
        return chosen, f"recommended trial {number}"
    if not ok:
        return None, "no ok trial"
    best = max(ok, key=lambda t: t["tokens_per_second"])
    return best, f"trial {best['number']}, the fastest ok trial (nothing recommended)"


def _run(trainer: str, params: dict[str, Any], model: str, steps: int, signals_every: int,
         rewards: list[str] | None) -> dict[str, Any]:
    from tuner.trial import TrialSpec, run_trial

    spec = TrialSpec(trainer=trainer, params=params, model=model, max_steps=steps, seed=0, warmup_steps=2,
                     signals_every=signals_every, reward_funcs=rewards)
    result = run_trial(spec)
    _release()
    steps_times = [r["step_time"] for r in result.history if r.get("step_time") is not None and r["step"] > 2]
    return {"status": str(result.status), "reason": result.reason, "tokens_per_second": result.tokens_per_second,
            "step_seconds": statistics.fmean(steps_times) if steps_times else None,  # sampled steps included
            "peak_memory_mb": result.peak_memory_mb, "memory_estimate_mb": result.memory_estimate_mb,
            "device": result.device, "history": result.history}


def _release() -> None:
    """What the last in-process trial left on the GPU, freed: the next one starts from an empty allocator."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _speed(pick: dict[str, Any], label: str, space_fixed: dict[str, Any], model: str, sizes: dict[str, int],
           rewards: list[str] | None, echo: Callable[[str], None]) -> dict[str, Any]:
    from tuner.search.driver import hardware_precisions

    defaults = {"precision": "bf16-mixed"}  # TRL's config with nothing set: fp32 weights, bf16 autocast
    if defaults["precision"] in hardware_precisions(None):  # unsupported here: a CPU (the dry run), a GPU without bf16
        defaults["precision"] = "fp32"
    configs = {"A": (f"the pick ({label})", dict(pick["params"]), 5),
               "B": ("TRL defaults + the space's fixed values", {**defaults, **space_fixed}, 5),
               "C": ("the pick, signals off", dict(pick["params"]), 0)}
    # One discarded run first: the first trial in this process pays the CUDA context and the kernels' caches (the
    # GPU run of 2026-11-26: the pick's first run read 1088 tokens/s, its next 1889).
    _run("grpo", configs["A"][1], model, min(3, sizes["speed_steps"]), 5, rewards)
    rows = []
    for repeat in range(sizes["repeats"]):
        for key, (name, params, every) in configs.items():  # A B C A B C ...: a drift falls on every config alike
            row = _run("grpo", params, model, sizes["speed_steps"], every, rewards)
            history = row.pop("history")
            rows.append({"config": key, "name": name, "repeat": repeat, **row,
                         "signals_rows": sum(1 for h in history if "weight_norm" in h)})
            echo(f"[gpu] speed {key} ({name}) #{repeat}: {row['status']}, {row['tokens_per_second']} tokens/s, "
                 f"step {row['step_seconds']} s")
    summary = {}
    for key, (name, params, every) in configs.items():
        tps = [r["tokens_per_second"] for r in rows if r["config"] == key and r["tokens_per_second"]]
        step = [r["step_seconds"] for r in rows if r["config"] == key and r["step_seconds"]]  # each run's mean
        summary[key] = {"name": name, "params": params, "signals_every": every,
                        "tokens_per_second_median": statistics.median(tps) if tps else None, "tokens_per_second": tps,
                        "step_seconds_median": statistics.median(step) if step else None}

    def ratio(a: str, b: str, key: str) -> float | None:
        x, y = summary[a][key], summary[b][key]
        return round(x / y, 3) if x and y else None

    per_repeat = [{"repeat": i, "pick_over_trl_defaults": _over(rows[3 * i], rows[3 * i + 1]),
                   "signals_off_over_on": _over(rows[3 * i + 2], rows[3 * i])} for i in range(len(rows) // 3)]
    return {"configs": summary, "rows": rows, "per_repeat": per_repeat,
            "pick_over_trl_defaults": ratio("A", "B", "tokens_per_second_median"),
            "signals_step_time_ratio": ratio("A", "C", "step_seconds_median"),
            "signals_tokens_ratio": ratio("C", "A", "tokens_per_second_median")}


def _step_walls(history: list[dict[str, Any]]) -> dict[int, float]:
    """Each optimizer step's wall time, from the monitor's running ``train_seconds``."""
    seen = [(int(h["step"]), float(h["train_seconds"])) for h in history
            if h.get("step") is not None and h.get("train_seconds") is not None]
    return {step: round(now - before, 4) for (_, before), (step, now) in zip(seen, seen[1:])}


def _over(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    x, y = a.get("tokens_per_second"), b.get("tokens_per_second")
    return round(x / y, 3) if x and y else None


def _fp16(pick: dict[str, Any], model: str, sizes: dict[str, int], rewards: list[str] | None) -> dict[str, Any]:
    params = {**pick["params"], "precision": "fp16-mixed"}
    row = _run("grpo", params, model, sizes["speed_steps"], 1, rewards)
    history = row.pop("history")
    keep = ("step", "loss_scale", "step_skipped", "scale_backoffs", "headroom", "headroom_site", "grad_norm",
            "update_ratio")
    return {"params": params, **row, "steps": [{k: h[k] for k in keep if k in h} for h in history]}


def _signals(picks: dict[str, tuple[dict[str, Any], str]], model: str, sizes: dict[str, int],
             rewards: list[str] | None, clock: Clock, echo: Callable[[str], None]) -> dict[str, Any]:
    """Each pick with the signals on and off, in pairs whose order swaps; per pair, tokens/s off over on (and TRL's
    step time on over off where it logs one), and their medians. Each run keeps its steps' wall times."""
    out: dict[str, Any] = {}
    for trainer, (pick, label) in picks.items():
        funcs = rewards if trainer == "grpo" else None
        params, steps = dict(pick["params"]), sizes["signal_steps"]
        _run(trainer, params, model, min(3, steps), 5, funcs)  # warm-up: the CUDA context and kernels' caches
        rows = []
        for pair in range(sizes["signal_pairs"]):
            if pair and not clock.fits(rows[-1]["seconds"] + rows[-2]["seconds"]):  # another pair as long as the last
                echo(f"[gpu] signals {trainer}: {pair} pairs (the budget)")
                break
            for every in ((5, 0) if pair % 2 == 0 else (0, 5)):
                started = time.perf_counter()
                row = _run(trainer, params, model, steps, every, funcs)
                history = row.pop("history")
                rows.append({"pair": pair, "signals_every": every, **row,
                             "seconds": round(time.perf_counter() - started, 1),
                             "signals_rows": sum(1 for h in history if "weight_norm" in h),
                             "step_walls": _step_walls(history)})
                echo(f"[gpu] signals {trainer} {'on' if every else 'off'} #{pair}: {row['status']}, "
                     f"{row['tokens_per_second']} tokens/s, step {row['step_seconds']} s")
        ratios, steps_ratios = [], []  # tokens/s off over on (every trainer); TRL's step_time on over off (GRPO's)
        for pair in sorted({r["pair"] for r in rows}):
            on = next((r for r in rows if r["pair"] == pair and r["signals_every"]), None)
            off = next((r for r in rows if r["pair"] == pair and not r["signals_every"]), None)
            if on and off and _over(off, on):
                ratios.append(_over(off, on))
            if on and off and on["step_seconds"] and off["step_seconds"]:
                steps_ratios.append(round(on["step_seconds"] / off["step_seconds"], 3))
        out[trainer] = {"pick": label, "params": params, "steps": steps, "rows": rows,
                        "tokens_off_over_on": ratios, "median": statistics.median(ratios) if ratios else None,
                        "step_time_on_over_off": steps_ratios,
                        "step_time_median": statistics.median(steps_ratios) if steps_ratios else None}
    return out


def run(*, dry: bool, budget: float, output: Path, echo: Callable[[str], None] = print,
        reuse: dict[str, Any] | None = None, stages: tuple[str, ...] = STAGES,
        signals_on: tuple[str, ...] = ("grpo", "dpo")) -> dict[str, Any]:
    import torch

    from bench.common import results as common

    sizes = DRY if dry else GPU
    clock = Clock(budget)
    cuda = torch.cuda.is_available()
    figures: dict[str, Any] = {
        "command": None, "dry": dry, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "machine": common.machine(), "versions": common.versions(), "sizes": sizes, "budget_seconds": budget,
        "stages": {}, "skipped": [],
    }
    if not cuda and not dry:
        figures["skipped"].append("everything: no CUDA GPU here (use --dry on a CPU)")
        return _write(figures, output, clock)
    model = "tiny" if dry else None
    rewards = None if dry else [REWARD]  # GRPO's: the built-in reward on the tiny model
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        store = Path(scratch)
        searches: dict[str, Any] = {}

        def search(trainer: str, estimate: float) -> None:
            earlier = (reuse or {}).get("stages", {}).get(f"search_{trainer}")
            if earlier and "trials" in earlier:  # --reuse: that run's search, its model built again here
                from bench.studies import real_model

                earlier["model"] = {**earlier["model"], **real_model.build_model(None if not dry else "tiny",
                                                                                 time_build=False)}
                earlier["reused_from"] = reuse.get("machine", {}).get("date")
                searches[trainer] = figures["stages"][f"search_{trainer}"] = earlier
                echo(f"[gpu] search {trainer}: reused from the run of {earlier['reused_from']}")
                return
            if not clock.fits(estimate):
                figures["skipped"].append(f"search {trainer}: {budget - clock.elapsed():.0f} s left")
                return
            echo(f"[gpu] search {trainer} at {clock.elapsed():.0f} s")
            try:
                searches[trainer] = _search(trainer, sizes, model, store, dry, echo)
            except Exception as error:  # noqa: BLE001 - one stage's failure is a figure; the next stages still run
                searches[trainer] = {"error": f"{type(error).__name__}: {error}"}
            figures["stages"][f"search_{trainer}"] = searches[trainer]
            _write(figures, output, clock)

        # The headline's order: GRPO's search, its pick's speed, fp16-mixed, then DPO's search with what is left.
        if "search" not in stages and not reuse:
            figures["skipped"].append("everything: no search to take the picks from (run the search, or --reuse)")
            return _write(figures, output, clock)
        search("grpo", 60)
        grpo = searches.get("grpo") or {}
        pick, label = _pick(grpo) if "trials" in grpo else (None, "no GRPO search")
        model_path = (grpo.get("model") or {}).get("path") or "tiny"
        if pick is None:
            figures["skipped"].append(f"speed, fp16: {label}")
        elif "speed" not in stages:
            pass
        elif clock.fits(30 * sizes["repeats"]):
            from tuner.config.space import load_space

            echo(f"[gpu] speed at {clock.elapsed():.0f} s: {label}")
            try:
                figures["stages"]["speed"] = _speed(pick, label, dict(load_space(trainer="grpo").fixed), model_path,
                                                    sizes, rewards, echo)
            except Exception as error:  # noqa: BLE001
                figures["stages"]["speed"] = {"error": f"{type(error).__name__}: {error}"}
            _write(figures, output, clock)
        else:
            figures["skipped"].append(f"speed: {budget - clock.elapsed():.0f} s left")
        if "fp16" not in stages:
            pass
        elif pick is not None and cuda and clock.fits(20):
            echo(f"[gpu] fp16-mixed at {clock.elapsed():.0f} s")
            try:
                figures["stages"]["fp16"] = _fp16(pick, model_path, sizes, rewards)
            except Exception as error:  # noqa: BLE001
                figures["stages"]["fp16"] = {"error": f"{type(error).__name__}: {error}"}
            _write(figures, output, clock)
        elif not cuda:
            figures["skipped"].append("fp16: fp16-mixed (GradScaler) needs CUDA")
        search("dpo", 45)
        dpo = searches.get("dpo") or {}
        picks = {name: chosen for name, chosen in (("grpo", (pick, label)),
                                                    ("dpo", _pick(dpo) if "trials" in dpo else (None, "no DPO search")))
                 if chosen[0] is not None}
        picks = {name: chosen for name, chosen in picks.items() if name in signals_on}
        if "signals" in stages and picks and clock.fits(60):
            echo(f"[gpu] signals at {clock.elapsed():.0f} s: {', '.join(f'{k} {v[1]}' for k, v in picks.items())}")
            try:
                figures["stages"]["signals"] = _signals(picks, model_path, sizes, rewards, clock, echo)
            except Exception as error:  # noqa: BLE001
                figures["stages"]["signals"] = {"error": f"{type(error).__name__}: {error}"}
            _write(figures, output, clock)
        elif "signals" in stages:
            figures["skipped"].append(f"signals: {'no pick' if not picks else f'{budget - clock.elapsed():.0f} s left'}")
    return _write(figures, output, clock)


def _write(figures: dict[str, Any], output: Path, clock: Clock | None = None) -> dict[str, Any]:
    if clock is not None:
        figures["seconds"] = round(clock.elapsed(), 1)
    text = json.dumps(figures, indent=1, default=str) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    if os.environ.get("OUT"):  # the GPU machine's folder that comes back
        Path(os.environ["OUT"], "gpu.json").write_text(text)
    return figures


# -- the RESULTS section ---------------------------------------------------------------------------


def section(data: dict[str, Any]) -> list[str]:
    """The Markdown section of one run (its command, device and date); what the run recorded (its command, its notes)
    with bench's paths of today (bench.common.results.today)."""
    lines = [SECTION, "",
             f"Written from `bench/recorded/gpu.json` by `{data.get('command')}` on {data['device']} "
             f"({data['machine'].get('date')}; {data['seconds']:.0f} s in all; torch {data['versions'].get('torch')}). "
             "The model is the Qwen2.5-0.5B shape with seeded random weights (bench/studies/shapes.py): speed and memory are "
             "the real size's, learning is not a pretrained model's."]
    if data.get("dry"):
        lines += ["", "**A dry run** (`--dry`: the tiny model on a CPU): the plumbing, not a GPU figure."]
    for trainer in ("grpo", "dpo"):
        stage = data["stages"].get(f"search_{trainer}")
        if not stage:
            continue
        lines += ["", f"**{trainer} search**"]
        if "error" in stage:
            lines.append(f"failed: {stage['error']}")
            continue
        s = stage["search"]
        lines.append(f"{s['trials']} trials of {s['max_steps']} steps, {s['space_note']}; {stage['seconds']:.0f} s in all, "
                     f"at most {s['max_overlap']} trials at once (plan: {_plan(s.get('plan'))}); statuses "
                     f"{s['statuses']}; recommended: {s['recommended']}.")
        lines += ["", "| trial | params | status | tokens/s | peak MB | estimate MB | peak / estimate |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for t in stage["trials"]:
            lines.append(f"| {t['number']} | {_params(t['params'])} | {t['status']} | {t['tokens_per_second']} | "
                         f"{t['peak_memory_mb']} | {t['memory_estimate_mb']} | {t['peak_over_estimate']} |")
    speed = data["stages"].get("speed")
    if speed and "error" in speed:
        lines += ["", f"**Speed**: failed: {speed['error']}"]
    elif speed:
        lines += ["", "**Speed: the pick against TRL's defaults** (A B C in turn, each repeat; medians)", "",
                  "| config | params | tokens/s (median) | readings | step s (median of each run's mean) |", "| --- | --- | --- | --- | --- |"]
        for key, c in speed["configs"].items():
            lines.append(f"| {key}: {c['name']} | {_params(c['params'])} | {_num(c['tokens_per_second_median'])} | "
                         f"{', '.join(_num(v) for v in c['tokens_per_second'])} | {_num(c['step_seconds_median'], '.3f')} |")
        lines += ["", f"The pick over TRL's defaults: **{speed['pick_over_trl_defaults']}x** tokens/s (goal: at least "
                  f"1.5x); per repeat, side by side: {[p['pick_over_trl_defaults'] for p in speed.get('per_repeat', [])]}. "
                  f"The signals' cost: tokens/s without them over with them, {speed['signals_tokens_ratio']} (per "
                  f"repeat {[p['signals_off_over_on'] for p in speed.get('per_repeat', [])]}); step time with over "
                  f"without, {speed['signals_step_time_ratio']} (goal: at most 1.05)."]
        for key in ("source", "note"):
            if speed.get(key):
                lines += ["", f"{key.capitalize()}: {speed[key]}."]
    earlier = data["stages"].get("speed_run2")
    if earlier:
        lines += ["", f"Signals' cost in run 2 (3 repeats side by side, its pick LoRA r16 in bf16-pure): tokens/s without "
                  f"them over with them {earlier['signals_tokens_ratio']}, step time with over without "
                  f"{earlier['signals_step_time_ratio']}. {earlier.get('note', '')}."]
    fp16 = data["stages"].get("fp16")
    if fp16 and "error" in fp16:
        lines += ["", f"**fp16-mixed**: failed: {fp16['error']}"]
    elif fp16:
        scales = [s.get("loss_scale") for s in fp16["steps"]]
        lines += ["", f"**fp16-mixed** (the pick in fp16-mixed, {len(fp16['steps'])} steps): {fp16['status']}; "
                  f"GradScaler scale by step {scales}; back-offs "
                  f"{max((s.get('scale_backoffs') or 0) for s in fp16['steps']) if fp16['steps'] else 0:.0f}; "
                  f"headroom (share of float16's range) {[_num(s.get('headroom'), '.2g') for s in fp16['steps']]}."]
    if fp16 and fp16.get("note"):
        lines += ["", f"Note: {fp16['note']}."]
    for key, signals in data["stages"].items():
        if key.startswith("signals"):
            lines += _signals_lines(key, signals)
    if data.get("runs"):
        lines += ["", "Runs behind these figures: " + "; ".join(f"{k}: {v}" for k, v in data["runs"].items()) + "."]
    if data.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(data["skipped"]) + "."]
    return [today(line) for line in lines]


def _signals_lines(key: str, signals: dict[str, Any]) -> list[str]:
    """One signals stage's table (``signals``; a later run of it: ``signals_<what>``)."""
    title = "The signals' cost alone" + (f" ({key.removeprefix('signals_')})" if key != "signals" else "")
    if "error" in signals:
        return ["", f"**{title}**: failed: {signals['error']}"]
    lines = ["", f"**{title}** (each pick with the early-warning readings on and off, in pairs whose order swaps, "
             "after a discarded warm-up run; read on step 1 and every 5th; goal: at most 5% of a step)", "",
             "| pick | steps a run | pairs | tokens/s off over on, per pair | median | TRL step time on over off, "
             "per pair | median |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for trainer, t in signals.items():
        if not isinstance(t, dict) or "tokens_off_over_on" not in t:
            continue
        lines.append(f"| {trainer}: {t['pick']} ({_params(t['params'])}) | {t['steps']} | "
                     f"{len(t['tokens_off_over_on'])} | {t['tokens_off_over_on']} | {_num(t['median'], '.3f')} | "
                     f"{t['step_time_on_over_off'] or '-'} | {_num(t.get('step_time_median'), '.3f')} |")
    if signals.get("note"):
        lines += ["", f"Note: {signals['note']}."]
    return lines


def _plan(plan) -> str:
    if not plan:
        return "none recorded"
    if isinstance(plan, dict):
        return ", ".join(f"{k} {v}" for k, v in plan.items() if not isinstance(v, (dict, list)))[:200]
    return str(plan)[:200]


def _params(params: dict[str, Any] | None) -> str:
    if not params:
        return "-"
    return ", ".join(f"{k}={_num(v, '.2g') if isinstance(v, float) else v}" for k, v in params.items())


def _num(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def write_section(data: dict[str, Any], results: Path = RESULTS) -> None:
    """Put the section into RESULTS.md in place of the last one (or at its end)."""
    from bench.common.results import replace_section

    title, *rest = section(data)
    replace_section(results, title, rest[1:] if rest and rest[0] == "" else rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.gpu", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:6]))
    parser.add_argument("--dry", action="store_true", help="the tiny model on this machine: every stage, small")
    parser.add_argument("--budget-seconds", type=float, default=270.0,
                        help="stop starting stages past this (default %(default)s: a rerun must fit the lease)")
    parser.add_argument("--output", default=None, help="default: bench/recorded/gpu.json (--dry: a temporary file)")
    parser.add_argument("--render", metavar="JSON", help="write the RESULTS section from JSON and stop")
    parser.add_argument("--reuse", metavar="JSON", help="take the searches from this earlier run (a rerun of the "
                                                        "later stages when the lease is short)")
    parser.add_argument("--results", default=str(RESULTS), help="the RESULTS.md that --render writes")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="comma-separated, of %(default)s (the searches run or are reused whatever this says)")
    parser.add_argument("--signals-on", default="grpo,dpo", help="the picks the signals stage reads (default %(default)s)")
    parser.add_argument("--signal-steps", type=int, help="steps a run in the signals stage (default: the sizes')")
    args = parser.parse_args(argv)
    if args.render:
        write_section(json.loads(Path(args.render).read_text()), Path(args.results))
        print(f"wrote the GPU section of {args.results}")
        return 0
    output = Path(args.output) if args.output else (
        Path(tempfile.gettempdir()) / "bench-gpu-dry.json" if args.dry else OUTPUT)
    reuse = json.loads(Path(args.reuse).read_text()) if args.reuse else None
    stages = tuple(args.stages.split(","))
    if unknown := [s for s in stages if s not in STAGES]:
        parser.error(f"--stages: unknown {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    if args.signal_steps:
        (DRY if args.dry else GPU)["signal_steps"] = args.signal_steps
    figures = run(dry=args.dry, budget=args.budget_seconds, output=output, reuse=reuse, stages=stages,
                  signals_on=tuple(args.signals_on.split(",")))
    figures["command"] = " ".join(["python -m bench.gpu.gpu", *(sys.argv[1:] if argv is None else argv)])
    _write(figures, output)
    print("\n".join(section(figures)))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
