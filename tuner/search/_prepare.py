"""A search's pre-run checks: every input the user gave, checked before any run, study or trial exists.

    prepared = prepare(SearchOptions(trainer="dpo", dataset="prefs.jsonl"))   # TunerError on bad input
    prepared = prepare_resume(options)                                        # --resume: its own options again

``prepare`` reads as a list of checks, cheap ones first (options, the space, the --from file, Ray's address,
the tracking URI), then the slow ones that import torch and TRL (GPUs, param names and values, precisions this
machine cannot run, the model, data and rewards probed on a few rows), the local store last. ``Prepared`` is
what the search then runs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.options import DEFAULT_TRIALS, SUBMITTED_JOB_ENV, SearchOptions, check_options
from tuner.config.space import SearchSpace, check_param_names, load_space
from tuner.errors import TunerError
from tuner.inputs.quiet import quiet_libraries
from tuner.search.start import ColdStart, Start, starts

if TYPE_CHECKING:
    from tuner.config.trl_config import SourceConfig
    from tuner.search._warm import Here, WarmStart

__all__ = ["Prepared", "hardware_precisions", "halves", "model_label", "on_gpu", "prepare", "prepare_resume",
           "trial_ranks"]


@dataclass
class Prepared:
    """A search's inputs, every one checked (``prepare``): what ``run_search`` runs.

    Args:
        options: the search's options as checked, the user's paths made absolute and --from's file read in.
        space: the space it searches: the shipped one or --search-space, narrowed for this machine (precisions it
            cannot run or runs 10x slower, what earlier searches showed failing here) or derived from --from's file.
        model_path: the model folder every trial loads (a hub id, or tuner's local copy of a built or packaged model).
        tracking_uri: the MLflow store or server it logs to.
        experiment: the MLflow experiment (--experiment, or TRAINER-MODEL).
        n_trials: the search trials it plans (--trials, a grid's size, or a warm start's cut budget).
        grid: the grid's points in the order they run (--sampler grid), else None.
        dropped_precisions: the space's precisions this machine cannot run (said in ``warnings``).
        warnings: lines the search prints before it starts.
        resume_run_id: the search run --resume continues, else None.
        start: how it starts: cold, from the user's config (--from), warm from earlier searches, or both
            (tuner.search.start).
        model_line: which model --model resolved to, and from where: the search's first line.
    """

    options: SearchOptions
    space: SearchSpace
    model_path: str
    tracking_uri: str
    experiment: str
    n_trials: int
    grid: list[dict[str, Any]] | None
    dropped_precisions: list[str]
    warnings: list[str] = field(default_factory=list)
    resume_run_id: str | None = None
    start: Start = field(default_factory=ColdStart)
    model_line: str = ""



def halves(options: SearchOptions) -> bool:
    """Whether successive halving stops trials inside the first rung: as --prune says when given; by default on
    for the tiny model (but with --sampler grid) and off for a pretrained model. At its learning rates a pretrained
    model's reward or loss does not move visibly in a quarter of --max-steps, so halving there ranks noise: on the
    tiny pretrained model it stopped at step 6 of 20 all four fp32 trials at 2e-5 to 5e-5, the ones that learn
    within 60 steps, and kept a trial at 1e-6 with a lucky start. For a pretrained model the longer rungs
    (tuner.search._extend: 20 -> 60 -> 180 steps, the best third each time) do the halving."""
    from tuner.inputs import models

    if options.prune is not None:
        return options.prune
    return options.sampler != "grid" and (options.model or models.TINY_MODEL) == models.TINY_MODEL

def model_label(model: str) -> str:
    return Path(model.rstrip("/")).name or model


def hardware_precisions(gpus_per_trial: float | None) -> dict[str, str]:
    """Precisions this hardware cannot run, each with why. Dropped with one warning, never
    silently run as something else. ``gpus_per_trial`` None: GPU trials when this machine has a GPU."""
    import torch

    from tuner.config import precision

    gpu = on_gpu(gpus_per_trial)
    bf16 = torch.cuda.is_bf16_supported() if gpu and torch.cuda.is_available() else True
    return precision.unsupported(gpu, bf16_supported=bf16)


def _without_slow_precisions(space: SearchSpace, model: str, gpus_per_trial: float | None,
                             source: SourceConfig | None) -> tuple[SearchSpace, dict[str, str]]:
    """The space without the precisions this hardware trains ``model`` an order of magnitude slower in
    (tuner.config.precision.slow_here), and those left out with why. A --from file's own precision stays (trial 0
    runs the file as written), and so does a space's only precision: the user asked for it."""
    from tuner.config import precision
    from tuner.inputs import models

    slow = precision.slow_here(on_gpu(gpus_per_trial), built_here=models.is_built_here(model))
    mine = source.params["precision"] if source is not None else None
    left_out = {p: slow[p] for p in space.precisions() if p in slow and p != mine}
    if not left_out or len(left_out) == len(space.precisions()):
        return space, {}
    return space.without_precisions(list(left_out)), left_out


