"""The trials' shared weight copies (tuner.trial.weights) removed at the search's end on every node of its Ray cluster.

    release_everywhere(model_path)                      # the driver, at its end, Ray still up: every node, then here
    release_everywhere(model_path, other_nodes=False)   # here only: a local Ray, or an interrupted search's

Each other alive node runs ``weights.release`` in a zero-CPU Ray task pinned to it; this node runs it directly.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from tuner.trial import weights

__all__ = ["release_everywhere"]


def release_everywhere(model_path: str | None = None, timeout: float = 60.0,
                       other_nodes: bool = True) -> dict[str, Any]:
    """``weights.release(model_path)`` on every other alive node of the Ray cluster while Ray is up (a zero-CPU task
    pinned to each), then here: what trials on other nodes built does not outlive the search either. Best effort: a
    node that does not answer within ``timeout`` keeps its copy until a later tuner run there sweeps it; never raises
    (the driver calls it while ending the search, also on errors). ``other_nodes`` False: here only, Ray is not
    asked (a local Ray has no other node; an interrupted search's Ray may be gone). Returns the bytes freed:
    {"nodes": {node id: bytes}, "local": bytes}."""
    nodes: dict[str, int] = {}
    try:
        import ray

        if other_nodes and ray.is_initialized():
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            remote = ray.remote(num_cpus=0, max_retries=0)(_release_on_node)
            here = ray.get_runtime_context().get_node_id()  # released below without a task (a worker's start)
            refs = {node["NodeID"]: remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(model_path)
                for node in ray.nodes() if node.get("Alive") and node["NodeID"] != here}
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
            for node_id, ref in refs.items():
                with contextlib.suppress(Exception):
                    nodes[node_id] = ray.get(ref, timeout=0)
    except Exception as error:  # noqa: BLE001 - called from the driver's finally: never mask what ended the search
        _say(f"releasing on the Ray nodes failed ({type(error).__name__}: {error})")
    try:
        local = weights.release(model_path)
    except Exception as error:  # noqa: BLE001
        _say(f"releasing here failed ({type(error).__name__}: {error})")
        local = 0
    return {"nodes": nodes, "local": local}


def _release_on_node(model_path: str | None) -> int:
    return weights.release(model_path)


def _say(message: str) -> None:
    print(f"tuner.search._release: {message}", file=sys.stderr, flush=True)
