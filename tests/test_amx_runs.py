"""The AMX kernel's two flavours (tilegen/amx_kernel.py): on A packed in slabs, the depth
steps of a call go in even runs of at most RUN_STEPS over all of its register blocks, A's
tiles loaded with `tileloaddt1` and nothing prefetched into L1 (the next block's C into L2,
for reading: its rows 8 KB apart would evict each other in L1); on A read in place,
one run with A's rows and B's lines prefetched into L1. Products on the packed flavour
whose depth blocks split into runs -- unevenly, with the depth tail's zero-padded step in
the last run, in a depth block after the first (the runs add to C), on ragged rows and
columns (staged through their compact slot, copied in by the first run and out by the
last), B transposed, a batch, one and two threads -- against the exact products of the
bf16 inputs (NumPy float64)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.test_amx_gemm import _check, _compile, _llvm_functions, _row_strides, _ty
from tilegen import amx_kernel

BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.usefixtures("amx_host")


@pytest.fixture
def amx_host():
    from tests.test_amx_gemm import HOST_AMX, NO_AMX_REASON
    if not HOST_AMX:
        pytest.skip(f"no AMX-BF16 here: {NO_AMX_REASON}")


def _kernels(module):
    """The LLVM IR of each AMX micro-kernel of `f`, by name."""
    return {name: text for name, text in _llvm_functions(module).items()
            if name.startswith("tilegen.gemm.amx.") and "tdpbf16ps" in text}


L1_READ_PREFETCH = "i32 0, i32 3, i32 1)"  # llvm.prefetch(ptr, read, keep in L1, data)
L1_WRITE_PREFETCH = "i32 1, i32 3, i32 1)"  # prefetchw


def test_packed_a_runs_stream_a_and_prefetch_only_c_where_in_place_a_prefetches(monkeypatch):
    # K = 1024: rows 2 KB apart, packed; K = 1000: read in place (a_read_in_place).
    source = f"""
fn f(p: {_ty((64, 1024))}, q: {_ty((1024, 64))}, x: {_ty((64, 1000))}, y: {_ty((1000, 64))})
    -> ({_ty((64, 64), 'F32')}, {_ty((64, 64), 'F32')}) {{
  return (matmul(p, q), matmul(x, y));
}}"""
    module = _compile(source, monkeypatch, threads=1)
    assert _row_strides(module) == [None, 1000]
    kernels = _kernels(module)
    packed, in_place = kernels["tilegen.gemm.amx.32x32"], kernels["tilegen.gemm.amx.32x32.in_place"]
    assert "tileloaddt164" in packed and L1_READ_PREFETCH not in packed
    assert "tileloaddt164" not in in_place and L1_READ_PREFETCH in in_place
    assert all(L1_WRITE_PREFETCH not in kernel for kernel in (packed, in_place))


def _products(m, k, n, batch=(), transposed_b=False):
    """A Kina product whose A is a cast of an F32 parameter (so it is packed)."""
    a_shape, b_shape = (*batch, m, k), (*batch, n, k) if transposed_b else (*batch, k, n)
    axes = list(range(len(batch))) + [len(batch) + 1, len(batch)]
    b_expr = f"transpose(b, {axes})" if transposed_b else "b"
    return (f"fn f(a: {_ty(a_shape, 'F32')}, b: {_ty(b_shape)}) -> "
            f"{_ty((*batch, m, n), 'F32')} {{ return matmul(cast(a, BF16), {b_expr}); }}")


def _inputs(rng, m, k, n, batch=(), transposed_b=False):
    a = rng.standard_normal((*batch, m, k)).astype(BF16)
    b_shape = (*batch, n, k) if transposed_b else (*batch, k, n)
    return a, rng.standard_normal(b_shape).astype(BF16)


def _check_product(module, a, b, transposed_b=False):
    wide_b = np.swapaxes(b, -1, -2) if transposed_b else b
    got = module.f(a.astype(np.float32), b)
    _check(got, a, np.ascontiguousarray(wide_b))


# Depth blocks of 545 (18 steps, the last a zero-padded tail of 1: runs of 9), 1000 (32
# steps, tail of 8: runs of 16), 517 (17 steps: runs of 9 and 8), 1024 + 545 (a second depth
# block in runs), 16 x 32 (one run); ragged rows (333, 45, 13 on one row of tiles, 17) and
# columns (777, 40, 9 on the narrow kernel), one and two threads.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(333, 545, 777), (45, 1000, 40), (13, 517, 70),
                                   (17, 1569, 50), (64, 512, 9), (96, 2048, 64)])
def test_products_of_packed_a_in_runs(m, k, n, threads, monkeypatch):
    assert -(-min(k, 1024) // 32) > amx_kernel.RUN_STEPS or k == 512
    module = _compile(_products(m, k, n), monkeypatch, threads)
    assert _row_strides(module) == [None]
    rng = np.random.default_rng(m * k + n)
    _check_product(module, *_inputs(rng, m, k, n))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch,m,k,n,transposed_b", [((3,), 70, 545, 50, False),
                                                      ((2, 2), 33, 1000, 41, True),
                                                      ((), 200, 1569, 100, True)])
def test_batched_and_transposed_products_of_packed_a_in_runs(batch, m, k, n, transposed_b,
                                                             threads, monkeypatch):
    module = _compile(_products(m, k, n, batch, transposed_b), monkeypatch, threads)
    rng = np.random.default_rng(k + n)
    _check_product(module, *_inputs(rng, m, k, n, batch, transposed_b), transposed_b)
