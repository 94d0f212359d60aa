"""The search: Optuna proposes, Ray Tune runs the trials, the driver logs, confirms and recommends.

    _prepare.py     prepare: every input checked before any run, study or trial exists (and --resume's)
    driver.py       run_search: the search's resources (Ray, launcher, stores, interrupts) around the loop
    loop.py         Search: what each free slot runs next (the sampler's trials, then the phases); the results written
    ledger.py       one list of the search's runs and their kinds; the Phase protocol every follow-up answers
    start.py        how a search starts: cold, --from the user's config, warm from earlier searches, or both
    _execution.py   Ray Tune: the trainable, the searcher (hands on to Search), successive halving, the driver's callback
    _sampling.py    Optuna: the sampler, asking without repeats, telling outcomes
    _staging.py     speed knobs first, then learning knobs on the fastest stable system configs
    _neighbours.py  a --from search's single changes to trial 0, in the order its verdict calls for
    _confirm.py     the best candidates re-run on other seeds
    _extend.py      longer rungs when no stable trial learned within --max-steps
    _anchor.py      GRPO: the anchored twin (beta > 0) of a best trial losing its reward spread with beta 0
    _warm.py        warm start from earlier searches; _warm_fallback.py: back to the default trials
    _remeasure.py   a --from search's speed re-runs: the faster trial and theirs again, side by side
    _packing.py     how many trials of given memory estimates fit a machine at once; the GPUs a trial spans
    _placement.py   how many trials at once and what each asks of Ray, from the memory plan
    _resume.py      an interrupted search continued in the same run
    _release.py     the trials' shared weight copies removed at the end, on every node of the Ray cluster

May import: every subsystem below it (tuner.report, tuner.trial, tuner.verdicts, tuner.inputs, tuner.config,
tuner.stores) and tuner.errors, tuner.records. Only tuner.cli imports it.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.search._extend import risk_rung_steps as risk_rung_steps
    from tuner.search._prepare import Prepared as Prepared
    from tuner.search._prepare import hardware_precisions as hardware_precisions
    from tuner.search._prepare import prepare as prepare
    from tuner.search._prepare import prepare_resume as prepare_resume
    from tuner.search._sampling import Proposer as Proposer
    from tuner.search._sampling import make_sampler as make_sampler
    from tuner.search.driver import SearchOutcome as SearchOutcome
    from tuner.search.driver import run_search as run_search

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "Proposer": "tuner.search._sampling",
    "SearchOutcome": "tuner.search.driver",
    "Prepared": "tuner.search._prepare",
    "hardware_precisions": "tuner.search._prepare",
    "make_sampler": "tuner.search._sampling",
    "prepare": "tuner.search._prepare",
    "prepare_resume": "tuner.search._prepare",
    "risk_rung_steps": "tuner.search._extend",
    "run_search": "tuner.search.driver",
})
