"""Fusing an element-wise producer into the nest that consumes it (tilegen/producer_fusion.py):
the temporary goes where every read is at the consumer's own element, stays where any read
is elsewhere, and results match the interpreter and float64 NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from kina_frontend.interpreter import interpret
from tilegen import config
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.loopir_parse import parse_kernel
from tilegen.pipeline import lower, prepare
from tilegen.producer_fusion import fuse_producers_pass
from tilegen.target import host_target


def _ty(shape, dtype="F32"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _split_source(rows, cols):
    """A GELU read three times by a bf16 hi/lo split: the shape bf16x3 gives MiniLM's FFN."""
    return (f"fn f(x: {_ty((rows, cols))}) -> {_ty((rows, 3 * cols), 'BF16')} {{\n"
            f"  let g = gelu(x);\n"
            f"  return concat(cast(g, BF16), cast(g, BF16), "
            f"cast(g - cast(cast(g, BF16), F32), BF16), axis=1);\n}}")


def _lowered(source):
    options = config.load()
    return lower(prepare(program_from_text(source, "fusion.kina"), "f", options), options)


def _temps(kernel):
    return [b.name for b in kernel.buffers if b.role == "temp"]


def _gelu64(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


@pytest.mark.parametrize("rows, cols", [(1, 17), (2, 1), (3, 17), (7, 50), (33, 129)])
def test_a_gelu_read_by_a_split_is_computed_in_the_split(rows, cols):
    kernel = _lowered(_split_source(rows, cols))
    assert len(_temps(kernel)) == 1  # the GELU, stored because it has three readers
    fused = fuse_producers_pass(kernel, host_target())
    assert _temps(fused) == []
    (nest,) = fused.body
    lets = [s for s in L.statements([nest]) if isinstance(s, L.Let)]
    assert len(lets) == 1 and L.contains(lets[0].value, (L.Unary,))  # erf, computed once
    assert parse_kernel(L.format_kernel(fused), verify=True) == fused

    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    module = compile_program(program_from_text(_split_source(rows, cols), "fusion.kina"))
    out = np.asarray(module.f(x)).astype(np.float32)
    hi, again, lo = out[:, :cols], out[:, cols:2 * cols], out[:, 2 * cols:]
    np.testing.assert_array_equal(hi, again)
    exact = _gelu64(x.astype(np.float64))
    np.testing.assert_allclose(hi.astype(np.float64) + lo, exact, rtol=2e-5, atol=1e-6)
    # hi is the bf16 rounding of GELU: within half a bf16 ulp of it (plus the f32 erf's error)
    assert np.all(np.abs(hi - exact) <= np.abs(exact) * 2.0 ** -8 + 1e-6)


def test_a_read_at_another_element_keeps_the_temporary():
    source = (f"fn f(x: {_ty((9, 9))}) -> {_ty((9, 9))} {{\n"
              f"  let e = exp(x);\n  return e + transpose(e, [1, 0]);\n}}")
    kernel = _lowered(source)
    assert len(_temps(kernel)) == 1
    assert fuse_producers_pass(kernel, host_target()) == kernel
    x = np.random.default_rng(3).standard_normal((9, 9)).astype(np.float32)
    module = compile_program(program_from_text(source, "fusion.kina"))
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(module.f(x), e + e.T, rtol=1e-6)


def test_a_temporary_read_by_a_later_nest_too_is_kept():
    """The producer's value also feeds a reduction after the consumer: fusing would leave
    that reader without its buffer."""
    source = (f"fn f(x: {_ty((5, 19))}) -> {_ty((5,))} {{\n"
              f"  let s = sigmoid(x);\n  let t = s * s + s;\n"
              f"  return sum(t, axis=1) + sum(s, axis=1);\n}}")
    kernel = fuse_producers_pass(_lowered(source), host_target())
    x = np.random.default_rng(5).standard_normal((5, 19)).astype(np.float32)
    s = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    module = compile_program(program_from_text(source, "fusion.kina"))
    np.testing.assert_allclose(module.f(x), (s * s + s).sum(1) + s.sum(1), rtol=1e-5)
    assert parse_kernel(L.format_kernel(kernel), verify=True) == kernel


UNARY = ["exp", "erf", "gelu", "sigmoid", "tanh", "silu"]


@st.composite
def _programs(draw):
    rows = draw(st.integers(1, 21))
    cols = draw(st.integers(1, 41))
    op = draw(st.sampled_from(UNARY))
    consumer = draw(st.sampled_from([
        "concat(v, v * 2.0, axis=1)",
        "concat(cast(v, BF16), cast(v - cast(cast(v, BF16), F32), BF16), axis=1)",
        "where(greater(v, 0.25), v, v * v)",
        "v * v + v",
        "maximum(v, v * 0.5) - v",
    ]))
    return rows, cols, op, consumer


@settings(max_examples=30, deadline=None)
@given(_programs())
def test_generated_producers_and_consumers_match_the_interpreter(case):
    rows, cols, op, consumer = case
    body = f"let v = {op}(x);\n  return {consumer};"
    widths = 2 * cols if consumer.startswith("concat") else cols
    dtype = "BF16" if "BF16" in consumer else "F32"
    source = f"fn f(x: {_ty((rows, cols))}) -> {_ty((rows, widths), dtype)} {{\n  {body}\n}}"
    program = program_from_text(source, "generated.kina")
    x = np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols))
    x = x.astype(np.float32)
    expected = np.asarray(interpret(program, "f", x)[0], dtype=np.float64)
    got = np.asarray(compile_program(program).f(x)).astype(np.float64)
    tolerance = 2.0 ** -7 if dtype == "BF16" else 1e-5
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=1e-6)
