"""tuner.inputs._tiny_pretrained: the tiny pretrained model (--model tiny-pretrained), built for real.

The full build takes minutes, so the tests build a short one (SHORT_STEPS steps: the same code, the same files,
under the target) and put it where the alias looks. The real model (its build reaches the target, and a GRPO trial
through tuner learns from it at a pretrained model's learning rate) is checked by ``python -m bench.studies.tiny_pretrained``
(bench/recorded/tiny_pretrained.json); the tests at the end hold the suite to that check: it must be for this recipe, every
claim must have held, and its code runs here end to end on the short build.
"""

import json

import pytest
from helpers import at_once

from tuner.inputs._tiny_pretrained import (
    HEDGED_ANSWER,
    MAX_STEPS,
    RECORD,
    TINY_PRETRAINED_VERSION,
    VERBOSE_ANSWER,
    build_tiny_pretrained,
    build_tokenizer,
    rescale,
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


# ---- the real model: its full check is bench/studies/tiny_pretrained.py -------------------------------------------------


def test_the_real_build_was_checked_by_the_bench_for_this_very_recipe():
    """The real build (MAX_STEPS steps, minutes on a core) and its 120-step GRPO check at a pretrained model's
    learning rate run in ``python -m bench.studies.tiny_pretrained``, which writes bench/recorded/tiny_pretrained.json. Here: every
    claim held there (target reached, start reward in its band on two other sampling seeds, a GRPO trial through
    tuner learned with a gain of at least 0.1), on the recipe this code builds. A change to the build, its
    tokenizer or its tasks fails this test until the bench has checked the new build."""
    from bench.studies.tiny_pretrained import GRPO_STEPS, OUTPUT, recipe_fingerprint

    figures = json.loads(OUTPUT.read_text())
    assert figures["recipe_fingerprint"] == recipe_fingerprint(), (
        "the tiny-pretrained build's code changed since bench/recorded/tiny_pretrained.json was written: bump "
        "TINY_PRETRAINED_VERSION if the model changes, and run `python -m bench.studies.tiny_pretrained`")
    record = figures["record"]
    assert record["version"] == TINY_PRETRAINED_VERSION and record["steps"] == MAX_STEPS
    assert figures["grpo"]["steps_run"] == GRPO_STEPS and figures["grpo"]["status"] == "ok"
    assert figures["held"] and all(claim["held"] for claim in figures["claims"]), figures["claims"]
    assert len(figures["claims"]) == 9  # target, scale, 2 x (reward band, spread), trial ok, learned, gain


def test_the_recipe_fingerprint_sees_code_and_not_comments(tmp_path):
    from bench.studies.tiny_pretrained import RECIPE, REPO, recipe_fingerprint

    for name in RECIPE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO / name).read_text())
    assert recipe_fingerprint(tmp_path) == recipe_fingerprint()
    build = tmp_path / RECIPE[0]
    text = build.read_text()
    build.write_text(text.replace('"""The tiny pretrained model', '"""Reworded: the tiny pretrained model', 1)
                     + "\n# a comment\n")
    assert recipe_fingerprint(tmp_path) == recipe_fingerprint()  # docstrings and comments do not count
    build.write_text(text.replace("MAX_STEPS = 14_000", "MAX_STEPS = 14_001", 1))
    assert recipe_fingerprint(tmp_path) != recipe_fingerprint()


@pytest.mark.slow
def test_the_bench_check_runs_end_to_end_through_the_alias_on_a_short_build(cache, monkeypatch):
    """bench.studies.tiny_pretrained.measure, the real check's own code, on the short build where the alias looks: the start
    estimates on the other seeds, a GRPO trial through tuner on ``--model tiny-pretrained`` at the pretrained
    learning rate, tuner's learning judgement. The short build is under the target, and the check says so."""
    from bench.studies.tiny_pretrained import ESTIMATE_SEEDS, GRPO_PARAMS, measure

    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))  # the trial's own process resolves the alias there too
    figures = measure(resolve_model(TINY_PRETRAINED_MODEL), TINY_PRETRAINED_MODEL, grpo_steps=4)
    assert figures["record"]["steps"] == SHORT_STEPS
    target = figures["claims"][0]
    assert target["figure"] < figures["record"]["target_reward"] and not target["held"] and not figures["held"]
    estimates = [c["figure"] for c in figures["claims"] if c["claim"].startswith(("start reward", "groups with"))]
    assert len(estimates) == 2 * len(ESTIMATE_SEEDS) and all(0.0 <= x <= 1.0 for x in estimates)
    assert figures["grpo"]["status"] == "ok" and figures["grpo"]["steps_run"] == 4, figures["grpo"]
    assert GRPO_PARAMS["learning_rate"] <= 1e-4  # a pretrained model's rate (the shipped spaces' pretrained: ranges)
    assert "judged" in figures["grpo"] and [c["claim"] for c in figures["claims"][-2:]] == [
        "the 4-step GRPO trial learned (tuner's judgement)", "its gain, last third over the start"]
