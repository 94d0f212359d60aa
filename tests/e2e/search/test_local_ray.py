"""The Ray a search starts when it is given no --ray-address: its own, whatever else runs on the machine."""

from __future__ import annotations

import os
import socket

import pytest


def _dead_address() -> str:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.slow
def test_a_search_without_ray_address_starts_its_own_ray_even_where_one_is_named(monkeypatch):
    """Ray's own default joins the cluster that RAY_ADDRESS names or that `ray start` last recorded on the machine
    (/tmp/ray/ray_current_cluster), and then refuses the search's num_cpus with a traceback: it failed a search
    beside another one's `ray start` cluster. Without --ray-address the search starts a Ray of its own."""
    import ray

    from tuner.search import _execution as execution

    monkeypatch.setenv("RAY_ADDRESS", _dead_address())
    execution.init_ray(None, None)
    try:
        assert ray.is_initialized()
        assert ray.cluster_resources().get("CPU") == os.cpu_count()  # the num_cpus it started its own Ray with
    finally:
        execution.shutdown_ray()
    assert not ray.is_initialized()
