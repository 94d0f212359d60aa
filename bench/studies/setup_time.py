"""Per-trial set-up with the base model's weights loaded from disk by every trial (before) and mapped from the node's
one shared copy (after, tuner.trial.weights), side by side in one run, on the tiny model and the Qwen2.5-0.5B shape.

    python -m bench.studies.setup_time                       # 5-20 min on a 2-core CPU (its load); writes bench/recorded/setup_time.json
    python -m bench.studies.setup_time --repeats 5 --models tiny

Every measurement runs in a fresh child of the trial forkserver (torch, transformers and TRL preloaded), as a trial
does; before and after alternate within each repeat, medians and the ratio before/after are reported.

1. model load alone: ``from_pretrained`` of the causal LM (before: from the model's folder, page cache warm; and
   cold, the checkpoint dropped from the page cache first), then one read of every page of every weight (a mapped
   checkpoint is read lazily: its cost would otherwise hide in the first step); after: ``tuner.trial.weights`` forced on
   (TUNER_SHARED_WEIGHTS=always). Also the trial's private memory after it (what N concurrent trials pay N times),
   the same with every page written once (full fine-tuning: its first optimizer step), and the one-off build of
   the shared copy by the first trial on the node.
2. per-trial set-up in a real trial (tuner.trial.run_trial; shipped setting, TUNER_SHARED_WEIGHTS=auto, against
   off): seconds to the first optimizer step (the trial record's ``seconds_to_first_step``; SFT with LoRA and full),
   the trainer's construction (tokenizer, model, reference model, PEFT wrapping; also the reward model and GRPO
   with a reference model, built but not stepped), and the model loads inside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common.results import RECORDED

OUT = RECORDED / "setup_time.json"

# Trials: short and small, so the first step (the same before and after) does not drown the set-up on a CPU. Those
# marked construct_only stop when the trainer is built (the set-up; their first step is the same before and after).
_SMALL = {"learning_rate": 1e-5, "per_device_train_batch_size": 1, "max_length": 64, "activation_checkpointing": False}
TRIALS: dict[str, dict[str, Any]] = {
    # LoRA: the frozen base is what sharing keeps shared
    "sft-lora": {"trainer": "sft", "params": {**_SMALL, "use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]}},
    # full fine-tuning: the first optimizer step copies the pages it writes
    "sft-full": {"trainer": "sft", "params": {**_SMALL, "use_peft": False}},
    # the reward model: a sequence classifier whose score head is drawn fresh
    "reward-lora": {"trainer": "reward", "construct_only": True, "params": {**_SMALL, "use_peft": True}},
    # GRPO with a KL term and full fine-tuning: TRL loads a reference model from the same path
    "grpo-ref": {"trainer": "grpo", "construct_only": True,
                 "params": {"use_peft": False, "beta": 0.04, "learning_rate": 1e-6, "per_device_train_batch_size": 4,
                            "num_generations": 4, "max_completion_length": 8, "activation_checkpointing": False}},
}
PRECISIONS = ("fp32", "bf16-pure")
DTYPES = ("float32", "bfloat16")


# -- children (run in the trial forkserver) ------------------------------------------------------------------------


def _private_mb() -> float | None:
    """This process's anonymous (private, not file-backed) memory: a copy of the weights shows here, a mapping not."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _touch(model, write: bool = False) -> None:
    """Read (or write, as an optimizer step does) one byte of every page of every weight."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            pages = p.reshape(-1).view(torch.uint8)[::4096]
            if write:
                pages.add_(0)
            else:
                pages.sum()


def _load_child(model_path: str, dtype: str, mode: str, root: str, trained: bool, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from tuner.inputs import quiet_libraries
    from tuner.trial import weights

    quiet_libraries()
    os.environ[weights.DIR_ENV], os.environ[weights.ENV] = root, mode
    private_before = _private_mb()
    started = time.perf_counter()
    model = weights.from_pretrained(AutoModelForCausalLM, model_path, getattr(torch, dtype), trained)
    loaded = time.perf_counter()
    _touch(model, write=trained)
    touched = time.perf_counter()
    private = _private_mb()
    Path(out).write_text(json.dumps({
        "load_s": loaded - started, "load_touch_s": touched - started,
        "private_mb": None if private is None else private - private_before,
        "shared": Path(model.name_or_path).parent == Path(root)}))


def _trial_child(spec_dict: dict, workdir: str, mode: str, root: str, construct_only: bool, out: str) -> None:
    import trl.trainer.dpo_trainer
    import trl.trainer.grpo_trainer

    from tuner.inputs import data, models, quiet_libraries, rewards
    from tuner.trial import TrialSpec, run_trial, trainer, weights

    quiet_libraries()
    os.environ[weights.DIR_ENV], os.environ[weights.ENV] = root, mode
    times: dict[str, float] = {"model_load_s": 0.0, "ref_model_load_s": 0.0, "build_trainer_s": 0.0}
    shared: list[bool] = []

    def timed(function, key, after=None):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            value = function(*args, **kwargs)
            times[key] += time.perf_counter() - started
            if after:
                after(value)
            return value
        return wrapper

    weights.from_pretrained = timed(weights.from_pretrained, "model_load_s",
                                    lambda m: shared.append(Path(m.name_or_path).parent == Path(root)))
    for module in (trl.trainer.grpo_trainer, trl.trainer.dpo_trainer):
        module.create_model_from_path = timed(module.create_model_from_path, "ref_model_load_s")
    trainer.build_trainer = timed(trainer.build_trainer, "build_trainer_s")
    spec = TrialSpec(**spec_dict)
    row: dict[str, Any] = {}
    if construct_only:
        model_path = models.resolve_model(spec.model)
        tiny = models.is_tiny(model_path)
        dataset = data.load_dataset_spec(None, spec.entry, tiny=tiny)
        reward_funcs = (rewards.resolve_reward_funcs([data.builtin_reward(tiny)])
                        if spec.entry.uses_reward_funcs else None)
        run = {"max_steps": 1, "seed": spec.seed, "output_dir": str(Path(workdir) / "out"), "use_cpu": True}
        trainer.build_trainer(spec.entry, model_path, spec.params, dataset, run, reward_funcs=reward_funcs)
        row["status"] = "built"
    else:
        result = run_trial(spec, workdir)
        row.update(status=str(result.status), reason=result.reason, seconds_to_first_step=result.seconds_to_first_step)
    row.update(times, shared=bool(shared) and all(shared))
    Path(out).write_text(json.dumps(row))


def _in_child(target, *args) -> dict[str, Any]:
    from tuner.trial import process_context

    with tempfile.TemporaryDirectory(prefix="setup-time-") as folder:
        out = str(Path(folder) / "out.json")
        process = process_context().Process(target=target, args=(*args, out))
        process.start()
        process.join()
        if process.exitcode != 0 or not Path(out).exists():
            return {"error": f"child exited with {process.exitcode}"}
        return json.loads(Path(out).read_text())


def _trial(model_path: str, name: str, precision: str, mode: str, root: str) -> dict[str, Any]:
    from tuner.trial import TrialSpec

    entry = TRIALS[name]
    spec = TrialSpec(trainer=entry["trainer"], params={**entry["params"], "precision": precision}, model=model_path,
                     max_steps=1, warmup_steps=0)
    with tempfile.TemporaryDirectory(prefix="setup-trial-") as workdir:
        return _in_child(_trial_child, spec.to_dict(), workdir, mode, root, bool(entry.get("construct_only")))


# -- the page cache ------------------------------------------------------------------------------------------------


def _drop_from_page_cache(model_path: str) -> bool:
    """Evict the checkpoint's files from the page cache (posix_fadvise DONTNEED): the next load reads the disk."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in Path(model_path).glob("*.safetensors"):
        fd = os.open(path.resolve(), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


# -- the run -------------------------------------------------------------------------------------------------------


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _ratio(before: float | None, after: float | None) -> float | None:
    return None if not before or not after else before / after


def measure_model(label: str, model_path: str, repeats: int, trials: list[str], root: str) -> dict[str, Any]:
    from tuner.trial import weights

    out: dict[str, Any] = {"model": label, "path": model_path, "load": {}, "trials": {}}
    for dtype in DTYPES:
        weights.release(model_path)
        first = _in_child(_load_child, model_path, dtype, "always", root, False)  # builds the node's copy
        rows: dict[str, list[dict]] = {"disk": [], "disk_cold": [], "shared": [], "disk_written": [],
                                       "shared_written": []}
        for _ in range(repeats):
            rows["disk"].append(_in_child(_load_child, model_path, dtype, "off", root, False))
            rows["shared"].append(_in_child(_load_child, model_path, dtype, "always", root, False))
            # full fine-tuning: every page written once, as the first optimizer step does
            rows["disk_written"].append(_in_child(_load_child, model_path, dtype, "off", root, True))
            rows["shared_written"].append(_in_child(_load_child, model_path, dtype, "always", root, True))
            cold = _drop_from_page_cache(model_path)
            rows["disk_cold"].append({**_in_child(_load_child, model_path, dtype, "off", root, False), "cold": cold})
        summary = {side: {k: _median(r, k) for k in ("load_s", "load_touch_s", "private_mb")} for side, r in rows.items()}
        summary["first_shared_load_builds_copy"] = first
        summary["ratio_load_touch"] = _ratio(summary["disk"]["load_touch_s"], summary["shared"]["load_touch_s"])
        summary["ratio_load_touch_cold"] = _ratio(summary["disk_cold"]["load_touch_s"], summary["shared"]["load_touch_s"])
        summary["ratio_load_write"] = _ratio(summary["disk_written"]["load_touch_s"],
                                             summary["shared_written"]["load_touch_s"])
        out["load"][dtype] = {"median": summary, "runs": rows}
        _print_load(label, dtype, summary)
    for name in trials:
        for precision in PRECISIONS:
            weights.release(model_path)
            first = _trial(model_path, name, precision, "auto", root)
            rows = {"before": [], "after": []}
            for _ in range(repeats):
                rows["before"].append(_trial(model_path, name, precision, "off", root))
                rows["after"].append(_trial(model_path, name, precision, "auto", root))
            keys = ("seconds_to_first_step", "build_trainer_s", "model_load_s", "ref_model_load_s")
            summary = {side: {k: _median(r, k) for k in keys} for side, r in rows.items()}
            summary["shared"] = all(r.get("shared") for r in rows["after"])
            summary["first_after_trial_builds_copy"] = first
            summary["ratio_build_trainer"] = _ratio(summary["before"]["build_trainer_s"], summary["after"]["build_trainer_s"])
            summary["ratio_model_loads"] = _ratio(
                (summary["before"]["model_load_s"] or 0) + (summary["before"]["ref_model_load_s"] or 0),
                (summary["after"]["model_load_s"] or 0) + (summary["after"]["ref_model_load_s"] or 0))
            summary["ratio_seconds_to_first_step"] = _ratio(summary["before"]["seconds_to_first_step"],
                                                            summary["after"]["seconds_to_first_step"])
            out["trials"][f"{name}/{precision}"] = {"median": summary, "runs": rows}
            _print_trial(label, name, precision, summary)
    weights.release(model_path)
    return out


def _fmt(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def _print_load(label: str, dtype: str, s: dict) -> None:
    print(f"[load] {label} {dtype}: load call disk {_fmt(s['disk']['load_s'])} s, shared {_fmt(s['shared']['load_s'])} s; "
          f"load+touch disk {_fmt(s['disk']['load_touch_s'])} s "
          f"(cold {_fmt(s['disk_cold']['load_touch_s'])} s), shared {_fmt(s['shared']['load_touch_s'])} s: "
          f"{_fmt(s['ratio_load_touch'], '.1f')}x ({_fmt(s['ratio_load_touch_cold'], '.1f')}x cold); private MB "
          f"{_fmt(s['disk']['private_mb'], '.0f')} -> {_fmt(s['shared']['private_mb'], '.0f')}; written (full "
          f"fine-tuning) disk {_fmt(s['disk_written']['load_touch_s'])} s, shared "
          f"{_fmt(s['shared_written']['load_touch_s'])} s: {_fmt(s['ratio_load_write'], '.1f')}x; first (builds) "
          f"{_fmt(s['first_shared_load_builds_copy'].get('load_touch_s'))} s", flush=True)


def _print_trial(label: str, name: str, precision: str, s: dict) -> None:
    b, a = s["before"], s["after"]
    print(f"[trial] {label} {name} {precision} (shared: {s['shared']}): trainer built {_fmt(b['build_trainer_s'])} -> "
          f"{_fmt(a['build_trainer_s'])} s ({_fmt(s['ratio_build_trainer'], '.1f')}x), model loads "
          f"{_fmt((b['model_load_s'] or 0) + (b['ref_model_load_s'] or 0))} -> "
          f"{_fmt((a['model_load_s'] or 0) + (a['ref_model_load_s'] or 0))} s ({_fmt(s['ratio_model_loads'], '.1f')}x), "
          f"to first step {_fmt(b['seconds_to_first_step'])} -> {_fmt(a['seconds_to_first_step'])} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny", "qwen2.5-0.5b"], choices=["tiny", "qwen2.5-0.5b"])
    parser.add_argument("--trials", nargs="+", default=list(TRIALS), choices=list(TRIALS))
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args(argv)

    import torch
    import transformers
    import trl

    from bench.studies.shapes import QWEN25_05B, build_shaped_model
    from tuner.inputs.models import tiny_model_dir

    paths = {"tiny": str(tiny_model_dir()), "qwen2.5-0.5b": str(build_shaped_model(QWEN25_05B))}
    from tuner.trial import weights

    # the bench's own entries folder (children get it as an argument; release() here needs it too): the node's
    # folder, which searches running beside the bench use, is left alone
    root = tempfile.mkdtemp(prefix="tuner-weights-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.environ[weights.DIR_ENV] = root
    started = time.time()
    results: dict[str, Any] = {
        "command": "python -m bench.studies.setup_time " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "load_average_start": os.getloadavg(), "repeats": args.repeats, "models": {}}
    try:
        for label in args.models:
            results["models"][label] = measure_model(label, paths[label], args.repeats, args.trials, root)
            args.output.write_text(json.dumps(results, indent=1))  # what is done so far
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_average_end"] = os.getloadavg()
    results["seconds"] = round(time.time() - started)
    args.output.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.output} ({results['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
