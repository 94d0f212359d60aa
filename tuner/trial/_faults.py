"""Fault injection, a test hook documented in docs/failures.md: make a trial die, raise or go NaN at a given step.

    TUNER_FAULT=sigfpe@3 tuner trial --config trial.yaml     # the trial's process dies of SIGFPE after step 3
"""

from __future__ import annotations

import os
import signal

import yaml

from tuner.errors import TunerError

# Test hook for fault injection (documented in docs/failures.md): "<kind>@<step>", e.g. "sigfpe@3".
# The trial's own process then dies (or raises) at the end of that optimizer step; "nan" instead
# poisons the trainable weights, a real divergence for the guard to catch on the next step; "slow" makes every
# step from that one on take SLOW_STEP_S longer (a trial that must still be running when the driver decides), or
# TUNER_FAULT_SLOW_S seconds where that is set (a trial made slower than any load makes another).
# TUNER_FAULT_WHEN="key=value[,key=value]" limits it to trials whose params (or seed, or rank) match.
FAULT_ENV = "TUNER_FAULT"
FAULT_WHEN_ENV = "TUNER_FAULT_WHEN"
SLOW_S_ENV = "TUNER_FAULT_SLOW_S"
_FAULTS = {"sigfpe": signal.SIGFPE, "sigsegv": signal.SIGSEGV, "sigkill": signal.SIGKILL}
SLOW_STEP_S = 0.25


def parse_fault(fault: str, where: str) -> tuple[str, int]:
    kind, _, at = str(fault).partition("@")
    known = (*_FAULTS, "oom", "error", "nan", "slow")
    if kind not in known or not (at or "1").isdigit() or int(at or 1) < 1:
        raise TunerError(f"{where}: fault must be '<kind>@<step>' with kind one of {', '.join(known)} "
                         f"and step >= 1, got {fault!r}")
    return kind, int(at or 1)


def _fault_applies(spec, when: str) -> bool:
    # rank: the process's rank in a distributed trial (tuner.trial.ranks), 0 in a one-process trial
    values = {**spec.params, "seed": spec.seed, "trainer": spec.trainer, "rank": int(os.environ.get("RANK") or 0)}
    for condition in filter(None, when.split(",")):
        key, _, expected = condition.partition("=")
        if key.strip() not in values or values[key.strip()] != yaml.safe_load(expected):
            return False
    return True


def fault_hook(spec):
    fault = spec.fault
    where = "fault" if fault else FAULT_ENV
    fault = fault or os.environ.get(FAULT_ENV)
    if not fault or not _fault_applies(spec, os.environ.get(FAULT_WHEN_ENV, "")):
        return None
    kind, at_step = parse_fault(fault, where)

    def fire(step: int, model=None):
        if kind == "slow" and step >= at_step:
            import time

            time.sleep(float(os.environ.get(SLOW_S_ENV) or SLOW_STEP_S))
            return
        if step != at_step:
            return
        if kind == "nan":
            import torch

            with torch.no_grad():
                for p in model.parameters():
                    if p.requires_grad:
                        p.fill_(float("nan"))
        elif kind in _FAULTS:
            # what a dying C library writes to stderr first (below Python's own streams): the crash's last words
            os.write(2, f"injected {kind} at step {step}\n".encode())
            os.kill(os.getpid(), _FAULTS[kind])
        elif kind == "oom":
            import torch

            raise torch.OutOfMemoryError("injected: CUDA out of memory. Tried to allocate 20.00 GiB")
        else:
            raise RuntimeError(f"injected fault {kind!r}")

    return fire


