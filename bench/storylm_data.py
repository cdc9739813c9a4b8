"""The inputs of the StoryLM groups: the StoryLM-0 fixture (B1-B3) and the scaled model (B4).

Both are held as `Model`: widths, the seven float32 arrays in the Kina parameter order, and
the host constants (mask, scale, lr). `as_float64()` gives the copy the references run on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from storylm import fixture

TRAINABLE = ("embed", "wq", "wk", "wv", "wo", "lm_head")

# B1/B3: Section 23's prompt, padded to T = 36.
ROLLOUT_PROMPT = (1, 4, 2, 6)
ROLLOUT_T = 36
ROLLOUT_STEPS = 32
# B2: Section 24's loop.
TRAIN_EPOCHS = 40
TRAIN_LR = 0.1


@dataclass(frozen=True, eq=False)
class Model:
    """One StoryLM instance: widths and arrays. Weight arrays are C-contiguous float32 (or
    float64 for the reference), never written to by any provider."""

    vocab: int
    model_dim: int
    heads: int
    head_dim: int
    length: int  # T of the programs that take this model's mask
    embed: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    lm_head: np.ndarray
    scale: np.ndarray  # [1, 1, 1, 1]
    mask: np.ndarray  # [1, 1, T, T]
    lr: np.ndarray  # [1, 1]

    def weights(self) -> tuple[np.ndarray, ...]:
        """The six trainable arrays in TRAINABLE order."""
        return tuple(getattr(self, name) for name in TRAINABLE)

    def forward_args(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """Arguments of storylm0_forward/_rollout: (ids, embed, mask, scale, wq..lm_head)."""
        return (ids, self.embed, self.mask, self.scale, self.wq, self.wk, self.wv, self.wo,
                self.lm_head)

    def with_weights(self, weights) -> Model:
        return replace(self, **dict(zip(TRAINABLE, weights, strict=True)))

    def as_float64(self) -> Model:
        arrays = {name: getattr(self, name).astype(np.float64)
                  for name in (*TRAINABLE, "scale", "mask", "lr")}
        return replace(self, **arrays)


def storylm0(length: int) -> Model:
    """The Section 5 patterned fixture with the causal mask for `length` tokens."""
    checkpoint = fixture.load_checkpoint()
    widths = checkpoint.widths
    arrays = {name: np.ascontiguousarray(getattr(checkpoint, name)) for name in TRAINABLE}
    return Model(vocab=widths.vocab_size, model_dim=widths.model_dim, heads=widths.heads,
                 head_dim=widths.head_dim, length=length, **arrays,
                 scale=np.ascontiguousarray(checkpoint.scale),
                 mask=fixture.causal_mask(length),
                 lr=np.full((1, 1), TRAIN_LR, dtype=np.float32))


def rollout_ids() -> np.ndarray:
    """[1, 36] int64: the prompt, then pad ids."""
    ids = np.full((1, ROLLOUT_T), fixture.PAD_ID, dtype=np.int64)
    ids[0, :len(ROLLOUT_PROMPT)] = ROLLOUT_PROMPT
    return ids


def corpus() -> list[tuple[np.ndarray, np.ndarray]]:
    """Section 24's three windows as ([1, 4] ids, [1, 4] targets) int64 pairs."""
    return [(window.id_array(), window.target_array()) for window in fixture.load_corpus()]


# B4: the scaled StoryLM (same algebra), random weights x 0.02.
SCALED = {"vocab": 4096, "model_dim": 256, "heads": 8, "head_dim": 32, "length": 256}
SCALED_SEED = 0


def scaled_model() -> Model:
    widths = SCALED
    rng = np.random.default_rng(SCALED_SEED)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    vocab, dim, length = widths["vocab"], widths["model_dim"], widths["length"]
    return Model(**widths, embed=weight(vocab, dim), wq=weight(dim, dim), wk=weight(dim, dim),
                 wv=weight(dim, dim), wo=weight(dim, dim), lm_head=weight(dim, vocab),
                 scale=np.full((1, 1, 1, 1), 1 / np.sqrt(widths["head_dim"]), np.float32),
                 mask=fixture.causal_mask(length), lr=np.full((1, 1), TRAIN_LR, np.float32))


def scaled_batch() -> tuple[np.ndarray, np.ndarray]:
    """[1, 256] ids and next-token targets (the ids shifted by one), seeded."""
    rng = np.random.default_rng(SCALED_SEED + 1)
    stream = rng.integers(0, SCALED["vocab"], size=SCALED["length"] + 1, dtype=np.int64)
    return stream[None, :-1].copy(), stream[None, 1:].copy()
