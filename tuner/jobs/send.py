"""A search sent to the cluster as a Ray job: ``tuner search`` on the cluster, this folder as its working directory.

    folder = working_folder(Path.cwd(), store="mlflow")    # what travels; TunerError over Ray's upload limit
    sent = submit(client, url, {"trainer": "dpo", "trials": 40}, folder)
    sent.job_id, sent.experiment, sent.entrypoint

The job runs ``tuner search --ray-address auto`` with the options the user typed (only those: the cluster's own
defaults, e.g. its shared store named by TUNER_STORE where ``ray start`` ran, apply to the rest), in a copy of this
folder (the user's jsonl, reward module and --from file travel with it; Ray uploads it, up to its limit). Each job
gets an MLflow experiment of its own unless --experiment is given, and half the cluster unless the user asks for
more (--cluster-share, --max-gpus), so that searches of several users queue beside each other.
"""

from __future__ import annotations

import fnmatch
import getpass
import os
import re
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from tuner.config.options import CLUSTER_ENV, SUBMITTED_JOB_ENV, flag, option_field, option_fields
from tuner.config.trainers import DEFAULT_TRAINER
from tuner.errors import TunerError

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

__all__ = ["Folder", "Submitted", "check_given", "resume", "search_words", "submit", "working_folder"]

DEFAULT_SHARE = 0.5  # of the cluster's GPUs (CPUs for CPU trials), when the user asks for no share
DRIVER_CPUS = 1  # the search's driver (the Optuna sampler, MLflow writes, Ray Tune's loop): declared to Ray
AGENT_WAIT_S = 60.0  # how long a submission waits for a job agent that is still starting ("try again later")
STOP_WAIT_S = 60  # after `tuner stop`'s SIGTERM, before Ray's SIGKILL: the search marks its runs KILLED meanwhile
# Never uploaded: version control, virtual environments, caches, and a local MLflow store (the cluster has its own).
ALWAYS_EXCLUDED = (".git", ".hg", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache")
# Never uploaded unless --include names them: what looks like a secret. The job's working directory is unpacked on
# every node and kept in Ray's session folders, so a key that travels is a key every node's users can read.
SECRET_FILES = (".env", ".env.*", "*.env", "*.pem", "*.key", "*.p12", "*.pfx", "*.keystore", "*.jks", "id_rsa*",
                "id_dsa*", "id_ecdsa*", "id_ed25519*", ".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc",
                "credentials", "credentials.json", "*.credentials", "auth_token", "token", "*.token",
                "service-account*.json", "kubeconfig")
# ... and folders of tools' credentials (home-directory style: Ray's token file lives in ~/.ray, MLflow's in ~/.mlflow)
SECRET_FOLDERS = (".ssh", ".aws", ".azure", ".gnupg", ".kube", ".docker", ".ray", ".mlflow", ".huggingface",
                  ".config", ".gcloud", ".databricks")
# Options a submitted search cannot take: the cluster is the one it is sent to.
NOT_FOR_SUBMIT = ("ray_address", "resume")
# Options that name a file in this folder, which must travel with the job.
FILE_OPTIONS = ("from_config", "search_space", "dataset")
METADATA_PREFIX = "tuner."


def upload_limit() -> int:
    """Ray's limit on a job's working directory, as Ray computes it (ray._private.runtime_env.packaging): the
    gRPC message size, 512 MiB unless RAY_max_grpc_message_size says otherwise."""
    return int(os.environ.get("RAY_max_grpc_message_size", 512 * 1024 * 1024))


@dataclass
class Folder:
    root: Path
    excludes: list[str]  # gitignore-style patterns, relative to root (Ray's runtime_env "excludes")
    size: int  # bytes of the files that travel, before compression
    largest: list[tuple[int, str]] = field(default_factory=list)  # (bytes, relative path), largest first
    secrets: list[str] = field(default_factory=list)  # relative paths left behind as secrets (SECRET_FILES, _FOLDERS)

    def secrets_line(self) -> str | None:
        """What was left behind as a secret, in one line (None: nothing)."""
        if not self.secrets:
            return None
        shown = ", ".join(self.secrets[:8]) + (f" and {len(self.secrets) - 8} more" if len(self.secrets) > 8 else "")
        return (f"  left out:   {shown} (they look like secrets, so they stay on this machine; "
                "--include PATH sends one on purpose)")


def looks_secret(relative: str) -> bool:
    """Whether a path in the job's folder (relative, with /) looks like a secret: a file named as in SECRET_FILES,
    or anything inside a folder named as in SECRET_FOLDERS."""
    *folders, name = relative.split("/")
    return any(part in SECRET_FOLDERS for part in folders) or any(
        fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_FILES)


def working_folder(root: Path, store: str | None, include: Sequence[str] = ()) -> Folder:
    """What travels with the job: ``root`` without version control, virtual environments, caches, the local store
    and what looks like a secret (``looks_secret``; ``include`` names paths, relative to ``root``, to send all the
    same); TunerError, with the largest files, when it is over Ray's upload limit."""
    root = root.resolve()
    skipped = set(ALWAYS_EXCLUDED)
    excludes = [f"{name}/" for name in ALWAYS_EXCLUDED]
    store_path = (root / (store or "mlflow")).resolve()
    if store_path.is_relative_to(root) and store_path != root:
        excludes.append("/" + store_path.relative_to(root).as_posix() + "/")
    wanted = {_included(root, path) for path in include}
    size, files, secret = 0, [], []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in skipped and (here / d).resolve() != store_path)
        for name in sorted(names):
            path = here / name
            relative = path.relative_to(root).as_posix()
            if looks_secret(relative) and relative not in wanted:
                secret.append(relative)
                excludes.append("/" + _escaped(relative))
                continue
            try:
                n = path.lstat().st_size
            except OSError:
                continue
            size += n
            files.append((n, relative))
    files.sort(reverse=True)
    found = Folder(root, excludes, size, files[:3], secret)
    limit = upload_limit()
    if size > limit:
        biggest = ", ".join(f"{name} ({n / 2**20:.0f} MiB)" for n, name in found.largest)
        raise TunerError(f"{root}: {size / 2**20:.0f} MiB to upload with the job, over Ray's limit of "
                         f"{limit / 2**20:.0f} MiB (largest: {biggest}); put the data on storage every node reads "
                         "(a shared path or a hub dataset id) and pass it as --dataset, or submit from a folder "
                         "with only the files the search needs")
    return found


