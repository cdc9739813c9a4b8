"""The B5 kernels as each peer writes them: row softmax and one causal attention head.

(Matmul needs no code: `a @ b` in NumPy, PyTorch and JAX.) The numba softmax is the
hand-fused row loop: max, exp and sum, scale, one row at a time, single-threaded.
"""

from __future__ import annotations

import math

import numpy as np


def softmax_numpy(x: np.ndarray) -> np.ndarray:
    exps = np.exp(x - x.max(axis=1, keepdims=True))
    exps /= exps.sum(axis=1, keepdims=True)
    return exps


def attention_numpy(q, k, v, mask, scale) -> np.ndarray:
    return softmax_numpy(q @ k.T * scale + mask) @ v


def attention_torch(q, k, v, mask, scale):
    import torch
    return torch.softmax(q @ k.T * scale + mask, dim=1) @ v


def attention_torch_sdpa(q, k, v, mask, scale: float):
    """PyTorch's fused attention entry point (the way a PyTorch user writes this block)."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                          scale=scale)[0]


def attention_jax(q, k, v, mask, scale):
    import jax
    return jax.nn.softmax(q @ k.T * scale + mask, axis=1) @ v


def make_softmax_numba():
    from numba import njit

    @njit(cache=False)
    def softmax_rows_into(x, out):
        rows, cols = x.shape
        for r in range(rows):
            top = x[r, 0]
            for c in range(1, cols):
                top = max(top, x[r, c])
            total = np.float32(0.0)
            for c in range(cols):
                e = np.float32(math.exp(x[r, c] - top))
                out[r, c] = e
                total += e
            inverse = np.float32(1.0) / total
            for c in range(cols):
                out[r, c] *= inverse

    return softmax_rows_into
