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
from tuner.errors import TunerError

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

DEFAULT_PORT = 8265  # Ray's dashboard and job server
# Ray's token authentication (Ray 2.52 on; on by default for new clusters from 2.59-2.61): the token is read from the
# first of these, as Ray reads it, and Ray's clients send it only in token mode (RAY_AUTH_MODE=token).
AUTH_MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = "~/.ray/auth_token"
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


def token_source() -> str | None:
    """Where Ray would take its authentication token from here ($RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH
    names, ~/.ray/auth_token), in words; None where there is none. The token itself is never read into a message."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    named = os.environ.get(TOKEN_PATH_ENV)
    if named:
        return f"${TOKEN_PATH_ENV} ({named})" if os.path.isfile(os.path.expanduser(named)) else None
    return DEFAULT_TOKEN_FILE if os.path.isfile(os.path.expanduser(DEFAULT_TOKEN_FILE)) else None


def use_token_if_any() -> str | None:
    """Token mode for this process (and what it starts) where a token is at hand and RAY_AUTH_MODE says nothing:
    Ray's clients send the token only in token mode, and a cluster started with it refuses a client without one.
    Returns where the token is (token_source)."""
    source = token_source()
    if source is not None and not os.environ.get(AUTH_MODE_ENV):
        os.environ[AUTH_MODE_ENV] = "token"
        try:  # Ray reads its mode into a config object once; read again, as Ray does when it turns token mode on
            from ray._raylet import Config  # type: ignore[attr-defined]  # the compiled module's stub omits it

            Config.initialize("")
        except ImportError:  # pragma: no cover - a Ray without token authentication (before 2.52)
            pass
    return source


def auth_error(url: str, error: Exception) -> TunerError:
    """One line for Ray's AuthenticationError: no token sent, or a token the cluster refused (never the token)."""
    source, mode = token_source(), os.environ.get(AUTH_MODE_ENV, "")
    fix = (f"get it with `ray get-auth-token` on the head node and put it in {DEFAULT_TOKEN_FILE} (or ${TOKEN_ENV}), "
           f"with {AUTH_MODE_ENV} unset or token")
    if source is not None and mode.lower() == "disabled":
        return TunerError(f"--cluster {url}: the cluster needs Ray's authentication token and no token was sent "
                          f"({AUTH_MODE_ENV}={mode}, though {source} has one); unset {AUTH_MODE_ENV} or set it to token")
    if source is None:
        return TunerError(f"--cluster {url}: the cluster needs Ray's authentication token and tuner found none "
                          f"(looked in ${TOKEN_ENV}, ${TOKEN_PATH_ENV} and {DEFAULT_TOKEN_FILE}); {fix}")
    if "Missing" in str(error):
        return TunerError(f"--cluster {url}: the cluster needs Ray's authentication token and the one in {source} "
                          f"was not sent; {fix}")
    return TunerError(f"--cluster {url}: the cluster refused the token from {source}: it is not this cluster's; get "
                      f"the cluster's with `ray get-auth-token` on the head node")


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
        raise auth_error(url, e) from None
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
