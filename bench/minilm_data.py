"""Sentences for the all-MiniLM-L6-v2 checks and benchmarks (B8), deterministic.

`sentences_of_every_length` gives one text per token count 2..max (the count includes
[CLS] and [SEP]) and a few past the 256-token truncation, built from words that are one
WordPiece token each, so the count is exact; `unicode_sentences` covers what the
tokenizer's normaliser and pre-tokenizer treat specially.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

UNICODE_SENTENCES = (
    "",
    " ",
    "\t\n  ",
    "a",
    "Hello, world!",
    "Crème brûlée, façade, naïve café — déjà vu.",
    "Übergrößenträger straße ÅNGSTRÖM",
    "東京は日本の首都です。北京是中国的首都。",
    "서울은 한국의 수도입니다",
    "Москва — столица России.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "🙂🚀 emoji 👩‍👩‍👧 and flags 🇫🇷🇯🇵",
    "zero\u200bwidth\u00a0spaces\u2003and\u3000more",
    "control\x07chars\x1b[0m and \ufeffBOM",
    "ALL CAPS SHOUTING!!! ??? ...",
    "url https://example.com/path?q=1&r=2#frag and e-mail a.b@c.de",
    "numbers 3.14159 2,718 1e-9 0x1F 12345678901234567890",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "(((nested))) [[brackets]] {{braces}} <<angles>>",
    "tab\tseparated\tvalues\tand\nnew\nlines",
)


@cache
def single_token_words(tokenizer_json: str) -> tuple[str, ...]:
    """Lower-case alphabetic vocabulary entries of 3+ letters: each is one token."""
    vocab = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))["model"]["vocab"]
    return tuple(sorted(word for word in vocab
                        if word.isascii() and word.isalpha() and len(word) >= 3))


def words(tokenizer_json: str, count: int, seed: int) -> str:
    vocabulary = single_token_words(tokenizer_json)
    rng = np.random.default_rng(seed)
    return " ".join(vocabulary[i] for i in rng.integers(0, len(vocabulary), count))


def sentences_of_every_length(tokenizer_json: str, longest: int = 260,
                              step: int = 1) -> list[str]:
    """Texts of 2, 2 + step, ... tokens up to `longest` ([CLS] and [SEP] included); the
    model truncates those past max_seq_length."""
    return [words(tokenizer_json, tokens - 2, seed=tokens)
            for tokens in range(2, longest + 1, step)]


def mixed_batch(tokenizer_json: str, count: int = 32, seed: int = 8) -> list[str]:
    """`count` texts of mixed length (3 to 120 tokens), as a real batch would hold."""
    rng = np.random.default_rng(seed)
    return [words(tokenizer_json, int(n), seed=seed * 1000 + i)
            for i, n in enumerate(rng.integers(1, 119, count))]
