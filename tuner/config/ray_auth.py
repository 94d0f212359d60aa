"""Ray's token authentication, taken as Ray takes it: where the token is, token mode for this process, and one line
when a cluster refuses (tuner's job commands, tuner.jobs.cluster; a search's --ray-address, tuner.search._execution).

    use_token_if_any()          # "$RAY_AUTH_TOKEN", "~/.ray/auth_token", ... or None; token mode on where one is
    raise auth_error("--cluster URL", sent=is_refusal(e))   # TunerError: no token sent, or the cluster refused it

Ray 2.52 added token authentication; later Rays turn it on by default for new clusters. A cluster started with it
refuses every client and node without the token (`ray get-auth-token` prints it on the head node).
"""

from __future__ import annotations

import os

from tuner.errors import TunerError

__all__ = ["AUTH_MODE_ENV", "DEFAULT_TOKEN_FILE", "TOKEN_ENV", "TOKEN_PATH_ENV", "auth_error", "is_refusal",
           "token_source", "use_token_if_any"]

# The token is read from the first of these, as Ray reads it, and Ray's clients send it only in token mode
# (RAY_AUTH_MODE=token).
AUTH_MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = "~/.ray/auth_token"


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


def is_refusal(error: Exception) -> bool:
    """Whether Ray's AuthenticationError says a token was sent and refused (not that none was sent: "Missing")."""
    return "Missing" not in str(error)


def auth_error(where: str, sent: bool) -> TunerError:
    """One line for a cluster's authentication refusal: no token sent, or a token the cluster refused (``sent``:
    what Ray said; the token itself never appears)."""
    source, mode = token_source(), os.environ.get(AUTH_MODE_ENV, "")
    fix = (f"get it with `ray get-auth-token` on the head node and put it in {DEFAULT_TOKEN_FILE} (or ${TOKEN_ENV}), "
           f"with {AUTH_MODE_ENV} unset or token")
    if source is not None and mode.lower() == "disabled":
        return TunerError(f"{where}: the cluster needs Ray's authentication token and no token was sent "
                          f"({AUTH_MODE_ENV}={mode}, though {source} has one); unset {AUTH_MODE_ENV} or set it to token")
    if source is None:
        return TunerError(f"{where}: the cluster needs Ray's authentication token and tuner found none "
                          f"(looked in ${TOKEN_ENV}, ${TOKEN_PATH_ENV} and {DEFAULT_TOKEN_FILE}); {fix}")
    if not sent:
        return TunerError(f"{where}: the cluster needs Ray's authentication token and the one in {source} "
                          f"was not sent; {fix}")
    return TunerError(f"{where}: the cluster refused the token from {source}: it is not this cluster's; get "
                      f"the cluster's with `ray get-auth-token` on the head node")