# A real model's step on a CPU costs seconds per row: the shipped spaces' larger batches (DPO's 8 x accumulation 4) ran
# SmolLM2-135M-Instruct's DPO at ~80 s a step on a 2-core machine, against ~4 s at 4 x 1, so a default search ran for
# hours. On a CPU such a model's trials take the shipped space's smallest accumulation, batches of at most
# CPU_BATCH_ROWS, and no activation checkpointing (it saves memory a CPU has and costs a third of the step).
CPU_BATCH_ROWS = 8


def _small_steps_on_cpu(space: SearchSpace, model: str, gpus_per_trial: float | None, shipped: bool,
                        source: SourceConfig | None) -> tuple[SearchSpace, list[str]]:
    """The shipped space with the step kept small for a real model on a CPU (CPU_BATCH_ROWS), and a line per knob
    narrowed. A --search-space of the user's and a --from file keep theirs: they asked for them."""
    from tuner.inputs import models

    if not shipped or source is not None or on_gpu(gpus_per_trial) or models.is_built_here(model):
        return space, []
    lines = []
    for name, keep in (("gradient_accumulation_steps", lambda v, values: v == min(values)),
                       ("per_device_train_batch_size", lambda v, values: v <= max(CPU_BATCH_ROWS, min(values))),
                       ("activation_checkpointing", lambda v, values: v is False or len(values) == 1)):
        values = space.values_of(name) if name in space.params else []
        dropped = [v for v in values if not keep(v, values)]
        if dropped:
            space = space.without_choices(name, dropped)
            lines.append(f"{name} kept to {_listed(space.values_of(name))} of {_listed(values)}")
    if not lines:
        return space, []
    return space, [f"on a CPU a real model's step costs seconds per row: {'; '.join(lines)} (the shipped space's "
                   "larger steps ran SmolLM2-135M-Instruct's DPO at ~80 s a step here, against ~4 s at batch 4 x 1); "
                   "a --search-space of yours keeps what it says"]


def _listed(values: list) -> str:
    return ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)


def on_gpu(gpus_per_trial: float | None) -> bool:
    import torch

    return torch.cuda.device_count() > 0 if gpus_per_trial is None else gpus_per_trial > 0


