"""One rank of a distributed trial (tuner.trial.ranks starts ``ranks`` of these through torch's elastic launcher):

    python -m tuner.trial._rank WORKDIR      # RANK, WORLD_SIZE, MASTER_ADDR/PORT set by the launcher

It trains the job's TrialSpec (WORKDIR/ranks-spec.json) as one process of the data-parallel job, writes its
result to WORKDIR/rank<R>.json and its output to WORKDIR/rank<R>.log; rank 0 also writes the metrics rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from tuner.errors import describe_exception
from tuner.records import TrialResult
from tuner.trial._files import output_to
from tuner.trial._run import broke_off, run_trial
from tuner.trial._spec import TrialSpec
from tuner.trial.ranks import SPEC_NAME, rank_log, rank_result


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the agent) dies, however it dies: no rank outlives its trial."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    if os.getppid() == 1:  # the agent died before the request: nobody would ever stop this rank
        os._exit(1)


def _rank_main(workdir: Path) -> int:
    _die_with_parent()
    rank = int(os.environ["RANK"])
    output_to(rank_log(workdir, rank))
    started = time.perf_counter()
    try:
        job = json.loads((workdir / SPEC_NAME).read_text())
        spec = dataclasses.replace(TrialSpec(**job["spec"]), ranks=1)  # this process is one rank of the job
        metrics = job["metrics"] if rank == 0 else None
        result = run_trial(spec, workdir, metrics_path=metrics)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - told as the trial's reason
        result = TrialResult.crashed(describe_exception(error), wall_seconds=time.perf_counter() - started)
    ended = {"result": result.summary(), "ended_at": time.time()}  # when: the first rank to fail is the cause
    rank_result(workdir, rank).write_text(json.dumps(ended, allow_nan=True))
    sys.stdout.flush()
    sys.stderr.flush()
    # A rank that broke off would leave the others waiting in a collective: a failed exit makes the agent stop them.
    # (The guard stops every rank at the same step: they all see the same all-reduced rows.)
    return 1 if broke_off(result) else 0


if __name__ == "__main__":
    code = _rank_main(Path(sys.argv[1]))
    os._exit(code)  # skip the interpreter's slow teardown of torch and the process group
