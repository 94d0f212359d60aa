"""Warm start: a search begins from the earlier searches of the same trainer, model and hardware in its MLflow store.

    here = identity(options, space)                          # who this search is: trainer, model, hardware, data
    sources = read_sources(uri, store, here, "auto")         # the MLflow reading, in this one function
    warm = build(sources, here, space, n_trials)             # pure: what is reused, and the line that says so
    warm.line  # "warm start from 2 searches of sft on tiny (cpu; same data): trial 0 = their recommendation; ..."

What matches (``--warm-start auto``, the default): finished search runs, in every experiment of the store, whose
trainer, model and hardware (the device's name and the precisions it can run) are this search's, newest first, at
most ``MAX_SOURCES``; when none is of this model, those of another size of its family (``family``: the same name
but for its size, "Qwen/Qwen2.5-0.5B" and "Qwen/Qwen2.5-1.5B"). Of another size only this is reused: its
recommendation runs first, as it is (tuner's pretrained learning-rate ranges are the same for every size, so its
learning rate lies in this search's range too), a precision that crashed there on this hardware is left out, and
a batch size that ran out of memory on a smaller model of the family; its trials are not told to the sampler
(another size learns and runs at other speeds) and the budget is not cut. The dataset is compared by fingerprint (``fingerprint``): same data or other data.
``--warm-start RUN_ID`` uses that search run alone (its trainer must be this search's); ``none`` starts cold.

What is reused, each rule also in docs/how-a-search-works.md ("Warm start"):

- picks: the sources' recommendations, newest first and each once, run first (after a ``--from`` trial 0), when
  their searched values lie in this space; at most ``MAX_PICKS``, and a third of the trials.
- left out: a precision every trial of which crashed in the sources on this hardware (at least two trials), while
  another precision there did not crash: the crash follows the precision on this device, not the data. Never the
  space's last precision, nor the precision of a ``--from`` file.
- left out too: a batch size (per_device_train_batch_size) every trial of which ran out of memory in the sources on
  this hardware (at least two trials, whatever the other knobs), while a smaller one ran: it and every larger
  choice leave the space (memory grows with the batch). Never the smallest choice, nor a ``--from`` file's.
- priors: the trials of sources of this model on this hardware are told to the sampler (Optuna) before this
  search's own, with their objective and constraint as they were told then, on the same data or on other data of
  the same task (the line says how many ran on other data); learning knobs keep their full range. None are told
  when none of them learned (``WarmStart.to_tell``): tied at 0, they rank nothing.
- speeds: with the tpe sampler, the tokens/s of those of them on the same data, or on other data whose rows' token
  lengths are alike (the 10th, 50th and 90th percentiles within 10% or a token: tuner.inputs.lengths.alike, the
  profile kept as the search run's tag), count as measured here (the model, hardware and the lengths of the rows
  batched match: ``WarmStart.measured_here``): with at least three stable ones the search has no speed stage of its
  own, and its learning stage runs on the fastest system configs among theirs and its own (tuner.search._staging).
  Other data of other lengths pads and batches otherwise: its speeds are measured again.
- trust: nothing is recommended from them. The picks are trials of this search, on this data and these seeds, and
  confirmed as any candidate is; the first pick's confirmation runs go beside its own trial, ahead of the search's
  other trials (``to_confirm_first``), then those of a trial that beats it here (``challenger``); a pick that fails
  here is said (``told_line``) and the search goes on exploring.
  When every pick failed here (``fell_back``), or its trials and confirmations are done with nothing confirmed
  (tuner.search.driver), a search whose budget the earlier trials had cut runs the default trials again: a cold
  search's exploration, the trials already run kept. Where the earlier speeds count here it runs a cold search's
  learning stage, the default less the speed stage it need not run (``WarmStart.fallback_trials``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.space import SearchSpace
from tuner.errors import TunerError
from tuner.records import Status, TrialRecord
from tuner.stores.tags import (
    DATA_TAG,
    HARDWARE_TAG,
    KIND_TAG,
    LENGTHS_TAG,
    PRECISIONS_TAG,
    WARM_BUDGET_TAG,
    WARM_START_TAG,
)

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

__all__ = ["BATCH", "Here", "Source", "WarmStart", "batches_left_out", "build", "challenger", "confirmation_failed", "family", "fell_back", "fingerprint", "hardware", "identity", "left_out",
           "pick_of", "read_sources", "to_confirm_first", "told_line"]

MAX_SOURCES = 3  # the newest matching searches used
MAX_PICKS = 2  # earlier recommendations run first, at most
# A warm search whose earlier trials were told to the sampler runs this share of the default trials (--trials N sets
# its own): the earlier trials count toward its budget; its pick is still confirmed on this data. A third (4 of 12):
# measured side by side with a cold search on a quiet machine, 8 seeds (bench/warm_start-third.json), its pick was as
# good on 7 and worse on none, as with half (6 of 12: 6 good, 1 worse; bench/warm_start-half.json).
WARM_BUDGET = 1 / 3
MIN_EVIDENCE = 2  # trials at a precision, all crashed, before it is left out
BATCH = "per_device_train_batch_size"  # the batch knob whose out-of-memory trials leave larger batches out
CANDIDATES = 200  # finished search runs read from the store (their tags) to find the matching ones


@dataclass(frozen=True)
class Here:
    """What a warm start matches earlier searches by: logged as the search run's params (trainer, model) and tags."""

    trainer: str
    model: str
    hardware: str  # "cpu", the GPU's name, or "Ray cluster ADDRESS"
    precisions: tuple[str, ...]  # those this hardware can run
    data: str  # the dataset's fingerprint
    lengths: str = ""  # its rows' token lengths (tuner.inputs.lengths.profile); "" where not measured

    def tags(self) -> dict[str, str]:
        lengths = {LENGTHS_TAG: self.lengths} if self.lengths else {}
        return {HARDWARE_TAG: self.hardware, PRECISIONS_TAG: ",".join(self.precisions), DATA_TAG: self.data, **lengths}


