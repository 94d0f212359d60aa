"""A search whose trials span 2 processes (--processes-per-trial 2: gloo ranks on this CPU, the code path GPU
trials take): verdicts, MLflow, the export with its accelerate config and the trl command that launches it, and a
killed driver leaving no rank behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import expected_exit_code, kill_session, preference_rows, rank_processes, wait_for

from tuner import cli

pytestmark = pytest.mark.slow

# The tiny reward model learns in 20 fp32 steps at these rates (the anchor grid's fp32 cell), here with 2 ranks.
SPACE = {"trainer": "reward", "fixed": {"precision": "fp32", "use_peft": False, "per_device_train_batch_size": 8,
                                       "max_length": 64},
         "params": {"learning_rate": {"type": "categorical", "choices": [1e-3, 2e-3]}}}


def test_a_two_process_search_judges_records_and_exports_a_launchable_config(tmp_path, tiny_model, monkeypatch):
    from tuner.stores import mlflow_store, run_reader

    rows = preference_rows(96)
    (tmp_path / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["search", "--search-space", "space.yaml", "--dataset", "prefs.jsonl", "--sampler", "grid",
                     "--max-steps", "20", "--confirm-seeds", "0", "--processes-per-trial", "2",
                     "--experiment", "ranks", "-o", "recommended.yaml"])
    run, search = run_reader.load_search(mlflow_store.default_tracking_uri(Path("mlflow")), "ranks")
    records = search["trials"]
    assert code == 0 and search["recommended"] is not None, records
    assert sorted(r["params"]["learning_rate"] for r in records) == [1e-3, 2e-3]
    assert {r["status"] for r in records} == {"ok"} and all(r["learned"] for r in records), records
    assert search["plan"]["ranks"] == 2 and search["plan"]["cpus_per_trial"] == 2
    # Each trial's MLflow run has every step (rank 0's rows, averaged over both ranks by Trainer).
    client = mlflow_store.client(mlflow_store.default_tracking_uri(Path("mlflow")))
    trials = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert len(trials) == 2
    for trial in trials:
        assert [m.step for m in client.get_metric_history(trial.info.run_id, "loss")] == list(range(1, 21))

    # The export: the TRL file, its accelerate config beside it, and the command that launches them together.
    launch = yaml.safe_load((tmp_path / "recommended.accelerate.yaml").read_text())
    assert (launch["num_processes"], launch["distributed_type"]) == (2, "MULTI_GPU")
    text = (tmp_path / "recommended.yaml").read_text()
    command = next(line for line in text.splitlines() if line.startswith("# Run: "))
    assert command == ("# Run: trl reward --config THIS_FILE --accelerate_config recommended.accelerate.yaml "
                       "--dataset_name YOUR_DATASET")
    # ... which trains, with 2 CPU processes: the command as written, with a dataset, 2 steps and --use_cpu.
    (tmp_path / "prefs_data").mkdir()
    (tmp_path / "prefs_data" / "train.jsonl").write_text((tmp_path / "prefs.jsonl").read_text())
    args = command.removeprefix("# Run: ").replace("THIS_FILE", "recommended.yaml").replace(
        "YOUR_DATASET", "./prefs_data").split()
    trl = Path(sys.executable).with_name("trl")
    log = tmp_path / "trl.log"
    with log.open("wb") as out:
        job = subprocess.Popen([str(trl), *args[1:], "--max_steps", "2", "--use_cpu", "true", "--output_dir", "out",
                                "--save_strategy", "no"], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    # Done when training has ended and the model is saved: TRL's script then tears the 2-process job down, which
    # once hung here in a gloo barrier after the model was written (TRL's end, not the training): not waited for.
    try:
        wait_for(lambda: job.poll() is not None or (tmp_path / "out" / "model.safetensors").exists()
                 and "'train_runtime'" in log.read_text(errors="replace"), "trl to train 2 steps", timeout=600)
        assert job.poll() in (None, 0), log.read_text(errors="replace")[-3000:]
    finally:
        kill_session(job.pid)
        for entry in Path("/proc").iterdir():  # its ranks run in sessions of their own (torch's launcher)
            with contextlib.suppress(OSError, ValueError):
                if entry.name.isdigit() and int(entry.name) != os.getpid() and Path(os.readlink(entry / "cwd")) == tmp_path:
                    os.kill(int(entry.name), signal.SIGKILL)
    text = log.read_text(errors="replace")
    # Two processes trained: each loaded the model (one process prints this once).
    assert text.count("Loading weights") >= 2, text[-3000:]
    assert "'train_runtime'" in text


def _marked_ranks(mark: str) -> list[int]:
    return rank_processes(mark.encode(), where="environ")


def test_a_killed_driver_leaves_no_rank_running_and_the_search_resumes_with_its_ranks(tmp_path, tiny_model,
                                                                                      spawn):
    mark = f"ranks-{uuid.uuid4().hex}"
    tuner = str(Path(sys.executable).with_name("tuner"))
    store = tmp_path / "mlflow"
    # every step slow: the trial's ranks are mid-training when the driver dies. One trial: the one cut short is what
    # the resume must run again with its ranks (trials never started running on resume: test_reliability.py).
    search = spawn.start([tuner, "search", "--trainer", "sft", "--trials", "1", "--max-steps", "20", "--confirm-seeds",
                          "0", "--budget", "0", "--processes-per-trial", "2", "--store", str(store), "--experiment",
                          "killed"], "search", env={"TUNER_FAULT": "slow@1", "TUNER_TEST_MARK": mark})
    ranks = wait_for(lambda: len(_marked_ranks(mark)) >= 2 and _marked_ranks(mark), "2 ranks training",
                     process=search)
    os.kill(search.pid, signal.SIGKILL)  # the driver only: its launcher, trial and ranks must follow by themselves
    search.wait(30)
    wait_for(lambda: not _marked_ranks(mark), "every rank to end", timeout=60)
    assert not any(Path(f"/proc/{pid}").exists() and pid in _marked_ranks(mark) for pid in ranks)
    kill_session(search.pid)

    # Resumed (at full speed), the search's trials are still 2-rank jobs: the trial cut short is run again as one.
    code, out = spawn.run([tuner, "search", "--resume", "killed", "--store", str(store)], "resume")
    from tuner.stores import mlflow_store, run_reader

    _, summary = run_reader.load_search(mlflow_store.default_tracking_uri(store), "killed")
    assert code == expected_exit_code(summary), out[-4000:]
    assert summary["plan"]["ranks"] == 2, summary["plan"]
    (rerun,) = summary["trials"]
    assert rerun["number"] != 0  # the one cut short (trial 0) re-run under a number of its own
    assert rerun["status"] == "ok", rerun
