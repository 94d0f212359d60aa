"""A search written to MLflow: one parent run per search, one nested run per trial, all written from the
driver; writes kept on disk while a tracking server is away (the spool) and sent when it returns.

Only the driver process writes (trials hand their metrics back through Ray), so trials running
at the same time never contend for the SQLite store's lock and no metric point is lost.

A trial's run is written in three parts, so ``tuner ui`` shows a search while it runs:

    tracker.start_trial(key, number, spec, tags)     # when the trial starts: RUNNING, with its params
    tracker.log_steps(key, rows)                     # while it runs: its new per-step metrics
    tracker.finish_trial(key, spec, summary, history, streamed=n)  # the rest, the verdict, FINISHED/FAILED
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from tuner.errors import TunerError
from tuner.records import Status, TrialRecord, is_ok, new_record
from tuner.stores import interrupts
from tuner.stores.mlflow_store import DEFAULT_STORE, client, get_or_create_experiment, is_server
from tuner.stores.run_reader import trial_runs
from tuner.stores.tags import (
    ANCHORED_TAG,
    CONFIRMATION_TAG,
    EXTENSION_TAG,
    KIND_TAG,
    PARAM_PREFIX,
    REASON_TAG,
    REMEASURE_TAG,
    RISK_TAG,
    RUN_NAME_TAG,
    STATUS_TAG,
    STOPPED_AT_STEP_TAG,
    STUDY_TAG,
    TRIAL_KEY_TAG,
    TRIAL_NUMBER_TAG,
)

LOG_ARTIFACT = "process.log"  # a trial run's file: the end of what its process printed, when it died
RUNNING_STATUS = "running"  # the tuner.status tag of a trial run until its verdict is written
INTERRUPTED_STATUS = "interrupted"  # the tuner.status tag of a trial run its search ended before the trial did
RETRY_AFTER_S = 10.0  # while the server is away, writes go straight to the spool; it is tried again after this


def _metric_value(value: float) -> float:
    # The stores accept NaN; an infinity is written as the largest float so the point is not lost.
    if math.isinf(value):
        return math.copysign(1.7976931348623157e308, value)
    return value


def _param_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)
    return text[:6000]


class TrackingUnavailable(Exception):
    """The tracking server stopped answering; the operation was kept on disk instead."""


def _unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the server went away (refused, reset, or cut off mid-answer) or stopped taking the
    search's credentials (401, 403), not that it refused the write itself. A server killed while it answers cuts the response short: requests' ChunkedEncodingError ("Connection
    broken: IncompleteRead"), which MLflow wraps in an MlflowException."""
    text = f"{type(error).__name__}: {error}"
    return any(k in text for k in ("ConnectionError", "Connection refused", "Max retries exceeded",
                                   "Failed to establish", "RemoteDisconnected", "timed out", "503", "502",
                                   "Connection broken", "Connection reset", "Connection aborted",
                                   "ChunkedEncodingError", "IncompleteRead",
                                   # a server with users that stops taking the search's credentials mid-search
                                   # (a password changed, a user removed): its results wait on disk for tuner sync
                                   "error code 401", "error code 403"))


class Spool:
    """MLflow writes kept on disk while a tracking server is away: one JSON line per write, in the order made,
    replayed in that order. One file per search run: ``<store>/pending/<parent run>.jsonl``."""

    def __init__(self, path: Path):
        self.path = path

    def __len__(self) -> int:
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0

    def __bool__(self) -> bool:
        return self.path.exists()

    def append(self, kind: str, payload: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"kind": kind, "payload": payload}, allow_nan=True) + "\n")

    def replay(self, apply: Callable[[str, dict[str, Any]], Any]) -> int:
        """``apply(kind, payload)`` each kept write in order, removing those sent; stops at the first the server
        does not take (it stays first) and returns how many are left."""
        if not self.path.exists():
            return 0
        lines = self.path.read_text().splitlines()
        for i, line in enumerate(lines):
            op = json.loads(line)
            try:
                apply(op["kind"], op["payload"])
            except Exception as e:  # noqa: BLE001 - only an absent server keeps the rest; anything else is raised
                if not _unavailable(e):
                    raise
                self.path.write_text("".join(rest + "\n" for rest in lines[i:]))
                return len(lines) - i
        self.path.unlink()
        return 0