@dataclass
class Source:
    """An earlier search: its run, who it was (as ``Here``), and its search.json (tuner.records.SearchSummary)."""

    run_id: str
    run_name: str
    experiment: str
    was: Here
    summary: dict[str, Any]

    def matches(self, here: Here) -> bool:
        return (self.was.trainer, self.was.model, self.was.hardware, self.was.precisions) == \
            (here.trainer, here.model, here.hardware, here.precisions)

    def kin(self, here: Here) -> bool:
        """Another size of this search's model family (``family``), on the same trainer and hardware."""
        mine, theirs = family(here.model), family(self.was.model)
        return (self.was.trainer, self.was.hardware, self.was.precisions) == \
            (here.trainer, here.hardware, here.precisions) and mine is not None and theirs is not None \
            and mine[0] == theirs[0] and mine[1] != theirs[1]


@dataclass
class WarmStart:
    """What a search reuses of earlier searches (``build``). Empty (``not warm``) when nothing was found."""

    sources: list[Source] = field(default_factory=list)
    picks: list[dict[str, Any]] = field(default_factory=list)  # searched params to run first, in order
    left_out: dict[str, str] = field(default_factory=dict)  # precision -> the evidence ("crashed 4 of 4 there")
    batches_left_out: dict[int, str] = field(default_factory=dict)  # batch size -> the evidence ("out of memory ...")
    priors: list[TrialRecord] = field(default_factory=list)  # earlier trial records (told to the sampler: to_tell)
    other_data: int = 0  # how many of the priors ran on other data (their speeds are not this data's)
    notes: list[str] = field(default_factory=list)  # what was found but not reused, and why
    line: str = ""  # what the search says at its start
    first_pick: int = 0  # the search trial number of the first pick (1 after a --from trial 0)
    trials: tuple[int, int] | None = None  # (this search's trials, the default it replaces): the budget rule
    speeds_reused: bool = False  # the priors' speeds count as measured here: no speed stage (tuner.search._staging)
    data: str = ""  # this search's data fingerprint (Here.data): which priors ran on the same data
    lengths: str = ""  # its rows' token lengths (Here.lengths): which priors on other data ran rows of these lengths
    # the trials it runs when it falls back, where that is not the default: a cold search's learning stage, when the
    # speeds are known here (tuner.search._prepare sets it; ``fallback_trials``)
    fallback: int = 0

    def budget(self, n_trials: int) -> int:
        """The trials a search of ``n_trials`` by default runs warm: WARM_BUDGET of them when earlier trials of this
        model and hardware were told to the sampler and a recommendation runs first (they count toward this
        search's budget), never fewer than the picks and two more; ``n_trials`` otherwise."""
        if not (self.priors and self.picks):
            return n_trials
        trials = min(n_trials, max(len(self.picks) + 2, math.ceil(n_trials * WARM_BUDGET)))
        self.trials = (trials, n_trials) if trials < n_trials else None
        return trials

    def fallback_trials(self) -> int:
        """The trials a warm search whose budget was cut runs once it falls back (``fell_back``): a cold search's
        exploration. That is the default (``trials[1]``), less the speed stage a cold search would open with when the
        earlier trials' speeds count as measured here (``speeds_reused``, ``fallback``): the cold search's trials
        with the learning knobs searched, on the system configs already timed."""
        return self.fallback or (self.trials[1] if self.trials else 0)

    def __bool__(self) -> bool:
        return bool(self.sources)

    def to_tell(self) -> list[TrialRecord]:
        """The priors told to the sampler: all of them, or none when none of them learned. Tied at an objective of 0,
        such trials rank nothing, and the sampler would take an arbitrary few of them for its good ones: on the
        bench, a first search whose trials all stopped short of learning (its lr-0.039 trial 0 cut at step 6) sent
        the warm search after it into the low learning rates it had tried last (0.005-0.02), where its best learned
        0.41x as fast as the cold search's pick beside it. Their speeds still count (``measured_here``)."""
        from tuner.verdicts import recommend as rec

        return self.priors if any(rec.objective(r) > 0 for r in self.priors) else []

    def measured_here(self) -> list[TrialRecord]:
        """The priors that ran on this search's data, or on other data whose rows' token lengths are alike
        (tuner.inputs.lengths.alike): their tokens/s are speeds measured here (tuner.search._staging: the same model
        and hardware, and batches of rows of the same lengths)."""
        same = {s.run_id for s in self.speed_sources()}
        return [r for r in self.priors if r.get("source") in same]

    def speed_sources(self) -> list[Source]:
        """The sources whose speeds are this search's: on the same data, or on other data of alike lengths."""
        from tuner.inputs.lengths import alike

        return [s for s in self.sources if s.was.data == self.data or alike(s.was.lengths, self.lengths)]

    def tags(self) -> dict[str, str]:
        if not self.sources:
            return {}
        budget = {WARM_BUDGET_TAG: f"{self.trials[0]}/{self.trials[1]}"} if self.trials else {}
        return {WARM_START_TAG: ",".join(s.run_id for s in self.sources), **budget}

    def pick_numbers(self) -> range:
        return range(self.first_pick, self.first_pick + len(self.picks))


