"""Loop fission of short row passes (tilegen/fission.py): which nests are split, that the
split prints and parses back, and that the results still match NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen import config
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.fission import MAX_ROW_EXTENT, fission_pass
from tilegen.loopir_parse import parse_kernel
from tilegen.runtime import program_of

TARGET = config.load().target


def _ty(shape, dtype="F32"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _compile(op, shape, axis, dtype="F32"):
    ty = _ty(shape, dtype)
    source = f"fn f(x: {ty}) -> {ty} {{ return {op}(x, axis={axis}); }}"
    return compile_program(program_from_text(source, "rows.kina"))


def _reference(op, x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    if op == "log_softmax":
        return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    e = np.exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("op,nests", [("softmax", 4), ("log_softmax", 3)])
@pytest.mark.parametrize("shape,axis", [((72, 36), 1), ((2, 36, 36), 2), ((3, 5, 17), 1),
                                        ((17, 1), 1), ((130, 3), 1), ((16, 128), 1)])
@pytest.mark.parametrize("dtype", ["F32", "F64"])
def test_short_row_passes_run_one_nest_per_step(op, nests, shape, axis, dtype):
    """softmax: max, exp, sum and 1/sum, scale; log_softmax: max, sum and log, subtract.
    Row extents not multiples of the vector width, a single-element row, and masked
    entries (whole vectors that underflow)."""
    module = _compile(op, shape, axis, dtype)
    kernel = program_of(module).plans["f"].kernel
    assert len(kernel.body) == nests
    assert len(kernel.buffers) == 4  # x, out0 and two kept row scalars (max, 1/sum or log)
    rng = np.random.default_rng(sum(shape) + axis)
    x = (rng.standard_normal(shape) * 4).astype(np.float32 if dtype == "F32" else np.float64)
    x.reshape(-1)[::5] = -1e9
    want = _reference(op, x.astype(np.float64), axis)
    tolerance = 2e-6 if dtype == "F32" else 1e-13
    np.testing.assert_allclose(module.f(x), want, rtol=tolerance, atol=tolerance)


def test_few_rows_stay_one_pass():
    """8 rows: little to overlap, and every split step costs compile time."""
    module = _compile("softmax", (8, 36), 1)
    assert len(program_of(module).plans["f"].kernel.body) == 1


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_long_rows_stay_one_pass(op):
    """Rows longer than MAX_ROW_EXTENT keep every step in one nest: the row stays in L1
    between steps, and its own chain keeps the core busy."""
    shape = (3, MAX_ROW_EXTENT + 1)
    module = _compile(op, shape, 1)
    assert len(program_of(module).plans["f"].kernel.body) == 1
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(module.f(x), _reference(op, x.astype(np.float64), 1),
                               rtol=2e-6, atol=2e-6)


def test_large_buffers_stay_one_pass():
    """Short rows but more data than L2 holds: each split step would stream it again."""
    module = _compile("softmax", (8192, 64), 1)
    assert len(program_of(module).plans["f"].kernel.body) == 1


def test_split_kernel_prints_and_parses_back():
    kernel = program_of(_compile("softmax", (72, 36), 1)).plans["f"].kernel
    assert parse_kernel(L.format_kernel(kernel)) == kernel
    text = L.format_kernel(kernel)
    assert "row_max_rows[" in text and "row_inverse_rows[" in text


_ROW_SHARED_TEMP = """kernel @f
  input  x: f32[16x8]
  temp   t: f32[8]
  output out0: f32[16x8]
{
  for i in 0..16 {
    for j in 0..8 {
      t[j] = (x[i, j] * 2.0:f32)
    }
    let s: f32 = sum[r < 8](t[r])
    for j2 in 0..8 {
      out0[i, j2] = (t[j2] / s)
    }
  }
}
"""

_ROW_PRIVATE = _ROW_SHARED_TEMP.replace("temp   t: f32[8]", "temp   t: f32[16x8]") \
    .replace("t[j]", "t[i, j]").replace("t[r]", "t[i, r]").replace("t[j2]", "t[i, j2]")


def test_a_temporary_shared_by_all_rows_blocks_the_split():
    """`t` holds one row at a time: running the first step for every row before the
    second would leave only the last row in it."""
    kernel = parse_kernel(_ROW_SHARED_TEMP)
    assert fission_pass(kernel, TARGET) == kernel


def test_a_row_private_temporary_splits():
    """Three steps; the first (a cheap row of t) and the second (its sum) are then joined
    again as producer and row reduction, so two nests remain."""
    kernel = parse_kernel(_ROW_PRIVATE)
    split = fission_pass(kernel, TARGET)
    assert len(split.body) == 2
    assert [b.name for b in split.buffers if b.name not in ("x", "t", "out0")] == ["s_rows"]
    assert split.buffer("s_rows").shape == (16,)
    assert parse_kernel(L.format_kernel(split)) == split


def test_id_checks_stay_in_one_nest():
    """A failing id must be reported at the same place: nests with checks are not split."""
    text = """kernel @f
  input  ids: i64[4]
  input  table: f32[8x3]
  output out0: f32[4x3]
  check 0: gather "t.kina:1:1" limit 8 ids [4] from ids
{
  for i in 0..4 {
    let row: i64 = checked(ids[i] < 8, site 0, at [i])
    for j in 0..3 {
      out0[i, j] = table[row, j]
    }
  }
}
"""
    kernel = parse_kernel(text)
    assert fission_pass(kernel, TARGET) == kernel


def test_a_row_reduction_joins_the_nest_that_produced_the_row():
    """scores = a @ b * 0.5, then softmax: the row max is taken in the scores nest, right
    after each row is stored (no second pass over the scores); the exp step is not merged
    into anything."""
    source = (f"fn f(a: {_ty((20, 6))}, b: {_ty((6, 30))}) -> {_ty((20, 30))} "
              f"{{ return softmax(mul(matmul(a, b), 0.5), axis=1); }}")
    module = compile_program(program_from_text(source, "scores.kina"))
    kernel = program_of(module).plans["f"].kernel
    first = kernel.body[0]
    assert isinstance(first, L.For) and isinstance(first.body[0], L.For)
    row = first.body
    assert isinstance(row[0], L.For) and any(
        isinstance(s, (L.Let, L.Store)) and L.contains(s.value, (L.Reduce,))
        and s.value.op == "maxnum" for s in row[1:] if isinstance(s.value, L.Reduce))
    assert len(kernel.body) == 4  # scores + max, exp, sum and 1/sum, scale
    rng = np.random.default_rng(11)
    a = rng.standard_normal((20, 6)).astype(np.float32)
    b = rng.standard_normal((6, 30)).astype(np.float32)
    scores = (a.astype(np.float64) @ b) * 0.5
    np.testing.assert_allclose(module.f(a, b), _reference("softmax", scores, 1), rtol=2e-6,
                               atol=1e-7)


_PRODUCER_THEN_REDUCTION = """kernel @f
  input  x: f32[4x8]
  temp   t: f32[4x8]
  output out0: f32[4]
{
  for i in 0..4 {
    for j in 0..8 {
      t[i, j] = (x[i, j] * 2.0:f32)
    }
  }
  for r in 0..4 {
    out0[r] = sum[k < 8](READ)
  }
}
"""


def test_a_reduction_of_its_own_row_merges():
    kernel = parse_kernel(_PRODUCER_THEN_REDUCTION.replace("READ", "t[r, k]"))
    merged = fission_pass(kernel, TARGET)
    assert len(merged.body) == 1
    assert "out0[i] = sum[k < 8](t[i, k])" in L.format_kernel(merged)


@pytest.mark.parametrize("read", ["t[((r + 1) % 4), k]", "t[0, k]"])
def test_a_reduction_of_another_row_stays_apart(read):
    """Row r + 1 (or row 0) is not written yet when row r would run its reduction."""
    kernel = parse_kernel(_PRODUCER_THEN_REDUCTION.replace("READ", read))
    assert fission_pass(kernel, TARGET) == kernel
