"""The embedded tiny model's own task: its vocabulary and the row builders of its built-in data.

    grpo_row(random.Random("grpo:0"), 0)   # {"prompt": "name red cat colours"}

Pure Python (no datasets, no torch), so the tiny model's tokenizer (tuner.inputs.models) and the trainer table
(tuner.config.trainers) can import it cheaply. The data is made so that the tiny model (random weights) visibly
learns in 20 optimizer steps at batch 8 (measured with TRL 1.16: DPO and reward accuracy reach 1.0 at
learning rate 5e-3, SFT loss falls from 6.0 to 3.4, KTO loss from 0.5 to 0.16, GRPO reward doubles at 1e-2).
The preference trainers share one pattern, "colours are good, animals are bad":

- grpo:   prompts such as "name red cat colours"; the default reward (``tuner.inputs.rewards.builtin_reward``) is
          the fraction of completion words that are words of VOCABULARY; a random policy writes about one
          in four (the rest are word fragments), so completions in a group get different rewards.
- dpo, reward: chosen " yes good red blue green", rejected " no bad cat dog fox".
- kto:    the same completions unpaired, labelled True (colours) / False (animals), half and half.
- sft:    "text" lines from one small grammar: "the red cat sees four small dog".

Completions start with a space because TRL joins standard-format prompt and completion as ``prompt + completion``.
"""

from __future__ import annotations

import random

__all__ = ["ANIMALS", "COLOURS", "DIGITS", "VOCABULARY", "grpo_row", "kto_row", "preference_row", "sft_row"]

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
COLOURS = ["black", "blue", "brown", "gold", "gray", "green", "orange", "pink", "purple", "red", "white", "yellow"]
ANIMALS = [
    "bear", "bird", "cat", "cow", "dog", "duck", "fish", "fox", "frog",
    "goat", "horse", "lion", "mouse", "owl", "pig", "sheep", "tiger", "wolf",
]  # fmt: skip
_VERBS = [
    "are", "chase", "chases", "count", "do", "does", "eat", "eats", "find", "finds", "give", "has", "have",
    "is", "like", "likes", "list", "make", "name", "say", "see", "sees", "take", "want", "wants",
]  # fmt: skip
_ANSWERS = ["bad", "false", "good", "maybe", "no", "right", "true", "wrong", "yes"]
_ADJECTIVES = ["big", "cold", "fast", "happy", "hot", "new", "old", "sad", "slow", "small"]
_NOUNS = [
    "animal", "animals", "ball", "box", "car", "colour", "colours", "fire", "house",
    "moon", "number", "numbers", "star", "sun", "tree", "water", "word", "words",
]  # fmt: skip
_FUNCTION_WORDS = [
    "a", "an", "and", "i", "in", "it", "not", "of", "on", "or", "that", "the", "they",
    "this", "to", "very", "we", "what", "which", "with", "you",
]  # fmt: skip

# Every word of every built-in dataset; the tiny model's tokenizer has exactly these words (plus special tokens),
# so nothing built in is ever tokenized to <unk>. Sorted so token ids are stable.
VOCABULARY: list[str] = sorted(
    set(DIGITS + COLOURS + ANIMALS + _VERBS + _ANSWERS + _ADJECTIVES + _NOUNS + _FUNCTION_WORDS)
)

def grpo_row(rng: random.Random, i: int) -> dict:
    # Short prompts that mention colours and animals; the reward only looks at the completion, so the prompt
    # gives the policy context to condition on without making the task depend on reading it.
    verb = rng.choice(["name", "say", "list", "count"])
    words = rng.sample(COLOURS, 1) + rng.sample(ANIMALS, 1)
    rng.shuffle(words)
    return {"prompt": " ".join([verb, *words, rng.choice(["colours", "words"])])}


def _prompt(rng: random.Random) -> str:
    return f"do you like the {rng.choice(COLOURS)} {rng.choice(ANIMALS)}"


def _good(rng: random.Random) -> str:
    return " " + " ".join(["yes", "good", *rng.sample(COLOURS, rng.randint(2, 4))])


def _bad(rng: random.Random) -> str:
    return " " + " ".join(["no", "bad", *rng.sample(ANIMALS, rng.randint(2, 4))])


def preference_row(rng: random.Random, i: int) -> dict:
    return {"prompt": _prompt(rng), "chosen": _good(rng), "rejected": _bad(rng)}


def kto_row(rng: random.Random, i: int) -> dict:
    # Alternating labels keep desirable and undesirable exactly balanced, so KTO's default weights fit.
    desirable = i % 2 == 0
    prompt = _prompt(rng)
    return {"prompt": prompt, "completion": _good(rng) if desirable else _bad(rng), "label": desirable}


def sft_row(rng: random.Random, i: int) -> dict:
    subject = f"the {rng.choice(COLOURS)} {rng.choice(ANIMALS)}"
    verb = rng.choice(["sees", "likes", "finds", "chases", "eats"])
    count = rng.choice(DIGITS[2:])
    return {"text": f"{subject} {verb} {count} {rng.choice(_ADJECTIVES)} {rng.choice(ANIMALS)}"}


# The built-in rows by shape (a trainer entry's ``rows``): (seeded rng, row index) -> one row.
ROWS = {"prompt": grpo_row, "preference": preference_row, "unpaired": kto_row, "completion": sft_row}
