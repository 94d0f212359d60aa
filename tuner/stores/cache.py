"""Where tuner keeps what it builds once per machine (the tiny models, the empty MLflow store):
$TUNER_CACHE_DIR, default ~/.cache/tuner; and how a folder there is built once."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from tuner.errors import TunerError


def cache_dir() -> Path:
    return Path(os.environ.get("TUNER_CACHE_DIR") or Path.home() / ".cache" / "tuner").expanduser()


def build_folder_once(path: str | os.PathLike, marker: str, version: str, write: Callable[[Path], None],
                      what: str) -> Path:
    """Write the folder ``path`` with ``write(folder)`` unless a complete build is there; return ``path``.

    A build is complete when it holds the file ``marker`` (written last, holding ``version``). Safe across
    processes: each builds in its own temporary folder beside ``path`` and renames it into place (atomic); a
    builder that loses the race discards its copy. An empty folder at ``path`` is replaced; anything else there
    is refused, naming ``what`` was to be built ("tiny-model build").
    """
    path = Path(path).expanduser().absolute()
    if (path / marker).is_file():
        return path
    if path.exists():
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()  # an empty folder (e.g. made by a caller) is replaced by the build
        elif (path / marker).is_file():
            return path  # another process finished its build between the two checks
        else:
            raise TunerError(f"{path} exists but is not a complete {what} (no {marker}); "
                             "remove it or choose another folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        write(staging)
        (staging / marker).write_text(version + "\n")
        try:
            os.rename(staging, path)  # atomic; fails if another process already put a build there
        except OSError:
            if not (path / marker).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


@contextlib.contextmanager
def build_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the build lock of ``path`` (a file ``.<name>.lock`` beside it; the kernel drops it if the holder
    dies), for builds that take minutes: processes that need the same build at once wait for one builder
    instead of each building a copy."""
    import fcntl

    path = Path(path).expanduser().absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
