"""tuner.config.ray_auth without a cluster: where Ray's token is taken from, and the one line a refusal becomes,
which names where tuner looked and how to get the token, and never the token itself (the refusals themselves, from a
real cluster with token authentication: tests/e2e/jobs/test_token_auth.py)."""

from __future__ import annotations

import pytest

from tuner.config import ray_auth

TOKEN = "0123456789abcdef-not-a-real-token"


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No token anywhere Ray looks: no variables, a home without ~/.ray/auth_token."""
    for name in (ray_auth.TOKEN_ENV, ray_auth.TOKEN_PATH_ENV, ray_auth.AUTH_MODE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_the_token_is_taken_from_the_variable_then_the_named_file_then_the_default_file(no_token, monkeypatch):
    assert ray_auth.token_source() is None
    (no_token / ".ray").mkdir()
    (no_token / ".ray" / "auth_token").write_text(TOKEN)
    assert ray_auth.token_source() == ray_auth.DEFAULT_TOKEN_FILE
    named = no_token / "token"
    monkeypatch.setenv(ray_auth.TOKEN_PATH_ENV, str(named))
    assert ray_auth.token_source() is None  # a named file that is not there: Ray finds none either
    named.write_text(TOKEN)
    assert ray_auth.token_source() == f"${ray_auth.TOKEN_PATH_ENV} ({named})"
    monkeypatch.setenv(ray_auth.TOKEN_ENV, TOKEN)
    assert ray_auth.token_source() == f"${ray_auth.TOKEN_ENV}"


def test_a_refusal_is_one_line_saying_what_was_wrong_and_never_the_token(no_token, monkeypatch):
    none = str(ray_auth.auth_error("--cluster http://head:8265", sent=False))
    assert "found none" in none and ray_auth.TOKEN_ENV in none and "ray get-auth-token" in none
    monkeypatch.setenv(ray_auth.TOKEN_ENV, TOKEN)
    unsent = str(ray_auth.auth_error("--cluster http://head:8265", sent=False))
    assert "was not sent" in unsent and f"${ray_auth.TOKEN_ENV}" in unsent
    refused = str(ray_auth.auth_error("--ray-address head:6379", sent=True))
    assert refused.startswith("--ray-address head:6379: the cluster refused the token from $RAY_AUTH_TOKEN"), refused
    monkeypatch.setenv(ray_auth.AUTH_MODE_ENV, "disabled")
    disabled = str(ray_auth.auth_error("--cluster http://head:8265", sent=False))
    assert f"{ray_auth.AUTH_MODE_ENV}=disabled" in disabled and "unset" in disabled
    for line in (none, unsent, refused, disabled):
        assert "\n" not in line and TOKEN not in line


@pytest.mark.parametrize(("said", "refused"), [
    ("Authentication error: Missing authentication token", False),
    ("Authentication error: Invalid authentication token", True),
])
def test_rays_words_say_whether_a_token_was_sent(said, refused):
    assert ray_auth.is_refusal(RuntimeError(said)) is refused
