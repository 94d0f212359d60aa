"""tuner.search._release: a search's end removes the trials' shared weight copies on every node of its Ray cluster."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM  # noqa: E402

from tuner.search._release import release_everywhere  # noqa: E402
from tuner.trial import weights  # noqa: E402


@pytest.fixture
def shared_dir(monkeypatch, tmp_path):
    """A fresh entries folder, in /dev/shm where there is one (what trials use), removed afterwards."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tmp_path
    root = base / f"tuner-weights-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(weights.DIR_ENV, str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_release_everywhere_reaches_the_other_ray_nodes(tiny_model, shared_dir):
    """A real two-node Ray cluster on this machine (ray.cluster_utils): the other node releases by a task pinned
    to it, the driver's own node without one (a worker started only for that would cost a search ~0.5 s)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        other = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cluster.wait_for_nodes()
        here = ray.get_runtime_context().get_node_id()
        freed = release_everywhere(tiny_model)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert not entry.exists()
    # only the other node got a task; it found the entry (both nodes share this machine's folder), and the
    # driver's own release, after it, found nothing left
    assert list(freed["nodes"]) == [other.node_id] != [here], freed
    assert list(freed["nodes"].values())[0] > 0 and freed["local"] == 0, freed
