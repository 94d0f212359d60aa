"""A real tuner search on the Qwen2.5-0.5B-shaped model (bench/studies/shapes.py): set-up time, step time, peak memory
against tuner.trial.memory's estimate, and the memory plan the search ran under; on a GPU, also tokens/s of the
search's pick against TRL's default config.

    python -m bench.studies.real_model                                  # grpo, 2 trials of 2 steps -> bench/recorded/real_model.json
    python -m bench.studies.real_model --trainer grpo --trials 2 --max-steps 2 --output bench/recorded/real_model.json

What it does:

1. builds the shaped model once (494M parameters, seeded random bf16 weights, the tiny tokenizer; reused after, and
   then a fresh build into a temporary folder is timed for the figure, unless ``--no-build-timing``);
2. runs ``tuner.search.driver.prepare`` + ``run_search`` on it in a temporary store, ``--confirm-seeds 0`` (2 steps are
   too few for the learning test, so nothing would be confirmed anyway). No ``--gpus-per-trial``: the search's
   memory plan (tuner.search, its placement) decides how many trials run at once and, on a GPU, what share of it each gets;
3. reads each trial's per-step history back from its MLflow run and writes, per trial: set-up time (trial start to
   the start of optimizer step 1), the first step, the later steps (TRL's own ``step_time``), tokens/s, peak memory
   beside the estimate; and for the search: the plan, how many trials really overlapped (their MLflow runs' start
   and end times), the peak resident memory of the search's process tree;
4. with CUDA (or ``--compare on``): runs, one at a time on the whole GPU, the search's pick (its recommendation, or
   with nothing recommended its fastest ok trial), TRL's defaults (``{"precision": "bf16-mixed"}``: TRL's config
   with nothing set trains fp32 weights under bf16 autocast, as ``trl grpo`` with no flags does) and TRL's defaults
   plus the space's ``fixed:`` values (the search's generation lengths), each for ``--max-steps`` steps, and reports
   their tokens/s. On a CPU this part is skipped and the JSON says "no GPU: GPU figures not measured".

On a CPU without ``--search-space``, the search runs ``CPU_SPACE`` (below): the shipped GRPO space (fp32, batch up
to 8 x 2 accumulation) would make one 2-step trial of a 0.5B model take several minutes on 1 core; on a GPU it runs
the shipped space.

``section`` (below) renders the JSON as the "real model" section of bench/RESULTS.md, which ``python -m bench``
writes (bench/headline/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # `python bench/studies/real_model.py`
    sys.path.insert(0, str(REPO))

from bench.common.results import fmt, read_recorded, today  # noqa: E402

OUTPUT = REPO / "bench" / "recorded" / "real_model.json"
NO_GPU = "no GPU: GPU figures not measured"

# The CPU run's space. Why these values (measured on the 2-core runner, 1 thread per trial as Ray gives it):
# - the precision is fixed, not searched, to the CPU's fast one (cpu_precision): bf16-pure where the CPU multiplies
#   bf16 natively (a batch-4 linear layer of this model took 0.4 ms in bf16 and 2.7 ms in fp32 on one core with
#   avx512_bf16), fp32 where bf16 is emulated (one of this model's MLP matmuls, 240 tokens: 100 ms in fp32 and
#   480 ms in bf16 on an AVX2-only AMD EPYC core): either way the other would make the trials ~5x slower;
# - batch 4 = one group of num_generations 4, no accumulation, 8 completion tokens: the least GRPO work per step;
#   a 2-step trial then takes about 40-80 s (model load ~10 s, steps 12-35 s each, two trials sharing 2 cores);
# - searched: LoRA on/off and activation checkpointing on/off, the params that move memory most (estimates from
#   ~2.3 GiB, LoRA with checkpointing, to ~7.7 GiB, full fine-tuning without), and a pretrained-model learning
#   rate range (TRL's 1e-6 default up to LoRA's ~1e-4).
CPU_SPACE: dict[str, Any] = {
    "trainer": "grpo",
    "description": "bench/studies/real_model.py on a CPU: GRPO on the Qwen2.5-0.5B-shaped model, smallest steps",
    "fixed": {"precision": "bf16-pure", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
              "num_generations": 4, "max_completion_length": 8, "temperature": 1.0},
    "params": {
        "learning_rate": {"type": "float", "low": 1.0e-6, "high": 1.0e-4, "log": True},
        "use_peft": {"type": "categorical", "choices": [True, False]},
        "lora_r": {"type": "categorical", "choices": [8, 16], "when": {"use_peft": True}},
        "activation_checkpointing": {"type": "categorical", "choices": [False, True]},
    },
}


def cpu_precision() -> str:
    """The CPU's fast precision for this model: bf16-pure with native bf16 arithmetic (AVX512-BF16 or AMX), else
    fp32. Read from the kernel's CPU flags, as torch's oneDNN kernels choose by them; fp32 where they cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "fp32"
    return "bf16-pure" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


