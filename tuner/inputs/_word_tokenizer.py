"""The tiny models' tokenizer: Qwen2's byte-level BPE pipeline over a small vocabulary of whole words.

    build_word_tokenizer([" red", " cat"], model_max_length=256)   # " red" is one token; other text, characters

transformers 5 loads the tokenizer of every ``qwen2`` checkpoint as ``Qwen2Tokenizer``, whatever tokenizer.json
says, and rebuilds it from the vocabulary and merges with Qwen's fixed pre-tokenizer and decoder; a word-level
tokenizer would come back from ``AutoTokenizer`` as a different, broken one. So this tokenizer has exactly
Qwen2's pipeline and only its vocabulary is ours: special tokens, printable ASCII characters, and the prefixes
of each whole word, built by merges that extend a word from its first character on. Decoding gives ASCII text
back exactly; other characters are dropped. Used by the tiny model (``tuner.inputs.models``) and the tiny pretrained
model (``tuner.inputs._tiny_pretrained``).
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "EOS_TOKEN", "PAD_TOKEN", "build_word_tokenizer"]

PAD_TOKEN = "<pad>"  # its own token, not EOS, so padding never hides a real end of text
EOS_TOKEN = "<|endoftext|>"  # Qwen2.5's end-of-text token
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
# Single characters the tokenizer knows, as byte-level symbols: printable ASCII plus space, newline and tab.
# Anything else (non-ASCII text) is dropped by the tokenizer; a tiny random model loses nothing by that.
_ALPHABET = [chr(c) for c in range(33, 127)] + ["\u0120", "\u010a", "\u0109"]  # "Ġ" " ", "Ċ" "\n", "ĉ" "\t"

# transformers' Qwen2Tokenizer splits text into words with this (one leading space or mark stays with a word).
_QWEN2_PRETOKENIZE_REGEX = (  # noqa: E501
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, as Qwen2.5-Instruct writes it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_word_tokenizer(words: list[str], model_max_length: int):
    """A Qwen2-style byte-level BPE whose whole-word tokens are ``words``.

    Each of ``words`` (" red" with its leading space, or "Question" for a word that starts a line) becomes one
    token, through merges that extend its prefixes from the first character on; any other text is spelled in
    printable ASCII characters. ``model_max_length`` should be the model's max_position_embeddings.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD_TOKEN, EOS_TOKEN, *CHAT_TOKENS]
    byte_level = [word.replace(" ", "\u0120") for word in words]  # how ByteLevel writes a space: "Ġ"
    prefixes = sorted(
        {word[:end] for word in byte_level for end in range(2, len(word) + 1)},
        key=lambda prefix: (len(prefix), prefix),
    )
    vocab = {token: index for index, token in enumerate(specials + _ALPHABET + prefixes)}
    merges = [(prefix[:-1], prefix[-1]) for prefix in prefixes]  # shorter prefixes first: they rank higher
    # From here on, the same pipeline as transformers' Qwen2Tokenizer.__init__.
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,  # as in Qwen2.5: byte-level BPE has no unknown token
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(CHAT_TOKENS),
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
