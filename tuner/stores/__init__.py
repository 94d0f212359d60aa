"""Where a search's state lives and what guards it: MLflow (tracking.py), the per-machine cache folder
(cache.py), signals held while a store is written (interrupts.py), and the reaper that ends Ray's processes
with their driver (reaper.py).

May import: tuner.errors, tuner.records. The lowest subsystem after them: nothing of tuner's search, trials or
verdicts.
"""

import importlib

# Each public name and the module it lives in, imported when first asked for: ``import tuner.stores`` stays cheap
# (``tuner --help`` answers without pydantic, Ray or torch).
_HOMES = {
    "SearchTracker": "tuner.stores.tracking",
    "TrackingUnavailable": "tuner.stores.tracking",
    "cache_dir": "tuner.stores.cache",
    "client": "tuner.stores.tracking",
    "default_tracking_uri": "tuner.stores.tracking",
    "load_search": "tuner.stores.tracking",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