# The search's seed. With it, the two configs TPE's random start draws from CPU_SPACE are full fine-tuning without
# activation checkpointing (the space's largest memory corner, the one the plan sizes its budget by) and LoRA: both
# ends of the memory plan in a 2-trial search. (Seed 0 draws two LoRA configs.) Chosen for coverage, not for a figure.
SEED = 4
# TRL's config with nothing set: fp32 weights (TRL's ModelConfig dtype) under bf16 autocast (bf16 defaults on).
TRL_DEFAULTS = {"precision": "bf16-mixed"}


# -- pieces ----------------------------------------------------------------------------------------


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def build_model(model: str | None, time_build: bool = True) -> dict[str, Any]:
    """The shaped model (built, or reused when already complete), or ``model`` as given; with its size. When the
    shaped model is reused and ``time_build``, a fresh build into a temporary folder is timed (~15 s, ~1 GB) and
    removed, so the figure is there either way."""
    import shutil

    from transformers import AutoConfig

    from bench.studies.shapes import QWEN25_05B, build_shaped_model, shape_dir
    from tuner.inputs.models import resolve_model
    from tuner.trial import memory

    started = time.perf_counter()
    if model is None:
        reused = (shape_dir(QWEN25_05B) / "tuner-shape.complete").is_file()
        path, name = str(build_shaped_model(QWEN25_05B)), f"{QWEN25_05B['name']}-shaped"
    else:
        reused, path, name = True, resolve_model(model), model
    seconds = time.perf_counter() - started
    if model is None and reused and time_build:
        scratch = Path(tempfile.mkdtemp(prefix="bench-shape-build-"))
        try:
            started = time.perf_counter()
            build_shaped_model(QWEN25_05B, scratch / "model")
            seconds = time.perf_counter() - started
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    config = AutoConfig.from_pretrained(path)
    return {"name": name, "path": path, "parameters": memory.count_parameters(config),
            "dtype": str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)).removeprefix("torch."),
            "build_seconds": round(seconds, 2) if (model is None and (time_build or not reused)) else None,
            "reused": reused}


class TreeMemory:
    """Peak resident memory of this process and all its descendants (Ray, its workers, the trials' processes),
    sampled every ``every`` seconds: a sum of RSS, so pages shared between processes count once per process (an
    upper bound on what the search held). Also the machine's memory in use (MemTotal - MemAvailable)."""

    def __init__(self, every: float = 1.0):
        self.every, self.peak_tree, self.peak_machine = every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "TreeMemory":
        self.machine_before = _machine_in_use()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak_tree = max(self.peak_tree, total)
            self.peak_machine = max(self.peak_machine, _machine_in_use())
            self._stop.wait(self.every)


def _machine_in_use() -> int:
    import psutil

    vm = psutil.virtual_memory()
    return vm.total - vm.available


def _download(mlflow, run_id: str | None, folder: Path) -> dict[str, Any]:
    if not run_id:
        return {}
    try:
        return json.loads(Path(mlflow.download_artifacts(run_id, "result.json", str(folder))).read_text())
    except Exception:  # noqa: BLE001 - a too_big trial never ran: it has no result.json
        return {}


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one instant; one that ends as another starts does not overlap it."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    open_, most = 0, 0
    for _, delta in events:
        open_ += delta
        most = max(most, open_)
    return most


