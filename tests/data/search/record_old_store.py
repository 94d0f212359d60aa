"""Records old-store-optuna-numbers.tar.gz: a store written by a search whose trials were numbered by the Optuna study
(before commit 4dd10ab), its driver killed mid-search. Run once, with that code, from this repository's root:

    git worktree add /tmp/oldcode 4dd10ab~1
    python tests/data/search/record_old_store.py /tmp/oldcode /tmp/tuner-old-store

In /tmp/tuner-old-store it runs the old code's CLI (PYTHONPATH=/tmp/oldcode):

    python -m tuner.cli search --search-space space.yaml --sampler tpe --trials 6 --seed 0 --max-steps 4 \
        --confirm-seeds 0 --budget 0 --concurrency 1 --experiment old --store store

over SPACE below (six points), SIGKILLs the driver's process group once 3 trial runs have finished and the study has
one trial in flight (its params drawn, new, and still RUNNING a second later), and archives the store beside this file
(Ray's folder left out: a resume does not read it). The study's numbers skip the proposals drawn again: the archive
here holds trials 0, 1 and 3 finished (2 and 4 to 23 were proposals drawn again, told FAIL) and 24 in flight (its
trial run left RUNNING in MLflow, with no verdict). TPE's proposals follow the measured speeds, so another recording
may number its trials otherwise. The test that reads it (tests/e2e/search/test_numbers.py) rewrites the recorded root,
/tmp/tuner-old-store, to where it extracts it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil

SPACE = """\
trainer: reward
fixed:
  learning_rate: 0.01
  max_length: 64
params:
  precision: {type: categorical, choices: [fp32, bf16-pure]}
  gradient_accumulation_steps: {type: categorical, choices: [1, 2, 4]}
"""
ARCHIVE = Path(__file__).resolve().parent / "old-store-optuna-numbers.tar.gz"
FINISHED = 3  # trial runs finished before the kill


def query(db: Path, sql: str) -> list:
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    except sqlite3.OperationalError:  # not created yet, or busy
        return []


def in_flight(db: Path) -> int | None:
    """The number of the study's RUNNING trial whose params are drawn and repeat no other trial's (a proposal that
    repeats one is about to be drawn again: not handed out)."""
    rows = query(db, "SELECT t.number, t.state, p.param_name, p.param_value FROM trials t JOIN trial_params p "
                 "ON p.trial_id = t.trial_id WHERE t.state IN ('RUNNING', 'COMPLETE')")
    params: dict[int, tuple[str, dict]] = {}
    for number, state, name, value in rows:
        params.setdefault(number, (state, {}))[1][name] = value
    running = [n for n, (state, _) in params.items() if state == "RUNNING"]
    if len(running) != 1:
        return None
    (number,) = running
    mine = params[number][1]
    if len(mine) < 2 or any(p == mine for n, (_, p) in params.items() if n != number):
        return None
    return number


def main(old: str, root: Path) -> None:
    root.mkdir(parents=True)
    (root / "space.yaml").write_text(SPACE)
    store = root / "store"
    env = {**os.environ, "PYTHONPATH": old, "OMP_NUM_THREADS": "1", "TUNER_CACHE_DIR": str(root / "cache")}
    args = [sys.executable, "-m", "tuner.cli", "search", "--search-space", "space.yaml", "--sampler", "tpe",
            "--trials", "6", "--seed", "0", "--max-steps", "4", "--confirm-seeds", "0", "--budget", "0",
            "--concurrency", "1", "--experiment", "old", "--store", "store"]
    with (root / "driver.log").open("wb") as log:
        driver = subprocess.Popen(args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    seen = None
    while True:
        if driver.poll() is not None:
            sys.exit(f"the driver exited ({driver.returncode}) first: {root / 'driver.log'}")
        done = query(store / "mlflow.db", "SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                     "WHERE t.key = 'tuner.kind' AND t.value = 'trial' AND r.status != 'RUNNING'")
        handed_out = in_flight(store / "optuna.db")
        if len(done) >= FINISHED and handed_out is not None and handed_out == seen:
            os.killpg(driver.pid, signal.SIGKILL)
            break
        seen = handed_out
        time.sleep(1)
    driver.wait()
    time.sleep(3)
    for process in psutil.process_iter():  # what is left of its session (Ray's processes): by PID
        try:
            if os.getsid(process.pid) == driver.pid:
                process.kill()
        except (ProcessLookupError, psutil.Error):
            continue
    print(query(store / "optuna.db", "SELECT number, state FROM trials ORDER BY number"))
    with tarfile.open(ARCHIVE, "w:gz") as tar:
        tar.add(root / "space.yaml", "space.yaml")
        for name in ("mlflow.db", "optuna.db", "artifacts"):
            tar.add(store / name, f"store/{name}")
    print(ARCHIVE, ARCHIVE.stat().st_size, "bytes")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
