"""Fewer and faster sweeps over a program's rows: reductions of the same rows run in one
sweep (sibling_reductions.py), against torch, with the cases where they must not join;
row-long accesses prefetch ahead (prefetch.py)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend import sibling_reductions  # noqa: E402


@contextlib.contextmanager
def counting_joins():
    """How many later reductions each first reduction took into its sweep. Launch
    `fresh(kernel)` inside: a new JITFunction, compiled (not from the disk cache)."""
    found: list[int] = []
    joined = sibling_reductions.SiblingReductions.joined

    def spy(self, e, first, shape):
        later = joined(self, e, first, shape)
        found.append(len(later[0]))
        return later
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sibling_reductions.SiblingReductions, "joined", spy)
        patch.setattr(triton.knobs.compilation, "always_compile", True)
        yield found


def fresh(kernel):
    return triton.jit(kernel.fn)


@triton.jit
def two_row_reductions(x_ptr, y_ptr, a_ptr, b_ptr, n, stride, CASE: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0)
    a = tl.sum(x * y, axis=0)
    if CASE == 0:  # another combine (max) right after: joined
        b = tl.max(tl.where(mask, y, float("-inf")), axis=0) + a * 0.0
    elif CASE == 1:  # a two-operand reduction (argmax) and a scalar op between: joined
        scaled = a / n
        b = tl.argmax(tl.where(mask, x, float("-inf")), axis=0).to(tl.float32) + scaled
    elif CASE == 2:  # a store between that overwrites the row the second one loads
        tl.store(y_ptr + row * stride + cols, x * 3.0, mask=mask)
        b = tl.sum(tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0), axis=0)
    elif CASE == 3:  # reads the first one's result: not joined
        b = tl.sum(tl.where(mask, x - a, 0.0), axis=0)
    else:  # y read again after a store to it: the sum of the old y, not joined
        tl.store(y_ptr + row * stride + cols, x, mask=mask)
        b = tl.sum(y * 2.0, axis=0)
    tl.store(a_ptr + row, a)
    tl.store(b_ptr + row, b)


def _two_reference(x, y, case):
    x, y = x.double(), y.double()
    a = (x * y).sum(1)
    n = x.shape[1]
    if case == 0:
        return a, y.max(1).values
    if case == 1:
        return a, x.argmax(1).double() + a / n
    if case == 2:
        return a, (x * 3.0).sum(1)
    if case == 3:
        return a, (x - a[:, None]).sum(1)
    return a, (y * 2.0).sum(1)


@settings(max_examples=12, deadline=None)
@given(case=st.integers(0, 4), n=st.sampled_from([1, 3, 37, 200, 1000, 1024]),
       rows=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_reductions_of_one_row_share_its_sweep(case, n, rows, seed):
    g = torch.Generator().manual_seed(seed)
    block = max(16, triton.next_power_of_2(n))
    x, y = torch.randn(rows, n + 5, generator=g), torch.randn(rows, n + 5, generator=g)
    x_in, y_in = x[:, :n].clone(), y[:, :n].clone()
    a, b = torch.empty(rows), torch.empty(rows)
    with counting_joins() as joins:
        fresh(two_row_reductions)[(rows,)](x, y, a, b, n, x.stride(0), CASE=case, BLOCK=block)
    expected_a, expected_b = _two_reference(x_in, y_in, case)
    torch.testing.assert_close(a.double(), expected_a, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.double(), expected_b, rtol=1e-5, atol=1e-4)
    assert joins[0] == (1 if case in (0, 1) else 0)


@triton.jit
def row_statistics_2d(x_ptr, sum_ptr, max_ptr, arg_ptr, m, n, BM: tl.constexpr,
                      BN: tl.constexpr):
    """Three reductions of a 2-D tile along its rows, the last with an integer sum."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    x = tl.load(x_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(x, axis=1)
    biggest = tl.max(tl.where(mask, x, float("-inf")), axis=1)
    positive = tl.sum((x > 0).to(tl.int32), axis=1)
    tl.store(sum_ptr + rows, total, mask=rows < m)
    tl.store(max_ptr + rows, biggest, mask=rows < m)
    tl.store(arg_ptr + rows, positive, mask=rows < m)


