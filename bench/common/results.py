"""bench/RESULTS.md's writer, shared by every kind of bench: the machine and the versions a run records, the load
average beside them, a section put into RESULTS.md in place of its last version, and the table helpers the
sections share. Each run writes its own section (or, for ``python -m bench``, its own sections) through
``replace_section``; nothing here knows which sections there are.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
RESULTS = BENCH / "RESULTS.md"
RECORDED = BENCH / "recorded"  # the data files the runs write, and tests read (tests/conftest.py)
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "ray", "optuna", "mlflow")

# bench's modules and shell scripts by kind (bench/<kind>/<name>.py or .sh). Runs recorded before bench became a
# package of its kinds keep the commands they ran (``python -m bench.horizon``, ``bash bench/gpu_run.sh``,
# ``--output bench/horizon-seed17.json.gz``) and the notes that name its old paths; a section that shows them shows
# them through ``today``, as they run now.
KINDS = {
    "headline": ("run", "headline", "anchor_asha", "tuner_search", "reference", "efficiency", "lookup_targets",
                 "report", "history"),
    "studies": ("warm_start", "slots", "setup_time", "real_model", "smollm2", "distributed", "default_search",
                "tiny_pretrained", "shapes"),
    "horizon": ("horizon", "horizon_fit", "horizon_picks", "anchor", "horizon_run"),
    "gpu": ("gpu", "gpu_run", "gpu_env", "gpu_carry", "gpu_horizon"),
}
_KIND = {name: kind for kind, names in KINDS.items() for name in names}


# -- the machine and the versions -----------------------------------------------------------------


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    memory = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA install means no usable GPU here
        gpu = None
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "platform": platform.platform(),
            "python": platform.python_version(), "cpu": cpu, "cpus": os.cpu_count(), "memory": memory, "gpu": gpu,
            "load_before": load_average()}


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["tuner"] = _git_revision()
    return found


def _git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "tuner"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes in tuner/' if dirty else ''}" if head else "unknown"


def today(text: str | None) -> str | None:
    """Recorded text (a run's command, a note) as it reads today: ``python -m bench.X`` as ``python -m
    bench.<kind>.X`` (and ``bench.X.name`` as ``bench.<kind>.X.name``), ``bench/X.sh`` (or ``.py``) as
    ``bench/<kind>/X.sh``, a data file ``bench/X.json(.gz)`` as ``bench/recorded/X.json(.gz)``. Text recorded since
    is left as it is, and so is a path elsewhere (``/tmp/bench/x.json``)."""
    if text is None:
        return None
    text = re.sub(r"(?<![\w/.-])bench\.(\w+)(\.\w+)?", _module_today, text)
    text = re.sub(r"(?<![\w/.-])bench/(\w+)\.(py|sh)\b",
                  lambda m: f"bench/{_KIND[m[1]]}/{m[1]}.{m[2]}" if m[1] in _KIND else m[0], text)
    return re.sub(r"(?<![\w/.-])bench/([\w.*{},-]+\.json(?:\.gz)?)\b", r"bench/recorded/\1", text)


def _module_today(m: re.Match[str]) -> str:
    name, rest = m[1], m[2] or ""
    if name in KINDS and rest[1:] in KINDS[name] or name not in _KIND:
        return m[0]  # bench.<kind>.<module> already, or no module of bench's (bench.common)
    return f"bench.{_KIND[name]}.{name}{rest}"


def read_recorded(path: Path) -> dict[str, Any] | None:
    """A recorded run's JSON, or None when no run wrote it (or it does not parse)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# -- RESULTS.md ------------------------------------------------------------------------------------


def replace_section(path: Path, title: str, lines: list[str]) -> None:
    """Put a section (``title``, then ``lines``) into a Markdown file in place of its last version, or at its end:
    the runs that are not part of ``python -m bench`` (bench.gpu.gpu, bench.horizon.horizon,
    bench.studies.warm_start) write their own section. A ``### `` subsection of the old version that ``lines`` do
    not write (another run's: bench.horizon.horizon_picks' in bench.horizon.horizon's section) is kept at the
    section's end."""
    text = path.read_text() if path.exists() else ""
    new = "\n".join([title, "", *lines]) + "\n"
    if title in text:
        before, _, after = text.partition(title)
        rest = after.split("\n## ", 1)
        kept = [part for part in rest[0].split("\n### ")[1:] if "### " + part.splitlines()[0] not in lines]
        new += "".join("\n### " + part.rstrip("\n") + "\n" for part in kept)
        text = before + new + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + new
    path.write_text(text)


# -- table helpers ---------------------------------------------------------------------------------


def fmt(value, spec: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    if isinstance(value, float) and math.isinf(value):
        return "never"
    return format(value, spec)


def met(ok: bool | None) -> str:
    """A target's verdict as the Targets table reads it."""
    return "not measured" if ok is None else ("**met**" if ok else "**not met**")