def trial_ranks(o: SearchOptions) -> int:
    """Processes per trial the options ask for: --processes-per-trial, else --gpus-per-trial when it is 2 or more
    (one process per GPU), else 1 (the memory plan may raise it for a config that fits no single GPU)."""
    gpus = o.gpus_per_trial or 0
    if gpus > 1 and not float(gpus).is_integer():
        raise TunerError(f"--gpus-per-trial {gpus:g}: a trial on more than one GPU takes whole GPUs (one process "
                         f"each); use {math.floor(gpus)} or {math.ceil(gpus)}")
    if o.processes_per_trial and gpus >= 1 and o.processes_per_trial != int(gpus):
        raise TunerError(f"--processes-per-trial {o.processes_per_trial} with --gpus-per-trial {gpus:g}: a GPU "
                         f"trial runs one process per GPU; drop --processes-per-trial or make it {int(gpus)}")
    if o.processes_per_trial and 0 < gpus < 1 and o.processes_per_trial > 1:
        raise TunerError(f"--processes-per-trial {o.processes_per_trial} with --gpus-per-trial {gpus:g}: the "
                         "processes of one trial each need a whole GPU; give --gpus-per-trial "
                         f"{o.processes_per_trial}")
    return o.processes_per_trial or (int(gpus) if gpus >= 2 else 1)


def _check_ray_address(address: str) -> None:
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise TunerError(f"--ray-address {address}: expected HOST:PORT of a Ray head node (e.g. 10.0.0.1:6379, or "
                         "ray://HOST:10001 for Ray Client), or auto; leave it out to run Ray locally")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=3):
            pass
    except OSError as e:
        raise TunerError(
            f"--ray-address {address}: no Ray cluster answers there ({e}); start one with `ray start --head` "
            "and pass the address it prints, or leave --ray-address out to run Ray locally"
        ) from None


def _check_job_store(store: str) -> None:
    """A search sent with tuner submit runs in a copy of the submitter's folder that Ray deletes with the job: its
    store (the Optuna study, Ray Tune's trial folders, MLflow's local files) must be somewhere that stays."""
    if os.environ.get(SUBMITTED_JOB_ENV) and Path(store).resolve().is_relative_to(Path.cwd().resolve()):
        raise TunerError(f"--store {store}: inside the job's working directory, which Ray deletes when the job "
                         f"ends (no resume, no review); set TUNER_STORE to a folder every node shares where `ray "
                         f"start` runs on the cluster, or pass --store /shared/path to tuner submit")


