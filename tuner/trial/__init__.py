"""One trial, runnable without Ray::

    tuner trial --config trial.yaml          # in this process, prints metrics and the verdict

    spec.py       what a trial is (TrialSpec) and the trial config YAML
    run.py        run_trial: build the TRL trainer, train under the guard, measure, classify
    measure.py    throughput after warm-up, peak memory, out-of-memory errors
    faults.py     fault injection (TUNER_FAULT), the test hook for crashes and NaNs
    isolation.py  run_trial_isolated: the same in a child process, so a dying trial dies alone
    launcher.py   the node's trial launcher (launcher_server.py): children forked from one import of torch
"""

from tuner.records import TrialResult
from tuner.trial.isolation import run_trial_isolated
from tuner.trial.run import format_result, run_trial
from tuner.trial.spec import TrialSpec, load_trial_spec, prepare_trial_spec

__all__ = ["TrialResult", "TrialSpec", "format_result", "load_trial_spec", "prepare_trial_spec", "run_trial",
           "run_trial_isolated"]
