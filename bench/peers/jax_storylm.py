"""StoryLM in JAX: jitted forward and training step, and the lax.fori_loop variants that put
the whole 120-step training or the whole 32-token rollout in one compiled call."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np


def forward(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads: int):
    x = embed[ids]
    batch, length, width = x.shape

    def split(projected):
        return projected.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    probs = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) * scale + mask, axis=-1)
    attended = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, width)
    return (x + attended @ wo) @ lm_head


def nll(weights, ids, targets, mask, scale, heads: int):
    embed, wq, wk, wv, wo, lm_head = weights
    logits = forward(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_probs, targets[..., None], axis=-1).sum()


def step(weights, ids, targets, mask, scale, lr, heads: int):
    """(nll, weights') for one window."""
    loss, grads = jax.value_and_grad(nll)(weights, ids, targets, mask, scale, heads)
    return loss, tuple(w - lr * g for w, g in zip(weights, grads, strict=True))


def jit_forward(heads: int):
    return jax.jit(partial(forward, heads=heads))


def jit_step(heads: int):
    return jax.jit(partial(step, heads=heads))


def jit_train_fori(heads: int, steps: int):
    """All `steps` SGD steps in one call; step i uses window i mod len(windows). Returns the
    last step's loss and the trained weights."""

    def train(weights, window_ids, window_targets, mask, scale, lr):
        count = window_ids.shape[0]

        def body(i, carry):
            index = i % count
            return step(carry[1], window_ids[index], window_targets[index], mask, scale, lr,
                        heads)

        start = (jnp.zeros((), weights[0].dtype), tuple(weights))
        return jax.lax.fori_loop(0, steps, body, start)

    return jax.jit(train)


def _greedy_step(tokens, step, embed, mask, scale, wq, wk, wv, wo, lm_head, heads: int,
                 prompt_length: int):
    """Section 23 step: re-forward, argmax of row P-1+step, write token P+step."""
    logits = forward(tokens, embed, mask, scale, wq, wk, wv, wo, lm_head, heads)
    row = jax.lax.dynamic_index_in_dim(logits[0], prompt_length - 1 + step, 0, False)
    return tokens.at[0, prompt_length + step].set(jnp.argmax(row).astype(tokens.dtype))


def jit_greedy_step(heads: int, prompt_length: int):
    """One step per call, for a Python host loop: (tokens, step, weights...) -> tokens'."""
    return jax.jit(partial(_greedy_step, heads=heads, prompt_length=prompt_length))


def jit_greedy_fori(heads: int, prompt_length: int, steps: int):
    """Section 23's greedy loop in one call: re-forward, argmax of row P-1+s, write P+s."""

    def rollout(tokens, *weights):
        def body(step, buffer):
            return _greedy_step(buffer, step, *weights, heads, prompt_length)

        return jax.lax.fori_loop(0, steps, body, tokens)

    return jax.jit(rollout)


def device(*arrays: np.ndarray):
    """Put inputs on the CPU device once, as a JAX user holds them."""
    return tuple(jax.device_put(a) for a in arrays)
