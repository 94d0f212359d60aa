"""What tuner submit sends and what tuner jobs reads, without a cluster: the search's command line (the options
typed, parsed back by tuner search's own parser), the folder that travels, the cluster's address, a search's
progress read from the lines tuner.report.progress writes, and the share of a cluster a search holds."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tuner import cli
from tuner.config.options import SearchOptions, option_fields
from tuner.errors import TunerError
from tuner.jobs import cluster, listing, send
from tuner.records import Status
from tuner.report.progress import Progress
from tuner.search import _placement as placement
from tuner.trial.memory import GiB


def given_by(*argv: str) -> dict:
    args = cli.build_parser().parse_args(["submit", *argv])
    return {f.name: getattr(args, f.name) for f in option_fields() if hasattr(args, f.name)}


def test_only_the_typed_options_travel_and_tuner_search_parses_them_back_to_the_same_values(monkeypatch):
    monkeypatch.setenv("TUNER_STORE", "/my/laptop/store")  # the submitter's own default must not travel
    argv = ["--trainer", "dpo", "--trials", "40", "--max-steps", "30", "--no-prune", "--reward-func", "a:f",
            "--reward-func", "b:g", "--cluster-share", "0.25", "--experiment", "team run", "--budget", "0"]
    given = given_by(*argv)
    assert set(given) == {"trainer", "trials", "max_steps", "prune", "reward_funcs", "cluster_share", "experiment",
                          "budget"}
    words = send.search_words(given)
    back = cli.build_parser().parse_args(["search", *shlex.split(shlex.join(words))])
    for name, value in given.items():
        assert getattr(back, name) == value, name
    assert back.store == "/my/laptop/store"  # parsed here from this environment; on the cluster, the cluster's
    assert "--store" not in words


def test_the_experiment_is_the_jobs_own_and_half_the_cluster_unless_asked():
    assert send._experiment({}, "tuner-alice-3f9a2c") == "grpo-tiny-alice-3f9a2c"
    assert send._experiment({"trainer": "dpo", "model": "Qwen/Qwen2.5-0.5B"}, "tuner-bob-1") == \
        "dpo-Qwen2.5-0.5B-bob-1"
    assert send._experiment({"from_config": "my.yaml"}, "tuner-c-2") == "c-2"  # its trainer is the file's
    assert send._experiment({"experiment": "mine"}, "tuner-c-2") == "mine"


def test_the_folder_leaves_its_store_version_control_and_environments_behind(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n" * 100)
    for folder in ("mlflow", ".git", ".venv", "sub/__pycache__"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "big").write_bytes(b"x" * 10_000)
    found = send.working_folder(tmp_path, None)
    assert found.size == 300 and [name for _, name in found.largest] == ["data.jsonl"]
    assert "/mlflow/" in found.excludes and ".git/" in found.excludes and ".venv/" in found.excludes
    found = send.working_folder(tmp_path, "runs/store")
    assert "/runs/store/" in found.excludes and found.size == 10_300  # mlflow/ is just a folder now


SECRETS = [".env", ".env.local", "deploy/server.pem", "deploy/tls.key", ".netrc", ".git-credentials",
           ".ssh/id_ed25519", ".ray/auth_token", ".mlflow/credentials", "sub/.env"]
KEPT = ["prefs.jsonl", "my_rewards.py", "space.yaml", "notes/env.md", "keys.txt"]


def uploaded(folder: send.Folder, tmp_path) -> set[str]:
    """The files Ray's own packaging puts in the job's zip for ``folder`` (its excludes applied as Ray applies them)."""
    import zipfile

    from ray._private.runtime_env.packaging import create_package

    target = tmp_path / f"upload-{len(list(tmp_path.glob('upload-*.zip')))}.zip"  # Ray keeps a package it finds
    create_package(str(folder.root), target, include_gitignore=True, excludes=folder.excludes)
    return {name for name in zipfile.ZipFile(target).namelist() if not name.endswith("/")}


def test_what_looks_like_a_secret_stays_home_and_the_submit_says_so(tmp_path):
    root = tmp_path / "work"
    for name in SECRETS + KEPT:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("s3cr3t-value\n" if name in SECRETS else "data\n")
    found = send.working_folder(root, None)
    assert sorted(found.secrets) == sorted(SECRETS)
    assert uploaded(found, tmp_path) == set(KEPT)  # Ray's packaging leaves them out, not only tuner's count
    assert found.size == sum(len("data\n") for _ in KEPT)
    line = found.secrets_line()
    assert line is not None and sum(f" {name}," in line or f" {name} " in line for name in SECRETS) == 8
    assert "and 2 more" in line
    assert "--include PATH" in line and "s3cr3t" not in line
    sent = send.Submitted("tuner-a-1", "e", "tuner search", "http://h:8265", found)
    assert line in sent.lines()
    # --include sends one on purpose; nothing else changes
    found = send.working_folder(root, None, include=["deploy/tls.key"])
    assert "deploy/tls.key" not in found.secrets and uploaded(found, tmp_path) == {*KEPT, "deploy/tls.key"}
    assert send.working_folder(root / "deploy", None).secrets == ["server.pem", "tls.key"]
    assert send.working_folder(root, None, include=[]).secrets_line() is not None
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "prefs.jsonl").write_text("{}\n")
    assert send.working_folder(tmp_path / "clean", None).secrets_line() is None


def test_an_include_that_is_no_file_here_is_one_line(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    for path in ("missing.key", "../outside.key"):
        with pytest.raises(TunerError) as e:
            send.working_folder(tmp_path, None, include=[path])
        assert str(e.value).startswith(f"--include {path}: no such file in ") and "\n" not in str(e.value)


def test_files_named_must_be_in_the_folder(tmp_path):
    (tmp_path / "space.yaml").write_text("trainer: sft\n")
    send.check_given({"search_space": "space.yaml", "dataset": "trl-lib/ultrafeedback"}, tmp_path)  # hub id
    send.check_given({"dataset": "/shared/data/prefs.jsonl"}, tmp_path)  # a path every node reads
    with pytest.raises(TunerError, match=r"--from missing.yaml: no such file in"):
        send.check_given({"from_config": "missing.yaml"}, tmp_path)
    with pytest.raises(TunerError, match=r"--dataset prefs.jsonl: no such file in"):
        send.check_given({"dataset": "prefs.jsonl"}, tmp_path)
    (tmp_path.parent / "outside.yaml").write_text("x: 1\n")
    with pytest.raises(TunerError, match="outside this folder"):
        send.check_given({"search_space": "../outside.yaml"}, tmp_path)


@pytest.mark.parametrize("given, url", [("10.0.0.1", "http://10.0.0.1:8265"), ("http://head:9000/", "http://head:9000"),
                                        ("https://ray.example.com:443", "https://ray.example.com:443")])
def test_the_cluster_address(given, url):
    assert cluster.address(given) == url


@pytest.mark.parametrize("given", ["ftp://head:8265", "http://:8265", "http://head:99999"])
def test_a_bad_cluster_address_is_one_line(given):
    with pytest.raises(TunerError, match="--cluster"):
        cluster.address(given)


def test_progress_is_read_from_the_lines_the_search_writes():
    lines: list[str] = []
    progress = Progress(12, lines.append, tty=False)
    record = {"number": 4, "status": Status.OK, "params": {"learning_rate": 1e-3}, "seed": 0,
              "tokens_per_second": 1234.0, "progress": 0.5, "learned": True, "learning_p": 0.001}
    progress.finished({"number": 1, "status": Status.DIVERGED, "params": {}, "seed": 0})
    assert listing.progress_of("\n".join(lines)) == ("1/12", "none yet", None)
    progress.finished(record)
    log = "\n".join([*lines, "tuner: exit code 0"])
    done, best, code = listing.progress_of(log)
    assert done == "2/12" and code == 0
    assert best == "trial 4 (1234 tok/s, progress +0.500)"


# -- a search's share of a shared cluster ----------------------------------------------------------------------


def planned(device: str, gpu: float, cpu: float, concurrency: int, ranks: int = 1) -> placement.Placement:
    return placement.Placement(device=device, plan=None, resources={"cpu": cpu, "gpu": gpu},  # type: ignore[arg-type]
                               concurrency=concurrency, budget_bytes=GiB, estimate_of=lambda p: None, ranks=ranks)


EIGHT_GPUS = placement.Cluster(gpus=8, gpu_memory_bytes=80 * GiB, host_memory_bytes=1024 * GiB, cpus=64)
FOUR_CPUS = placement.Cluster(gpus=0, gpu_memory_bytes=0, host_memory_bytes=24 * GiB, cpus=4)


def test_the_share_caps_the_trials_at_once_and_says_so():
    # a quarter GPU per trial: 32 fit the cluster; half the cluster is 16, --max-gpus 3 is 12
    assert placement.share_cap(planned("cuda", 0.25, 1, 32), EIGHT_GPUS, cluster_share=None, max_gpus=None) == (32, None)
    count, note = placement.share_cap(planned("cuda", 0.25, 1, 32), EIGHT_GPUS, cluster_share=0.5, max_gpus=None)
    assert count == 16 and note == "16 trials at a time (--cluster-share 0.5: 4 of the cluster's 8 GPUs)"
    count, note = placement.share_cap(planned("cuda", 0.25, 1, 32), EIGHT_GPUS, cluster_share=0.5, max_gpus=3)
    assert count == 12 and "--cluster-share 0.5 and --max-gpus 3: 3 of the cluster's 8 GPUs" in note
    # whole GPUs per trial (4 ranks): one trial even where the share is smaller than a trial
    assert placement.share_cap(planned("cuda", 4, 1, 2, ranks=4), EIGHT_GPUS, cluster_share=None, max_gpus=2)[0] == 1
    # CPU trials: the share of the CPUs
    assert placement.share_cap(planned("cpu", 0, 1, 4), FOUR_CPUS, cluster_share=0.5, max_gpus=None)[0] == 2
    # a share above what fits changes nothing
    assert placement.share_cap(planned("cpu", 0, 1, 1), FOUR_CPUS, cluster_share=0.5, max_gpus=None) == (1, None)


def test_share_options_are_checked():
    from tuner.config.options import check_options

    with pytest.raises(TunerError, match=r"--cluster-share 1.5: must be above 0 and at most 1"):
        check_options(SearchOptions(cluster_share=1.5))
    with pytest.raises(TunerError, match=r"--max-gpus 0: must be positive"):
        check_options(SearchOptions(max_gpus=0))


def test_a_head_node_without_tuner_on_its_path_says_so_in_one_line(tmp_path):
    """The job's entrypoint as Ray's job supervisor runs it (a shell): with tuner on the PATH it runs tuner search
    itself; without, it writes send.NO_TUNER_LINE and exits 127 instead of the shell's bare 'tuner: not found'."""
    import subprocess
    import sys

    shown, runs = send.entrypoint(["--help"])
    assert shown == "tuner search --ray-address auto --help" and runs.endswith(f"exec {shown}")
    tuner_bin = Path(sys.executable).parent
    if not (tuner_bin / "tuner").exists():
        pytest.skip("the tuner command is not installed beside this Python")
    has = subprocess.run(["/bin/sh", "-c", runs], capture_output=True, text=True, timeout=120,
                         env={"PATH": f"{tuner_bin}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert has.returncode == 0 and "--ray-address" in has.stdout, has.stderr[-500:]
    lacks = subprocess.run(["/bin/sh", "-c", runs], capture_output=True, text=True, timeout=60,
                           env={"PATH": str(tmp_path), "HOME": str(tmp_path)})  # a folder without tuner (nor sh's tools)
    assert lacks.returncode == send.NO_TUNER_EXIT == 127
    assert lacks.stderr.strip() == send.NO_TUNER_LINE and lacks.stdout == ""
