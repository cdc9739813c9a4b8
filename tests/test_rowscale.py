"""Deferring softmax's row scaling into the p @ v that reads it (tilegen/rowscale.py):
when it applies, that it does not apply when p is read any other way, and results."""

from __future__ import annotations

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen import config
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.fission import fission_pass
from tilegen.loopir_parse import parse_kernel
from tilegen.pipeline import lower, prepare
from tilegen.rowscale import defer_row_scaling
from tilegen.runtime import program_of


def _ty(shape):
    return f"Tensor[F32, [{', '.join(str(d) for d in shape)}], @host]"


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _scaling_nests(kernel) -> int:
    """Top-level nests whose innermost statement is `B[idx] = B[idx] * s`."""
    count = 0
    for stmt in kernel.body:
        inner = stmt
        while isinstance(inner, L.For) and len(inner.body) == 1:
            inner = inner.body[0]
        if isinstance(inner, L.Store) and isinstance(inner.value, L.Binary) and \
                inner.value.op == "mul" and L.Load(inner.buffer, inner.index,
                                                   inner.value.dtype) in (inner.value.lhs,
                                                                          inner.value.rhs):
            count += 1
    return count


@pytest.mark.parametrize("heads,t,width", [(2, 36, 2), (1, 5, 3), (3, 17, 1), (2, 40, 7)])
def test_attention_scales_the_weighted_sums(heads, t, width):
    """softmax(s) @ v: p is never scaled; each output of p @ v is, once."""
    s, v, o = _ty((heads, t, t)), _ty((heads, t, width)), _ty((heads, t, width))
    source = f"fn f(s: {s}, v: {v}) -> {o} {{ return matmul(softmax(s, axis=2), v); }}"
    module = compile_program(program_from_text(source, "attention.kina"))
    kernel = program_of(module).plans["f"].kernel
    assert _scaling_nests(kernel) == 0
    assert parse_kernel(L.format_kernel(kernel)) == kernel
    rng = np.random.default_rng(heads * 100 + t)
    scores = (rng.standard_normal((heads, t, t)) * 3).astype(np.float32)
    scores[:, np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] = -1e9  # causal
    values = rng.standard_normal((heads, t, width)).astype(np.float32)
    want = _softmax(scores.astype(np.float64)) @ values.astype(np.float64)
    np.testing.assert_allclose(module.f(scores, values), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("case", ["p is a result too", "p read elementwise",
                                  "p on both sides"])
def test_other_readers_keep_the_scaling(case):
    """p a result as well (it must be written scaled), p read outside a sum over its rows,
    p in both factors of the product: p is scaled where it is produced, as before. 21 rows:
    fission splits the softmax (16 rows or more), so its scaling nest reaches the pass."""
    t, width = 21, 3
    body, first, second = {
        "p is a result too": ("return (matmul(p, v), p);", (t, width), (t, t)),
        "p read elementwise": ("return (matmul(p, v), mul(p, s));", (t, width), (t, t)),
        "p on both sides": ("return (matmul(p, transpose(p, [1, 0])), s);", (t, t), (t, t)),
    }[case]
    source = (f"fn f(s: {_ty((t, t))}, v: {_ty((t, width))}) -> ({_ty(first)}, "
              f"{_ty(second)}) {{ let p = softmax(s, axis=1); {body} }}")
    program = program_from_text(source, "readers.kina")
    options = config.load()
    before = fission_pass(lower(prepare(program, "f", options), options), options.target)
    assert _scaling_nests(before) == 1  # what the pass is asked to move
    assert defer_row_scaling(before) == before
    control = fission_pass(lower(prepare(program_from_text(
        source.replace(body, "return (matmul(p, v), s);").replace(
            f"-> ({_ty(first)}", f"-> ({_ty((t, width))}"), "control.kina"), "f", options),
        options), options.target)
    assert _scaling_nests(control) == 1 and _scaling_nests(defer_row_scaling(control)) == 0
    module = compile_program(program)
    assert _scaling_nests(program_of(module).plans["f"].kernel) == 1
    rng = np.random.default_rng(7)
    s = rng.standard_normal((t, t)).astype(np.float32)
    v = rng.standard_normal((t, width)).astype(np.float32)
    p = _softmax(s.astype(np.float64))
    want = {"p is a result too": (p @ v, p), "p read elementwise": (p @ v, p * s),
            "p on both sides": (p @ p.T, s)}[case]
    for got, expected in zip(module.f(s, v), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


_SCALED_THEN_READ = """kernel @f
  input  x: f32[3x5]
  input  v: f32[5x2]
  temp   b: f32[3x5]
  temp   s: f32[3]
  output out0: f32[3x2]
{
  for i in 0..3 {
    for j in 0..5 {
      b[i, j] = exp(x[i, j])
    }
  }
  for r in 0..3 {
    s[r] = (1.0:f32 / sum[k < 5](b[r, k]))
  }
  for i2 in 0..3 {
    for j2 in 0..5 {
      b[i2, j2] = (b[i2, j2] * s[i2])
    }
  }
  for o1 in 0..3 {
    for o2 in 0..2 {
      out0[o1, o2] = READ
    }
  }
}
"""


def test_a_summed_factor_takes_the_scale_at_its_own_row():
    text = _SCALED_THEN_READ.replace("READ", "sum[k2 < 5]((v[k2, o2] * b[o1, k2]))")
    kernel = parse_kernel(text)
    deferred = defer_row_scaling(kernel)
    assert len(deferred.body) == len(kernel.body) - 1
    assert "(sum[k2 < 5]((v[k2, o2] * b[o1, k2])) * s[o1])" in L.format_kernel(deferred)


@pytest.mark.parametrize("read", [
    "b[o1, o2]",                                        # a plain read
    "sum[k2 < 5]((b[o1, k2] + v[k2, o2]))",             # summed, but not as a factor
    "sum[k2 < 3]((b[k2, o2] * v[o2, o1]))",             # summed across rows
    "max[k2 < 5]((b[o1, k2] * v[k2, o2]))",             # not a sum
])
def test_any_other_read_keeps_the_scaling_pass(read):
    kernel = parse_kernel(_SCALED_THEN_READ.replace("READ", read))
    assert defer_row_scaling(kernel) == kernel
