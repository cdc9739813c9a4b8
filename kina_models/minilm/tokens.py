"""Tokens as sentence-transformers makes them, and the padded batches the program takes.

sentence-transformers tokenizes with the model's `tokenizer.json` (WordPiece, lower-cased,
`[CLS] ... [SEP]`, token type 0), truncating each text to `max_seq_length` tokens (the
special tokens included) and padding the batch on the right with `[PAD]` (id 0, type 0,
mask 0). Here each batch is padded to a *bucketed* shape instead of its longest text, so
the few (B, T) shapes that occur are compiled once each; the padding cannot change the
result, since padded keys get an additive -1e9 in attention and padded rows are left out
of the pooled mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import ModelFileError


@dataclass(frozen=True)
class Batch:
    """One padded batch: `rows` are the positions of its texts in the caller's list."""

    rows: tuple[int, ...]
    ids: np.ndarray        # int64 [B, T]
    type_ids: np.ndarray   # int64 [B, T]
    mask: np.ndarray       # int64 [B, T]: 1 for a token, 0 for padding


def load_tokenizer(path: Path, max_seq_length: int):
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelFileError(path, "missing")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception on a malformed file
        raise ModelFileError(path, f"is not a readable tokenizer file ({error})") from None
    # tokenizer.json itself says truncate and pad to 128; sentence-transformers overrides
    # both per call (truncate at max_seq_length, pad to the longest), and so do we.
    tokenizer.enable_truncation(max_length=max_seq_length, strategy="longest_first")
    tokenizer.no_padding()
    return tokenizer


def bucket(n: int, step: int, limit: int) -> int:
    """The smallest multiple of `step` that holds n, at most `limit` (which always fits)."""
    return min(-(-n // step) * step, limit)


def padded_length(n: int, length_step: int, short_step: int, limit: int) -> int:
    """The length a batch whose longest text has n tokens is padded to: a multiple of
    `short_step` up to 2 x `length_step` tokens, of `length_step` beyond, at most `limit`.
    A short batch's products run at a cost that grows with its rows (the weights stream
    once either way), so padding a 12-token sentence to 16 is a third more work; beyond a
    few dozen tokens the coarse step wastes little and keeps the shapes few."""
    return bucket(n, short_step if n <= 2 * length_step else length_step, limit)


def batch_rows(n: int, limit: int) -> int:
    """Rows to compile a batch of n texts for: the next power of two, at most `limit`."""
    rows = 1
    while rows < n:
        rows *= 2
    return min(rows, limit)


def make_batches(encodings: Sequence, batch_size: int, length_step: int,
                 max_seq_length: int, short_step: int | None = None) -> list[Batch]:
    """Texts grouped longest first (so a batch holds texts of similar length, as in
    sentence-transformers), each group padded to a bucketed (B, T) (`padded_length`;
    `short_step` defaults to `length_step`, one step for every length)."""
    order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = tuple(order[start:start + batch_size])
        longest = len(encodings[rows[0]].ids)
        shape = (batch_rows(len(rows), batch_size),
                 padded_length(longest, length_step, short_step or length_step,
                               max(max_seq_length, longest)))
        ids = np.zeros(shape, np.int64)
        type_ids = np.zeros(shape, np.int64)
        mask = np.zeros(shape, np.int64)
        for row, index in enumerate(rows):
            encoding = encodings[index]
            count = len(encoding.ids)
            ids[row, :count] = encoding.ids
            type_ids[row, :count] = encoding.type_ids
            mask[row, :count] = encoding.attention_mask
        batches.append(Batch(rows, ids, type_ids, mask))
    return batches