def prepare(options: SearchOptions) -> Prepared:
    """Check everything the user gave us; raises TunerError before any run, study or trial exists.

    Cheap checks run first, so a typo fails in a second instead of after importing TRL and torch;
    the local store is checked last because checking it creates its folder.
    """
    from tuner.config import trainers, values
    from tuner.inputs import models, probe
    from tuner.stores import mlflow_store

    o = options
    check_options(o)  # choices and ranges, as the command line checks them
    source = None
    origins: list[str] = []
    if o.from_config:
        source = _read_from(o.from_config, o.trainer)
        o, origins = _flags_over_file(o, source)
        space = _derived_space(o, source)
    else:
        # A space's `trainer:` is the default trainer; an explicit --trainer must agree with it (load_space says so).
        space = load_space(o.search_space, o.trainer or (None if o.search_space else trainers.DEFAULT_TRAINER))
    model = o.model or models.TINY_MODEL
    o = dataclasses.replace(o, trainer=space.trainer, model=model)
    space = space.for_model(pretrained=model != models.TINY_MODEL)
    if o.reward_funcs and not o.entry.uses_reward_funcs:
        online = ", ".join(name for name, a in trainers.ADAPTERS.items() if a.uses_reward_funcs)
        raise TunerError(f"--reward-func is for {online} only; {o.trainer} learns from its dataset's labels")
    if o.sampler == "grid":
        space.grid()  # a float or int param cannot be a grid axis: say so before the slow checks
    if o.ray_address:
        _check_ray_address(o.ray_address)
    _check_job_store(o.store)
    uri = o.tracking_uri or mlflow_store.default_tracking_uri(Path(o.store))
    remote = mlflow_store.is_server(uri)
    if o.tracking_uri:
        mlflow_store.check_tracking_scheme(uri)
    if remote:
        mlflow_store.check_tracking(uri, Path(o.store))  # asks the server's /health; writes nothing

    # -- the slow checks: they import torch, TRL and datasets, and build the tiny model once
    quiet_libraries()
    if o.gpus_per_trial and not o.ray_address:
        import torch

        if torch.cuda.device_count() == 0:
            raise TunerError(f"--gpus-per-trial {o.gpus_per_trial}: this machine has no CUDA GPU; drop the flag "
                             "to run on the CPU, or pass --ray-address of a cluster with GPUs")
    trial_ranks(o)  # --gpus-per-trial 1.5 or --processes-per-trial that disagrees: said before the slow checks
    check_param_names(space, o.entry.config_fields())
    values.check_space_values(space)  # 2e-4 is a number; a value of the wrong type is refused here

    if "fsdp" in space.values_of("sharding") and not on_gpu(o.gpus_per_trial):
        raise TunerError(f"{space.source}: sharding: fsdp needs GPUs (accelerate shards a model over GPU ranks only); "
                         "on a CPU a trial of several processes runs DDP: remove fsdp from sharding")
    cannot = hardware_precisions(o.gpus_per_trial)
    dropped = [p for p in space.precisions() if p in cannot]
    warnings = [f"precision {p} dropped: {cannot[p]}" for p in dropped]
    if source is not None and source.params["precision"] in dropped:
        raise TunerError(f"{o.from_config}: precision: your config runs {source.params['precision']}, which "
                         f"{cannot[source.params['precision']]}; run tuner on such a machine (or change the file)")
    space = space.without_precisions(dropped)
    space, slow = _without_slow_precisions(space, model, o.gpus_per_trial, source)
    dropped += list(slow)
    warnings += [f"precision {p} left out: {why}" for p, why in slow.items()]
    space, small = _small_steps_on_cpu(space, model, o.gpus_per_trial, not o.search_space, source)
    warnings += small
    if source is not None:
        from tuner.config import trl_config

        # what this machine cannot run of their file (a package missing, CUDA needed): said now, run as stated
        warnings += trl_config.run_here(source, on_gpu(o.gpus_per_trial), space.fixed)

    grid = space.grid() if o.sampler == "grid" else None
    first = None
    if source is not None:
        from tuner.config import trl_config

        first = trl_config.trial0(space, source)
        if grid is not None:  # trial 0 is the first grid point, and runs once
            grid = [first, *(point for point in grid if point != first)]
    n_trials = o.trials or (len(grid) if grid is not None else DEFAULT_TRIALS)

    if source is not None and o.reward_funcs and o.reward_funcs == source.reward_funcs:
        from tuner.inputs import rewards

        try:  # the file's reward_funcs: the refusal names the file and the flag that replaces them
            rewards.resolve_reward_funcs(rewards.resolve_reward_paths(o.reward_funcs))
        except TunerError as e:
            raise TunerError(f"{o.from_config}: reward_funcs: {e}; or pass --reward-func NAME (repeat for several) "
                             "to replace the file's") from None
    inputs = probe.check_user_inputs(
        o.entry, model, o.dataset, o.reward_funcs,
        missing_reward=f"--dataset {o.dataset}: grpo on your own data needs a reward for it (tuner's built-in reward "
                       "only scores its built-in data); pass --reward-func NAME: a TRL reward such as accuracy_reward, "
                       "or module:function of yours")
    model_path = inputs.model_path
    _check_assistant_only_loss(o, space, model_path)
    # The user's paths are resolved against this folder now: trials run in Ray's working directories, and the
    # MLflow params, trial specs and trial.yaml files keep them absolute (so --resume works from anywhere).
    o = dataclasses.replace(
        o, model=inputs.model, dataset=inputs.dataset, reward_funcs=inputs.reward_funcs,
        search_space=str(Path(o.search_space).resolve()) if o.search_space else None,
        from_config=source.path if source is not None else None)
    space.source = o.search_space or space.source

    # the stores checked before the warm start reads them
    if not remote:
        mlflow_store.check_tracking(uri, Path(o.store))
    if o.tracking_uri:
        # the local store folder is written with any tracking URI: the Optuna study (and a server's spool) live there
        mlflow_store.check_tracking(mlflow_store.default_tracking_uri(Path(o.store)), Path(o.store))
    if o.optuna_storage:
        from tuner.search._sampling import absolute_storage, check_study_storage

        storage = absolute_storage(o.optuna_storage)
        check_study_storage(storage)
        o = dataclasses.replace(o, optuna_storage=storage)
    here, warm = _warm_start(o, uri, space, cannot, n_trials, source, first, model_path)
    if warm.left_out:  # precisions that crashed on this hardware in every earlier trial (tuner.search._warm)
        space = space.without_precisions(list(warm.left_out))
        if grid is not None:
            grid = [point for point in grid if point.get("precision") not in warm.left_out]
    if warm.batches_left_out:  # batch sizes that ran out of memory on this hardware in every earlier trial
        from tuner.search._warm import BATCH

        space = space.without_choices(BATCH, list(warm.batches_left_out))
        if grid is not None:
            grid = [point for point in grid if point.get(BATCH) not in warm.batches_left_out]
    if grid is not None and warm.picks:  # the earlier picks run first, each once, after a --from trial 0
        picked = []
        for pick in warm.picks:
            point = next((p for p in grid if p is not first and p not in picked
                          and all(p.get(k) == v for k, v in pick.items())), None)
            if point is not None:
                picked.append(point)
        warm.picks = picked  # a grid point each; the line says so
        grid = [*([first] if first is not None else []), *picked,
                *(point for point in grid if point is not first and point not in picked)]
    if grid is not None and not o.trials:
        n_trials = len(grid)
    elif not o.trials and warm:  # a warm search's budget (tuner.search._warm.WarmStart.budget): said in its line
        n_trials = warm.budget(n_trials)
    if warm and o.sampler == "tpe" and grid is None:  # the earlier trials' speeds: no speed stage of its own
        from tuner.search._staging import speed_known

        warm.speeds_reused = speed_known(warm.measured_here())
        warm.fallback = _fallback(warm, space)
    warm.line = _warm_line(warm, here)  # what it reuses, as the rules above left it

    experiment = o.experiment or f"{o.trainer}-{model_label(inputs.model)}"
    # on a grid, --from's trial 0 is the grid's first point and runs once like any other
    start = starts(here, warm, source, first if grid is None else None, origins, o.search_space)
    return Prepared(o, space, model_path, uri, experiment, n_trials, grid, dropped, warnings, start=start,
                    model_line=inputs.model_line)


