"""``tuner verify CONFIG.yaml --steps N``: a TRL config (an export, or your own) run for N steps as one guarded
trial, in this process, before the long run it stands for.

    spec, lines = prepare_verify("recommended.yaml", steps=600)   # checked as `trl <trainer> --config` reads it
    result = run_verify(spec, echo=print)                          # a line per tenth of the run, and every 30 s
    verdict_lines(spec, result)                                    # "held 600 steps ..." or the step it failed at

A search's verdict covers its trials' steps and seeds and nothing beyond them; this is how a user extends that
horizon to the length they will run, on the seed they will run, with the same guard stopping it at the first
non-finite or collapsed step. A length the file leaves to TRL's default runs as the search's trials ran it, where
the file's header (a ``tuner export``) says what that was (``trl_default_lengths=True``: TRL's default instead);
the lines before the run say which lengths run.
"""

from __future__ import annotations

from typing import Any, Callable

from tuner.errors import TunerError
from tuner.inputs.quiet import quiet_libraries
from tuner.records import Status, TrialResult
from tuner.trial._follow import BLOCKS, run_followed
from tuner.trial._spec import TrialSpec

__all__ = ["BLOCKS", "TRL_DEFAULT_LENGTHS_FLAG", "prepare_verify", "run_lengths", "run_verify", "verdict_lines"]

TRL_DEFAULT_LENGTHS_FLAG = "--trl-default-lengths"  # tuner verify's flag: lengths the file leaves out run TRL's default


def prepare_verify(path: str, steps: int, model: str | None = None, dataset: str | None = None,
                   reward_funcs: list[str] | None = None, seed: int | None = None,
                   trainer: str | None = None, trl_default_lengths: bool = False) -> tuple[TrialSpec, list[str]]:
    """The config read and checked as `tuner search --from` reads it (flags over the file), its inputs probed; the
    trial spec of its whole run for ``steps`` steps, and the lines to print before it starts. A length the file
    leaves to TRL's default runs as the search's trials ran it where the file's header says (trl_default_lengths:
    TRL's default)."""
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
    entry = source.entry
    lengths, said = run_lengths(source, trl_default_lengths)
    params = values.check_params({**source.params, **lengths}, entry, f"{path}")
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
            *(f"  {line}" for line in origins), said]
    return spec, head + lines


def run_lengths(source, trl_default_lengths: bool = False) -> tuple[dict[str, int], str]:
    """(the lengths to run that the file leaves to TRL's default: the search's trials', from its header; the line
    ``lengths: max_completion_length 12 (the search's trials; --trl-default-lengths runs TRL's default 512)``, which
    says for each length setting of the trainer the value the run has and where it comes from). ``source``: the
    file, a tuner.config.trl_config.SourceConfig."""
    from tuner.config.trl_lengths import length_fields, search_lengths

    searched = search_lengths(source.text)
    run: dict[str, int] = {}
    said = []
    for name, default in length_fields(source.entry).items():
        trials = searched.get(name)
        if name in source.raw:
            theirs = f"; the search's trials ran {trials}" if trials is not None and trials != source.raw[name] else ""
            said.append(f"{name} {_length(source.raw[name])} (the file's{theirs})")
        elif trials is not None and not trl_default_lengths:
            run[name] = trials
            said.append(f"{name} {trials} (the search's trials; {TRL_DEFAULT_LENGTHS_FLAG} runs TRL's default "
                        f"{_length(default)})")
        elif trials is not None:
            said.append(f"{name} {_length(default)} (TRL's default, {TRL_DEFAULT_LENGTHS_FLAG}; the search's trials "
                        f"ran {trials})")
        else:
            said.append(f"{name} {_length(default)} (TRL's default: the file sets none)")
    return run, "lengths: " + ("; ".join(said) or f"none ({source.entry.name} has no length setting)")


def _length(value: Any) -> str:
    return "unlimited" if value is None else str(value)


def run_verify(spec: TrialSpec, echo: Callable[[str], None] = print) -> TrialResult:
    """The trial, with a line per tenth of the run as its steps are logged (the progress metric and grad norm, steps
    per second, time left), one at least every 30 s, and an estimate of the whole run after its first steps."""
    return run_followed(spec, echo, shorter="pass --steps N for a shorter check")


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