# -- who this search is --------------------------------------------------------------------------------------------


def hardware(gpus_per_trial: float | None, ray_address: str | None) -> str:
    """Where the trials run, as this machine sees it: "cpu", the first GPU's name, or the Ray cluster's address
    (whose GPUs this machine cannot see); for ``auto`` (a search sent with tuner submit), the address Ray gives
    the job (RAY_ADDRESS), so that searches on one cluster match each other and not another cluster's."""
    if ray_address == "auto" and os.environ.get("RAY_ADDRESS"):
        ray_address = os.environ["RAY_ADDRESS"]
    if ray_address:
        return f"Ray cluster {ray_address}"
    import torch

    gpu = torch.cuda.device_count() > 0 if gpus_per_trial is None else gpus_per_trial > 0
    return torch.cuda.get_device_name(0) if gpu and torch.cuda.is_available() else "cpu"


def fingerprint(dataset: str | None, trainer: str, reward_funcs: list[str] | None = None) -> str:
    """The data's identity: its content's sha256 for a local file (a folder: its files'), the id of a hub dataset,
    or the trainer's built-in data; for GRPO, with ``reward_funcs`` other than the built-in one, also the rewards
    (a reward is part of the task: the same prompts under another reward are other data): "+rewards:DIGEST" of
    their names and, for a function in a file, the file's content."""
    if dataset in (None, "builtin"):
        data = f"builtin:{trainer}"
    elif not Path(dataset).exists():
        data = f"hub:{dataset}"
    else:
        path = Path(dataset)
        digest = hashlib.sha256()
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            digest.update(str(file.relative_to(path) if file != path else file.name).encode())
            _hash_file(digest, file)
        data = f"sha256:{digest.hexdigest()[:16]}"
    rewards = [spec for spec in reward_funcs or [] if spec != "builtin"]
    if not rewards:
        return data
    digest = hashlib.sha256()
    for spec in rewards:
        where, _, function = spec.rpartition(":")
        source = Path(where) if where and Path(where).is_file() else None
        digest.update(function.encode() if source else spec.encode())
        if source:
            _hash_file(digest, source)
    return f"{data}+rewards:{digest.hexdigest()[:12]}"


