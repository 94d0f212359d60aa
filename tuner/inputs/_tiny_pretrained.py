"""The tiny pretrained model (``--model tiny-pretrained``): a test and demo model for the ``pretrained:`` path.

    from tuner.inputs._tiny_pretrained import tiny_pretrained_dir
    tiny_pretrained_dir()    # built once per machine (a few minutes on a CPU core), then returns its folder

The embedded tiny model (``--model tiny``) has random weights and its own word task, so a search on it uses the
spaces' large tiny-model learning rates and never the built-in exact-answer questions. This model has the same
2-layer Qwen2 shape, pretrained here with plain torch on those questions (``tuner.inputs.tasks``) until it answers some
of them: sampled at temperature 1.0 as GRPO does, its start reward on the built-in GRPO prompts under
``exact_answer_reward`` is about 0.2, and GRPO at a pretrained model's learning rates (1e-5 to 1e-4) takes it to
about 0.35 in some tens of steps. It is not the tiny model (``tuner.inputs.models.is_tiny`` says no), so a search on
it takes every pretrained path: the spaces' ``pretrained:`` ranges, ``tuner.inputs.tasks``' rows and its reward.

**What it learns.** Next-token prediction of the answer and end of text after the plain-text prompt
"Question: ...\\nAnswer:", on questions generated from other seeds than the built-in data's. The kinds that are
lookups, which a model this small learns in minutes (the letter after a letter, a letter's place, small
products, word lengths, ...), come up more often than in ``tuner.inputs.tasks``' mix; the others (large sums, two-step
arithmetic, reversed words) less often: it answers them in the asked format, mostly wrong. Like a pretrained
model, it is not always sure and not always terse: NEAR_MISS_RATE of its answers are near misses ("43" for
42), VERBOSE_RATE are written as "The answer is 42." and HEDGE_RATE hedge ("42 or maybe 43"). A hedged answer
scores 0.0 even when its first answer is right (the reward reads the last number), so there is something GRPO can
learn that it knows already: to stop hedging. That is how GRPO moves a real pretrained model in its first tens
of steps, bringing out answers it can already give (the format, the confident answer) more than teaching new
ones. The four completions GRPO samples for a prompt mostly differ in reward (right 1.0, a bare wrong answer
0.1, a wordy or hedged one 0.0), which is what GRPO learns from.

**At a real model's scale.** Trained at a high rate from a small model's initialisation, its weights end about
thirty times larger than a pretrained transformer's (embeddings of std ~0.5 where real models have ~0.02). Adam
moves every weight by about the learning rate per step whatever its size, so at that size the rates that move a
real model would barely move this one. The build ends by scaling it, without changing a single output, to the
embedding std of real models (``rescale``): the embeddings and each layer's output projections divided by a
factor, the final norm's weight multiplied by it (every layer's input is normalised, and the output layer shares
the embeddings). At that scale the spaces' ``pretrained:`` learning rates move it as they move a real model.

**What it measures.** It trains for MAX_STEPS. Every EVAL_EVERY steps it samples GROUP_SIZE completions for
each of the built-in GRPO prompts (``tuner.inputs.tasks.grpo_rows()``, the rows a search trains on) as GRPO does, and
scores them (``start_estimates``); the last estimate is its start reward (about 0.25; TARGET_REWARD is the least
the tests accept). ``pretraining.json`` in the folder records the estimates, the rescaling and the time taken.

**Deterministic.** Seeded initialization and data, batches in a fixed order, a fixed number of CPU threads and
torch's deterministic algorithms: two builds on one machine give identical weights. Another CPU or torch version
may round differently and end a little apart; the build is cached per machine, like the tiny model's.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

__all__ = [
    "TARGET_REWARD",
    "TINY_PRETRAINED_VERSION",
    "build_tiny_pretrained",
    "build_tokenizer",
    "rescale",
    "start_estimates",
    "tiny_pretrained_dir",
]

# Bump when the shape, tokenizer, data or training change, so old cached builds are not reused.
TINY_PRETRAINED_VERSION = "tiny-pretrained-qwen2-v2"
_COMPLETE_MARKER = "tuner-tiny-pretrained.complete"  # not the tiny model's marker: is_tiny() must say no
RECORD = "pretraining.json"  # what the build measured: steps, start-reward estimates, seconds

# -- the model: the embedded tiny model's shape (tuner.inputs.models), so GRPO trials on it take seconds on a CPU
HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
MAX_POSITIONS = 256  # the longest built-in prompt and answer is about 50 tokens

# -- what it learns
# How likely a generated task of each kind is kept for pretraining; tuner.inputs.tasks' own mix is the base. The kinds
# that are lookups the 2-layer model learns in minutes are always kept, and so are the small sums, differences
# and quotients it learns about half of; the arithmetic it would need far longer for is kept rarely, so it learns
# their answer format without spending the budget on them.
KEEP = {"next_letter": 1.0, "alphabet_position": 1.0, "multiply_small": 1.0, "word_length": 1.0,
        "alphabetical": 1.0, "largest": 1.0, "letter_count": 1.0, "add": 1.0, "subtract": 1.0, "divide": 1.0}
KEEP_OTHERS = 0.15
NEAR_MISS_RATE = 0.05  # answers that are one of the task's near misses
HEDGE_RATE = 0.55  # answers written as HEDGED_ANSWER: 0.0 whether the first answer is right or not
HEDGED_ANSWER = "{} or maybe {}"  # the answer, then another near miss: the reward reads the last one
VERBOSE_RATE = 0.2  # answers written as VERBOSE_ANSWER: a wrong one scores 0.0, a bare wrong one FORMAT_CREDIT
VERBOSE_ANSWER = "The answer is {}."  # exact_answer_reward reads its last number or word, so a right one scores 1.0
GROUP_SIZE = 4  # completions per prompt: search_spaces/grpo.yaml's num_generations

# -- pretraining
SEED = 0  # initial weights
DATA_SEED = 10_000  # make_tasks seeds DATA_SEED + chunk: far from the built-in data's 0 and the tests' small seeds
BATCH_SIZE = 32  # learned about twice as much per example as 64 did, at about the same time per example
LEARNING_RATE = 3e-3  # AdamW's peak; 2e-3 learns as fast, 6e-3 stalled for thousands of steps
WARMUP_STEPS = 100
MIN_LEARNING_RATE = 0.1  # cosine decay to this fraction of the peak at MAX_STEPS: the last steps settle the answers
MAX_GRAD_NORM = 1.0
MAX_STEPS = 14_000  # the schedule's length: about 4 minutes on a CPU core
EVAL_EVERY = 1000  # steps between estimates (1024 sampled completions, about a second)
TARGET_REWARD = 0.2  # where it must end at least: some answers right, most wrong (GRPO needs both)
EMBEDDING_STD = 0.02  # the scale it ends at: the std of a pretrained transformer's embeddings (rescale)
ESTIMATE_SEED = 0  # the sampling seed of the start-reward estimates
THREADS = 1  # torch CPU threads while training: a fixed count, since results may depend on it; and on a busy
# 2-core machine two threads made steps several times slower, not faster
CHUNK_STEPS = 50  # batches are drawn from chunks of this many steps' tasks, sorted by length (less padding)

# Plain prompts start their lines with these (tuner.inputs.tasks: "Question: ...\nAnswer:"): whole tokens too.
_LINE_START_WORDS = ["Question", "Answer"]
_SPACED_WORD = re.compile(r" [A-Za-z]+")

_TRAINING = threading.Lock()  # torch's thread count and deterministic mode are process-wide


def tiny_pretrained_dir() -> Path:
    """The model's folder, built on first use: $TUNER_CACHE_DIR/tiny-pretrained-qwen2-v1 (default ~/.cache/tuner)."""
    from tuner.stores.cache import cache_dir

    return build_tiny_pretrained(cache_dir() / TINY_PRETRAINED_VERSION)


