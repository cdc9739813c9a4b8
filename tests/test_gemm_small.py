"""Products of few rows with B streamed in place (tilegen/gemm_small.py): chosen by shape for
any program, against float64 at odd M, N, K (one or two row blocks, partial column strips,
depths not a multiple of the vector), batched with per-entry and broadcast B, transposed
and computed A, f64, 1 and 2 threads; B read up to its last element and not past it."""

from __future__ import annotations

import ctypes
import mmap
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import interpret, program_from_text
from tilegen import gemm_small
from tilegen.api import compile_program
from tilegen.loopir import Gemm, format_kernel
from tilegen.loopir_parse import parse_kernel
from tilegen.runtime import program_of


def _ty(shape, dtype="F32"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _compile(source, threads, monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    program = program_from_text(source)
    return program, compile_program(program)


def _gemms(module, name="f"):
    return [s for s in program_of(module).plans[name].kernel.body if isinstance(s, Gemm)]


def _bound(a, b, k):
    """The float32 summation error bound of a @ b (float64 inputs)."""
    return 4 * np.finfo(np.float32).eps * np.sqrt(k) * (np.abs(a) @ np.abs(b)) + 1e-30


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(16, 384, 1536), (1, 1777, 45), (5, 45, 300), (17, 300, 37),
                                   (25, 129, 1000), (32, 33, 513), (24, 170, 17), (7, 1200, 8)])
