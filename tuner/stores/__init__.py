"""Where a search's state lives and what guards it: MLflow (tracking.py), the per-machine cache folder
(cache.py), signals held while a store is written (interrupts.py), and the reaper that ends Ray's processes
with their driver (reaper.py).

May import: tuner.errors, tuner.records. The lowest subsystem after them: nothing of tuner's search, trials or
verdicts.
"""

from tuner._exports import lazy_exports

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "SearchTracker": "tuner.stores.tracking",
    "TrackingUnavailable": "tuner.stores.tracking",
    "cache_dir": "tuner.stores.cache",
    "client": "tuner.stores.tracking",
    "default_tracking_uri": "tuner.stores.tracking",
    "load_search": "tuner.stores.tracking",
})