def build_tiny_pretrained(path: str | os.PathLike, max_steps: int = MAX_STEPS) -> Path:
    """Pretrain the model and write it, its tokenizer and RECORD to ``path``, unless a complete build is there;
    return ``path``. Processes that need it at once wait for one build (a file lock beside ``path``).
    A ``max_steps`` below MAX_STEPS makes a short build that stops there, under the target (for tests)."""
    from tuner.stores.cache import build_folder_once, build_lock

    path = Path(path).expanduser().absolute()
    if (path / _COMPLETE_MARKER).is_file():
        return path
    with build_lock(path):
        if not (path / _COMPLETE_MARKER).is_file():  # a wait of minutes, once per machine: say why
            _say(f"pretraining the tiny-pretrained model once, into {path} (about 4 minutes on a CPU core)")
        return build_folder_once(path, _COMPLETE_MARKER, TINY_PRETRAINED_VERSION,
                                 lambda folder: _write(folder, max_steps), "tiny-pretrained build")


def build_tokenizer():
    """The tiny model's kind of tokenizer (``tuner.inputs._word_tokenizer``) over the words of tuner.inputs.tasks'
    questions and VERBOSE_ANSWER: each word after a space is one token, and so are "Question" and "Answer";
    numbers are digits, and quoted words ('stone') are spelled in characters, as the letter questions need."""
    from tuner.inputs._word_tokenizer import build_word_tokenizer
    from tuner.inputs.tasks import make_tasks

    # Every template word and list word of tuner.inputs.tasks turns up in a few thousand tasks (there are ~170).
    texts = [" " + task.question for task in make_tasks(5000, seed=DATA_SEED - 1)]
    texts += [" " + VERBOSE_ANSWER, " " + HEDGED_ANSWER]
    words = {word for text in texts for word in _SPACED_WORD.findall(text)}
    return build_word_tokenizer(sorted(words) + _LINE_START_WORDS, model_max_length=MAX_POSITIONS)