def _hash_file(digest: hashlib._Hash, file: Path) -> None:
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def identity(trainer: str, model: str, dataset: str | None, gpus_per_trial: float | None, ray_address: str | None,
             cannot: dict[str, str], reward_funcs: list[str] | None = None, lengths: str = "") -> Here:
    """This search as a warm start matches it (``cannot``: the precisions this hardware cannot run; ``lengths``: its
    rows' token lengths, tuner.inputs.lengths.data_profile)."""
    from tuner.config import precision

    return Here(trainer, model, hardware(gpus_per_trial, ray_address),
                tuple(p for p in precision.NAMES if p not in cannot), fingerprint(dataset, trainer, reward_funcs),
                lengths)


# -- the MLflow reading ----------------------------------------------------------------------------------------------


def read_sources(uri: str, store: Path, here: Here, requested: str) -> list[Source]:
    """The earlier searches a warm start uses: ``requested`` "none" (none), "auto" (those that match, newest first),
    or a search run id, or several comma-joined (a resumed search's own). Reads the store, writes nothing: a local
    store that does not exist yet holds nothing (and is not created). TunerError for a run id that is not a finished
    search of this trainer."""
    from tuner.stores import mlflow_store

    if requested == "none":
        return []
    local = not mlflow_store.is_server(uri)
    if local and uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        if requested == "auto":
            return []
        raise TunerError(f"--warm-start {requested}: no MLflow store at {uri.removeprefix('sqlite:///')} holds it; pass "
                         "the --store (or --tracking-uri) of the search to start from, or --warm-start auto")
    try:
        return _read(mlflow_store.client(uri), here, requested)
    except TunerError:
        raise
    except Exception as error:  # noqa: BLE001 - a store that cannot be read (a server answering 500, a locked file)
        if requested == "auto":  # nothing to start from; the store's own checks then say what is wrong with it
            return []
        raise TunerError(f"--warm-start {requested}: the MLflow store at {uri} cannot be read "
                         f"({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}); "
                         "check the store, or pass --warm-start auto or none") from None


_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", re.IGNORECASE)


def family(model: str) -> tuple[str, float] | None:
    """(the model's family, its size in parameters) from a size in its name, as model hubs name sizes:
    "Qwen/Qwen2.5-0.5B" -> ("Qwen/Qwen2.5-{size}", 5e8), "HuggingFaceTB/SmolLM2-135M-Instruct" ->
    ("HuggingFaceTB/SmolLM2-{size}-Instruct", 1.35e8); a local folder by its own name. None without one size."""
    path = model.rstrip("/")
    name = Path(path).name if Path(path).is_absolute() else path
    found = list(_SIZE.finditer(name))
    if len(found) != 1:
        return None
    size = found[0]
    scale = 1e9 if size.group(2).lower() == "b" else 1e6
    return f"{name[:size.start()]}{{size}}{name[size.end():]}".lower(), float(size.group(1)) * scale


