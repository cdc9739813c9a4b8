"""B1: one StoryLM-0 forward at T = 36 (Section 23's padded prompt [1, 4, 2, 6]).

tilegen runs `storylm0_rollout` from examples/storylm0_rollout.kina; every provider writes or
returns the [1, 36, 8] logits, checked against storylm.reference in float64 before timing.
Also here: the call overhead with the same nine arguments and no work
(examples/bench/call_overhead.kina), against numba's dispatcher.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from bench import storylm_data
from bench.common import (
    BENCH_EXAMPLES,
    EXAMPLES,
    JAX,
    NUMBA,
    NUMPY,
    TILEGEN,
    TILEGEN_ATTRIBUTE,
    TINY_TORCH_THREADS,
    TORCH,
    TORCH_COMPILE,
    Case,
    check_close,
    compile_kina,
    measure,
    need,
    numpy_threads,
    tilegen_threads,
    timed_first_call,
    tiny_torch_threads,
    xla_threads,
)
from storylm import reference

GROUP = "B1 StoryLM-0 forward T=36"
PROGRAM = EXAMPLES / "storylm0_rollout.kina"


def _guard(model: storylm_data.Model, ids: np.ndarray):
    expected = reference.forward(*model.as_float64().forward_args(ids))
    return lambda logits: check_close(f"{GROUP} logits", logits, expected, rtol=1e-5)


# The Python-called providers (tilegen, NumPy, numba) are called with their nine arrays
# spelled out, as user code calls a function: `f(*args, out=o)` makes CPython build a
# keyword dict and an argument tuple on every call (~0.13 us, measured on tilegen's call).


def _tilegen(model, ids, kina_function) -> Case:
    function = kina_function(PROGRAM, "storylm0_rollout")
    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    out = np.empty((1, model.length, model.vocab), np.float32)
    return Case(lambda: function(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, out=out),
                _guard(model, ids), tilegen_threads())


def _tilegen_attribute(model, ids, kina_function) -> Case:
    """The same call written `module.storylm0_rollout(...)`, the attribute looked up on every
    call as user loops do (it is a plain instance attribute once compiled)."""
    kina_function(PROGRAM, "storylm0_rollout")  # compiled once, outside the timing
    module = compile_kina(PROGRAM)  # the in-memory cache's module
    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    out = np.empty((1, model.length, model.vocab), np.float32)
    return Case(lambda: module.storylm0_rollout(ids, embed, mask, scale, wq, wk, wv, wo,
                                                lm_head, out=out),
                _guard(model, ids), tilegen_threads())


def _numpy(model, ids, kina_function) -> Case:
    from bench.peers import numpy_storylm
    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    heads = model.heads
    return Case(lambda: numpy_storylm.forward(ids, embed, mask, scale, wq, wk, wv, wo,
                                              lm_head, heads=heads),
                _guard(model, ids), numpy_threads())


def _torch(model, ids, kina_function, compiled: bool = False) -> Case:
    need("torch")
    from bench.peers import torch_storylm
    args = torch_storylm.tensors(*model.forward_args(ids))
    heads = model.heads

    def forward(*tensors):
        return torch_storylm.forward(*tensors, heads)

    extra = {}
    if compiled:
        forward = torch_storylm.compiled(forward)
        _, extra["compile_s"] = timed_first_call(lambda: forward(*args))
    guard = _guard(model, ids)
    return Case(lambda: forward(*args), lambda logits: guard(logits.numpy()),
                TINY_TORCH_THREADS, context=tiny_torch_threads, extra=extra)


def _jax(model, ids, kina_function) -> Case:
    need("jax")
    from bench.peers import jax_storylm
    forward = jax_storylm.jit_forward(model.heads)
    args = jax_storylm.device(*model.forward_args(ids))
    _, compile_s = timed_first_call(lambda: forward(*args).block_until_ready())
    guard = _guard(model, ids)
    return Case(lambda: forward(*args).block_until_ready(), lambda y: guard(np.asarray(y)),
                xla_threads(), extra={"compile_s": compile_s})


def _numba(model, ids, kina_function) -> Case:
    need("numba")
    from bench.peers import numba_storylm
    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    heads = model.heads
    out = np.empty((1, model.length, model.vocab), np.float32)

    def call():
        numba_storylm.forward_into(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads, out)
        return out

    _, compile_s = timed_first_call(call)
    return Case(call, _guard(model, ids), 1, extra={"compile_s": compile_s})


BUILDERS = {
    TILEGEN: _tilegen,
    TILEGEN_ATTRIBUTE: _tilegen_attribute,
    NUMPY: _numpy,
    TORCH: _torch,
    TORCH_COMPILE: partial(_torch, compiled=True),
    JAX: _jax,
    NUMBA: _numba,
}


@pytest.mark.parametrize("provider", list(BUILDERS))
def test_b1_forward(benchmark, provider, storylm0_t36, kina_function, full_run_only):
    if provider == TORCH_COMPILE:
        full_run_only("torch.compile's first compile costs 10-30 s")
    case = BUILDERS[provider](storylm0_t36, storylm_data.rollout_ids(), kina_function)
    measure(benchmark, GROUP, provider, case, units=1, unit="call")


# --------------------------------------------------------------------------- call overhead

OVERHEAD_GROUP = "B1 call overhead, 9 arguments"
OVERHEAD_PROGRAM = BENCH_EXAMPLES / "call_overhead.kina"


def _overhead_tilegen(model, ids, kina_function) -> Case:
    function = kina_function(OVERHEAD_PROGRAM, "call_overhead")
    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    out = np.empty((1, 1, 1, 1), np.float32)
    return Case(lambda: function(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, out=out),
                _overhead_guard(model), tilegen_threads())


def _overhead_tilegen_attribute(model, ids, kina_function) -> Case:
    kina_function(OVERHEAD_PROGRAM, "call_overhead")
    module = compile_kina(OVERHEAD_PROGRAM)
    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    out = np.empty((1, 1, 1, 1), np.float32)
    return Case(lambda: module.call_overhead(ids, embed, mask, scale, wq, wk, wv, wo, lm_head,
                                             out=out),
                _overhead_guard(model), tilegen_threads())


def _overhead_numba(model, ids, kina_function) -> Case:
    need("numba")
    from numba import njit

    @njit(cache=False)
    def call_overhead(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, out):
        out[0, 0, 0, 0] = -scale[0, 0, 0, 0]

    ids, embed, mask, scale, wq, wk, wv, wo, lm_head = model.forward_args(ids)
    out = np.empty((1, 1, 1, 1), np.float32)

    def call():
        call_overhead(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, out)
        return out

    _, compile_s = timed_first_call(call)
    return Case(call, _overhead_guard(model), 1, extra={"compile_s": compile_s})


def _overhead_guard(model):
    return lambda out: check_close(OVERHEAD_GROUP, out, -model.scale.astype(np.float64),
                                   rtol=0, atol=0)


OVERHEAD_BUILDERS = {TILEGEN: _overhead_tilegen, TILEGEN_ATTRIBUTE: _overhead_tilegen_attribute,
                     NUMBA: _overhead_numba}


@pytest.mark.parametrize("provider", list(OVERHEAD_BUILDERS))
def test_b1_call_overhead(benchmark, provider, storylm0_t36, kina_function):
    """The cost of one call with StoryLM's nine arrays (and out=) and no work: tilegen's
    Python-to-native crossing against numba's dispatcher."""
    case = OVERHEAD_BUILDERS[provider](storylm0_t36, storylm_data.rollout_ids(), kina_function)
    measure(benchmark, OVERHEAD_GROUP, provider, case, units=1, unit="call")