def _fallback(warm: WarmStart, space: SearchSpace) -> int:
    """The trials a warm search with a cut budget runs if it falls back (tuner.search._warm.WarmStart.fallback_trials),
    where that is not the default: a cold search's learning stage (its default less its speed stage,
    tuner.search._staging.Stages) when the earlier speeds count as measured here, and more than it planned; else 0."""
    from tuner.search._staging import Stages

    if not (warm.trials and warm.speeds_reused):
        return 0
    cold = Stages.for_space(space, warm.trials[1])
    learning = warm.trials[1] - (cold.speed_trials if cold is not None else 0)
    return learning if cold is not None and cold.speed_trials and learning > warm.trials[0] else 0


def _warm_line(warm: WarmStart, here: Here) -> str:
    from tuner.search import _warm

    return _warm.describe(warm, here) if warm else ""


def _warm_start(o: SearchOptions, uri: str, space: SearchSpace, cannot: dict[str, str], n_trials: int,
                source: SourceConfig | None, first: dict[str, Any] | None, model_path: str) -> tuple[Here, WarmStart]:
    """This search's identity, and what it reuses of the earlier searches --warm-start names (tuner.search._warm):
    the store is read, never written; a --warm-start RUN_ID that is no finished search of this trainer is refused."""
    from tuner.inputs.lengths import data_profile
    from tuner.search import _warm

    assert o.trainer is not None and o.model is not None  # prepare resolved both before this
    here = _warm.identity(o.trainer, o.model, o.dataset, o.gpus_per_trial, o.ray_address, cannot, o.reward_funcs,
                          data_profile(o.entry, o.dataset, model_path))
    sources = _warm.read_sources(uri, Path(o.store), here, o.warm_start)
    # a --from file's precision and batch size run as written
    keep = (source.params["precision"], source.params.get(_warm.BATCH)) if source is not None else ()
    return here, _warm.build(sources, here, space, n_trials, keep=keep, after_first=first is not None)


