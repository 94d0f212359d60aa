"""The libraries that load a trial's inputs (transformers, datasets) kept quiet, before anything is loaded::

    quiet_libraries()   # in every process that loads a model or data: the CLI's checks, a trial, verify
"""

from __future__ import annotations

__all__ = ["quiet_libraries"]


def quiet_libraries() -> None:
    """Keep library chatter off stderr, where a bad input's one line goes, and out of a search of hundreds of
    trials: progress bars, load reports, and the datasets loader's own log of a file it cannot parse."""
    import logging

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("datasets").setLevel(logging.CRITICAL)
