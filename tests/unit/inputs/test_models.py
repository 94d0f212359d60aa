"""tuner.inputs.models: --model resolution (paths, aliases, the Hugging Face cache offline) and a build folder that is
not a build, refused; the embedded tiny model built for real and loaded with transformers is
tests/training/inputs/test_models_training.py."""

import time

import pytest

from tuner.errors import TunerError
from tuner.inputs.models import ALIASES, build_tiny_model, looks_like_path, resolve_model


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    # The user's own Hugging Face cache may hold the models named here; tests must not depend on it.
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_build_refuses_a_folder_that_is_not_a_build(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(TunerError, match="not a complete tiny-model build"):
        build_tiny_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _one_line_error(spec, **kwargs) -> str:
    with pytest.raises(TunerError) as caught:
        resolve_model(spec, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_resolve_directory_without_config(tmp_path):
    message = _one_line_error(str(tmp_path))
    assert f"{tmp_path} is a directory but not a model: no config.json" in message


def test_resolve_missing_path():
    assert "does not exist" in _one_line_error("./no/such/model")
    assert "does not exist" in _one_line_error("~/no-such-model-dir-for-tuner")
    assert "does not exist" in _one_line_error("/no/such/model")


def test_resolve_unreachable_hub_id_offline(empty_hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    message = _one_line_error("Qwen2.5-0.5B")
    assert time.monotonic() - started < 5
    # The alias is named as typed, and the fix names the hub id to download.
    assert "model 'Qwen2.5-0.5B' is neither a local directory nor reachable on the Hugging Face Hub" in message
    assert "hf download Qwen/Qwen2.5-0.5B" in message
    assert "--model tiny" in message


def test_resolve_cached_hub_id_offline(empty_hub_cache, monkeypatch):
    # The layout huggingface_hub writes: a ref pointing at a snapshot holding config.json.
    repo = empty_hub_cache / "models--org--cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("org/cached-model") == "org/cached-model"


def test_resolve_rejects_malformed_names():
    assert "not a local directory, an alias" in _one_line_error("bad name!")
    assert "--model is empty" in _one_line_error("  ")


def test_aliases_are_hub_ids():
    assert ALIASES["Qwen2.5-0.5B"] == "Qwen/Qwen2.5-0.5B"
    assert all(hub_id.count("/") == 1 for hub_id in ALIASES.values())


@pytest.mark.parametrize(
    ("spec", "is_path"),
    [
        ("./model", True),
        ("../model", True),
        ("/abs/model", True),
        ("~/model", True),
        ("runs/a/b", True),
        ("Qwen/Qwen2.5-0.5B", False),
        ("gpt2", False),
        ("tiny", False),
    ],
)
def test_looks_like_path(spec, is_path):
    assert looks_like_path(spec) is is_path
