"""tuner.inputs._tiny_pretrained: the tiny pretrained model (--model tiny-pretrained), built for real.

The full build takes minutes, so the fast tests build a short one (SHORT_STEPS steps: the same code, the same
files, under the target) and put it where the alias looks; only the slow test builds the real model.
"""

import json

import pytest

from tuner.config.trainers import adapter
from tuner.inputs._tiny_pretrained import (
    HEDGED_ANSWER,
    RECORD,
    TINY_PRETRAINED_VERSION,
    VERBOSE_ANSWER,
    build_tiny_pretrained,
    build_tokenizer,
    rescale,
    start_estimates,
)
from tuner.inputs.models import TINY_MODEL, TINY_PRETRAINED_MODEL, is_tiny, resolve_model
from tuner.inputs.tasks import grpo_rows, sft_rows

SHORT_STEPS = 20  # shrunk for speed: a build of 20 steps takes about a second, the real one minutes


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder holding a short build where the alias looks for the model."""
    folder = tmp_path_factory.mktemp("cache")
    build_tiny_pretrained(folder / TINY_PRETRAINED_VERSION, max_steps=SHORT_STEPS)
    return folder


def test_builds_are_deterministic_and_leave_torch_as_they_found_it(cache, tmp_path):
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    random_state = torch.random.get_rng_state()
    again = build_tiny_pretrained(tmp_path / "again", max_steps=SHORT_STEPS)
    first = cache / TINY_PRETRAINED_VERSION
    # Seeded weights, data and batch order, pinned threads: the same steps give the same bytes.
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes(), name
    # The build pins threads, deterministic mode and the seed for itself only.
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (threads, deterministic)
    assert torch.equal(torch.random.get_rng_state(), random_state)
    record = json.loads((again / RECORD).read_text())
    assert record["steps"] == SHORT_STEPS and record["version"] == TINY_PRETRAINED_VERSION
    assert 0.0 <= record["start_reward"] <= 1.0 and 0.0 <= record["groups_with_spread"] <= 1.0


def test_concurrent_builders_wait_for_one_build(tmp_path):
    from test_models import at_once

    target = tmp_path / "shared"
    assert at_once(lambda: build_tiny_pretrained(target, max_steps=SHORT_STEPS), 2) == [target] * 2
    # One build and its lock file; no staging folder is left behind.
    assert sorted(path.name for path in tmp_path.iterdir()) == [".shared.lock", "shared"]


def test_the_alias_resolves_to_the_cached_build_and_is_not_tiny(cache, monkeypatch):
    build = cache / TINY_PRETRAINED_VERSION
    before = (build / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))
    assert resolve_model(TINY_PRETRAINED_MODEL) == str(build)
    assert resolve_model(TINY_PRETRAINED_MODEL, cache_dir=cache) == str(build)
    # A complete build is reused, not rebuilt.
    assert (build / "model.safetensors").stat().st_mtime_ns == before
    # It counts as pretrained: the built-in data and reward of tuner.inputs.tasks, not the tiny model's own task.
    assert not is_tiny(build) and not is_tiny(TINY_PRETRAINED_MODEL)


def test_a_search_on_it_takes_the_pretrained_path(cache, tmp_path, monkeypatch):
    from tuner.config.space import load_space
    from tuner.inputs.rewards import reward_func_spec
    from tuner.inputs.tasks import exact_answer_reward
    from tuner.search import driver as search

    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))
    prepared = search.prepare(search.options_from(model=TINY_PRETRAINED_MODEL, store=str(tmp_path / "mlflow")))
    shipped = load_space(None, "grpo")
    # The shipped space's pretrained: learning rates, and tuner.inputs.tasks' exact-answer reward for its questions.
    assert prepared.space.params["learning_rate"] == shipped.pretrained["learning_rate"]
    assert prepared.options.reward_funcs == [reward_func_spec(exact_answer_reward)]
    assert prepared.experiment == "grpo-tiny-pretrained"
    tiny = search.prepare(search.options_from(model=TINY_MODEL, store=str(tmp_path / "mlflow")))
    assert tiny.space.params["learning_rate"] == shipped.params["learning_rate"]


def test_rescaling_keeps_every_output_and_reaches_a_real_models_scale(cache, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cache / TINY_PRETRAINED_VERSION).eval()
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(25.0)  # as large as pretraining leaves it
        before = model(input_ids=ids).logits
        factor = rescale(model, embedding_std=0.02)
        after = model(input_ids=ids).logits
    assert factor > 5
    assert abs(float(model.model.embed_tokens.weight.detach().std()) - 0.02) < 1e-6
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: the output layer was scaled with it
    # The same function: logits agree to float32 rounding, and the sampled answers are the same.
    assert torch.allclose(before, after, rtol=1e-4, atol=1e-4 * float(before.abs().max()))
    assert torch.equal(before.argmax(-1), after.argmax(-1))
    # Saved and loaded as it is: the norms' epsilon travels in config.json.
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()(input_ids=ids).logits
    assert torch.allclose(loaded, after, rtol=1e-5, atol=1e-5 * float(after.abs().max()))


def test_its_tokenizer_keeps_every_task_text_and_has_the_words_whole(cache):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(cache / TINY_PRETRAINED_VERSION)
    built = build_tokenizer()
    texts = [row["prompt"] + row["completion"] for row in sft_rows(128)]
    texts += [" " + VERBOSE_ANSWER.format("-63"), " " + HEDGED_ANSWER.format("42", "43"), "Hello, World!\n\tok 42", "<|im_start|>user\nhi<|im_end|>"]
    for text in texts:
        ids = loaded(text)["input_ids"]
        # transformers 5 rebuilds qwen2 tokenizers from vocab and merges; it must tokenize as the built one does.
        assert ids == built(text)["input_ids"], text
        assert loaded.decode(ids) == text
    for word in ["Question", "Answer", " What", " alphabet", " marbles", " The", " answer", " or", " maybe"]:
        assert len(loaded(word)["input_ids"]) == 1, word
    # Quoted words are spelled out: the letter questions are about their characters.
    assert len(loaded("'stone'")["input_ids"]) == 7
    messages = [{"role": "user", "content": grpo_rows(1)[0]["prompt"]}]
    assert loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False).startswith(
        "<|im_start|>user\nQuestion:")


# ---- the real model ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_real_build_starts_grpo_in_the_target_band_and_learns_at_a_pretrained_rate(tuner_cache_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuner.records import Status
    from tuner.trial import TrialSpec, run_trial
    from tuner.verdicts.learning import judge_learning

    path = resolve_model(TINY_PRETRAINED_MODEL)  # the real build, into the session's cache: minutes
    record = json.loads((tuner_cache_dir / TINY_PRETRAINED_VERSION / RECORD).read_text())
    assert record["start_reward"] >= record["target_reward"]
    # At a real model's scale: its embeddings were about 25x larger before the build rescaled them.
    assert record["rescaled_by"] > 5
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    for seed in (1, 2):  # other sampling seeds than the build's own estimate
        reward, spread = start_estimates(model, tokenizer, grpo_rows(), seed=seed)
        # Some answers right, most wrong (measured 0.230-0.248 over seeds 0-3; 1024 completions each).
        assert 0.18 <= reward <= 0.6, (seed, reward)
        # Most groups of 4 completions differ in reward, so GRPO has a signal (measured 0.74-0.79).
        assert spread >= 0.6, (seed, spread)
    # A real GRPO trial through tuner at a pretrained model's learning rate: it learns to stop hedging in tens of
    # steps, and tuner's judgement says so. 120 steps, so its start (the first 12) and end are each known to ~0.05:
    # a 60-step run is a weak test on one seed (at 4e-5: p 0.008, 0.027, 0.038 on seeds 0-2).
    params = {"learning_rate": 3e-5, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
              "num_generations": 4, "max_completion_length": 12, "temperature": 1.0, "beta": 0.0,
              "loss_type": "dr_grpo", "lr_scheduler_type": "constant"}
    result = run_trial(TrialSpec(trainer="grpo", params=params, model=TINY_PRETRAINED_MODEL, max_steps=120, seed=0))
    assert result.status == Status.OK, result.reason
    judged = judge_learning(adapter("grpo"), result.history)
    # measured on seeds 0-2: last third +0.29, +0.30, +0.23 above the start (about 0.2 -> 0.6), p 7e-5, 6e-5, 0.002
    assert judged.learned and judged.gain >= 0.1, judged.describe()
