"""The base model's weights, once per node: converted to the trial's dtype once, in shared memory, mapped by every
trial on the node (each still in its own process).

    model = from_pretrained(AutoModelForCausalLM, model_path, dtype=torch.float32)   # in a trial (tuner.trial.trainer)
    release(model_path)              # this node's copies (the search removes every node's: tuner.search._release)
    sweep()                          # entries idle for hours or whose checkpoint is gone, builds whose process died

Why the weights are shared this way, with the measurements behind it: docs/architecture.md ("Shared weights").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import mmap
import os
import re
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

__all__ = ["ENV", "DIR_ENV", "IDLE_HOURS", "cache_root", "entries", "from_pretrained", "release", "shared_checkpoint",
           "sweep"]

ENV = "TUNER_SHARED_WEIGHTS"  # auto (default): share when the trial's dtype is not the checkpoint's; always; off
DIR_ENV = "TUNER_SHARED_WEIGHTS_DIR"  # where entries live (default: /dev/shm/tuner-weights-<uid>)
IDLE_HOURS = 2.0  # sweep(): an entry no trial has loaded for this long is removed
FORMAT = 2  # bump when an entry's layout changes: old entries are then never taken
MANIFEST = "tuner-weights.json"  # written last into the staging folder: an entry is whole when it is there
LAST_USED = "tuner-weights.last-used"  # its mtime: when a trial last loaded the entry
SHM_MARGIN = 256 * 2**20  # shared memory left free beside a new entry

# Element sizes, in the order of safetensors' Dtype (by alignment), by which its writer lays tensors out
_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
           "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
_RANKS = {tag: rank for rank, tag in enumerate(_DTYPES)}
_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_TAGS = {name: tag for tag, name in _FLOATS.items()}
_WEIGHTS_INDEX = "model.safetensors.index.json"
_WEIGHTS = "model.safetensors"
_NOT_COPIED = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
_SMALL_FILE = 64 * 2**20  # the source folder's other files (config, generation config, ...) up to this are copied


# -- the one call a trial makes --------------------------------------------------------------------------------------


def from_pretrained(auto_class, model_path: str, dtype, trained: bool = False, **kwargs):
    """``auto_class.from_pretrained(model_path, dtype=dtype, **kwargs)``, the weights mapped from the node's shared
    copy when there is one to build or take (see the module doc); from ``model_path`` itself otherwise or on any
    problem. The model's ``name_or_path`` is then the shared folder, so a reference model TRL loads maps it too.

    ``trained``: training writes these weights (full fine-tuning, not LoRA's frozen base). They are then the trial's
    own from the start: loaded from ``model_path`` (converting them costs less than copying mapped pages: bench/
    setup_time.py), or, when transformers maps them from a checkpoint already in the trial's dtype, copied at once in
    one kernel call per tensor instead of a fault per page on the optimizer's first writes. The shared copy is still
    built and named as ``name_or_path``, for the reference model. With TUNER_SHARED_WEIGHTS=off this is exactly
    ``auto_class.from_pretrained``."""
    import torch

    try:
        shared = shared_checkpoint(model_path, dtype, auto_class)
    except Exception as error:  # noqa: BLE001 - sharing is an optimisation: never the reason a trial fails
        _say(f"not shared ({type(error).__name__}: {error}); loading {model_path}")
        shared = None
    if shared is not None and not trained:
        generator = torch.random.get_rng_state()
        try:
            model = auto_class.from_pretrained(str(shared), dtype=dtype, **kwargs)
            if model.dtype != dtype:
                raise ValueError(f"the shared copy loaded as {model.dtype}, not {dtype}")
            return model
        except Exception as error:  # noqa: BLE001 - a damaged entry: drop it, load as before
            torch.random.set_rng_state(generator)  # the fallback draws the same new weights (a score head)
            _discard(shared, model_path, error)
            shared = None
    model = auto_class.from_pretrained(model_path, dtype=dtype, **kwargs)
    if trained and _mode() != "off":
        _copy_now(model)
    if shared is not None:  # trained: only TRL's reference model loads the shared copy, with no fallback: check it
        try:
            _check_readable(shared)
            model.config.name_or_path = model.name_or_path = str(shared)
        except Exception as error:  # noqa: BLE001
            _discard(shared, model_path, error)
    return model


def _discard(entry: Path, model_path: str, error: BaseException) -> None:
    """A shared copy that failed: removed, and not built again on this node until release() or sweep()."""
    reason = f"{type(error).__name__}: {str(error)[:200]}"
    _say(f"shared copy {entry} failed to load ({reason}); removed, loading {model_path}")
    with _locked(entry), contextlib.suppress(OSError):
        _remove_entry(entry)
        _failed_marker(entry).write_text(json.dumps({"source": str(_source_folder(model_path)), "reason": reason,
                                                     "time": time.time()}))


def shared_checkpoint(model_path: str, dtype, auto_class=None, mode: str | None = None) -> Path | None:
    """The folder of ``model_path``'s checkpoint converted to ``dtype`` in shared memory, built now if no process on
    this node has built it; None when sharing is off or would not pay (the checkpoint already is ``dtype``), or the
    checkpoint is not one this can share (raises then, with why)."""
    mode = _mode(mode)
    if mode == "off":
        return None
    root = cache_root()
    if root is None:
        return None
    source = _source_folder(model_path)
    files = _weight_files(source)
    layouts = {name: _layout(source / name)[0] for name in files}
    target = _dtype_name(dtype)
    tag = _TAGS[target]
    floats = {kind for layout in layouts.values() for kind, _ in layout.values() if kind in _FLOATS}
    if mode != "always" and floats <= {tag}:
        return None  # the checkpoint is already in this dtype: mapped from its own folder, shared by the page cache
    if any(_narrows(t, tag) for t in floats) and _keeps_fp32(source, auto_class):
        raise ValueError("the model keeps some weights in float32: a narrowed copy would not load the same")
    entry = root / _entry_name(source, files, target)
    if _failed_marker(entry).exists():
        raise ValueError(f"an earlier load of its shared copy failed on this node (see {_failed_marker(entry)})")
    if _valid(entry):
        _touch(entry)
        return entry
    with _locked(entry):
        if _valid(entry):
            _touch(entry)
            return entry
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)  # damaged: rebuilt below
        sweep(root)
        need = sum(_converted_size(layout, tag) for layout in layouts.values())
        _check_room(root, need)
        _build(source, files, tag, entry)
        _touch(entry)
    return entry


def _mode(mode: str | None = None) -> str:
    """auto, always or off (TUNER_SHARED_WEIGHTS; off also for 0, false, no)."""
    mode = (mode or os.environ.get(ENV) or "auto").strip().lower()
    return "off" if mode in ("off", "0", "false", "no") else mode


_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault every page in writable, as a write would (a private copy of each)


def _copy_now(model) -> bool:
    """Give the trial its private copy of every parameter now: MADV_POPULATE_WRITE on each tensor's pages copies the
    mapped ones in the kernel, without a fault per page (a no-op on memory that is already the process's own). False
    where the kernel cannot (pages are then copied as they are written)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    page, seen = mmap.PAGESIZE, set()
    for p in model.parameters():
        start = p.data_ptr()
        if start in seen or p.device.type != "cpu" or p.numel() == 0:
            continue
        seen.add(start)
        end = start + p.numel() * p.element_size()
        if madvise(start - start % page, end - (start - start % page), _MADV_POPULATE_WRITE) != 0:
            return False
    return True


# -- cleaning up ------------------------------------------------------------------------------------------------------


def release(model_path: str | None = None) -> int:
    """Remove this node's shared copies of ``model_path`` (every dtype; every model when None), and stale ones (see
    ``sweep``). Safe while a trial runs: what it has mapped stays valid until it exits. The search calls it at
    its end on every node (tuner.search._release). Returns the bytes freed."""
    root = cache_root()
    if root is None or not root.is_dir():
        return 0
    freed = sweep(root)
    source = None
    if model_path is not None:
        try:
            source = str(_source_folder(model_path))
        except Exception:  # noqa: BLE001 - a model that cannot be found here has no entry here either
            source = os.path.abspath(os.path.expanduser(model_path))
    for marker in root.glob(".*.failed"):
        with contextlib.suppress(OSError, ValueError):
            if source is None or json.loads(marker.read_text()).get("source") in (source, model_path):
                marker.unlink()
    for entry, manifest in entries(root):
        if source is None or manifest.get("source") in (source, model_path):
            with _locked(entry):
                freed += _remove_entry(entry)
            with contextlib.suppress(OSError):  # the search is over: no trial waits on it
                (entry.parent / f".{entry.name}.lock").unlink()
    return freed


def sweep(root: Path | None = None, idle_hours: float = IDLE_HOURS) -> int:
    """Remove entries no trial has loaded for ``idle_hours`` (a search whose driver died before ``release``), damaged
    entries, entries whose checkpoint folder is gone, staging folders of builds whose process died, and markers of
    failed loads older than ``idle_hours``. An entry being built or removed (its lock held) is left alone. Returns the
    bytes freed."""
    root = root or cache_root()
    if root is None or not root.is_dir():
        return 0
    freed, now, host = 0, time.time(), socket.gethostname()
    for path in root.iterdir():
        if path.name.startswith(".") and ".building-" in path.name:
            owner = path.name.rsplit(".building-", 1)[1].split("-")
            pid = int(owner[1]) if len(owner) > 2 and owner[1].isdigit() else None
            alive = owner[0] == _host_tag(host) and pid is not None and _alive(pid)
            if not alive and now - _mtime(path) > 60:
                freed += _rmtree(path)
        elif path.name.startswith(".") and path.name.endswith(".failed"):
            if now - _mtime(path) > idle_hours * 3600:
                with contextlib.suppress(OSError):
                    path.unlink()
        elif path.name.startswith(".") and path.name.endswith(".lock"):
            entry = root / path.name[1:-len(".lock")]
            if not entry.exists() and now - _mtime(path) > idle_hours * 3600:
                with _locked(entry, wait=False) as held, contextlib.suppress(OSError):
                    if held:  # a removed entry's lock nobody holds; a build that opens it just now copes (_build)
                        path.unlink()
        elif path.is_dir() and not path.name.startswith("."):
            if _stale(path, now, idle_hours):
                with _locked(path, wait=False) as held:
                    if held and _stale(path, now, idle_hours):
                        freed += _remove_entry(path)
    return freed


def _stale(entry: Path, now: float, idle_hours: float) -> bool:
    """Damaged, idle for ``idle_hours``, or a copy of a checkpoint that is gone (a test's temporary model)."""
    if not _valid(entry) or now - _mtime(entry / LAST_USED) > idle_hours * 3600:
        return True
    try:
        return not Path(json.loads((entry / MANIFEST).read_text())["source"]).is_dir()
    except (OSError, ValueError, KeyError, TypeError):
        return True


def entries(root: Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """The whole entries under ``root``: (folder, manifest)."""
    root = root or cache_root()
    found = []
    if root is not None and root.is_dir():
        for path in sorted(root.iterdir()):
            if path.is_dir() and not path.name.startswith(".") and _valid(path):
                with contextlib.suppress(OSError, ValueError):
                    found.append((path, json.loads((path / MANIFEST).read_text())))
    return found


def cache_root() -> Path | None:
    """Where this node's entries live: $TUNER_SHARED_WEIGHTS_DIR, else /dev/shm/tuner-weights-<uid>; None where there
    is no shared memory file system (sharing is then off)."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        root = Path(configured).expanduser()
    elif os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        root = Path("/dev/shm") / f"tuner-weights-{os.getuid()}"
    else:
        return None
    root.mkdir(parents=True, exist_ok=True)
    return root


# -- what a checkpoint is ---------------------------------------------------------------------------------------------


def _source_folder(model_path: str) -> Path:
    """The local folder holding the checkpoint: ``model_path`` itself, or a hub id's snapshot in the local cache."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path.resolve()
    from transformers.utils import cached_file

    config = cached_file(model_path, "config.json", local_files_only=True, _raise_exceptions_for_missing_entries=False)
    if config is None:
        raise FileNotFoundError(f"{model_path} is not a local folder nor in the local Hugging Face cache")
    return Path(config).parent  # a snapshot folder: links to the cached files, kept as links


def _weight_files(source: Path) -> list[str]:
    """The checkpoint's safetensors files; raises for what from_pretrained would load differently from a copy."""
    if (source / "adapter_config.json").exists():
        raise ValueError("a PEFT adapter folder")
    config = json.loads((source / "config.json").read_text())
    if config.get("quantization_config"):
        raise ValueError("a quantized model")
    if (source / _WEIGHTS_INDEX).is_file():
        index = json.loads((source / _WEIGHTS_INDEX).read_text())
        files = sorted(set(index["weight_map"].values()))
    elif (source / _WEIGHTS).is_file():
        files = [_WEIGHTS]
    else:
        raise FileNotFoundError("no safetensors weights (model.safetensors or its index)")
    for name in files:
        if not (source / name).is_file():
            raise FileNotFoundError(f"{name} is not downloaded")
    return files


def _layout(path: Path) -> tuple[dict[str, tuple[str, list[int]]], dict[str, str] | None]:
    """A safetensors file's tensors, name -> (dtype tag, shape), and its metadata: its header, read by safetensors,
    which raises unless the header is whole and describes the whole file."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {k: (s.get_dtype(), s.get_shape()) for k in f.keys() for s in (f.get_slice(k),)}, f.metadata()


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _TAGS:
        raise ValueError(f"dtype {dtype!r} is not a floating dtype to share")
    return name


def _narrows(tag: str, target: str) -> bool:
    """Whether converting a ``tag`` tensor to ``target`` can lose bits (then a module kept in fp32 would differ)."""
    import torch

    source, goal = getattr(torch, _FLOATS[tag]), getattr(torch, _FLOATS[target])
    if source == goal:
        return False
    a, b = torch.finfo(source), torch.finfo(goal)
    return not (b.bits >= a.bits and b.eps <= a.eps and b.max >= a.max)


def _keeps_fp32(source: Path, auto_class) -> bool:
    """Whether the class that will be built keeps modules in float32 (or it cannot be told)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(source))
        model_class = auto_class._model_mapping[type(config)] if auto_class is not None else None
    except Exception:  # noqa: BLE001
        return True
    if model_class is None:
        return True
    return bool(getattr(model_class, "_keep_in_fp32_modules", None)
                or getattr(model_class, "_keep_in_fp32_modules_strict", None))


def _entry_name(source: Path, files: list[str], target: str) -> str:
    """Folder name: the model, the dtype, and a digest of where it is and its files' sizes and times (a rewritten
    checkpoint gets a new entry; the old one is swept)."""
    stats = []
    for name in sorted(set(files) | {"config.json"}):
        st = (source / name).stat()
        stats.append([name, st.st_size, st.st_mtime_ns])
    digest = hashlib.sha256(json.dumps([FORMAT, str(source), target, stats]).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.name)[:40] or "model"
    return f"{slug}-{target}-{digest}"


def _converted_size(layout: dict[str, tuple[str, list[int]]], tag: str) -> int:
    return sum(math.prod(shape) * _DTYPES[tag if kind in _FLOATS else kind] for kind, shape in layout.values())


# -- building an entry ------------------------------------------------------------------------------------------------


def _build(source: Path, files: list[str], tag: str, entry: Path) -> None:
    """Write the converted checkpoint into a staging folder beside ``entry``, then rename it into place."""
    owner = f"{_host_tag(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = entry.parent / f".{entry.name}.building-{owner}"
    staging.mkdir()
    try:
        for name in files:
            _convert_file(source / name, staging / name, tag)
        for path in source.iterdir():  # config.json, generation_config.json, the index, ...
            if path.name in files or path.name.endswith(_NOT_COPIED) or not path.is_file():
                continue
            if path.stat().st_size <= _SMALL_FILE:
                shutil.copyfile(path, staging / path.name)
        manifest = {"format": FORMAT, "source": str(source), "dtype": _FLOATS[tag], "created": time.time(),
                    "host": socket.gethostname(), "pid": os.getpid(),
                    "files": {name: (staging / name).stat().st_size for name in files}}
        (staging / LAST_USED).touch()
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(staging, entry)
        except OSError:
            if not _valid(entry):  # another whole build won the race (its lock file was removed under us): take it
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _convert_file(src: Path, dst: Path, tag: str) -> None:
    """``src`` (safetensors) with every floating tensor cast to ``tag``'s dtype, one tensor at a time: read with
    safetensors, written here (see the module doc). Laid out as safetensors' writer lays a file out: tensors ordered
    by dtype, the widest first (so each is aligned to its element size), then by name; the header padded with spaces
    to 8 bytes."""
    import torch
    from safetensors import safe_open

    layout, metadata = _layout(src)
    out_tag = {k: tag if kind in _FLOATS else kind for k, (kind, _) in layout.items()}
    names = sorted(layout, key=lambda k: (-_RANKS[out_tag[k]], k))
    # its metadata sorted: safetensors keeps it in a hash map, in no set order
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for k in names:
        size = math.prod(layout[k][1]) * _DTYPES[out_tag[k]]
        header[k] = {"dtype": out_tag[k], "shape": layout[k][1], "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # data starts 8-byte aligned
    start = 8 + len(encoded)
    with safe_open(src, framework="pt") as f, dst.open("w+b") as f_out:
        f_out.truncate(start + offset)
        # Each tensor is cast straight from the checkpoint's mapping (safetensors maps it, MAP_PRIVATE) into the new
        # file's: no copy in between.
        with mmap.mmap(f_out.fileno(), start + offset) as out:
            out[:8] = len(encoded).to_bytes(8, "little")
            out[8:start] = encoded
            for k in names:
                begin, end = header[k]["data_offsets"]
                if end == begin:
                    continue  # an empty tensor: nothing to write
                source = f.get_tensor(k)
                target = torch.frombuffer(out, dtype=torch.uint8, count=end - begin, offset=start + begin)
                # torch's own cast, the one from_pretrained applies; a plain copy where the dtype stays
                target = target.view(getattr(torch, _FLOATS[tag]) if layout[k][0] in _FLOATS else source.dtype)
                target.copy_(source.reshape(-1))
                del source, target  # the mapping closes only when no tensor points into it


def _check_room(root: Path, need: int) -> None:
    """Refuse (raise) an entry that would not fit in shared memory, or in the memory left on the node."""
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    if need + SHM_MARGIN > free:
        raise OSError(f"{need / 2**30:.1f} GiB do not fit in {root} ({free / 2**30:.1f} GiB free)")
    available = _mem_available()
    if available is not None and need + SHM_MARGIN > available:
        raise OSError(f"{need / 2**30:.1f} GiB do not fit in the node's available memory ({available / 2**30:.1f} GiB)")


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# -- entries on disk --------------------------------------------------------------------------------------------------


def _valid(entry: Path) -> bool:
    """A whole entry: its manifest is there and every weight file has the size it was written with."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        return manifest.get("format") == FORMAT and all(
            (entry / name).stat().st_size == size for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return False


def _check_readable(entry: Path) -> None:
    """Raise unless safetensors reads every weight file's header and its tensors end where the file does."""
    manifest = json.loads((entry / MANIFEST).read_text())
    for name in manifest["files"]:
        _layout(entry / name)


@contextlib.contextmanager
def _locked(entry: Path, wait: bool = True) -> Iterator[bool]:
    """Hold ``entry``'s build lock (a file beside it; the kernel drops it if the holder dies). Yields False when
    ``wait`` is False and another process holds it."""
    lock = entry.parent / f".{entry.name}.lock"
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _failed_marker(entry: Path) -> Path:
    return entry.parent / f".{entry.name}.failed"


def _remove_entry(entry: Path) -> int:
    """Remove a whole or damaged entry; its lock file stays (a process may be waiting on it)."""
    return _rmtree(entry)


def _rmtree(path: Path) -> int:
    size = 0
    for file in path.rglob("*") if path.is_dir() else ():
        with contextlib.suppress(OSError):
            if file.is_file() and not file.is_symlink():
                size += file.stat().st_size
    shutil.rmtree(path, ignore_errors=True)
    return size


def _touch(entry: Path) -> None:
    with contextlib.suppress(OSError):
        (entry / LAST_USED).touch()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _host_tag(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "", host)[:24] or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _say(message: str) -> None:
    print(f"tuner.trial.weights: {message}", file=sys.stderr, flush=True)
