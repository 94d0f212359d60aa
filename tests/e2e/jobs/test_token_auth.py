"""A cluster started with Ray's token authentication (RAY_AUTH_MODE=token, Ray 2.52 on; the default for new clusters
in later Rays): tuner's job commands take the token where Ray keeps it ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH,
~/.ray/auth_token) and work; no token, or the wrong one, is one line and exit 2, never the token itself. A real
`ray start --head` on 127.0.0.1, `tuner jobs` as a user runs it (a submitted search against such a cluster:
tests/e2e/jobs/test_cluster_jobs.py, which runs with the token on)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import Spawner, free_port, kill_session, wait_for

TOKEN = "5f0c0ffee5f0c0ffee5f0c0ffee5f0c0"  # Ray's tokens are 32 hex digits
WRONG = "0123456789abcdef0123456789abcdef"


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name) or name


@dataclass
class Head:
    url: str  # its job server
    address: str  # its GCS, as --ray-address takes it


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A head node whose job server and GCS ask for TOKEN."""
    import urllib.error
    import urllib.request

    folder = tmp_path_factory.mktemp("token-head")
    spawner = Spawner(folder)
    port, gcs = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="ta-", dir="/tmp")  # socket paths must stay short
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(folder)}
    process = spawner.start(
        [_tool("ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(port),
         "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
         "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
         "--num-cpus", "1", "--temp-dir", temp_dir, "--disable-usage-stats"], "ray-head", env=env)

    def answers() -> bool:  # up: it answers, 401 included (the version endpoint asks for the token too)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=3):
                return True
        except urllib.error.HTTPError as e:
            return e.code == 401
        except OSError:
            return False

    try:
        wait_for(answers, "the head's job server", timeout=240, process=process)
        yield Head(f"http://127.0.0.1:{port}", f"127.0.0.1:{gcs}")
    finally:
        kill_session(process.pid)
        spawner.cleanup()
        shutil.rmtree(temp_dir, ignore_errors=True)


def jobs(url: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    """`tuner jobs --cluster URL` with only ``env`` of Ray's auth variables set, HOME at ``home``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "TUNER_CLUSTER"))}
    return subprocess.run([_tool("tuner"), "jobs", "--cluster", url], capture_output=True, text=True, timeout=120,
                          env={**clean, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", **env})


@pytest.mark.slow
def test_the_token_is_taken_where_ray_keeps_it(head, tmp_path):
    done = jobs(head.url, tmp_path, RAY_AUTH_TOKEN=TOKEN)  # RAY_AUTH_MODE unset: tuner turns token mode on
    assert done.returncode == 0, done.stderr
    (tmp_path / "t").write_text(TOKEN)
    assert jobs(head.url, tmp_path, RAY_AUTH_TOKEN_PATH=str(tmp_path / "t")).returncode == 0
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(TOKEN)
    done = jobs(head.url, tmp_path)  # ~/.ray/auth_token, as `ray get-auth-token` leaves it
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_no_token_or_a_wrong_one_is_one_line_and_exit_2(head, tmp_path):
    for env, said in (({}, "tuner found none (looked in $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH and ~/.ray/auth_token)"),
                      ({"RAY_AUTH_TOKEN": WRONG}, "the cluster refused the token from $RAY_AUTH_TOKEN"),
                      ({"RAY_AUTH_TOKEN": TOKEN, "RAY_AUTH_MODE": "disabled"},
                       "no token was sent (RAY_AUTH_MODE=disabled, though $RAY_AUTH_TOKEN has one)")):
        done = jobs(head.url, tmp_path, **env)
        assert done.returncode == 2, (env, done.stderr)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert said in done.stderr and ("ray get-auth-token" in done.stderr or "RAY_AUTH_MODE" in env)
        assert TOKEN not in done.stderr and WRONG not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_search_joining_the_cluster_without_its_token_is_one_line_and_exit_2(head, tmp_path, tiny_model):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "TUNER_"))}
    for env, said in (({}, "tuner found none"), ({"RAY_AUTH_TOKEN": WRONG}, "the cluster refused the token")):
        done = subprocess.run([_tool("tuner"), "search", "--ray-address", head.address, "--trials", "1",
                               "--max-steps", "2", "--store", str(tmp_path / "S")], capture_output=True, text=True,
                              timeout=240, cwd=tmp_path, env={**clean, "HOME": str(tmp_path), **env})
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        assert lines[0].startswith(f"tuner: error: --ray-address {head.address}: the cluster needs") or \
            said in lines[0], lines[0]
        assert said in lines[0] and TOKEN not in done.stderr and WRONG not in done.stderr
