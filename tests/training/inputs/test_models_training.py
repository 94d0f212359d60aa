"""tuner.inputs.models: the embedded tiny model, built for real (deterministic, reused, one build when several race)
and loaded with transformers (generates, a reward model's head, its tokenizer and chat template); --model resolution
that needs a build (the rest, which builds nothing, is tests/unit/inputs/test_models.py)."""

from pathlib import Path

import pytest
from helpers import at_once

from tuner.config.trainers import adapter
from tuner.config.trainers import names as trainer_names
from tuner.inputs._tiny_data import VOCABULARY
from tuner.inputs.data import builtin_dataset
from tuner.inputs.models import (
    TINY_MODEL,
    TINY_MODEL_VERSION,
    build_tiny_model,
    build_tiny_tokenizer,
    resolve_model,
    tiny_model_dir,
)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("cache") / TINY_MODEL_VERSION)


def _builtin_texts() -> list[str]:
    texts = []
    for trainer in trainer_names():
        for row in builtin_dataset(adapter(trainer), size=32):
            texts += [value for value in row.values() if isinstance(value, str)]
    return texts


def test_tiny_model_builds_deterministically(tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again")
    # Same seed, same bytes: trials on the tiny model are reproducible across machines and runs.
    assert (again / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_tiny_model_build_is_reused(tiny):
    before = (tiny / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(tiny) == tiny
    # A complete build is returned as is, not rewritten.
    assert (tiny / "model.safetensors").stat().st_mtime_ns == before


def test_concurrent_builders_leave_one_complete_build(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: F401 - transformers' lazy import of a class is
    # not thread-safe ("cannot import name 'Qwen2Config'" when run alone): done here once, before the threads

    target = tmp_path / "shared"
    assert at_once(lambda: build_tiny_model(target), 3) == [target] * 3
    # The losers' staging folders are cleaned up; only the build remains.
    assert [path.name for path in tmp_path.iterdir()] == ["shared"]


def test_tiny_model_generates(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.config.vocab_size == len(tokenizer)
    assert (model.config.pad_token_id, model.config.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    torch.manual_seed(0)
    inputs = tokenizer(["name red cat colours", "do you like the blue owl"], return_tensors="pt", padding=True)
    output = model.generate(**inputs, max_new_tokens=8, do_sample=True)
    assert output.shape[0] == 2 and output.shape[1] > inputs["input_ids"].shape[1]


def test_tiny_model_loads_as_a_reward_model(tiny):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForSequenceClassification.from_pretrained(tiny, num_labels=1)
    batch = tokenizer(["do you like the red cat yes good", "no"], return_tensors="pt", padding=True)
    # A padded batch needs config.pad_token_id to find each sequence's last token.
    assert model(**batch).logits.shape == (2, 1)


def test_saved_tokenizer_is_the_built_one_and_round_trips(tiny):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tiny)
    built = build_tiny_tokenizer()
    assert len(loaded) == len(built)
    for text in _builtin_texts() + ["Hello, World!\n\tok 42", "<|im_start|>user\nhi<|im_end|>"]:
        ids = loaded(text)["input_ids"]
        # transformers 5 rebuilds qwen2 tokenizers from vocab and merges; it must tokenize as the built one does.
        assert ids == built(text)["input_ids"], text
        assert loaded.decode(ids) == text


def test_words_after_a_space_are_single_tokens(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    for word in VOCABULARY:
        assert len(tokenizer(" " + word)["input_ids"]) == 1, word


def test_chat_template_renders_and_tokenizes(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    messages = [{"role": "user", "content": "name red colours"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nname red colours<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert tokenizer.decode(ids["input_ids"]) == text


def test_resolve_tiny_uses_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    path = resolve_model(TINY_MODEL)
    assert path == str(tmp_path / TINY_MODEL_VERSION) == str(tiny_model_dir())
    assert (Path(path) / "config.json").is_file()


def test_resolve_local_model_dir(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny.parent)
    assert resolve_model(tiny.name) == str(tiny)
    assert resolve_model(str(tiny)) == str(tiny)