@pytest.mark.parametrize("m,n,bm,bn", [(7, 37, 4, 64), (33, 200, 8, 256), (5, 16, 8, 16)])
def test_2d_reductions_along_rows_share_one_sweep(m, n, bm, bn):
    g = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, n, generator=g)
    sums, maxima, positive = torch.empty(m), torch.empty(m), torch.empty(m, dtype=torch.int32)
    with counting_joins() as joins:
        fresh(row_statistics_2d)[(triton.cdiv(m, bm),)](x, sums, maxima, positive, m, n,
                                                        BM=bm, BN=bn)
    torch.testing.assert_close(sums.double(), x.double().sum(1), rtol=1e-5, atol=1e-4)
    assert torch.equal(maxima, x.max(1).values)
    assert torch.equal(positive, (x > 0).sum(1).to(torch.int32))
    assert joins[0] == 2


def test_tutorial_layer_norm_backward_sums_in_one_sweep():
    """c1 = sum(xhat * wdy) and c2 = sum(wdy): one sweep of the row for both."""
    from tests.test_triton_tutorials_2 import _layer_norm_bwd_dx_fused
    rows, n, group = 5, 300, 2
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(rows, n, generator=g), torch.randn(rows, n, generator=g)
    w = torch.rand(n, generator=g)
    mean, var = x.mean(1), x.var(1, unbiased=False)
    rstd = 1 / torch.sqrt(var + 1e-5)
    dx, locks = torch.empty_like(x), torch.zeros(2 * group, dtype=torch.int32)
    partial_dw, partial_db = torch.zeros(group, n), torch.zeros(group, n)
    with counting_joins() as joins:
        fresh(_layer_norm_bwd_dx_fused)[(rows,)](dx, dy, partial_dw, partial_db, x, w, mean,
                                                 rstd, locks, x.stride(0), n,
                                                 BLOCK_SIZE_N=512, GROUP_SIZE_M=group)
    xhat = (x - mean[:, None]) * rstd[:, None]
    wdy = w * dy
    c1, c2 = (xhat * wdy).mean(1, keepdim=True), wdy.mean(1, keepdim=True)
    torch.testing.assert_close(dx, (wdy - (xhat * c1 + c2)) * rstd[:, None], rtol=1e-4,
                               atol=1e-4)
    torch.testing.assert_close(partial_dw.sum(0), (dy * xhat).sum(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(partial_db.sum(0), dy.sum(0), rtol=1e-4, atol=1e-4)
    assert joins == [1]


# ---- prefetch ahead of row-long accesses (prefetch.py) --------------------------------------

@triton.jit
def scaled_rows(x_ptr, y_ptr, n, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0)
    total = tl.sum(x, axis=0)
    tl.store(y_ptr + row * stride + cols, x * 2.0 + total, mask=cols < n)


def _prefetches(llir: str) -> list[str]:
    """The read/write flag of each prefetch call in the kernel's LLVM IR."""
    calls = [line for line in llir.splitlines() if "call void @\"llvm.prefetch" in line]
    return [call.split("i32")[1].strip(" ,") for call in calls]


@pytest.mark.parametrize("n,block,rows", [(1000, 1024, 3), (613, 1024, 5), (2049, 4096, 2)])
def test_row_long_accesses_prefetch_ahead_without_faults(n, block, rows):
    """Rows of 4 KB and more: the load and the store prefetch ahead (read and write); the
    last row's prefetches run past the tensor's end, which must neither fault nor trip the
    bounds checks (debug=True), and the results stay exact."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(rows, n, generator=g)
    y = torch.empty_like(x)
    compiled = fresh(scaled_rows)[(rows,)](x, y, n, n, BLOCK=block, debug=True)
    torch.testing.assert_close(y, x * 2.0 + x.sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    flags = _prefetches(compiled.asm["llir"])
    assert "0" in flags and "1" in flags


def test_short_rows_do_not_prefetch():
    """Rows of 512 bytes (matmul- and attention-sized tiles) are left to the hardware."""
    x = torch.randn(4, 100)
    y = torch.empty_like(x)
    compiled = fresh(scaled_rows)[(4,)](x, y, 100, 100, BLOCK=128)
    torch.testing.assert_close(y, x * 2.0 + x.sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    assert _prefetches(compiled.asm["llir"]) == []