def _included(root: Path, path: str) -> str:
    """An --include path as the upload names it (relative to ``root``, with /); TunerError where it is no file there."""
    full = (root / path).resolve()
    if not full.is_relative_to(root) or not full.is_file():
        raise TunerError(f"--include {path}: no such file in {root}; name a file of this folder, relative to it")
    return full.relative_to(root).as_posix()


def _escaped(relative: str) -> str:
    """A path as one gitignore pattern that matches only it (Ray's excludes are gitignore patterns)."""
    return "".join("\\" + c if c in "*?[]!#\\" else c for c in relative)


def _user() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "user"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "user"


def search_words(given: dict[str, Any]) -> list[str]:
    """The ``tuner search`` flags for the options the user typed (as ``tuner submit`` parsed them)."""
    words: list[str] = []
    for f in option_fields():
        if f.name not in given:
            continue
        value = given[f.name]
        if isinstance(value, bool):
            words.append(flag(f) if value else "--no-" + flag(f).removeprefix("--"))
        elif isinstance(value, list):
            for item in value:
                words += [flag(f), str(item)]
        elif value is not None:
            words += [flag(f), format(value, "g") if isinstance(value, float) else str(value)]
    return words


def check_given(given: dict[str, Any], root: Path) -> None:
    """What tuner submit cannot send: --ray-address, --resume, a file named that is not in this folder."""
    for name in NOT_FOR_SUBMIT:
        if name in given:
            what = {"ray_address": "the cluster it is submitted to (--cluster)",
                    "resume": "a stopped job: tuner submit --resume JOB"}[name]
            raise TunerError(f"{flag(option_field(name))}: a submitted search runs on {what}; leave it out")
    for name in FILE_OPTIONS:
        value = given.get(name)
        if not value or name == "dataset" and value == "builtin":
            continue
        path = Path(value)
        if path.is_absolute():
            continue  # a path on storage the cluster's nodes read (said so in the help)
        if (root / path).exists():
            if not (root / path).resolve().is_relative_to(root.resolve()):
                raise TunerError(f"{flag(option_field(name))} {value}: outside this folder, so it does not travel "
                                 "with the job; copy it here, or pass a path every node reads")
        elif name != "dataset" or path.suffix:  # a dataset without a suffix may be a hub id
            raise TunerError(f"{flag(option_field(name))} {value}: no such file in {root}; the job runs on a copy "
                             "of this folder")


def _search_of(given: dict[str, Any]) -> tuple[str, str]:
    """The trainer and model the search will run, as far as the typed options say ("" where a file named in them
    decides: the --from file's, the --search-space file's)."""
    trainer = given.get("trainer") or ("" if given.get("from_config") or given.get("search_space")
                                       else DEFAULT_TRAINER)
    return trainer, given.get("model") or ("" if given.get("from_config") else "tiny")


def _experiment(given: dict[str, Any], job_id: str) -> str:
    """An experiment of the job's own: ``<trainer>-<model>-<job id's tail>``, unless --experiment is given."""
    if given.get("experiment"):
        return given["experiment"]
    trainer, model = _search_of(given)
    model = model.rstrip("/").rsplit("/", 1)[-1]
    return "-".join(part for part in (trainer, model, job_id.removeprefix("tuner-")) if part)