def _flags_over_file(o: SearchOptions, source: SourceConfig) -> tuple[SearchOptions, list[str]]:
    """--from's file under the command line (tuner.config.trl_config.flags_over_file)."""
    from tuner.config import trl_config

    chosen, origins = trl_config.flags_over_file(source, model=o.model, dataset=o.dataset,
                                                 reward_funcs=o.reward_funcs, processes=o.processes_per_trial)
    return dataclasses.replace(o, trainer=source.trainer, model=chosen["model"], dataset=chosen["dataset"],
                               reward_funcs=chosen["reward_funcs"], processes_per_trial=chosen["processes"]), origins


def _read_from(path: str, trainer: str | None) -> SourceConfig:
    """--from FILE: their TRL config, read and checked as `trl <trainer> --config` reads it."""
    from tuner.config import trl_config

    return trl_config.read_config(path, trainer)


def _derived_space(o: SearchOptions, source: SourceConfig) -> SearchSpace:
    """The space around their config (narrowed by --search-space)."""
    from tuner.config import trl_config

    space = trl_config.derive_space(source)
    if o.search_space:
        space = trl_config.narrowed(space, load_space(o.search_space, source.trainer))
    return space


def _check_assistant_only_loss(o: SearchOptions, space: SearchSpace, model_path: str) -> None:
    """assistant_only_loss: true (SFT) trains on the assistant's turns: TRL needs conversational rows and a chat
    template that marks those turns ({% generation %}, or one TRL knows how to patch), and refuses anything else
    in every trial. Said here, once, before any trial, with what would make it run."""
    if True not in space.values_of("assistant_only_loss"):
        return
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template
    from trl.data_utils import is_conversational

    from tuner.inputs import data, models

    where = f"{o.from_config or space.source}: assistant_only_loss: true"
    template = space.values_of("chat_template_path")
    tokenizer = AutoTokenizer.from_pretrained(template[0] if template else model_path)
    try:
        if tokenizer.chat_template is None:
            raise ValueError("no chat template")
        get_training_chat_template(tokenizer)
    except ValueError:
        raise TunerError(f"{where} needs a chat template that marks the assistant's turns ({{% generation %}}), and "
                         f"{'chat_template_path' if template else f'model {o.model}'}'s has none TRL can patch; "
                         "set chat_template_path to a template that has them, or assistant_only_loss: false") from None
    rows = data.load_dataset_spec(o.dataset, o.entry, tiny=models.is_tiny(model_path),
                                  real=not models.is_built_here(model_path))
    if len(rows) and not is_conversational(rows[0]):
        label = f"--dataset {o.dataset}" if o.dataset not in (None, "builtin") else f"tuner's built-in {o.trainer} data"
        raise TunerError(f"{where} trains on the assistant's turns of conversational rows (a messages column of "
                         f"role/content turns), and {label} is not conversational; pass --dataset with such rows, or "
                         "set assistant_only_loss: false")


def prepare_resume(options: SearchOptions) -> Prepared:
    """``tuner search --resume EXPERIMENT``: the unfinished search's own options, checked again."""
    from tuner.search import _resume as resume

    resumed, run_id = resume.resume_options(options)
    prepared = prepare(resumed)
    prepared.resume_run_id = run_id
    return prepared