def start_estimates(model, tokenizer, rows: list[dict], seed: int = ESTIMATE_SEED) -> tuple[float, float]:
    """What GRPO sees at its first step on standard-format ``rows`` (prompt, answer): GROUP_SIZE completions per
    prompt sampled as search_spaces/grpo.yaml samples them (temperature 1.0, no top-k or top-p, 12 new tokens),
    scored by exact_answer_reward. Returns the mean reward and the share of prompts whose completions do not all
    get the same reward (GRPO learns from those only). Seeded, and the caller's random state is left as it was."""
    import torch

    from tuner.inputs.tasks import exact_answer_reward

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    try:
        batch = tokenizer([row["prompt"] for row in rows], return_tensors="pt", padding=True)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=12,
                                 num_return_sequences=GROUP_SIZE, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    answers = [row["answer"] for row in rows for _ in range(GROUP_SIZE)]
    rewards = exact_answer_reward(completions=completions, answer=answers)
    groups = [rewards[i : i + GROUP_SIZE] for i in range(0, len(rewards), GROUP_SIZE)]
    return sum(rewards) / len(rewards), sum(len(set(group)) > 1 for group in groups) / len(groups)


def rescale(model, embedding_std: float = EMBEDDING_STD) -> float:
    """Scale a tied-embedding Qwen2 model in place to ``embedding_std`` without changing its outputs; returns
    the factor it was divided by. The residual stream is divided by it (embeddings, and each layer's attention
    and MLP output projections); every layer normalises its input, so it computes the same (the norms' epsilon is
    divided by the factor squared, as the mean square they add it to is); the final norm's weight is multiplied
    by it, so the logits (through the shared, divided embeddings) are the same."""
    import torch

    base = model.model
    with torch.no_grad():
        factor = float(base.embed_tokens.weight.std()) / embedding_std
        base.embed_tokens.weight.div_(factor)  # also the output layer: tie_word_embeddings
        for layer in base.layers:
            layer.self_attn.o_proj.weight.div_(factor)
            layer.mlp.down_proj.weight.div_(factor)
        base.norm.weight.mul_(factor)
    model.config.rms_norm_eps /= factor**2
    for module in model.modules():
        if hasattr(module, "variance_epsilon"):  # Qwen2RMSNorm
            module.variance_epsilon = model.config.rms_norm_eps
    return factor


def _batch(prompts: list[list[int]], answers: list[list[int]], tokenizer):
    """Right-padded input ids, attention mask, and targets: the answer tokens and end of text, -100 elsewhere."""
    import torch

    length = max(len(p) + len(a) + 1 for p, a in zip(prompts, answers))
    ids = torch.full((len(prompts), length), tokenizer.pad_token_id)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    targets = torch.full((len(prompts), length), -100)
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        sequence = prompt + answer + [tokenizer.eos_token_id]
        ids[i, : len(sequence)] = torch.tensor(sequence)
        mask[i, : len(sequence)] = 1
        targets[i, len(prompt) : len(sequence)] = torch.tensor(sequence[len(prompt) :])
    return ids, mask, targets


