"""How a packed gemm is split across threads, read from the scheduled loop IR, and its
numbers against NumPy in float64 at odd sizes: a batched product is threaded by the work
of all its entries (attention's q @ k^T and p @ v over B x H heads, each head too small on
its own), a tiny one stays on one thread, and an operand that packing would evaluate more
than once is stored first when it is dear (a contraction read by the next product)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tilegen.api import compile_program
from tilegen.gemm_tiles import GEMM_PARALLEL_WORK
from tilegen.loopir import Gemm, Load, Reduce, subexpressions
from tilegen.runtime import program_of


def _ty(shape):
    return f"Tensor[F32, [{', '.join(str(d) for d in shape)}], @host]"


def _compile(source, threads, monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    return compile_program(program_from_text(source))


def _gemms(module, name="f"):
    return [s for s in program_of(module).plans[name].kernel.body if isinstance(s, Gemm)]


def _close(got, exact, a_abs_b_abs, k):
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(k) * a_abs_b_abs
    return np.all(np.abs(got - exact) <= bound + 1e-30)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(batch=st.tuples(st.integers(1, 5), st.integers(2, 13)),
       m=st.integers(45, 99), n=st.integers(37, 75), k=st.integers(40, 67))
def test_batched_gemm_is_threaded_by_its_whole_work(batch, m, n, k, monkeypatch):
    source = (f"fn f(a: {_ty(batch + (m, k))}, b: {_ty(batch + (k, n))}) -> "
              f"{_ty(batch + (m, n))} {{ return matmul(a, b); }}")
    module = _compile(source, 2, monkeypatch)
    (gemm,) = _gemms(module)
    assert gemm.batch_extents == batch
    assert 2 * m * n * k < GEMM_PARALLEL_WORK  # one entry alone would run on one thread
    whole = 2 * m * n * k * math.prod(batch)
    assert gemm.threads == (2 if whole >= GEMM_PARALLEL_WORK else 1)
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    b = rng.standard_normal(batch + (k, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert _close(module.f(a, b), exact, np.abs(a).astype(np.float64) @ np.abs(b), k)


def test_heads_too_small_alone_are_split_across_threads(monkeypatch):
    """12 heads of 8 sentences, 47 tokens: one head's q @ k^T is 2 x 47 x 47 x 32 flops,
    far below the threshold; all 96 are far above it."""
    heads, t, d = (8, 12), 47, 32
    assert 2 * t * t * d < GEMM_PARALLEL_WORK <= 2 * t * t * d * 96
    source = f"""
fn f(q: {_ty(heads + (t, d))}, k: {_ty(heads + (t, d))}, v: {_ty(heads + (t, d))})
    -> ({_ty(heads + (t, t))}, {_ty(heads + (t, d))}) {{
  let s = matmul(q, transpose(k, [0, 1, 3, 2]));
  return (s, matmul(s, v));
}}"""
    module = _compile(source, 2, monkeypatch)
    gemms = _gemms(module)
    assert len(gemms) == 2 and all(g.threads == 2 for g in gemms)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(heads + (t, d)).astype(np.float32) for _ in range(3))
    scores, out = module.f(q, k, v)
    exact = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)
    np.testing.assert_allclose(scores, exact, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out, exact @ v.astype(np.float64), rtol=1e-5, atol=2e-3)


def test_contraction_read_twice_by_packing_is_stored_first(monkeypatch):
    """(p @ v) @ w with p @ v too small for a gemm of its own: w's product splits its 2000
    columns across 2 threads, each packing all of A, so the contraction is stored once
    instead of being recomputed (one 13-term dot product per element) by both threads; a
    cheap producer read by the same packing is not."""
    source = f"""
fn f(p: {_ty((19, 13))}, v: {_ty((13, 33))}, w: {_ty((33, 2000))}, x: {_ty((19, 33))})
    -> ({_ty((19, 2000))}, {_ty((19, 2000))}) {{
  return (matmul(matmul(p, v), w), matmul(x * 0.5 + 1.0, w));
}}"""
    module = _compile(source, 2, monkeypatch)
    contraction, cheap = _gemms(module)
    assert contraction.threads == cheap.threads == 2
    assert not any(isinstance(e, Reduce) for e in subexpressions(contraction.a_elem))
    # x * 0.5 + 1 costs less than a store and a reload: still computed while packing.
    assert any(isinstance(e, Load) and e.buffer == "x" for e in subexpressions(cheap.a_elem))
    rng = np.random.default_rng(11)
    p, v, w, x = (rng.standard_normal(s).astype(np.float32)
                  for s in ((19, 13), (13, 33), (33, 2000), (19, 33)))
    first, second = module.f(p, v, w, x)
    np.testing.assert_allclose(first, (p.astype(np.float64) @ v) @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(second, (x.astype(np.float64) * 0.5 + 1.0) @ w, rtol=1e-5,
                               atol=1e-4)
