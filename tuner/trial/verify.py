"""``tuner verify CONFIG.yaml --steps N``: a TRL config (an export, or your own) run for N steps as one guarded
trial, in this process, before the long run it stands for.

    spec, lines = prepare_verify("recommended.yaml", steps=600)   # checked as `trl <trainer> --config` reads it
    result = run_verify(spec, echo=print)                          # a line per block of steps while it runs
    verdict_lines(spec, result)                                    # "held 600 steps ..." or the step it failed at

A search's verdict covers its trials' steps and seeds and nothing beyond them; this is how a user extends that
horizon to the length they will run, on the seed they will run, with the same guard stopping it at the first
non-finite or collapsed step.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from tuner.errors import TunerError
from tuner.inputs.quiet import quiet_libraries
from tuner.records import Status, TrialResult
from tuner.trial._spec import TrialSpec

__all__ = ["BLOCKS", "prepare_verify", "run_verify", "verdict_lines"]

BLOCKS = 10  # the run is reported in this many blocks of steps: enough to see a trend, short enough to read


def prepare_verify(path: str, steps: int, model: str | None = None, dataset: str | None = None,
                   reward_funcs: list[str] | None = None, seed: int | None = None,
                   trainer: str | None = None) -> tuple[TrialSpec, list[str]]:
    """The config read and checked as `tuner search --from` reads it (flags over the file), its inputs probed; the
    trial spec of its whole run for ``steps`` steps, and the lines to print before it starts."""
    import torch

    from tuner.config import precision, trl_config, values
    from tuner.inputs import models, probe

    quiet_libraries()
    if steps < 1:
        raise TunerError(f"--steps {steps}: must be at least 1")
    source = trl_config.read_config(path, trainer)
    chosen, origins = trl_config.flags_over_file(source, model, dataset, reward_funcs, processes=None)
    on_gpu = torch.cuda.device_count() > 0
    cannot = precision.unsupported(on_gpu, bf16_supported=torch.cuda.is_bf16_supported() if on_gpu else True)
    mine = source.params["precision"]
    if mine in cannot:
        raise TunerError(f"{path}: precision: your config runs {mine}, which {cannot[mine]}; verify it on such a "
                         "machine (or change the file)")
    source.set_env()  # the trial runs in this process
    lines = [f"warning: {line}" for line in trl_config.run_here(source, on_gpu)]
    lines += [f"note: {note}" for note in source.notes]
    params = values.check_params(dict(source.params), source.entry, f"{path}")
    entry = source.entry
    inputs = probe.check_user_inputs(
        entry, chosen["model"] or models.TINY_MODEL, chosen["dataset"], chosen["reward_funcs"],
        missing_reward=f"{path}: reward_funcs: grpo on your own dataset needs a reward for it; add reward_funcs to "
                       "the file or pass --reward-func NAME")
    their_seed = source.effective.get("seed")
    spec = TrialSpec(trainer=entry.name, params=params, model=inputs.model, dataset=inputs.dataset,
                     reward_funcs=inputs.reward_funcs, max_steps=steps,
                     seed=seed if seed is not None else int(their_seed if their_seed is not None else 0),
                     ranks=chosen["processes"] or 1)
    seed_from = "--seed" if seed is not None else "the file's seed" if "seed" in source.raw else "TRL's default seed"
    head = [f"verify {path}: {steps} steps of {entry.name}, seed {spec.seed} ({seed_from}), as one guarded trial",
            *(f"  {line}" for line in origins)]
    return spec, head + lines


def run_verify(spec: TrialSpec, echo: Callable[[str], None] = print) -> TrialResult:
    """The trial, with a line per block of steps as they are logged (the progress metric and grad norm)."""
    from tuner.trial._run import run_trial

    block = max(1, math.ceil(spec.max_steps / BLOCKS))
    with tempfile.TemporaryDirectory(prefix="tuner-verify-") as scratch:
        metrics = Path(scratch) / "metrics.jsonl"
        metrics.touch()
        done = threading.Event()
        follower = threading.Thread(target=_follow, args=(metrics, spec, block, done, echo), daemon=True)
        follower.start()
        try:
            result = run_trial(spec, workdir=Path(scratch) / "trial", metrics_path=metrics)
        finally:
            done.set()
            follower.join(timeout=5)
    return result


def _follow(metrics: Path, spec: TrialSpec, block: int, done: threading.Event, echo) -> None:
    """Print one line per finished block of the metrics file's rows until the trial ends."""
    rows: list[dict[str, Any]] = []
    printed = 0
    with open(metrics) as stream:
        while True:
            line = stream.readline()
            if line:
                if line.endswith("\n"):
                    rows.append(json.loads(line))
                while len(rows) - printed >= block:
                    echo(block_line(spec, rows[printed:printed + block]))
                    printed += block
                continue
            if done.is_set():
                break
            done.wait(0.2)
    if len(rows) > printed:
        echo(block_line(spec, rows[printed:]))


def block_line(spec: TrialSpec, rows: list[dict[str, Any]]) -> str:
    """``steps 61-120: reward 0.512, grad_norm 0.84`` (means of the finite values; "nan" when none was)."""
    from tuner.verdicts.learning import progress_metric

    metric, _ = progress_metric(spec.entry)
    first, last = rows[0].get("step", "?"), rows[-1].get("step", "?")

    def mean(key: str) -> str:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        finite = [v for v in values if math.isfinite(v)]
        if not values:
            return "-"
        return f"{sum(finite) / len(finite):.4g}" if len(finite) == len(values) else "nan"

    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return f"  {steps}: {metric} {mean(metric)}, grad_norm {mean('grad_norm')}"


def verdict_lines(spec: TrialSpec, result: TrialResult) -> list[str]:
    """The whole verdict: how far it held (or where it failed, and why), whether it learned, and what it does not
    say."""
    from tuner.verdicts.forecast import evidence, horizon_steps, said, stalling
    from tuner.verdicts.learning import judge_learning

    learning = judge_learning(spec.entry, result.history)
    if result.status == Status.OK:
        head = f"held {result.steps_run} steps: ok"
    else:
        at = f" at step {result.stopped_at_step}" if result.stopped_at_step else ""
        head = f"failed{at} of {spec.max_steps}: {result.status}: {result.reason}"
    lines = [head, f"learned: {'yes' if learning.learned else 'no'}: {learning.describe()}"]
    if result.status == Status.OK:
        lines.append(f"horizon: {result.steps_run} steps on seed {spec.seed}; nothing is measured past step "
                     f"{result.steps_run} or on other seeds (tuner verify --steps N --seed S)")
        lines.append("forecast: " + (said(result.risk) or evidence(result.steps_run, [], horizon_steps(result.steps_run))))
        note = stalling(result.history, spec.params.get("precision", "fp32"))
        if note:
            lines.append(f"note: {note}")
    if result.tokens_per_second:
        lines.append(f"speed: {result.tokens_per_second:.0f} tokens/s")
    return lines
