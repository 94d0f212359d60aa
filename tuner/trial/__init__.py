"""One trial, runnable without Ray::

    tuner trial --config trial.yaml          # in this process, prints metrics and the verdict

    _spec.py             what a trial is (TrialSpec) and the trial config YAML
    _run.py              run_trial: build the TRL trainer, train under the guard, measure, classify
    trainer.py           the real TRL trainer of one trial (precision, LoRA, the monitor)
    _monitor.py          the TrainerCallback that feeds the guard every optimizer step
    measure.py           throughput after warm-up, peak memory, out-of-memory errors
    memory.py            the memory a trial needs, before it runs
    weights.py           the base model's weights converted once per node, mapped by every trial
    _faults.py           fault injection (TUNER_FAULT), the test hook for crashes and NaNs
    _isolation.py        run_trial_isolated: the same in a child process, so a dying trial dies alone
    _follow.py           run_followed: a trial in this process, its progress echoed (steps/s, time left, estimate)
    verify.py            tuner verify: a TRL config file run for N steps as one guarded trial, its whole verdict
    launcher.py          the node's trial launcher (_launcher_server.py): children forked from one import of torch

May import: tuner.verdicts, tuner.inputs, tuner.config, tuner.stores (the reaper), tuner.errors, tuner.records.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.records import TrialResult as TrialResult
    from tuner.trial._follow import run_followed as run_followed
    from tuner.trial._isolation import process_context as process_context
    from tuner.trial._isolation import run_trial_isolated as run_trial_isolated
    from tuner.trial._run import format_result as format_result
    from tuner.trial._run import run_trial as run_trial
    from tuner.trial._spec import TrialSpec as TrialSpec
    from tuner.trial._spec import load_trial_spec as load_trial_spec
    from tuner.trial._spec import prepare_trial_spec as prepare_trial_spec
    from tuner.trial.verify import prepare_verify as prepare_verify
    from tuner.trial.verify import run_verify as run_verify

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "TrialResult": "tuner.records",
    "TrialSpec": "tuner.trial._spec",
    "format_result": "tuner.trial._run",
    "load_trial_spec": "tuner.trial._spec",
    "prepare_trial_spec": "tuner.trial._spec",
    "process_context": "tuner.trial._isolation",
    "run_followed": "tuner.trial._follow",
    "run_trial": "tuner.trial._run",
    "run_trial_isolated": "tuner.trial._isolation",
    "prepare_verify": "tuner.trial.verify",
    "run_verify": "tuner.trial.verify",
})