def test_few_rows_stream_b_in_place(m, k, n, threads, monkeypatch):
    source = (f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n))} "
              "{ return matmul(a, b); }")
    _, module = _compile(source, threads, monkeypatch)
    (gemm,) = _gemms(module)
    assert gemm.tiles.b_in_place and gemm.tiles.mr * -(-m // gemm.tiles.mr) >= m
    rng = np.random.default_rng(m * 31 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(module.f(a, b) - exact) <= _bound(a, b, k))


def test_more_rows_keep_the_packed_path(monkeypatch):
    source = (f"fn f(a: {_ty((gemm_small.SMALL_M + 1, 64))}, b: {_ty((64, 100))}) -> "
              f"{_ty((gemm_small.SMALL_M + 1, 100))} {{ return matmul(a, b); }}")
    _, module = _compile(source, 2, monkeypatch)
    assert not _gemms(module)[0].tiles.b_in_place


def _guarded(shape, fill):
    """A float32 array of `shape` whose last element ends where an inaccessible page starts,
    so a load past its end faults."""
    nbytes = int(np.prod(shape)) * 4
    pages = -(-nbytes // mmap.PAGESIZE)
    mapping = mmap.mmap(-1, (pages + 1) * mmap.PAGESIZE)
    raw = np.frombuffer(mapping, np.uint8)
    guard = raw.ctypes.data + pages * mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(guard, mmap.PAGESIZE, 0) == 0  # PROT_NONE
    start = pages * mmap.PAGESIZE - nbytes
    array = raw[start:start + nbytes].view(np.float32).reshape(shape)
    array[...] = fill
    return array, mapping


@pytest.mark.parametrize("threads", [1, 2])
def test_b_is_not_read_past_its_last_element(threads, monkeypatch):
    """The last column strip of B is partial (N = 37): its row loads are masked, so B's last
    row, ending against a PROT_NONE page, is read without touching that page."""
    m, k, n = 16, 200, 37
    source = (f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n))} "
              "{ return matmul(a, b); }")
    _, module = _compile(source, threads, monkeypatch)
    assert _gemms(module)[0].tiles.b_in_place
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float32)
    values = rng.standard_normal((k, n)).astype(np.float32)
    b, mapping = _guarded((k, n), values)
    exact = a.astype(np.float64) @ values.astype(np.float64)
    assert np.all(np.abs(module.f(a, b) - exact) <= _bound(a, values, k))
    del b, mapping


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_transposed_and_computed_operands(threads, monkeypatch):
    """Batched products of 7 and 19 rows: B per batch entry, B a broadcast matrix (batch
    stride 0), A transposed, A computed while packing (exp), and a transposed B that is not
    contiguous along the columns (the packed path), against the NumPy interpreter."""
    source = f"""
fn f(q: {_ty((2, 3, 7, 400))}, k: {_ty((2, 3, 400, 50))}, w: {_ty((400, 61))},
     x: {_ty((2, 3, 400, 19))}, v: {_ty((2, 3, 50, 400))})
    -> ({_ty((2, 3, 7, 50))}, {_ty((2, 3, 19, 61))}, {_ty((2, 3, 19, 61))},
        {_ty((2, 3, 7, 50))}) {{
  let per_entry = matmul(q, k);
  let shared = matmul(transpose(x, [0, 1, 3, 2]), broadcast(w, [2, 3, 400, 61]));
  let computed = matmul(exp(transpose(x, [0, 1, 3, 2]) * 0.1), broadcast(w, [2, 3, 400, 61]));
  let packed = matmul(q, transpose(v, [0, 1, 3, 2]));
  return (per_entry, shared, computed, packed);
}}"""
    program, module = _compile(source, threads, monkeypatch)
    in_place = [g.tiles.b_in_place for g in _gemms(module)]
    assert in_place == [True, True, True, False]
    rng = np.random.default_rng(8)
    inputs = [rng.standard_normal(s).astype(np.float32)
              for s in ((2, 3, 7, 400), (2, 3, 400, 50), (400, 61), (2, 3, 400, 19),
                        (2, 3, 50, 400))]
    for got, want in zip(module.f(*inputs), interpret(program, "f", *inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_f64_few_rows(monkeypatch):
    source = (f"fn f(a: {_ty((9, 700), 'F64')}, b: {_ty((700, 45), 'F64')}) -> "
              f"{_ty((9, 45), 'F64')} {{ return matmul(a, b); }}")
    _, module = _compile(source, 2, monkeypatch)
    assert _gemms(module)[0].tiles.b_in_place
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((9, 700)), rng.standard_normal((700, 45))
    np.testing.assert_allclose(module.f(a, b), a @ b, rtol=1e-12, atol=1e-12)


def test_a_dear_to_recompute_is_stored_once_for_both_threads(monkeypatch):
    """Both threads pack all of A (they split the columns): a contraction as A is stored
    first rather than computed twice, as gemm_tiles.operand_evaluations does for the packed path."""
    source = f"""
fn f(p: {_ty((16, 13))}, v: {_ty((13, 33))}, w: {_ty((33, 2000))})
    -> {_ty((16, 2000))} {{
  return matmul(matmul(p, v), w);
}}"""
    _, module = _compile(source, 2, monkeypatch)
    (gemm,) = _gemms(module)
    assert gemm.tiles.b_in_place and gemm.threads == 2
    assert gemm_small.operand_evaluations(16, 2000, 1, gemm.tiles, 2) == (2, 1)
    from tilegen.loopir import Load, subexpressions
    assert all(not isinstance(e, Load) or e.buffer != "p" for e in subexpressions(gemm.a_elem))
    rng = np.random.default_rng(12)
    p, v, w = (rng.standard_normal(s).astype(np.float32) for s in ((16, 13), (13, 33), (33, 2000)))
    np.testing.assert_allclose(module.f(p, v, w), (p.astype(np.float64) @ v) @ w, rtol=1e-5,
                               atol=1e-4)


def test_loop_ir_round_trip_keeps_b_in_place(monkeypatch):
    source = (f"fn f(a: {_ty((16, 64))}, b: {_ty((64, 100))}) -> {_ty((16, 100))} "
              "{ return matmul(a, b); }")
    _, module = _compile(source, 2, monkeypatch)
    kernel = program_of(module).plans["f"].kernel
    text = format_kernel(kernel)
    assert "b=in_place" in text
    assert format_kernel(parse_kernel(text)) == text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, gemm_small.SMALL_M), n=st.integers(8, 400), k=st.integers(8, 700),
       batch=st.sampled_from([1, 3]), threads=st.sampled_from([1, 2]))