def _read(client: MlflowClient, here: Here, requested: str) -> list[Source]:
    if requested != "auto":
        return [_named(client, run_id.strip(), here, requested) for run_id in requested.split(",") if run_id.strip()]
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    runs = client.search_runs(list(experiments), filter_string=f"tags.`{KIND_TAG}` = 'search' and "
                              "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                              max_results=CANDIDATES) if experiments else []
    found: list[Source] = []
    kin: list[Source] = []
    for run in runs:
        source = _source(client, run, experiments[run.info.experiment_id], with_summary=False)
        if source.matches(here):
            source.summary = _summary(client, run.info.run_id)
            if source.summary:
                found.append(source)
        elif source.kin(here) and len(kin) < MAX_SOURCES:
            kin.append(source)
        if len(found) == MAX_SOURCES:
            break
    if found:
        return found
    for source in kin:  # none of this model: the searches of another size of its family
        source.summary = _summary(client, source.run_id)
    return [source for source in kin if source.summary]


def _named(client: MlflowClient, run_id: str, here: Here, requested: str) -> Source:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise TunerError(f"--warm-start {requested}: the store has no run {run_id}; pass a search run id (tuner "
                         "report shows it), or auto, or none") from None
    if run.data.tags.get(KIND_TAG) != "search":
        raise TunerError(f"--warm-start {requested}: run {run_id} is not a tuner search run (tag {KIND_TAG} is "
                         f"{run.data.tags.get(KIND_TAG)!r}); pass the search's run id, or auto, or none")
    source = _source(client, run, client.get_experiment(run.info.experiment_id).name, with_summary=True)
    if source.was.trainer != here.trainer:
        raise TunerError(f"--warm-start {requested}: search {run.info.run_name} tuned {source.was.trainer}, this "
                         f"search tunes {here.trainer}; pass a search of {here.trainer}, or auto, or none")
    if not source.summary:
        raise TunerError(f"--warm-start {requested}: search {run.info.run_name} has no results (status "
                         f"{run.info.status}); pass a finished search, or auto, or none")
    return source


def _source(client: MlflowClient, run: Run, experiment: str, with_summary: bool) -> Source:
    params, tags = run.data.params, run.data.tags
    precisions = tuple(p for p in tags.get(PRECISIONS_TAG, "").split(",") if p)
    was = Here(params.get("trainer", ""), params.get("model", ""), tags.get(HARDWARE_TAG, ""), precisions,
               tags.get(DATA_TAG, ""), tags.get(LENGTHS_TAG, ""))
    summary = _summary(client, run.info.run_id) if with_summary else {}
    return Source(run.info.run_id, run.info.run_name or run.info.run_id, experiment, was, summary)


def _summary(client: MlflowClient, run_id: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tuner-warm-") as folder:  # read, then gone: nothing left in /tmp
        try:
            path = client.download_artifacts(run_id, "search.json", folder)
            return json.loads(Path(path).read_text())
        except Exception:  # noqa: BLE001 - a search that wrote no table (or an unreadable one) offers nothing to reuse
            return {}


# -- what is reused (pure) -------------------------------------------------------------------------------------------


def pick_of(summary: dict[str, Any], space: SearchSpace) -> tuple[dict[str, Any] | None, str | None]:
    """The searched params of an earlier recommendation, when they fit this space: (params, None); else (None, why)
    or (None, None) when that search recommended nothing."""
    from tuner.search._sampling import distributions

    best = summary.get("recommended")
    if not best or not best.get("params"):
        return None, None
    params = best["params"]
    searched = {name: params[name] for name in space.searched_names() if name in params}
    fitted = {**params, **{name: value for name, value in space.fixed.items()}}  # its own fixed settings may differ
    if distributions(space, fitted) is None:
        return None, f"trial {best.get('number')}'s params lie outside this space"
    return searched, None


def left_out(sources: list[Source], here: Here, precisions: list[str], keep: tuple[str, ...] = ()
             ) -> dict[str, str]:
    """The precisions of ``precisions`` to leave out, each with its evidence: every trial at it crashed (at least
    MIN_EVIDENCE) in the sources on this hardware, and some trial there at another precision did not. Never all of
    ``precisions``, nor those in ``keep``."""
    tried: dict[str, list[str]] = {}
    for source in sources:
        if source.was.hardware != here.hardware:
            continue
        for record in source.summary.get("trials") or []:
            precision = (record.get("params") or {}).get("precision", "fp32")
            tried.setdefault(precision, []).append(record.get("status"))
    survived = {p for p, statuses in tried.items() if any(s != Status.CRASHED for s in statuses)}
    out = {}
    for precision in precisions:
        statuses = tried.get(precision, [])
        if (len(statuses) >= MIN_EVIDENCE and all(s == Status.CRASHED for s in statuses) and survived - {precision}
                and precision not in keep):
            out[precision] = f"crashed {len(statuses)} of {len(statuses)} there"
    if len(out) >= len(precisions):
        return {}  # the space keeps a precision: no evidence says which of them would run
    return out


def batches_left_out(sources: list[Source], here: Here, choices: list, keep: tuple = ()) -> dict[int, str]:
    """The batch sizes of ``choices`` to leave out, each with its evidence: the smallest size at which every trial in
    the sources on this hardware ran out of memory (at least MIN_EVIDENCE, whatever their other knobs), while a
    trial at a smaller size did not, and every choice larger than it. Never the smallest choice, nor those in
    ``keep``."""
    tried: dict[int, list[str]] = {}
    mine = family(here.model)
    for source in sources:
        theirs = family(source.was.model)
        larger = source.was.model != here.model and (mine is None or theirs is None or theirs[1] > mine[1])
        if source.was.hardware != here.hardware or larger:  # a larger model's OOM says nothing of this one's
            continue
        for record in source.summary.get("trials") or []:
            size = (record.get("params") or {}).get(BATCH)
            if isinstance(size, int) and record.get("status") != Status.TOO_BIG:  # too_big: never ran
                tried.setdefault(size, []).append(record.get("status"))
    ran = [size for size, statuses in tried.items() if any(s != Status.OOM for s in statuses)]
    failed = sorted(size for size, statuses in tried.items()
                    if len(statuses) >= MIN_EVIDENCE and all(s == Status.OOM for s in statuses)
                    and any(smaller < size for smaller in ran))
    if not failed:
        return {}
    limit, n = failed[0], len(tried[failed[0]])
    sizes = [c for c in choices if isinstance(c, int)]
    return {c: (f"out of memory in {n} of {n} trials there" if c == limit else f"larger than {limit}, out of memory there")
            for c in sizes if c >= limit and c != min(sizes) and c not in keep}


def build(sources: list[Source], here: Here, space: SearchSpace, n_trials: int, keep: tuple = (),
          after_first: bool = False) -> WarmStart:
    """What this search reuses of ``sources`` (newest first); ``keep``: a precision and a batch size never left out
    (a --from file's); ``after_first``: a --from trial 0 runs before the picks."""
    warm = WarmStart(sources=list(sources), first_pick=1 if after_first else 0, data=here.data,
                     lengths=here.lengths)
    if not sources:
        return warm
    warm.left_out = left_out(sources, here, space.precisions() if "precision" in space.params else [], keep)
    if BATCH in space.params:
        warm.batches_left_out = batches_left_out(sources, here, space.values_of(BATCH), keep)
    most = min(MAX_PICKS, max(1, n_trials // 3))
    for source in sources:
        pick, why = pick_of(source.summary, space)
        if why:
            warm.notes.append(f"the recommendation of {source.run_name} is not run first: {why}")
        if pick is not None and (pick.get("precision") in warm.left_out or pick.get(BATCH) in warm.batches_left_out):
            pick = None
        if pick is not None and pick not in warm.picks and len(warm.picks) < most:
            warm.picks.append(pick)
    from tuner.search._sampling import distributions

    for source in sources:  # trials of this model only: another size learns and runs at other speeds
        if source.was.hardware == here.hardware and source.was.model == here.model:
            told: list[TrialRecord] = [
                {**r, "source": source.run_id} for r in source.summary.get("trials") or []
                if (r.get("params") or {}).get("precision") not in warm.left_out
                and (r.get("params") or {}).get(BATCH) not in warm.batches_left_out
                and distributions(space, r.get("params") or {}) is not None]
            warm.priors += told
            warm.other_data += len(told) if source.was.data != here.data else 0
    warm.line = describe(warm, here)
    return warm


def describe(warm: WarmStart, here: Here) -> str:
    """One line: what was found and what is reused, e.g. "warm start from 2 searches of sft on tiny (cpu; same
    data): trial 0 = their recommendation; 9 earlier trials told to the sampler; fp16-pure left out (crashed 4 of 4
    there)"."""
    n = len(warm.sources)
    same = sum(1 for s in warm.sources if s.was.data == here.data)
    data = "same data" if same == n else "other data" if same == 0 else f"{same} on the same data, {n - same} on other"
    hardware = {s.was.hardware for s in warm.sources}
    where = here.hardware if hardware == {here.hardware} else f"{', '.join(sorted(hardware))}; here {here.hardware}"
    searches = f"{n} search{'es' if n > 1 else ''}" if n > 1 else f"search {warm.sources[0].run_name}"
    model = Path(here.model.rstrip("/")).name or here.model
    others = sorted({Path(s.was.model.rstrip("/")).name or s.was.model for s in warm.sources if s.was.model != here.model})
    if others:  # another size of its family (``family``)
        model = f"{', '.join(others)} (another size of {model}'s family)"
    parts = []
    for number, _ in zip(warm.pick_numbers(), warm.picks):
        whose = "their" if n > 1 else "its"
        parts.append(f"trial {number} = {whose} recommendation" if len(warm.picks) == 1
                     else f"trial {number} = a recommendation")
    if not warm.picks:
        parts.append("no recommendation of theirs to run first")
    told = len(warm.priors)
    other = (f" ({'all' if warm.other_data == told else warm.other_data} on other data)"
             if warm.other_data else "")
    parts.append(f"{told} earlier trial{'s' if told != 1 else ''} told to the sampler{other}" if warm.to_tell()
                 else f"their {told} trial{'s' if told != 1 else ''} not told to the sampler (none of them learned: "
                      "tied at 0, they rank nothing)" if told
                 else "their outcomes not told to the sampler (another model size)" if others
                 else "their outcomes not told to the sampler (none fits this space)")
    if warm.speeds_reused:
        parts.append(f"their speeds reused (no speed stage{_alike_lengths(warm, here)})")
    parts += [f"{precision} left out ({evidence})" for precision, evidence in warm.left_out.items()]
    if warm.batches_left_out:
        sizes = sorted(warm.batches_left_out)
        parts.append(f"{BATCH} {', '.join(map(str, sizes))} left out ({warm.batches_left_out[sizes[0]]})")
    if warm.trials is not None:
        parts.append(f"{warm.trials[0]} trials instead of {warm.trials[1]}: the earlier ones count (--trials N to "
                     "run more)")
    return f"warm start from {searches} of {here.trainer} on {model} ({where}; {data}): {'; '.join(parts)}"


def _alike_lengths(warm: WarmStart, here: Here) -> str:
    """Why other data's speeds count here: its rows' token lengths are this data's (tuner.inputs.lengths.alike)."""
    from tuner.inputs.lengths import QUANTILES, parse

    other = [s for s in warm.speed_sources() if s.was.data != here.data]
    if not other:
        return ""
    mine, theirs = parse(here.lengths), parse(other[0].was.lengths)
    quantiles = "/".join(f"p{q}" for q in QUANTILES)
    return (f"; other data, its rows' token lengths alike: {quantiles} "
            f"{'/'.join(str(mine[f'p{q}']) for q in QUANTILES)} here, "
            f"{'/'.join(str(theirs[f'p{q}']) for q in QUANTILES)} there")


def told_line(record: TrialRecord, warm: WarmStart) -> str | None:
    """What the search says when a pick's trial ends: how the earlier recommendation did on this data."""
    number = record.get("number")
    if not warm.picks or number not in warm.pick_numbers() or "confirms" in record:
        return None
    from tuner.verdicts import recommend as rec

    if rec.is_ok(record) and rec.learned(record):
        return (f"warm start: trial {number}, the earlier recommendation, runs here: "
                f"{record.get('tokens_per_second') or 0:.0f} tokens/s, progress {record.get('progress') or 0:+.3f} (ranked "
                "and confirmed here like any other trial)")
    if record.get("status") == Status.PRUNED:
        return (f"warm start: trial {number}, the earlier recommendation, fell behind here and was stopped early "
                f"({record.get('reason') or 'successive halving'}); the search goes on exploring")
    why = record.get("reason") or ("stable but did not learn" if rec.is_ok(record) else record.get("status"))
    return (f"warm start: trial {number}, the earlier recommendation, failed here ({record.get('status')}: {why}); "
            "the search goes on exploring")


def to_confirm_first(told: list[TrialRecord], running: dict[int, dict[str, Any]], warm: WarmStart,
                     confirmations: Collection[TrialRecord] = ()) -> TrialRecord | None:
    """The earlier recommendation to confirm beside its own trial, ahead of this search's other trials: the first
    pick while its trial runs (``running``: search trial number -> params), or once it has ended here stable and
    learning; None before it starts, or once it failed here. Whether the last answer holds on this data and on other
    seeds is the first thing a second search finds out: when it does, the search has a confirmed config after its
    first two rounds, and its other trials look for a better one (on the bench the earlier recommendation stayed the
    pick on 5 of 8 seeds). A trial that beats it is confirmed next (``challenger``); a pick that fails on this
    search's seed stops getting confirmation runs, and so does one whose confirmation run (``confirmations``: those
    that have ended) failed: it cannot be confirmed (on the bench its trial and the run beside it diverged at the same
    step, and the slot the run freed went to a second confirmation run while its trial's end was still on its way; 6
    of 15 searches ran it)."""
    if not warm.picks:
        return None
    number = warm.first_pick
    if confirmation_failed(warm, confirmations):
        return None
    if number in running:
        return {"number": number, "params": running[number]}
    from tuner.verdicts import recommend as rec

    ended = [r for r in _own(told) if r.get("number") == number]
    return ended[0] if ended and rec.is_ok(ended[0]) and rec.learned(ended[0]) else None


def challenger(told: list[TrialRecord], warm: WarmStart, confirmations: Collection[TrialRecord] = ()
               ) -> TrialRecord | None:
    """The trial of this search to confirm ahead of its other trials once the earlier recommendation held here: the
    best of the search trials that have ended (``told``), ranked as the recommendation ranks them
    (tuner.search._confirm.candidates), when that is another trial than the earlier recommendation. None while the
    earlier recommendation runs, once it failed here (on its trial or a confirmation run: the search goes on as a
    cold one, whose best trial is confirmed at the end), or while it is still the best. Such a trial is the likeliest
    pick from then on: on the bench, a warm search whose later trial beat the earlier recommendation confirmed that
    trial only after every trial had ended, 0.59-0.84x a cold search's wall time to its pick against 0.32-0.48x where
    the earlier recommendation stayed the pick."""
    if to_confirm_first(told, {}, warm, confirmations) is None:  # no pick, still running, or failed here
        return None
    from tuner.search import _confirm as confirm

    best = confirm.candidates(_own(told), 1, list(confirmations))
    return best[0] if best and best[0].get("number") != warm.first_pick else None


def _own(told: list) -> list:
    """The records of this search's own trials: not its confirmation runs, longer runs or speed re-runs."""
    return [r for r in told if "confirms" not in r and "extends" not in r and "remeasures" not in r]


def confirmation_failed(warm: WarmStart, confirmations: Collection[TrialRecord]) -> bool:
    """Whether a confirmation run of the first earlier pick has ended unstable: it cannot be confirmed here."""
    from tuner.records import UNSTABLE

    return any(c.get("confirms") == warm.first_pick and c.get("status") in UNSTABLE for c in confirmations)


def fell_back(told: list[TrialRecord], warm: WarmStart, demoted: Collection[int] = ()) -> int | None:
    """The trials a warm search runs once every earlier pick has ended here and none held and learned (diverged,
    crashed, did not learn; not one that halving stopped for falling behind, which others beat): the default it had
    cut (``WarmStart.budget``), so that it explores as a cold search would. None while a pick runs, when one did
    well, or when its budget was not cut. ``told``: the records of this search's trials that have ended;
    ``demoted``: the numbers of picks that held on this search's seed and were demoted on their confirmation seeds
    (failed here too)."""
    if warm.trials is None or not warm.picks:
        return None
    from tuner.verdicts import recommend as rec

    picks = {r.get("number"): r for r in _own(told) if r.get("number") in warm.pick_numbers()}
    if len(picks) < len(warm.picks):
        return None
    if any(r.get("status") == Status.PRUNED or (rec.is_ok(r) and rec.learned(r) and n not in demoted)
           for n, r in picks.items()):
        return None
    return warm.fallback_trials()


def fallback_line(trials: int, warm: WarmStart, why: str | None = None) -> str:
    """What the search says when it falls back: its earlier picks failed here (``fell_back``), or ``why``."""
    whose = "the earlier recommendations" if len(warm.picks) > 1 else "the earlier recommendation"
    planned = warm.trials[0] if warm.trials else trials
    if warm.fallback and warm.trials and trials == warm.fallback:
        how = (f"the search runs {trials} trials, as a cold search explores the learning knobs (its default "
               f"{warm.trials[1]} less the {warm.trials[1] - trials} of its speed stage: the speeds are known here)")
    else:
        how = f"the search runs the default {trials} trials, as a cold search explores"
    return f"warm start: {why or whose + ' failed here'}; {how} (the {planned} it planned kept)"
