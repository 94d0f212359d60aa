"""The Ray cluster a team shares, as its job server sees it: the address, the client, one job.

    client = connect("http://10.0.0.1:8265")      # TunerError, one line, when nothing answers there or the
                                                  # cluster refuses (Ray's token: as Ray finds it, token_source)
    info = job(client, "tuner-alice-3f9a2c")      # TunerError when the cluster has no such job

A search submitted to the cluster is a Ray job (the Ray Jobs API: ``ray.job_submission.JobSubmissionClient``, the
job server on the head node); tuner keeps no queue or server of its own. The cluster's MLflow server and shared
store are named once, where ``ray start`` runs (TUNER_TRACKING_URI, TUNER_STORE): the jobs inherit them.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tuner.config.options import CLUSTER_ENV
from tuner.config.ray_auth import auth_error, is_refusal, use_token_if_any
from tuner.errors import TunerError

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

DEFAULT_PORT = 8265  # Ray's dashboard and job server
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def address(cluster: str | None) -> str:
    """``--cluster`` (or $TUNER_CLUSTER) as the job server's URL: ``10.0.0.1`` -> ``http://10.0.0.1:8265``."""
    given = cluster or os.environ.get(CLUSTER_ENV)
    if not given:
        raise TunerError(f"no cluster named: pass --cluster http://HEAD:{DEFAULT_PORT} (the head node's job server) "
                         f"or set {CLUSTER_ENV}")
    url = given if "://" in given else f"http://{given}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TunerError(f"--cluster {given}: expected the job server's URL, e.g. http://10.0.0.1:{DEFAULT_PORT}")
    try:
        port = parts.port
    except ValueError:
        raise TunerError(f"--cluster {given}: the port is not a number 1-65535") from None
    if port is None:
        url = f"{parts.scheme}://{parts.netloc}:{DEFAULT_PORT}{parts.path}"
    return url.rstrip("/")


def connect(cluster: str | None) -> JobSubmissionClient:
    """A client of the cluster's job server; one line, before any slow retry, when nothing answers there."""
    url = address(cluster)
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or DEFAULT_PORT), timeout=3):
            pass
    except OSError as e:
        raise TunerError(f"--cluster {url}: no Ray job server answers there ({e.strerror or e}); start the head node "
                         f"with `ray start --head --dashboard-host 0.0.0.0` and pass http://HEAD:{DEFAULT_PORT}") from None
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:  # pragma: no cover - the project installs ray[default]
        raise TunerError("the Ray job client needs ray[default]: pip install 'ray[default]'") from None
    import logging

    logging.getLogger("ray").setLevel(logging.WARNING)  # Ray's INFO lines ("Uploading package ...") are not ours
    use_token_if_any()
    from ray.exceptions import AuthenticationError

    try:
        return JobSubmissionClient(url)
    except AuthenticationError as e:  # a cluster with token authentication: no token, or not its token
        raise auth_error(f"--cluster {url}", sent=is_refusal(e)) from None
    except (ConnectionError, RuntimeError) as e:  # something answers, but not a Ray job server
        raise TunerError(f"--cluster {url}: not a Ray job server ({' '.join(str(e).split())[:160]}); pass the "
                         f"head node's dashboard address, http://HEAD:{DEFAULT_PORT}") from None


def job(client: JobSubmissionClient, job_id: str) -> JobDetails:
    """One job's details; TunerError when the cluster does not know it."""
    try:
        return client.get_job_info(job_id)
    except RuntimeError as e:
        if "404" in str(e) or "does not exist" in str(e):
            raise TunerError(f"job {job_id}: no such job on the cluster; `tuner jobs` lists them") from None
        raise TunerError(f"job {job_id}: the job server says: {' '.join(str(e).split())[:200]}") from None
