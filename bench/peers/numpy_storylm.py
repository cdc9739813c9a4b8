"""StoryLM in eager NumPy for any widths: forward, hand-derived backward, SGD step.

The same algebra as storylm.reference (which is fixed to StoryLM-0's two heads); here the
head count is a parameter so the scaled model (B4) runs through the same code. Computes in the
dtype of the arrays given: float32 as the NumPy peer, float64 as the B4 oracle.
"""

from __future__ import annotations

import numpy as np


def _split(projected: np.ndarray, heads: int) -> np.ndarray:
    """[B, T, D] -> [B, H, T, Dh]."""
    batch, length, width = projected.shape
    return projected.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)


def _merge(per_head: np.ndarray) -> np.ndarray:
    """[B, H, T, Dh] -> [B, T, D]."""
    batch, heads, length, head_dim = per_head.shape
    return per_head.transpose(0, 2, 1, 3).reshape(batch, length, heads * head_dim)


def _softmax(values: np.ndarray) -> np.ndarray:
    exps = np.exp(values - values.max(axis=-1, keepdims=True))
    exps /= exps.sum(axis=-1, keepdims=True)
    return exps


def forward(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, *, heads: int) -> np.ndarray:
    """Logits [B, T, V] (parameter order of storylm0_forward)."""
    x = embed[ids]
    q = _split(x @ wq, heads)
    k = _split(x @ wk, heads)
    v = _split(x @ wv, heads)
    probs = _softmax(q @ k.transpose(0, 1, 3, 2) * scale + mask)
    hidden = x + _merge(probs @ v) @ wo
    return hidden @ lm_head


def _weight_grad(inputs: np.ndarray, output_grad: np.ndarray) -> np.ndarray:
    return inputs.reshape(-1, inputs.shape[-1]).T @ output_grad.reshape(-1, output_grad.shape[-1])


def nll_and_grads(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, *, heads: int):
    """Sum-NLL of one window and the gradients of the six weights (embed..lm_head order)."""
    x = embed[ids]
    q = _split(x @ wq, heads)
    k = _split(x @ wk, heads)
    v = _split(x @ wv, heads)
    probs = _softmax(q @ k.transpose(0, 1, 3, 2) * scale + mask)
    attended = _merge(probs @ v)
    hidden = x + attended @ wo
    logits = hidden @ lm_head

    shifted = logits - logits.max(axis=-1, keepdims=True)
    exps = np.exp(shifted)
    sums = exps.sum(axis=-1, keepdims=True)
    picked = np.take_along_axis(shifted, targets[..., None], axis=-1)
    loss = (np.log(sums) - picked).sum()

    d_logits = exps / sums  # softmax(logits) - one_hot(targets)
    np.put_along_axis(d_logits, targets[..., None],
                      np.take_along_axis(d_logits, targets[..., None], axis=-1) - 1, axis=-1)
    d_lm_head = _weight_grad(hidden, d_logits)
    d_hidden = d_logits @ lm_head.T
    d_wo = _weight_grad(attended, d_hidden)
    d_out = _split(d_hidden @ wo.T, heads)
    d_probs = d_out @ v.transpose(0, 1, 3, 2)
    d_v = probs.transpose(0, 1, 3, 2) @ d_out
    d_scores = probs * (d_probs - (d_probs * probs).sum(axis=-1, keepdims=True)) * scale
    d_q = d_scores @ k
    d_k = d_scores.transpose(0, 1, 3, 2) @ q
    d_x = d_hidden
    grads = []
    for weight, d_head in ((wq, d_q), (wk, d_k), (wv, d_v)):
        d_projected = _merge(d_head)
        grads.append(_weight_grad(x, d_projected))
        d_x = d_x + d_projected @ weight.T
    d_embed = np.zeros_like(embed)
    np.add.at(d_embed, ids.reshape(-1), d_x.reshape(-1, embed.shape[1]))
    return loss, (d_embed, *grads, d_wo, d_lm_head)


def nll_step(ids: np.ndarray, targets: np.ndarray, embed: np.ndarray, wq: np.ndarray,
             wk: np.ndarray, wv: np.ndarray, wo: np.ndarray, lm_head: np.ndarray,
             mask: np.ndarray, scale: np.ndarray, lr: np.ndarray, *,
             heads: int) -> tuple[np.ndarray, ...]:
    """(nll, embed', wq', wk', wv', wo', lm_head'): the storylm0_nll_step contract."""
    loss, grads = nll_and_grads(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale,
                                heads=heads)
    rate = lr.reshape(())
    weights = (embed, wq, wk, wv, wo, lm_head)
    return (loss, *(weight - rate * grad for weight, grad in zip(weights, grads, strict=True)))
