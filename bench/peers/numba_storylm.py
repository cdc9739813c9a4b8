"""StoryLM-0 in numba @njit with hand-fused loops (the strongest peer on the tiny model).

Written the way one hand-writes a tiny model for numba: one pass over the tokens per stage,
no temporaries beyond the per-token activations, the backward derived by hand (the same
derivation as storylm.reference), outputs written into caller-provided buffers so a host loop
allocates nothing. Generic in the widths (read from the arrays); `heads` is an argument.
Single-threaded (no parallel=True): at these sizes threads only add overhead.

Softmax skips `exp` where the shifted score is below -104: float32 exp rounds to exactly 0
there, so the result is bit-for-bit what the full loop gives, while the masked half of the
causal scores costs no libm call (what a hand-written kernel would do; the mask stays an
input, nothing assumes it is causal).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

EXP_UNDERFLOW = np.float32(-104.0)  # float32 exp(x) == 0 for every x below this


@njit(cache=False, inline="always")
def _embed_and_project(ids, embed, wq, wk, wv, x, q, k, v):
    """x = embed[ids[0]], and its three projections, in one fused pass over the tokens."""
    length, width = x.shape
    for t in range(length):
        row = ids[0, t]
        for d in range(width):
            x[t, d] = embed[row, d]
        for j in range(width):
            acc_q = np.float32(0.0)
            acc_k = np.float32(0.0)
            acc_v = np.float32(0.0)
            for i in range(width):
                xi = x[t, i]
                acc_q += xi * wq[i, j]
                acc_k += xi * wk[i, j]
                acc_v += xi * wv[i, j]
            q[t, j] = acc_q
            k[t, j] = acc_k
            v[t, j] = acc_v


@njit(cache=False)
def _activations(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads, logits):
    """Fused forward over row 0 of `ids`; fills logits[0] and returns the activations the
    backward reads: x, q, k, v ([T, D]), probs [H, T, T], attended and hidden ([T, D])."""
    length = ids.shape[1]
    width = embed.shape[1]
    vocab = lm_head.shape[1]
    head_dim = width // heads
    x = np.empty((length, width), np.float32)
    q = np.empty((length, width), np.float32)
    k = np.empty((length, width), np.float32)
    v = np.empty((length, width), np.float32)
    _embed_and_project(ids, embed, wq, wk, wv, x, q, k, v)
    factor = scale[0, 0, 0, 0]
    probs = np.empty((heads, length, length), np.float32)
    attended = np.zeros((length, width), np.float32)
    for h in range(heads):
        base = h * head_dim
        for i in range(length):
            top = np.float32(-np.inf)
            for j in range(length):
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[i, base + d] * k[j, base + d]
                score = dot * factor + mask[0, 0, i, j]
                probs[h, i, j] = score
                top = max(top, score)
            total = np.float32(0.0)
            for j in range(length):
                shifted = probs[h, i, j] - top
                e = np.float32(math.exp(shifted)) if shifted > EXP_UNDERFLOW else np.float32(0)
                probs[h, i, j] = e
                total += e
            for j in range(length):
                p = probs[h, i, j] / total
                probs[h, i, j] = p
                for d in range(head_dim):
                    attended[i, base + d] += p * v[j, base + d]
    hidden = np.empty((length, width), np.float32)
    for t in range(length):
        for j in range(width):
            acc = x[t, j]
            for i in range(width):
                acc += attended[t, i] * wo[i, j]
            hidden[t, j] = acc
        for c in range(vocab):
            acc = np.float32(0.0)
            for i in range(width):
                acc += hidden[t, i] * lm_head[i, c]
            logits[0, t, c] = acc
    return x, q, k, v, probs, attended, hidden


@njit(cache=False)
def forward_into(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads, logits):
    """Inference forward into logits: one scratch allocation, each query row's softmax and
    weighted sum fused in one pass (normalised once at the end; no [H, T, T] kept)."""
    length = ids.shape[1]
    width = embed.shape[1]
    vocab = lm_head.shape[1]
    head_dim = width // heads
    work = np.empty((4, length, width), np.float32)
    x, q, k, v = work[0], work[1], work[2], work[3]
    _embed_and_project(ids, embed, wq, wk, wv, x, q, k, v)
    factor = scale[0, 0, 0, 0]
    scores = np.empty(length, np.float32)
    attended = np.empty(width, np.float32)
    hidden = np.empty(width, np.float32)
    for i in range(length):
        for h in range(heads):
            base = h * head_dim
            top = np.float32(-np.inf)
            for j in range(length):
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[i, base + d] * k[j, base + d]
                score = dot * factor + mask[0, 0, i, j]
                scores[j] = score
                top = max(top, score)
            total = np.float32(0.0)
            for d in range(head_dim):
                attended[base + d] = 0
            for j in range(length):
                shifted = scores[j] - top
                if shifted > EXP_UNDERFLOW:
                    e = np.float32(math.exp(shifted))
                    total += e
                    for d in range(head_dim):
                        attended[base + d] += e * v[j, base + d]
            inverse = np.float32(1.0) / total
            for d in range(head_dim):
                attended[base + d] *= inverse
        for j in range(width):
            acc = x[i, j]
            for c in range(width):
                acc += attended[c] * wo[c, j]
            hidden[j] = acc
        for c in range(vocab):
            acc = np.float32(0.0)
            for j in range(width):
                acc += hidden[j] * lm_head[j, c]
            logits[0, i, c] = acc


@njit(cache=False)
def greedy_step(tokens, step, prompt_length, embed, mask, scale, wq, wk, wv, wo, lm_head,
                heads, logits):
    """One Section 23 step: forward the buffer, argmax row P-1+step, write token P+step."""
    forward_into(tokens, embed, mask, scale, wq, wk, wv, wo, lm_head, heads, logits)
    read = prompt_length - 1 + step
    best = 0
    for c in range(1, logits.shape[2]):
        if logits[0, read, c] > logits[0, read, best]:
            best = c
    tokens[0, read + 1] = best


@njit(cache=False)
def _weight_grad(inputs, output_grad, into):
    rows, cols = into.shape
    for i in range(rows):
        for j in range(cols):
            acc = np.float32(0.0)
            for t in range(inputs.shape[0]):
                acc += inputs[t, i] * output_grad[t, j]
            into[i, j] = acc


@njit(cache=False)
def nll_step_into(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, lr, heads,
                  embed_out, wq_out, wk_out, wv_out, wo_out, lm_head_out):
    """Section 15 step with the hand-derived backward; writes w - lr * g into the *_out
    buffers and returns the window's sum-NLL."""
    length = ids.shape[1]
    width = embed.shape[1]
    vocab = lm_head.shape[1]
    head_dim = width // heads
    logits = np.empty((1, length, vocab), np.float32)
    x, q, k, v, probs, attended, hidden = _activations(ids, embed, mask, scale, wq, wk, wv,
                                                       wo, lm_head, heads, logits)
    # loss and d_logits = softmax(logits) - one_hot(targets)
    loss = np.float32(0.0)
    d_logits = np.empty((length, vocab), np.float32)
    for t in range(length):
        top = logits[0, t, 0]
        for c in range(1, vocab):
            top = max(top, logits[0, t, c])
        total = np.float32(0.0)
        for c in range(vocab):
            e = np.float32(math.exp(logits[0, t, c] - top))
            d_logits[t, c] = e
            total += e
        target = targets[0, t]
        loss += np.float32(math.log(total)) - (logits[0, t, target] - top)
        for c in range(vocab):
            d_logits[t, c] /= total
        d_logits[t, target] -= 1
    d_lm_head = np.empty((width, vocab), np.float32)
    _weight_grad(hidden, d_logits, d_lm_head)
    d_hidden = np.empty((length, width), np.float32)
    for t in range(length):
        for i in range(width):
            acc = np.float32(0.0)
            for c in range(vocab):
                acc += d_logits[t, c] * lm_head[i, c]
            d_hidden[t, i] = acc
    d_wo = np.empty((width, width), np.float32)
    _weight_grad(attended, d_hidden, d_wo)
    d_attended = np.empty((length, width), np.float32)
    for t in range(length):
        for i in range(width):
            acc = np.float32(0.0)
            for j in range(width):
                acc += d_hidden[t, j] * wo[i, j]
            d_attended[t, i] = acc
    # attention backward, per head, with q/k/v gradients in [T, D] column blocks
    factor = scale[0, 0, 0, 0]
    d_q = np.zeros((length, width), np.float32)
    d_k = np.zeros((length, width), np.float32)
    d_v = np.zeros((length, width), np.float32)
    d_probs = np.empty(length, np.float32)
    for h in range(heads):
        base = h * head_dim
        for i in range(length):
            weighted = np.float32(0.0)
            for j in range(length):
                acc = np.float32(0.0)
                for d in range(head_dim):
                    acc += d_attended[i, base + d] * v[j, base + d]
                    d_v[j, base + d] += probs[h, i, j] * d_attended[i, base + d]
                d_probs[j] = acc
                weighted += acc * probs[h, i, j]
            for j in range(length):
                d_score = probs[h, i, j] * (d_probs[j] - weighted) * factor
                for d in range(head_dim):
                    d_q[i, base + d] += d_score * k[j, base + d]
                    d_k[j, base + d] += d_score * q[i, base + d]
    d_x = d_hidden  # the residual hands d_hidden to x; projections add theirs
    for t in range(length):
        for i in range(width):
            acc = d_x[t, i]
            for j in range(width):
                acc += d_q[t, j] * wq[i, j] + d_k[t, j] * wk[i, j] + d_v[t, j] * wv[i, j]
            d_x[t, i] = acc
    rate = lr[0, 0]
    d_w = np.empty((width, width), np.float32)
    for weight, d_head, out in ((wq, d_q, wq_out), (wk, d_k, wk_out), (wv, d_v, wv_out)):
        _weight_grad(x, d_head, d_w)
        for i in range(width):
            for j in range(width):
                out[i, j] = weight[i, j] - rate * d_w[i, j]
    for i in range(width):
        for j in range(width):
            wo_out[i, j] = wo[i, j] - rate * d_wo[i, j]
        for c in range(vocab):
            lm_head_out[i, c] = lm_head[i, c] - rate * d_lm_head[i, c]
    # gather adjoint: scatter-add rows of d_x into the ids' rows of embed
    embed_out[:, :] = embed
    for t in range(length):
        row = ids[0, t]
        for d in range(width):
            embed_out[row, d] -= rate * d_x[t, d]
    return loss