def _chunk(index: int, tokenizer) -> list[tuple[list[list[int]], list[list[int]]]]:
    """CHUNK_STEPS batches of (prompt ids, answer ids), the same for the same ``index``."""
    from tuner.inputs.tasks import make_tasks

    draw = random.Random(f"tuner.tiny_pretrained:{index}")
    size = CHUNK_STEPS * BATCH_SIZE
    kept = [task for task in make_tasks(3 * size, seed=DATA_SEED + index)
            if draw.random() < KEEP.get(task.name, KEEP_OTHERS)][:size]
    answers = []
    for task in kept:
        answer = draw.choice(task.wrong) if draw.random() < NEAR_MISS_RATE else task.answer
        form = draw.random()
        if form < HEDGE_RATE:
            other = [wrong for wrong in task.wrong if wrong != answer] or list(task.wrong)
            answer = HEDGED_ANSWER.format(answer, draw.choice(other))
        elif form < HEDGE_RATE + VERBOSE_RATE:
            answer = VERBOSE_ANSWER.format(answer)
        answers.append(" " + answer)
    prompt_ids = tokenizer([f"Question: {task.question}\nAnswer:" for task in kept])["input_ids"]
    answer_ids = tokenizer(answers)["input_ids"]
    by_length = sorted(range(len(kept)), key=lambda i: (len(prompt_ids[i]) + len(answer_ids[i]), i))
    batches = [by_length[start : start + BATCH_SIZE] for start in range(0, len(by_length), BATCH_SIZE)]
    draw.shuffle(batches)  # each batch of similar lengths, the batches in no order
    return [([prompt_ids[i] for i in batch], [answer_ids[i] for i in batch]) for batch in batches]


def _learning_rate_factor(step: int) -> float:
    """Linear warm-up to the peak, then cosine decay to MIN_LEARNING_RATE of it at MAX_STEPS."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, MAX_STEPS - WARMUP_STEPS))
    return MIN_LEARNING_RATE + (1 - MIN_LEARNING_RATE) * 0.5 * (1 + math.cos(math.pi * progress))


def _pretrain(max_steps: int):
    """Train from seeded random weights for max_steps, estimating the start reward every EVAL_EVERY steps, then
    rescale; returns the model, its tokenizer and the record of the run."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tuner.inputs.tasks import grpo_rows

    started = time.perf_counter()
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=HIDDEN_SIZE, intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _learning_rate_factor)
    rows = grpo_rows()  # the built-in GRPO rows a search trains on: where the start reward is estimated
    estimates: list[dict] = []
    batches: list = []
    step = 0
    while step < max_steps:
        if not batches:
            batches = _chunk(step // CHUNK_STEPS, tokenizer)
        # mypy miscounts the (prompts, answers) pair unpacked here; the code is left as the recipe's fingerprint
        # (bench/studies/tiny_pretrained.py) has it
        ids, mask, targets = _batch(*batches.pop(), tokenizer)  # type: ignore[call-arg]
        # The loss is on the answer tokens only, so the output layer runs on those positions alone (it is about a
        # quarter of the model's work per token).
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
        targets = targets[:, 1:]
        scored = targets != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[scored]), targets[scored])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % EVAL_EVERY == 0 or step == max_steps:
            reward, spread = start_estimates(model, tokenizer, rows)
            estimates.append({"step": step, "start_reward": round(reward, 4), "groups_with_spread": round(spread, 4)})
    factor = rescale(model)
    record = {
        "version": TINY_PRETRAINED_VERSION, "steps": step, "target_reward": TARGET_REWARD,
        "start_reward": estimates[-1]["start_reward"] if estimates else None,
        "groups_with_spread": estimates[-1]["groups_with_spread"] if estimates else None,
        "rescaled_by": round(factor, 2), "embedding_std": EMBEDDING_STD,
        "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__, "threads": THREADS,
        "estimates": estimates,
    }
    return model, tokenizer, record


def _write(folder: Path, max_steps: int) -> None:
    import torch

    # Seeded weights, data and batch order; a fixed thread count and deterministic kernels, so every build on a
    # machine is the same. fork_rng gives the caller its random state back; the lock keeps other threads off
    # the process-wide settings meanwhile.
    with _TRAINING, torch.random.fork_rng(devices=[]):
        threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
        torch.set_num_threads(THREADS)
        torch.use_deterministic_algorithms(True)
        try:
            model, tokenizer, record = _pretrain(max_steps)
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    _say(f"pretrained in {record['seconds']:.0f} s, {record['steps']} steps: estimated GRPO start reward "
         f"{record['start_reward']}")


def _say(message: str) -> None:
    print(f"tuner.inputs._tiny_pretrained: {message}", file=sys.stderr, flush=True)
