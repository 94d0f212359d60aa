"""Where a search's state lives and what guards it: MLflow (mlflow_store.py: the store, its checks and client;
run_writer.py: a search's runs written; run_reader.py: read back; tags.py: the tag names), the per-machine cache
folder (cache.py), signals held while a store is written (interrupts.py), and the reaper that ends Ray's
processes with their driver (reaper.py).

May import: tuner.errors, tuner.records. The lowest subsystem after them: nothing of tuner's search, trials or
verdicts.
"""

from tuner._exports import lazy_exports

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "SearchTracker": "tuner.stores.run_writer",
    "TrackingUnavailable": "tuner.stores.run_writer",
    "cache_dir": "tuner.stores.cache",
    "client": "tuner.stores.mlflow_store",
    "default_tracking_uri": "tuner.stores.mlflow_store",
    "load_search": "tuner.stores.run_reader",
})