def test_generated_small_products(m, n, k, batch, threads):
    k = max(k, -(-(1 << 16) // (m * n)))  # a gemm at all (lower.gemm_pays)
    shape_a, shape_b, shape_c = (batch, m, k), (batch, k, n), (batch, m, n)
    source = (f"fn f(a: {_ty(shape_a)}, b: {_ty(shape_b)}) -> {_ty(shape_c)} "
              "{ return matmul(a, b); }")
    with mock.patch.dict(os.environ, {"TILEGEN_NUM_THREADS": str(threads)}):
        module = compile_program(program_from_text(source))
    assert _gemms(module)[0].tiles.b_in_place
    rng = np.random.default_rng(m * 1_000_003 + n * 1009 + k)
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(module.f(a, b) - exact) <= _bound(a, b, k))


def test_bf16_storage_b_widened_on_load_is_packed(monkeypatch):
    """BF16 operands computed in f32 (TILEGEN_BF16_DOT=0): B's loads widen 16-bit storage,
    so B is packed (widened while packing), not read in place as if it held f32."""
    import ml_dtypes

    monkeypatch.setenv("TILEGEN_BF16_DOT", "0")
    m, k, n = 13, 600, 70
    source = (f"fn f(a: {_ty((m, k), 'BF16')}, b: {_ty((k, n), 'BF16')}) -> "
              f"{_ty((m, n))} {{ return matmul(a, b); }}")
    _, module = _compile(source, 2, monkeypatch)
    (gemm,) = _gemms(module)
    assert gemm.dtype == "f32" and not gemm.tiles.b_in_place
    rng = np.random.default_rng(6)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    assert np.all(np.abs(module.f(a, b) - wide_a @ wide_b) <= _bound(wide_a, wide_b, k))


@pytest.mark.parametrize("registers", [16, 32])
def test_register_blocks_fit_and_load_least(registers):
    """Every row count gets blocks whose accumulators fit in 3/4 of the registers and that
    load no more per multiply-add than any other fitting block (counted here directly:
    each k step loads mr broadcasts and `parts` vectors per row block); one sentence's 16
    rows on AVX-512 take two blocks of 8, not one block of 16 with one vector of columns."""
    from types import SimpleNamespace
    target = SimpleNamespace(vector_registers=registers)
    budget = registers * 3 // 4
    for m in range(1, gemm_small.SMALL_M + 1):
        mr, parts = gemm_small.row_blocks(m, target)
        assert 1 <= mr <= m and 1 <= parts <= gemm_small.MAX_PARTS
        assert mr * parts <= budget

        def loads(mr, parts, m=m):
            blocks = -(-m // mr)
            return blocks * mr + blocks * parts, parts  # broadcasts + B vectors, columns
        chosen, columns = loads(mr, parts)
        for other_mr in range(1, m + 1):
            for other_parts in range(1, gemm_small.MAX_PARTS + 1):
                if other_mr * other_parts <= budget:
                    other, other_columns = loads(other_mr, other_parts)
                    assert chosen * other_columns <= other * columns + 1e-9, (m, mr, parts)
    assert gemm_small.row_blocks(16, SimpleNamespace(vector_registers=32)) == (8, 3)


def test_b_rows_are_prefetched_into_l2_one_depth_block_on():
    """Each k step of the kernel prefetches B's row one depth block (16 rows) on with
    locality 2 (prefetcht1: into L2, not L1), one prefetch per vector of columns."""
    from types import SimpleNamespace

    from llvmlite import ir

    assert gemm_small.small_m_tiles("f32", 16, 1536, 384, SimpleNamespace(
        vector_registers=32, lanes=lambda dtype: 16)).kc == 16
    module = ir.Module()
    gemm_small.small_m_kernel_function(module, "f32", 8, 3, 16, 384, 1536, 16)
    text = str(module)
    calls = [line for line in text.splitlines() if "call void @\"llvm.prefetch" in line]
    assert len(calls) == 3 and all("i32 0, i32 2, i32 1)" in line for line in calls), calls
    offsets = [line for line in text.splitlines() if "getelementptr" in line and
               "24576" in line]  # 16 rows * 1536 columns ahead
    assert offsets, text
