"""B3: Section 23's 32-token greedy rollout from the prompt [1, 4, 2, 6] at T = 36.

One timed call generates all 32 tokens: each step re-forwards the length-36 buffer, takes the
argmax of row 3 + s and writes token 4 + s. tilegen compiles examples/storylm0_rollout.kina once
and its host loop reuses every buffer (`out=` for the logits, and `greedy_row` writes each id
into its [1, 1] slot of the token buffer); the report also divides by 32 for the per-token
figure. The guard compares the 36 ids with
storylm.reference.rollout run in float64.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from bench import storylm_data
from bench.common import (
    EXAMPLES,
    JAX,
    JAX_FORI,
    NUMBA,
    NUMPY,
    TILEGEN,
    TINY_TORCH_THREADS,
    TORCH,
    TORCH_COMPILE,
    Case,
    check_equal,
    measure,
    need,
    numpy_threads,
    tilegen_threads,
    timed_first_call,
    tiny_torch_threads,
    xla_threads,
)
from storylm import reference

GROUP = "B3 StoryLM-0 greedy rollout, 32 tokens"
PROGRAM = EXAMPLES / "storylm0_rollout.kina"
PROMPT = len(storylm_data.ROLLOUT_PROMPT)
STEPS = storylm_data.ROLLOUT_STEPS


def _guard(model: storylm_data.Model):
    wide = model.as_float64()
    weights = dict(zip(storylm_data.TRAINABLE, wide.weights(), strict=True), scale=wide.scale)
    expected = reference.rollout(list(storylm_data.ROLLOUT_PROMPT), weights, steps=STEPS,
                                 T=model.length)
    return lambda tokens: check_equal(f"{GROUP}: tokens", np.asarray(tokens).reshape(-1),
                                      expected)


def _tilegen(model, kina_function) -> Case:
    forward = kina_function(PROGRAM, "storylm0_rollout")
    greedy = kina_function(PROGRAM, "greedy_row")
    initial = storylm_data.rollout_ids()
    tokens = initial.copy()
    logits = np.empty((1, model.length, model.vocab), np.float32)
    embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(tokens)[1:]
    rows = [logits[:, read:read + 1, :] for read in range(PROMPT - 1, PROMPT - 1 + STEPS)]
    # greedy_row writes each new id straight into its place in the token buffer (a [1, 1]
    # view of it), where the next forward reads it.
    slots = [tokens[:, PROMPT + step:PROMPT + step + 1] for step in range(STEPS)]

    def rollout():
        tokens[:] = initial
        for row, slot in zip(rows, slots, strict=True):
            forward(tokens, embed, mask, scale, wq, wk, wv, wo, lm_head, out=logits)
            greedy(row, out=slot)
        return tokens

    return Case(rollout, _guard(model), tilegen_threads())


def _numpy(model, kina_function) -> Case:
    from bench.peers import numpy_storylm
    initial = storylm_data.rollout_ids()
    weights = model.forward_args(initial)[1:]

    embed, mask, scale, wq, wk, wv, wo, lm_head = weights
    heads = model.heads

    def rollout():
        tokens = initial.copy()
        for step in range(STEPS):
            logits = numpy_storylm.forward(tokens, embed, mask, scale, wq, wk, wv, wo, lm_head,
                                           heads=heads)
            tokens[0, PROMPT + step] = np.argmax(logits[0, PROMPT - 1 + step])
        return tokens

    return Case(rollout, _guard(model), numpy_threads())


def _torch(model, kina_function, compiled: bool = False) -> Case:
    torch = need("torch")
    from bench.peers import torch_storylm
    initial = torch.from_numpy(storylm_data.rollout_ids())
    weights = torch_storylm.tensors(*model.forward_args(storylm_data.rollout_ids())[1:])
    heads = model.heads

    def forward(tokens, *tensors):
        return torch_storylm.forward(tokens, *tensors, heads)

    extra = {}
    if compiled:
        forward = torch_storylm.compiled(forward)
        _, extra["compile_s"] = timed_first_call(lambda: forward(initial, *weights))

    def rollout():
        tokens = initial.clone()
        for step in range(STEPS):
            logits = forward(tokens, *weights)
            tokens[0, PROMPT + step] = torch.argmax(logits[0, PROMPT - 1 + step])
        return tokens

    guard = _guard(model)
    return Case(rollout, lambda tokens: guard(tokens.numpy()), TINY_TORCH_THREADS,
                context=tiny_torch_threads, extra=extra)


def _jax(model, kina_function, fori: bool = False) -> Case:
    need("jax")
    from bench.peers import jax_storylm
    initial, *weights = jax_storylm.device(*model.forward_args(storylm_data.rollout_ids()))
    guard = _guard(model)
    if fori:
        run_all = jax_storylm.jit_greedy_fori(model.heads, PROMPT, STEPS)

        def rollout():
            return run_all(initial, *weights).block_until_ready()
    else:
        # The Python host loop: one jitted forward + argmax + write per token (the step index
        # is a traced argument, so one compilation serves all 32 steps).
        greedy_step = jax_storylm.jit_greedy_step(model.heads, PROMPT)

        def rollout():
            tokens = initial
            for step in range(STEPS):
                tokens = greedy_step(tokens, step, *weights)
            return tokens.block_until_ready()

    _, compile_s = timed_first_call(rollout)
    return Case(rollout, lambda tokens: guard(np.asarray(tokens)), xla_threads(),
                extra={"compile_s": compile_s})


def _numba(model, kina_function) -> Case:
    need("numba")
    from bench.peers import numba_storylm
    initial = storylm_data.rollout_ids()
    tokens = initial.copy()
    logits = np.empty((1, model.length, model.vocab), np.float32)
    weights = model.forward_args(initial)[1:]

    embed, mask, scale, wq, wk, wv, wo, lm_head = weights
    heads = model.heads

    def rollout():
        tokens[:] = initial
        for step in range(STEPS):
            numba_storylm.greedy_step(tokens, step, PROMPT, embed, mask, scale, wq, wk, wv, wo,
                                      lm_head, heads, logits)
        return tokens

    _, compile_s = timed_first_call(rollout)
    return Case(rollout, _guard(model), 1, extra={"compile_s": compile_s})


BUILDERS = {
    TILEGEN: _tilegen,
    NUMPY: _numpy,
    TORCH: _torch,
    TORCH_COMPILE: partial(_torch, compiled=True),
    JAX: _jax,
    JAX_FORI: partial(_jax, fori=True),
    NUMBA: _numba,
}


@pytest.mark.parametrize("provider", list(BUILDERS))
def test_b3_rollout(benchmark, provider, storylm0_t36, kina_function, full_run_only):
    if provider == TORCH_COMPILE:
        full_run_only("torch.compile's first compile costs 10-30 s")
    case = BUILDERS[provider](storylm0_t36, kina_function)
    measure(benchmark, GROUP, provider, case, units=STEPS, unit="token")