@dataclass
class Submitted:
    job_id: str
    experiment: str
    entrypoint: str
    cluster: str
    folder: Folder | None = None

    def lines(self) -> list[str]:
        where = f"--cluster {self.cluster}"
        size = f" ({self.folder.size / 2**20:.1f} MiB of {self.folder.root})" if self.folder else ""
        left = self.folder.secrets_line() if self.folder else None
        return [f"submitted {self.job_id} to {self.cluster}{size}", *([left] if left else []),
                f"  runs:       {self.entrypoint}",
                f"  experiment: {self.experiment} (MLflow, in the cluster's store)",
                f"  follow:     tuner logs {self.job_id} --follow {where}",
                f"  list:       tuner jobs {where}",
                f"  stop:       tuner stop {self.job_id} {where}   (resumable: tuner submit --resume {self.job_id})"]


# What the job's log says, and its exit code, when the cluster's head node cannot run tuner: Ray runs the entrypoint
# in a shell with the PATH of the environment that ran `ray start` there, which need not hold tuner.
NO_TUNER_EXIT = 127  # the shell's own code for a command not found
NO_TUNER_LINE = ("tuner submit: this cluster's head node has no 'tuner' on its PATH: install tuner (pip install tuner) "
                 "in the environment that runs `ray start` there, or start Ray from the one that has it, then submit "
                 "again")


def entrypoint(words: list[str]) -> tuple[str, str]:
    """(what the user reads, what the job runs) for ``tuner search --ray-address auto WORDS``: the same command,
    run only once the shell finds tuner, and otherwise one line saying so (NO_TUNER_LINE, exit NO_TUNER_EXIT) in
    place of the shell's bare "tuner: not found"."""
    shown = shlex.join(["tuner", "search", "--ray-address", "auto", *words])
    return shown, (f"command -v tuner >/dev/null 2>&1 || {{ echo {shlex.quote(NO_TUNER_LINE)} >&2; "
                   f"exit {NO_TUNER_EXIT}; }}; exec {shown}")


def _send(client: JobSubmissionClient, cluster: str, job_id: str, words: list[str], folder: Folder,
          metadata: dict[str, str], experiment: str) -> Submitted:
    shown, runs = entrypoint(words)
    runtime_env = {
        "working_dir": str(folder.root), "excludes": folder.excludes,
        "env_vars": {SUBMITTED_JOB_ENV: job_id, CLUSTER_ENV: cluster, "PYTHONUNBUFFERED": "1",
                     # read by the job's supervisor: how long the search has to end cleanly after `tuner stop`
                     "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S)},
    }
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            client.submit_job(entrypoint=runs, submission_id=job_id, runtime_env=runtime_env,
                              metadata={METADATA_PREFIX + k: v for k, v in metadata.items()},
                              entrypoint_num_cpus=DRIVER_CPUS)
            break
        except (RuntimeError, ValueError, ConnectionError) as e:
            said = " ".join(str(e).split())
            if "try again later" in said and time.monotonic() < deadline:
                time.sleep(2.0)  # a head node that just started: its job agent is not registered yet
                continue
            raise TunerError(f"--cluster {cluster}: the job server refused the search: {said[:240]}") from None
    return Submitted(job_id, experiment, shown, cluster, folder)


def submit(client: JobSubmissionClient, cluster: str, given: dict[str, Any], folder: Folder) -> Submitted:
    """Send ``tuner search`` with the options ``given`` as a job; returns what was sent."""
    check_given(given, folder.root)
    user = _user()
    job_id = f"tuner-{user}-{secrets.token_hex(3)}"
    given = dict(given)
    given["experiment"] = _experiment(given, job_id)
    if "cluster_share" not in given and "max_gpus" not in given:
        given["cluster_share"] = DEFAULT_SHARE
    words = search_words(given)
    share = search_words({k: given[k] for k in ("cluster_share", "max_gpus") if k in given})
    trainer, model = _search_of(given)
    metadata = {"user": user, "experiment": given["experiment"], "trainer": trainer, "model": model,
                "share": shlex.join(share)}
    return _send(client, cluster, job_id, words, folder, metadata, given["experiment"])


def resume(client: JobSubmissionClient, cluster: str, stopped, folder: Folder) -> Submitted:
    """Send ``tuner search --resume EXPERIMENT`` for the search of job ``stopped`` (its JobDetails), as a new job
    with the same experiment and share; the finished trials are kept (tuner.search._resume)."""
    meta = {k.removeprefix(METADATA_PREFIX): v for k, v in (stopped.metadata or {}).items()
            if k.startswith(METADATA_PREFIX)}
    if "experiment" not in meta:
        raise TunerError(f"job {stopped.submission_id}: not a search sent by tuner submit (no tuner metadata)")
    if stopped.status not in ("STOPPED", "FAILED"):
        raise TunerError(f"job {stopped.submission_id} is {stopped.status}: only a stopped or failed search is "
                         "resumed")
    job_id = f"tuner-{_user()}-{secrets.token_hex(3)}"
    words = ["--resume", meta["experiment"], *shlex.split(meta.get("share", ""))]
    metadata = {**meta, "user": _user(), "resumes": stopped.submission_id}
    return _send(client, cluster, job_id, words, folder, metadata, meta["experiment"])
