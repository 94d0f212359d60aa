"""Where tuner keeps what it builds once per machine (the tiny model, the empty MLflow store):
$TUNER_CACHE_DIR, default ~/.cache/tuner."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TUNER_CACHE_DIR") or Path.home() / ".cache" / "tuner").expanduser()
