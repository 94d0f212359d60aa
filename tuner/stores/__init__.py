"""Where a search's state lives and what guards it: MLflow (mlflow_store.py: the store, its checks and client;
run_writer.py: a search's runs written; run_reader.py: read back; tags.py: the tag names), the per-machine cache
folder (cache.py), signals held while a store is written (interrupts.py), and the reaper that ends Ray's
processes with their driver (reaper.py).

May import: tuner.errors, tuner.records. The lowest subsystem after them: nothing of tuner's search, trials or
verdicts.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.stores.cache import cache_dir as cache_dir
    from tuner.stores.mlflow_store import client as client
    from tuner.stores.mlflow_store import default_tracking_uri as default_tracking_uri
    from tuner.stores.run_reader import load_search as load_search
    from tuner.stores.run_writer import SearchTracker as SearchTracker
    from tuner.stores.run_writer import TrackingUnavailable as TrackingUnavailable

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "SearchTracker": "tuner.stores.run_writer",
    "TrackingUnavailable": "tuner.stores.run_writer",
    "cache_dir": "tuner.stores.cache",
    "client": "tuner.stores.mlflow_store",
    "default_tracking_uri": "tuner.stores.mlflow_store",
    "load_search": "tuner.stores.run_reader",
})