class SearchTracker:
    """The parent run of one search and the nested runs of its trials.

    Every write goes through ``_send``: if a tracking *server* stops answering mid-search, the
    write is appended to a spool file on disk (``<store>/pending/<parent run>.jsonl``) and the
    search goes on; spooled writes are replayed, in order, at the next successful write, at the
    end of the search, or by ``tuner sync``. A local SQLite store busy with another search is
    retried, not spooled.
    """

    def __init__(self, uri: str, experiment: str | None, store: Path = DEFAULT_STORE, parent_id: str | None = None):
        """``experiment``: the search's, created if new. Or None and ``parent_id``, an existing search run whose
        kept writes are to be sent (``tuner sync``): nothing is created."""
        self.uri = uri
        self.store = Path(store)
        self.client = client(uri)
        self.parent_id = parent_id
        self.experiment_id = (self.client.get_run(parent_id).info.experiment_id if experiment is None
                              else get_or_create_experiment(self.client, experiment, uri, store))
        self.warned = parent_id is not None  # `tuner sync` says what it sent itself
        self._reset_trials()

    def _reset_trials(self) -> None:
        self.trial_run_ids: dict[str, str] = {}  # trial key -> its MLflow run id, once created
        self.replaying = False  # spooled writes being sent (flush): a kept trial start may already exist there
        self.open_trials: set[str] = set()  # keys of trials started and not yet finished
        self.retry_at = 0.0  # time.monotonic() before which a kept write is not retried

    # -- the parent run --------------------------------------------------------------------

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        from mlflow.entities import Param

        with self._whole():  # the search run is made with its params, or not at all
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags={KIND_TAG: "search", **tags})
            self.parent_id = run.info.run_id
            self.client.log_batch(self.parent_id, params=[Param(k, _param_value(v)) for k, v in params.items()])
        return self.parent_id

    def attach(self, parent_id: str) -> None:
        """Continue an existing search run (``tuner search --resume``); ``resume()`` marks it RUNNING again."""
        self.parent_id = parent_id

    def resume(self) -> None:
        """The attached search run is RUNNING again: once the resumed search has started (Ray up), so that one
        stopped while it starts leaves the run as it was."""
        with self._whole():
            self.client.update_run(self.parent_id, status="RUNNING")

    def study_name(self) -> str:
        """The Optuna study of the search run (its tuner.study tag)."""
        return self.client.get_run(self.parent_id).data.tags[STUDY_TAG]

    def stored_trials(self) -> list[TrialRecord]:
        """The search's trials that MLflow holds in full, one record per trial number (``--resume`` keeps these).
        A trial run with no verdict belongs to a trial that was still running (or being written) when the search
        was interrupted (KILLED, tagged interrupted) or its driver died (left RUNNING): it is deleted, and its
        trial runs again. Confirmation re-runs and longer re-runs (tuner.search._extend) are not kept: they run again
        after the search's own trials."""
        if self.parent_id is None:
            return []  # no search run yet: no trial of it is stored
        records: dict[int, TrialRecord] = {}
        for run in trial_runs(self.uri, self.parent_id):
            cut_short = run.data.tags.get(STATUS_TAG) in (RUNNING_STATUS, INTERRUPTED_STATUS)
            if run.info.status == "RUNNING" or cut_short:  # a confirmation re-run cut short too: it runs again
                self.client.delete_run(run.info.run_id)
                continue
            if "true" in (run.data.tags.get(CONFIRMATION_TAG), run.data.tags.get(EXTENSION_TAG),
                          run.data.tags.get(REMEASURE_TAG), run.data.tags.get(ANCHORED_TAG)):
                continue  # longer, confirmation, speed re-runs and anchored twins run again after the search's trials
            record = self._record_from_run(run)
            records.setdefault(record["number"], record)
        return sorted(records.values(), key=lambda r: r["number"])

    def _record_from_run(self, run) -> TrialRecord:
        import yaml

        folder = tempfile.mkdtemp(prefix="tuner-resume-")
        result = json.loads(Path(self.client.download_artifacts(run.info.run_id, "result.json", folder)).read_text())
        spec = yaml.safe_load(Path(self.client.download_artifacts(run.info.run_id, "trial.yaml", folder)).read_text())
        spec = json.loads(json.dumps(spec))  # the values a fresh record holds (e.g. lists, not tuples)
        return new_record(result, number=int(run.data.tags[TRIAL_NUMBER_TAG]), params=spec["params"],
                          max_steps=spec["max_steps"], seed=spec["seed"], run_id=run.info.run_id)

    @property
    def spool(self) -> Spool:
        return Spool(self.store / "pending" / f"{self.parent_id}.jsonl")

    @property
    def spool_path(self) -> Path:
        return self.spool.path

    def pending(self) -> int:
        return len(self.spool)

    # -- writes ------------------------------------------------------------------------------

    def start_trial(self, key: str, number: int, spec: dict[str, Any],
                    tags: dict[str, str] | None = None) -> str | None:
        """The trial's nested run, created RUNNING with its params when the trial starts; its id, or None when
        the server is away and the write was kept. ``key`` (unique in the search) names the trial in the
        writes that follow."""
        self.open_trials.add(key)  # before the run exists: an interrupt inside its write still finds it (finish)
        return self._send("trial_start", {"key": key, "number": number, "spec": spec, "tags": tags or {}})

    def log_steps(self, key: str, rows: list[dict[str, Any]]) -> None:
        """Per-step metric rows of a running trial (each row once: the caller sends only new ones)."""
        if rows:
            self._send("steps", {"key": key, "rows": rows})

    def finish_trial(self, key: str, spec: dict[str, Any], summary: dict[str, Any], history: list[dict[str, Any]],
                     streamed: int = 0, output: str = "") -> None:
        """The trial's verdict: ``history`` is its whole per-step history (kept whole in result.json), of which
        the first ``streamed`` rows went out with log_steps already; ``output``, the end of what its process
        printed when it died (process.log); then FINISHED or FAILED."""
        self._send("trial_end", {"key": key, "spec": spec, "summary": summary, "history": history,
                                 "streamed": streamed, "output": output})
        self.open_trials.discard(key)  # after the write: interrupted before it, finish() still ends the run

    def run_id_of(self, key: str) -> str | None:
        """The run id of a started trial, once its run exists (None while its creation is kept on disk)."""
        return self.trial_run_ids.get(key)

    def log_artifact_text(self, text: str, name: str) -> None:
        self._send("text", {"text": text, "name": name})

    def log_artifact_dict(self, data: Mapping[str, Any], name: str) -> None:
        self._send("dict", {"data": data, "name": name})

    def set_tags(self, tags: dict[str, str]) -> None:
        self._send("tags", {"tags": tags})

    def finish(self, status: str = "FINISHED") -> None:
        """End the search run, and first the runs of its trials still open (the search was interrupted or failed):
        KILLED, tagged interrupted (--resume deletes those and runs the trials again). No run is left RUNNING.
        Nothing to end when the search run was never started."""
        if self.parent_id is None:
            return
        try:
            for key in sorted(self.open_trials):
                self._send("trial_interrupted", {"key": key})
            self.open_trials.clear()
        finally:  # the search run ends even if a trial's could not
            self._send("finish", {"status": status})

    def flush(self) -> int:
        """Replay spooled writes in order; returns how many are still pending."""
        self.replaying = True
        try:
            left = self.spool.replay(self._apply)
        finally:
            self.replaying = False
        if left:
            self.retry_at = time.monotonic() + RETRY_AFTER_S
        return left

    def _send(self, kind: str, payload: dict[str, Any]):
        # While writes are kept, a running trial's steps arrive every second or two: try the server again
        # only every RETRY_AFTER_S, not at each of them (each try can wait for the server's timeout).
        if self.spool and (time.monotonic() < self.retry_at or self.flush()):
            self._spool(kind, payload)
            return None
        try:
            return self._apply(kind, payload)
        except Exception as e:  # noqa: BLE001
            if not is_server(self.uri) or not _unavailable(e):
                raise
            self.retry_at = time.monotonic() + RETRY_AFTER_S
            self._spool(kind, payload, refused="error code 401" in str(e) or "error code 403" in str(e))
            return None

    def _spool(self, kind: str, payload: dict[str, Any], refused: bool = False) -> None:
        self.spool.append(kind, payload)
        if not self.warned:
            self.warned = True
            if refused:
                print(f"warning: MLflow server {self.uri} no longer takes this search's credentials "
                      f"(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD); results are kept in {self.spool_path}: "
                      "send them with tuner sync once the credentials are right", flush=True)
            else:
                print(f"warning: MLflow server {self.uri} is not answering; results are kept in {self.spool_path} "
                      "and sent when it returns (or run: tuner sync)", flush=True)

    def _apply(self, kind: str, payload: dict[str, Any]):
        return _retry_locked(lambda: getattr(self, f"_apply_{kind}")(**payload), self._whole)

    def _whole(self):
        """Around one write to a local store: Ctrl-C and SIGTERM wait for it to end (tuner.stores.interrupts), so a
        trial run is not left half-written nor SQLite's write lock held by the interrupted write. Not for a
        server: each request is its own transaction there, and one can take its timeout; Ctrl-C answers at once."""
        return contextlib.nullcontext() if is_server(self.uri) else interrupts.deferred()

    def _trial_run_there(self, key: str) -> str | None:
        """The run of this search's trial ``key`` in the store, if one was created (its TRIAL_KEY_TAG)."""
        runs = self.client.search_runs([self.experiment_id], max_results=1,
                                       filter_string=f"tags.`{TRIAL_KEY_TAG}` = '{key}' and "
                                                     f"tags.`mlflow.parentRunId` = '{self.parent_id}'")
        return runs[0].info.run_id if runs else None

    def _apply_text(self, text: str, name: str) -> None:
        self.client.log_text(self.parent_id, text, name)

    def _apply_dict(self, data: dict, name: str) -> None:
        self.client.log_dict(self.parent_id, data, name)

    def _apply_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.parent_id, k, v)

    def _apply_finish(self, status: str) -> None:
        self.client.set_terminated(self.parent_id, status)

    def _apply_trial(self, number: int, spec: dict[str, Any], summary: dict[str, Any],
                     history: list[dict[str, Any]], tags: dict[str, str]) -> str:
        """A whole trial in one write: what earlier versions kept on disk (``tuner sync`` still sends it)."""
        key = uuid.uuid4().hex
        run_id = self._apply_trial_start(key, number, spec, tags)
        self._apply_trial_end(key, spec, summary, history, 0)
        return run_id

    def _apply_trial_start(self, key: str, number: int, spec: dict[str, Any], tags: dict[str, str]) -> str:
        from mlflow.entities import Param

        # One run per trial. A kept start replayed after it was sent finds its run: in this process by its key, and
        # in another (tuner sync), or when the server created the run and went away before it answered or before
        # its params were written, by the run's key tag there. Its params are written again (the same values: a no-op).
        run_id = self.trial_run_ids.get(key) or (self._trial_run_there(key) if self.replaying else None)
        if run_id is None:
            label = tags.get(RUN_NAME_TAG, f"trial-{number:03d}")
            run = self.client.create_run(
                self.experiment_id,
                run_name=label,
                tags={
                    "mlflow.parentRunId": self.parent_id,
                    KIND_TAG: "trial",
                    TRIAL_KEY_TAG: key,
                    TRIAL_NUMBER_TAG: str(number),
                    STATUS_TAG: RUNNING_STATUS,
                    **tags,
                },
            )
            run_id = run.info.run_id
        self.trial_run_ids[key] = run_id
        params = [Param(k, _param_value(v)) for k, v in spec["params"].items()]
        params += [Param(f"{PARAM_PREFIX}{k}", _param_value(spec[k])) for k in ("max_steps", "seed", "model", "trainer")]
        if spec.get("schedule_steps"):  # a risk rung: the first max_steps steps of a run this long
            params.append(Param(f"{PARAM_PREFIX}schedule_steps", _param_value(spec["schedule_steps"])))
        # log_batch takes at most 100 params a call
        for i in range(0, len(params), 100):
            self.client.log_batch(run_id, params=params[i:i + 100])
        return run_id

    def _run_of(self, key: str) -> str:
        """The run of a trial key: created by this process, or found by its tag (``tuner sync``, --resume)."""
        if key not in self.trial_run_ids:
            runs = self.client.search_runs(
                [self.experiment_id], max_results=1,
                filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}' and tags.`{TRIAL_KEY_TAG}` = '{key}'")
            if not runs:
                raise TunerError(f"MLflow holds no trial run with {TRIAL_KEY_TAG} {key} under search run "
                                 f"{self.parent_id}; its kept writes in {self.spool_path} cannot be sent")
            self.trial_run_ids[key] = runs[0].info.run_id
        return self.trial_run_ids[key]

    def _log_metrics(self, run_id: str, metrics: list) -> None:
        for i in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics a call
            self.client.log_batch(run_id, metrics=metrics[i:i + 1000])

    def _apply_steps(self, key: str, rows: list[dict[str, Any]]) -> None:
        self._log_metrics(self._run_of(key), _step_metrics(rows))

    def _apply_trial_tags(self, key: str, tags: dict[str, str]) -> None:  # in kept writes of earlier versions
        run_id = self._run_of(key)
        for k, v in tags.items():
            self.client.set_tag(run_id, k, v)

    def _apply_trial_interrupted(self, key: str) -> None:
        """End a trial's run that is still RUNNING: KILLED, tagged interrupted. A run that got its verdict (an
        interrupt right after that write) keeps it; a trial whose run was never created has nothing to end."""
        try:
            run_id = self._run_of(key)
        except TunerError:
            return
        if self.client.get_run(run_id).info.status != "RUNNING":
            return
        self.client.set_tag(run_id, STATUS_TAG, INTERRUPTED_STATUS)
        self.client.set_terminated(run_id, "KILLED")

    def _apply_trial_end(self, key: str, spec: dict[str, Any], summary: dict[str, Any],
                         history: list[dict[str, Any]], streamed: int, output: str = "") -> str:
        from mlflow.entities import Metric, RunTag

        run_id = self._run_of(key)
        metrics = _step_metrics(history[streamed:])
        for k in ("tokens_per_second", "samples_per_second", "progress", "peak_memory_mb",
                  "seconds_to_first_step", "wall_seconds", "steps_run"):
            if isinstance(summary.get(k), (int, float)):
                metrics.append(Metric(f"trial/{k}", _metric_value(summary[k]), 0, 0))
        self._log_metrics(run_id, metrics)
        verdict = {STATUS_TAG: summary["status"], REASON_TAG: (summary.get("reason") or "")[:5000],
                   STOPPED_AT_STEP_TAG: str(summary.get("stopped_at_step"))}
        if summary.get("risk"):
            verdict[RISK_TAG] = summary["risk"][:5000]
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in verdict.items()])
        self.client.log_dict(run_id, spec, "trial.yaml")
        self.client.log_dict(run_id, {**summary, "history": history}, "result.json")
        if output:
            self.client.log_text(run_id, output, LOG_ARTIFACT)
        # MLflow's KILLED for a trial the search stopped because it could not win: not a failure of the config
        ended = "FINISHED" if is_ok(summary) else "KILLED" if summary.get("status") == Status.PRUNED else "FAILED"
        self.client.set_terminated(run_id, ended)
        return run_id


def _step_metrics(rows: list[dict[str, Any]]) -> list:
    """MLflow metric points of per-step rows: every number of each row at its step (timestamp 0)."""
    from mlflow.entities import Metric

    return [Metric(key, _metric_value(value), 0, row["step"])
            for row in rows for key, value in row.items()
            if key != "step" and isinstance(value, (int, float))]


def _retry_locked(write, whole=contextlib.nullcontext, attempts: int = 20):
    """Two searches on one SQLite store take turns: retry a write that found the database locked. Each try runs
    inside ``whole()`` (SearchTracker._whole), not the waits between tries."""
    for attempt in range(attempts):
        try:
            with whole():
                return write()
        except Exception as e:  # noqa: BLE001
            if "database is locked" not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def sync_pending(uri: str, store: Path) -> tuple[int, int]:
    """Replay every spooled search under ``store/pending`` to ``uri``: (writes sent, writes left)."""
    sent = left = 0
    for path in sorted((Path(store) / "pending").glob("*.jsonl")):
        tracker = SearchTracker(uri, None, store, parent_id=path.stem)
        before = tracker.pending()
        remaining = tracker.flush()
        sent, left = sent + before - remaining, left + remaining
    return sent, left