def timings(record: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """Set-up, first step and later steps of one trial: TRL's own per-step ``step_time`` where it logs one, else
    the wall time after step 1 spread over the later steps."""
    first_step_at = record.get("seconds_to_first_step")
    step_times = {int(r["step"]): r["step_time"] for r in history if r.get("step_time") is not None}
    first = step_times.get(1)
    later = [t for s, t in sorted(step_times.items()) if s > 1]
    steps = int(record.get("steps_run") or 0)
    if not later and first_step_at is not None and record.get("wall_seconds") and steps > 1:
        later = [(record["wall_seconds"] - first_step_at) / (steps - 1)]  # includes the trial's wind-down
    setup = first_step_at - first if first_step_at is not None and first is not None else first_step_at
    return {"setup_seconds": _round(setup), "first_step_seconds": _round(first),
            "step_seconds": _round(sum(later) / len(later)) if later else None}


def _round(value, digits: int = 2):
    return None if value is None else round(float(value), digits)


def trial_figures(record: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    peak, estimate = record.get("peak_memory_mb"), record.get("memory_estimate_mb")
    return {
        "number": record.get("number"), "params": record.get("params"), "status": str(record.get("status")),
        "reason": record.get("reason") or "", "device": record.get("device"), "steps_run": record.get("steps_run"),
        "seconds_to_first_step": _round(record.get("seconds_to_first_step")),
        **timings(record, history),
        "wall_seconds": _round(record.get("wall_seconds")),
        "tokens_per_second": _round(record.get("tokens_per_second")),
        "peak_memory_mb": _round(peak, 0), "memory_estimate_mb": _round(estimate, 0),
        "peak_over_estimate": round(peak / estimate, 3) if peak and estimate else None,
    }


# -- the search ------------------------------------------------------------------------------------


def run(*, trainer: str = "grpo", trials: int = 2, max_steps: int = 2, seed: int = SEED, model: str | None = None,
        search_space: str | None = None, store: str | os.PathLike | None = None, compare: str = "auto",
        time_build: bool = True, echo: Callable[[str], None] = print,
        reward_funcs: list[str] | None = None) -> dict[str, Any]:
    """The whole measurement; returns the figures (what --output holds)."""
    import yaml

    from bench.common import results as common
    from tuner.search.driver import SearchOptions, prepare, run_search
    from tuner.stores.mlflow_store import client

    started = time.perf_counter()
    machine = common.machine()
    cuda = _cuda()
    built = build_model(model, time_build=time_build)
    echo(f"[real_model] model {built['path']}: {built['parameters'] / 1e6:.0f}M parameters "
         f"({'reused' if built['reused'] else 'built'}; a build takes {built['build_seconds']} s)")

    store = Path(store or tempfile.mkdtemp(prefix="bench-real-model-")).resolve()
    store.mkdir(parents=True, exist_ok=True)
    if search_space is None and not cuda and trainer == "grpo":
        search_space = str(store / "cpu_space.yaml")
        space = {**CPU_SPACE, "fixed": {**CPU_SPACE["fixed"], "precision": cpu_precision()}}
        Path(search_space).write_text(yaml.safe_dump(space, sort_keys=False))
        space_note = (f"bench.studies.real_model.CPU_SPACE in {space['fixed']['precision']} (this CPU's fast precision): the "
                      "shipped space's batch 8 x 2 trials take minutes a step on the 1 core each trial gets (why each "
                      "value: the comment above CPU_SPACE)")
    elif search_space is None:
        space_note = f"the shipped {trainer} space (its pretrained-model ranges)"
    else:
        space_note = f"--search-space {search_space}"

    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        echo(line)

    t0 = time.perf_counter()
    prepared = prepare(SearchOptions(trainer=trainer, model=built["path"], search_space=search_space, trials=trials,
                                     reward_funcs=reward_funcs,
                                     max_steps=max_steps, seed=seed, store=str(store), confirm_seeds=0,
                                     warm_start="none"))
    prepare_seconds = time.perf_counter() - t0
    with TreeMemory() as tree:
        t1 = time.perf_counter()
        outcome = run_search(prepared, echo=say)
        run_seconds = time.perf_counter() - t1

    mlflow = client(prepared.tracking_uri)
    parent = mlflow.get_run(outcome.parent_run_id)
    children = mlflow.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    intervals = [(r.info.start_time / 1000, r.info.end_time / 1000) for r in children
                 if r.info.start_time and r.info.end_time]
    downloads = store / "downloads"
    figures = []
    for record in outcome.records:
        result = _download(mlflow, record.get("run_id"), downloads / str(record["number"]))
        figures.append(trial_figures(record, result.get("history") or []))

    plan = outcome.search.get("plan")
    statuses: dict[str, int] = {}
    for f in figures:
        statuses[f["status"]] = statuses.get(f["status"], 0) + 1
    space = prepared.space.model_dump(exclude={"source"}) if hasattr(prepared.space, "model_dump") else None
    result: dict[str, Any] = {
        "command": None, "date": machine["date"], "machine": machine, "versions": common.versions(),
        "model": built,
        "search": {
            "trainer": trainer, "trials": trials, "max_steps": max_steps, "seed": seed, "space": space,
            "space_note": space_note, "prepare_seconds": round(prepare_seconds, 1), "run_seconds": round(run_seconds, 1),
            "concurrency": int(parent.data.params.get("concurrency", 0)) or None,
            "max_overlap": max_overlap(intervals) if intervals else None,
            "plan": plan, "plan_note": None if plan else "search.json has no plan: this tuner does not plan memory",
            "statuses": statuses,
            "recommended": outcome.recommended["number"] if outcome.recommended else None,
            "process_tree_peak_mb": round(tree.peak_tree / 2**20),
            "machine_in_use_before_mb": round(tree.machine_before / 2**20),
            "machine_in_use_peak_mb": round(tree.peak_machine / 2**20),
            "log": lines[-20:],
        },
        "trials": figures,
    }
    want = cuda if compare == "auto" else compare == "on"
    result["gpu"] = (compare_with_defaults(prepared, outcome, store, echo) if want
                     else {"measured": False, "note": NO_GPU if not cuda else "--compare off"})
    result["total_seconds"] = round(time.perf_counter() - started, 1)
    result["load_after"] = common.load_average()
    return result


def pick(outcome) -> tuple[dict[str, Any] | None, str]:
    """The search's recommendation; with none (2 steps are too few to show learning), its fastest ok trial."""
    if outcome.recommended:
        return outcome.recommended, f"recommended trial {outcome.recommended['number']}"
    ok = [r for r in outcome.records if str(r.get("status")) == "ok" and r.get("tokens_per_second")]
    if not ok:
        return None, "no ok trial"
    best = max(ok, key=lambda r: r["tokens_per_second"])
    return best, (f"trial {best['number']}, the fastest ok trial (nothing recommended: {best.get('max_steps')} steps "
                  "are too few for the learning test)")


def compare_with_defaults(prepared, outcome, store: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """tokens/s of the search's pick, TRL's defaults, and TRL's defaults at the space's fixed values: each run alone
    (the whole GPU), in a child process, for the search's number of steps."""
    from tuner.search.driver import hardware_precisions
    from tuner.trial import TrialSpec, run_trial_isolated

    o = prepared.options
    chosen, label = pick(outcome)
    defaults = dict(TRL_DEFAULTS)
    if defaults["precision"] in hardware_precisions(None):  # e.g. a GPU without bf16: TRL's default cannot run
        defaults["precision"] = "fp32"
    fixed = {k: v for k, v in prepared.space.fixed.items() if k != "precision"}
    configs = [("TRL defaults", defaults), ("TRL defaults + the space's fixed values", {**defaults, **fixed})]
    if chosen is not None:
        configs.insert(0, (label, dict(chosen["params"])))
    runs = []
    for name, params in configs:
        spec = TrialSpec(trainer=o.trainer, params=params, model=prepared.model_path, dataset=o.dataset,
                         reward_funcs=o.reward_funcs, max_steps=o.max_steps, seed=o.seed)
        echo(f"[real_model] {name}: {params}")
        workdir = store / "compare" / str(len(runs))
        result = run_trial_isolated(spec, workdir, timeout=o.trial_timeout)
        summary = result.summary()
        runs.append({"config": name, **trial_figures({**summary, "number": None, "params": params}, result.history)})
        echo(f"[real_model] {name}: {summary['status']}, {summary.get('tokens_per_second')} tokens/s")
    by_name = {r["config"]: r for r in runs}
    speedup = None
    if chosen is not None and by_name[label]["tokens_per_second"] and by_name["TRL defaults"]["tokens_per_second"]:
        speedup = round(by_name[label]["tokens_per_second"] / by_name["TRL defaults"]["tokens_per_second"], 2)
    return {"measured": True, "pick": label, "runs": runs, "pick_over_trl_defaults": speedup,
            "device": runs[0]["device"] if runs else None}


# -- the RESULTS section -----------------------------------------------------------------------------


def load(path: Path | None = None) -> dict[str, Any] | None:
    """The figures of the run recorded at ``path`` (default OUTPUT), or None when none was."""
    return read_recorded(Path(path or OUTPUT))


def section(data: dict[str, Any]) -> list[str]:
    """The Markdown section of one ``python -m bench.studies.real_model`` run (its own command, date and machine), which
    ``python -m bench`` renders into bench/RESULTS.md from OUTPUT with every run of the bench; what the run recorded
    (its command, its notes) with bench's paths of today (bench.common.results.today)."""
    m, s, model, gpu = data["machine"], data["search"], data["model"], data["gpu"]
    plan = s.get("plan")
    on_gpu = bool(m.get("gpu"))
    lines = [
        "## A real model's shape: Qwen2.5-0.5B (issue 10)",
        "",
        f"Written from `bench/recorded/real_model.json` by `{data['command']}` ({data['date']}; {data['total_seconds']:.0f} s in all),"
        f" not by `python -m bench`: its own run on {m['cpu']}, {m['cpus']} CPU cores, {m['memory']} memory,"
        f" load average (1, 5, 15 min) before {m['load_before']}, after {data.get('load_after', '-')}"
        " (seconds on a shared CPU move with its load: compare them within one run; peak memory is steadier); "
        + ", ".join(f"{k} {v}" for k, v in data["versions"].items() if k in ("torch", "transformers", "trl", "ray", "tuner"))
        + ".",
        "",
        f"- GPU: {m['gpu'] if on_gpu else 'none. No GPU was available in this session: the GPU figures (trials packed per GPU, tokens/s of the pick vs TRL defaults) were not measured'}",
        f"- model: {model['name']} (`bench/studies/shapes.py`: Qwen2.5-0.5B's config numbers, seeded random {model['dtype']}"
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
        f"- trials that really ran at once (their MLflow runs' start/end times): {fmt(s.get('max_overlap'), 'd')}"
        f" (the search's concurrency: {fmt(s.get('concurrency'), 'd')})",
        f"- memory of the search's process tree (Ray, workers, trials; sum of RSS, sampled each second): peak"
        f" {s['process_tree_peak_mb']} MB; the whole machine's memory in use: {s['machine_in_use_before_mb']} MB before,"
        f" {s['machine_in_use_peak_mb']} MB at peak (other work on the machine included)",
        "",
        "| trial | config | status | trial start to end of step 1 (s) | set-up before step 1 (s) | step 1 (s) | later steps, mean (s) | tokens/s | peak memory (MB) | estimate (MB) | peak / estimate |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in data["trials"]:
        lines.append(_row(str(t["number"]), t))
    lines += [
        "",
        "Set-up is tuner's `seconds_to_first_step` (trial start in its child process to the end of optimizer step 1)"
        " less TRL's own `step_time` of step 1; a step's time is TRL's `step_time` (generation, scoring and the"
        " update); tokens/s is tuner's (the steps after its 2 warm-up steps, or with 2 steps the second alone). Peak"
        " memory is the trial's: on a CPU its process's peak resident set, on a GPU `torch.cuda.max_memory_allocated`;"
        " the estimate is `tuner.trial.memory`'s for the trial's params, made before it trains (GRPO's assumes 512-token"
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
            lines.append(f"| {r['config']} | `{_short_params(r['params'])}` | {r['status']} | {fmt(r['seconds_to_first_step'])} |"
                         f" {fmt(r['step_seconds'], '.2f')} | {fmt(r['tokens_per_second'], '.0f')} |"
                         f" {fmt(r['peak_memory_mb'], '.0f')} | {fmt(r['memory_estimate_mb'], '.0f')} |")
        lines += ["", f"tokens/s of the pick / TRL defaults: **{fmt(gpu.get('pick_over_trl_defaults'), '.2f')}**"
                  " (TRL defaults = GRPOConfig with nothing set: fp32 weights under bf16 autocast, batch 8, 8"
                  " generations of up to 512 tokens, activation checkpointing on)."]
    else:
        lines += ["", f"GPU comparison: {gpu.get('note')}."]
    return [today(line) for line in lines]


def _row(name: str, t: dict[str, Any]) -> str:
    status = t["status"] + (f" ({t['reason']})" if t.get("reason") else "")
    return (f"| {name} | `{_short_params(t['params'])}` | {status} | {fmt(t['seconds_to_first_step'])} |"
            f" {fmt(t['setup_seconds'])} | {fmt(t['first_step_seconds'])} | {fmt(t['step_seconds'])} |"
            f" {fmt(t['tokens_per_second'], '.1f')} | {fmt(t['peak_memory_mb'], '.0f')} |"
            f" {fmt(t['memory_estimate_mb'], '.0f')} | {fmt(t['peak_over_estimate'], '.2f')} |")


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


# -- the command -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.real_model", description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", default="grpo")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=SEED, help="search seed (default %(default)s: see SEED)")
    parser.add_argument("--model", default=None, help="default: the Qwen2.5-0.5B-shaped model (bench/studies/shapes.py)")
    parser.add_argument("--search-space", default=None,
                        help="default: bench.studies.real_model.CPU_SPACE on a CPU, the shipped space on a GPU")
    parser.add_argument("--compare", choices=("auto", "on", "off"), default="auto",
                        help="the pick vs TRL's defaults; auto: on a GPU only")
    parser.add_argument("--store", default=None, help="MLflow store (default: a temp dir, removed)")
    parser.add_argument("--no-build-timing", action="store_true",
                        help="when the shaped model is already built, do not time a fresh build of it (~15 s)")
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)

    keep = args.store is not None
    store = Path(args.store or tempfile.mkdtemp(prefix="bench-real-model-"))
    try:
        result = run(trainer=args.trainer, trials=args.trials, max_steps=args.max_steps, seed=args.seed,
                     model=args.model, search_space=args.search_space, store=store, compare=args.compare,
                     time_build=not args.no_build_timing)
    finally:
        if not keep:
            import shutil

            shutil.rmtree(store, ignore_errors=True)
    launcher = "python -m bench.studies.real_model" if __package__ not in (None, "") else "python bench/studies/real_model.py"
    result["command"] = " ".join([launcher, *(sys.argv[1:] if argv is None else argv)])
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {output} in {result['total_seconds']:.0f} s")
    for t in result["trials"]:
        print(f"  trial {t['number']}: {t['status']}, set-up {t['setup_seconds']} s, step {t['step_seconds']} s, "
              f"peak {t['peak_memory_mb']} MB vs estimate {t['memory_estimate_mb']} MB ({t['peak_over_estimate']})")
    print(f"  plan: {result['search']['plan']}; overlap {result['search']['max_overlap']}")
    print(f"  gpu: {result['gpu'].get('note') or result['gpu'].get('pick_over_trl_defaults')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
