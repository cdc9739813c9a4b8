"""An independent NumPy float64 all-MiniLM-L6-v2, from the checkpoint's tensors by name.

It follows Hugging Face's BertModel and sentence-transformers' Pooling and Normalize
modules, written out here without Kina, tilegen or torch, so the tests can check the
weight mapping (checked first against sentence-transformers itself) and the compiled
program against something that shares no code with either.
"""

from __future__ import annotations

from math import sqrt

import numpy as np
from scipy.special import erf


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)))


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def encode(tensors: dict[str, np.ndarray], ids: np.ndarray, type_ids: np.ndarray,
           mask: np.ndarray, layers: int = 6, heads: int = 12,
           eps: float = 1e-12) -> np.ndarray:
    """Normalised sentence embeddings [B, D] for padded int arrays [B, T]."""
    w = {name: array.astype(np.float64) for name, array in tensors.items()}
    batch, length = ids.shape

    def linear(x, prefix):
        return x @ w[prefix + ".weight"].T + w[prefix + ".bias"]

    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][np.arange(length)][None]
         + w["embeddings.token_type_embeddings.weight"][type_ids])
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    width = x.shape[-1]
    head = width // heads
    keep = mask.astype(bool)[:, None, None, :]          # [B, 1, 1, T]: keys to attend to
    for layer in range(layers):
        p = f"encoder.layer.{layer}."

        def split(y):  # contiguous heads: NumPy's batched matmul is slow on strided stacks
            return np.ascontiguousarray(y.reshape(batch, length, heads, head).swapaxes(1, 2))

        q, k, v = (split(linear(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ np.ascontiguousarray(k.swapaxes(2, 3)) / sqrt(head)
        probabilities = softmax(np.where(keep, scores, -np.inf))
        context = (probabilities @ v).swapaxes(1, 2).reshape(batch, length, width)
        x = layer_norm(x + linear(context, p + "attention.output.dense"),
                       w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], eps)
        hidden = gelu(linear(x, p + "intermediate.dense"))
        x = layer_norm(x + linear(hidden, p + "output.dense"), w[p + "output.LayerNorm.weight"],
                       w[p + "output.LayerNorm.bias"], eps)
    weights = mask.astype(np.float64)[:, :, None]
    pooled = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
