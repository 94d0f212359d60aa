"""Searches as jobs on a shared Ray cluster (the Ray Jobs API): sent (send.py), listed, followed and stopped
(listing.py), on the cluster a team names once (cluster.py). ``tuner submit``, ``tuner jobs``, ``tuner logs`` and
``tuner stop`` are these functions.

May import: tuner.config, tuner.errors. Nothing of the search itself: a job runs ``tuner search`` on the cluster.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

if TYPE_CHECKING:
    from tuner.jobs.cluster import connect as connect
    from tuner.jobs.listing import jobs_table as jobs_table
    from tuner.jobs.send import submit as submit

__all__, __getattr__ = lazy_exports(__name__, {
    "connect": "tuner.jobs.cluster",
    "jobs_table": "tuner.jobs.listing",
    "submit": "tuner.jobs.send",
})
