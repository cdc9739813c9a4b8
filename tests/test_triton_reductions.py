"""Reductions over long rows (several independent accumulators, lanes folded by halves) and
loop-carried tiles that are only reduced after their loop (partials.py: folded in
registers instead of kept in the frame), against torch and NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402


@triton.jit
def row_reductions(x_ptr, i_ptr, sum_ptr, max_ptr, min_ptr, arg_ptr, argmin_ptr, isum_ptr,
                   N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, N)
    offsets = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offsets)
    tl.store(sum_ptr + rows, tl.sum(x, axis=1))
    tl.store(max_ptr + rows, tl.max(x, axis=1))
    tl.store(min_ptr + rows, tl.min(x, axis=1))
    tl.store(arg_ptr + rows, tl.argmax(x, axis=1))
    tl.store(argmin_ptr + rows, tl.argmin(x, axis=1))
    tl.store(isum_ptr + rows, tl.sum(tl.load(i_ptr + offsets), axis=1))


@settings(max_examples=12, deadline=None)
@given(n=st.sampled_from([16, 32, 64, 128, 256, 1024, 4096]), rows=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 1000))
def test_long_row_reductions(n, rows, seed):
    """Every element is combined exactly once (an integer sum is exact), and argmax/argmin
    keep the first of tied values (few distinct values: many ties, in every chain)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 7, (rows, n), generator=g).float()
    ints = torch.randint(-1000, 1000, (rows, n), generator=g, dtype=torch.int32)
    sums, maxima, minima = torch.empty(rows), torch.empty(rows), torch.empty(rows)
    args, argmins = torch.empty(rows, dtype=torch.int32), torch.empty(rows, dtype=torch.int32)
    isums = torch.empty(rows, dtype=torch.int32)
    row_reductions[(1,)](x, ints, sums, maxima, minima, args, argmins, isums, N=n, ROWS=rows)
    assert torch.equal(sums, x.sum(1))  # small integers in f32: exact in any order
    assert torch.equal(maxima, x.amax(1)) and torch.equal(minima, x.amin(1))
    assert torch.equal(args.long(), x.argmax(1))
    assert torch.equal(argmins.long(), x.argmin(1))
    assert torch.equal(isums.long(), ints.long().sum(1))


def test_long_row_float_sum_against_float64():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 4096, generator=g)
    sums, maxima, minima = torch.empty(4), torch.empty(4), torch.empty(4)
    ints = torch.zeros(4, 4096, dtype=torch.int32)
    args, argmins = torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
    row_reductions[(1,)](x, ints, sums, maxima, minima, args, argmins,
                         torch.empty(4, dtype=torch.int32), N=4096, ROWS=4)
    reference = x.double().numpy().sum(1)
    np.testing.assert_allclose(sums.numpy(), reference, rtol=0, atol=1e-3)
    assert torch.equal(args.long(), x.argmax(1)) and torch.equal(argmins.long(), x.argmin(1))


# ---- carried tiles reduced after their loop (partials.py) ------------------------------------

@triton.jit
def carried_then_reduced(x_ptr, w_ptr, out_ptr, side_ptr, n, INIT: tl.constexpr,
                         OP: tl.constexpr, BLOCK: tl.constexpr):
    """One row of n elements in BLOCK-wide trips; OP picks the carried update and whether
    the carried tile is also observed (inside the loop, after it, by another combine)."""
    row = tl.program_id(0)
    x_row = x_ptr + row * n
    if INIT == 0:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
    elif INIT == 1:
        acc = tl.full([BLOCK], 3.0, dtype=tl.float32)
    else:  # a loaded initial tile
        acc = tl.load(w_ptr + tl.arange(0, BLOCK))
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n, other=0.0)
        if OP == 0:
            acc += x
        elif OP == 1:
            acc = x * 2.0 + acc  # the carried tile as the second operand
        elif OP == 2:
            acc = tl.maximum(acc, x)
        elif OP == 3:  # observed inside the loop: must stay a whole tile
            acc += x
            tl.store(side_ptr + row * BLOCK + tl.arange(0, BLOCK), acc)
        elif OP == 4:  # the update reads what a later store in the trip overwrites
            acc += x
            tl.store(x_row + cols, x * 0.0 - 1.0, mask=cols < n)
        elif OP == 5:  # differences: not regroupable
            acc = acc - x
        elif OP == 6:
            acc = x - acc
        else:  # a maximum, then summed: another combine than the reduction's
            acc = tl.maximum(acc, x)
    if OP == 2:
        total = tl.max(acc, axis=0)
    else:
        total = tl.sum(acc, axis=0)
    tl.store(out_ptr + row, total)


def _carried_reference(x, w, init, op, block):
    rows, n = x.shape
    acc = [torch.zeros(block), torch.full((block,), 3.0), w.clone()][init]
    acc = acc.double().expand(rows, block).clone()
    side = None
    for off in range(0, n, block):
        chunk = torch.zeros(rows, block, dtype=torch.float64)
        width = min(block, n - off)
        chunk[:, :width] = x[:, off:off + width].double()
        if op == 1:
            acc = chunk * 2.0 + acc
        elif op == 2:
            acc = torch.maximum(acc, chunk)
        elif op == 5:
            acc = acc - chunk
        elif op == 6:
            acc = chunk - acc
        elif op == 7:
            acc = torch.maximum(acc, chunk)
        else:
            acc = acc + chunk
        side = acc.clone()
    return (acc.amax(1) if op == 2 else acc.sum(1)), side


@settings(max_examples=40, deadline=None)
@given(n=st.sampled_from([0, 1, 15, 16, 100, 257, 1000, 1531]),
       block=st.sampled_from([16, 64, 256, 1024]), init=st.integers(0, 2),
       op=st.integers(0, 7), rows=st.sampled_from([1, 3]))
@example(n=1000, block=1024, init=1, op=6, rows=1)
@example(n=1000, block=256, init=2, op=5, rows=3)
@example(n=257, block=256, init=2, op=3, rows=3)
@example(n=0, block=256, init=1, op=0, rows=1)
@example(n=1531, block=64, init=0, op=4, rows=3)
@example(n=100, block=16, init=2, op=7, rows=1)
@example(n=1531, block=1024, init=1, op=1, rows=3)
def test_carried_tile_reduced_after_its_loop(n, block, init, op, rows):
    """Zero trips (n = 0), odd n with masks, every initial value, the carried tile on either
    side, observed inside the loop, and an update reading what a later store changes."""
    g = torch.Generator().manual_seed(n * 7 + block + init * 3 + op)
    x = torch.randn(rows, max(n, 1), generator=g)[:, :n].contiguous()
    w = torch.randn(block, generator=g)
    x_in = x.clone()
    out, side = torch.empty(rows), torch.zeros(rows, block)
    carried_then_reduced[(rows,)](x, w, out, side, n, INIT=init, OP=op, BLOCK=block)
    expected, observed = _carried_reference(x_in, w, init, op, block)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)
    if op == 3 and n:
        torch.testing.assert_close(side.double(), observed, rtol=1e-5, atol=1e-4)
    if op == 4:
        assert torch.equal(x, torch.full_like(x, -1.0))


@triton.jit
def carried_2d(x_ptr, sum0_ptr, sum1_ptr, max_ptr, isum_ptr, M, N: tl.constexpr,
               BLOCK_M: tl.constexpr):
    """dwdb's pattern: [BLOCK_M, N] tiles summed over the rows after the loop (axis 0), and
    others reduced along axis 1, with max and an integer sum."""
    cols = tl.arange(0, N)
    s0 = tl.zeros((BLOCK_M, N), dtype=tl.float32)
    s1 = tl.zeros((BLOCK_M, N), dtype=tl.float32)
    mx = tl.full((BLOCK_M, N), float("-inf"), dtype=tl.float32)
    si = tl.zeros((BLOCK_M, N), dtype=tl.int32)
    for i in range(0, M, BLOCK_M):
        rows = i + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
        s0 += x
        s1 += x * x
        mx = tl.maximum(mx, tl.where(mask, x, float("-inf")))
        si += (x * 4.0).to(tl.int32)
    tl.store(sum0_ptr + cols, tl.sum(s0, axis=0))
    tl.store(sum1_ptr + tl.arange(0, BLOCK_M), tl.sum(s1, axis=1))
    tl.store(max_ptr + cols, tl.max(mx, axis=0))
    tl.store(isum_ptr + tl.arange(0, BLOCK_M), tl.sum(si, axis=1))


@pytest.mark.parametrize("m,n,block_m", [(77, 128, 32), (5, 16, 8), (0, 32, 4), (300, 64, 1)])
def test_carried_2d_tiles_reduced_along_either_axis(m, n, block_m):
    g = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, n, generator=g)
    sum0, maxima = torch.empty(n), torch.empty(n)
    sum1, isum = torch.empty(block_m), torch.empty(block_m, dtype=torch.int32)
    carried_2d[(1,)](x, sum0, sum1, maxima, isum, m, N=n, BLOCK_M=block_m)
    padded = torch.zeros(-(-m // block_m) * block_m if m else block_m, n)
    padded[:m] = x
    by_slot = padded.reshape(-1, block_m, n)
    torch.testing.assert_close(sum0.double(), x.double().sum(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sum1.double(), (by_slot.double() ** 2).sum((0, 2)),
                               rtol=1e-5, atol=1e-4)
    expected_max = x.amax(0) if m else torch.full((n,), float("-inf"))
    assert torch.equal(maxima, expected_max)
    assert torch.equal(isum.long(), (by_slot * 4.0).long().sum((0, 2)))


def test_tutorial_layer_norm_keeps_its_accumulators_folded(monkeypatch):
    """Layer norm forward's `_mean` and `_var` and the backward's dW/dB partial sums are
    kept folded (and the check above would see a wrong fold)."""
    from tests.test_triton_tutorials import _layer_norm_fwd_fused
    from tests.test_triton_tutorials_2 import _layer_norm_bwd_dwdb
    from tilegen.triton_backend import partials

    folded, plan = [], partials.plan

    def spy(e, loop):
        found = plan(e, loop)
        folded.append((e.program.name, len(found)))
        return found
    monkeypatch.setattr(partials, "plan", spy)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    x = torch.randn(6, 700)
    w, b = torch.rand(700), torch.randn(700)
    y, mean, rstd = torch.empty_like(x), torch.empty(6), torch.empty(6)
    _layer_norm_fwd_fused[(6,)](x, y, w, b, mean, rstd, x.stride(0), 700, 1e-5,
                                BLOCK_SIZE=256)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (700,), w, b, 1e-5),
                               rtol=1e-4, atol=1e-4)
    partial_dw, partial_db = torch.randn(40, 300), torch.randn(40, 300)
    dw, db = torch.empty(300), torch.empty(300)
    _layer_norm_bwd_dwdb[(3,)](partial_dw, partial_db, dw, db, 40, 300, BLOCK_SIZE_M=32,
                               BLOCK_SIZE_N=128)
    torch.testing.assert_close(dw, partial_dw.sum(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(db, partial_db.sum(0), rtol=1e-5, atol=1e-4)
    assert ("_layer_norm_fwd_fused", 1) in folded and ("_layer_norm_bwd_dwdb", 2) in folded
    assert [count for name, count in folded if name == "_layer_norm_fwd_fused"] == [1, 1, 0]


# ---- shared tiles stored by the reduction that reads them first (shared_fills.py) ------------

@triton.jit
def shared_then_reduced(x_ptr, w_ptr, y_ptr, s_ptr, n, CASE: tl.constexpr, BLOCK: tl.constexpr):
    """A costly value with several readers, first read by a reduction (directly or through
    an elementwise op), a store of it, or a branch; then read again elementwise."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    if CASE == 4:  # a store first: x and w are stored, so e holds no load the branch stores
        tl.store(s_ptr + row, 0.0)
    e = tl.where(mask, tl.exp(x - 1.0) * w, 0.0)
    if CASE == 0:  # softmax's pattern: the sum reads it first
        total = tl.sum(e, axis=0)
        tl.store(y_ptr + row * n + cols, e / total, mask=mask)
    elif CASE == 1:  # layer norm backward's: an elementwise op whose reduction reads it
        total = tl.sum(e * x, axis=0) + tl.sum(e, axis=0)
        tl.store(y_ptr + row * n + cols, e * total - x, mask=mask)
    elif CASE == 2:  # stored first, over the row it was loaded from, then reduced
        tl.store(x_ptr + row * n + cols, e, mask=mask)
        total = tl.sum(e, axis=0)
        tl.store(y_ptr + row * n + cols, e + total, mask=mask)
    elif CASE == 3:  # another reader before the reduction: stored where it is defined
        tl.store(y_ptr + row * n + cols, e * 2.0, mask=mask)
        total = tl.sum(e, axis=0)
        tl.store(y_ptr + row * n + cols, e + total, mask=mask)
    else:  # the reduction inside a branch: not filled there
        total = 0.0
        if n > 3:
            total = tl.sum(e, axis=0)
        tl.store(y_ptr + row * n + cols, e - total, mask=mask)
    tl.store(s_ptr + row, total)


def _shared_reference(x, w, case):
    e = torch.exp(x.double() - 1.0) * w.double()
    if case == 0:
        total = e.sum(1, keepdim=True)
        return e / total, total
    if case == 1:
        total = (e * x.double()).sum(1, keepdim=True) + e.sum(1, keepdim=True)
        return e * total - x.double(), total
    total = e.sum(1, keepdim=True)
    if case == 4:
        total = total if x.shape[1] > 3 else torch.zeros_like(total)
        return e - total, total
    return e + total, total


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("n,block", [(1000, 1024), (3, 4), (37, 64), (4096, 4096)])
def test_shared_value_stored_by_its_first_reduction(case, n, block):
    g = torch.Generator().manual_seed(case * 31 + n)
    rows = 3
    x, w = torch.randn(rows, n, generator=g), torch.rand(n, generator=g) + 0.5
    x_in = x.clone()
    y, sums = torch.empty(rows, n), torch.empty(rows)
    shared_then_reduced[(rows,)](x, w, y, sums, n, CASE=case, BLOCK=block)
    expected, total = _shared_reference(x_in, w, case)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sums.double(), total[:, 0], rtol=1e-5, atol=1e-4)
    if case == 2:  # the first store wrote e over x
        torch.testing.assert_close(x.double(), torch.exp(x_in.double() - 1.0) * w.double(),
                                   rtol=1e-5, atol=1e-5)


@triton.jit
def shared_2d(x_ptr, out0_ptr, out1_ptr, y_ptr, A: tl.constexpr, B: tl.constexpr,
              C: tl.constexpr, AXIS: tl.constexpr):
    a = tl.arange(0, A)[:, None, None]
    b = tl.arange(0, B)[None, :, None]
    c = tl.arange(0, C)[None, None, :]
    offsets = a * B * C + b * C + c
    e = tl.exp(tl.load(x_ptr + offsets)) * 0.5 + 1.0
    r = tl.sum(e, axis=AXIS)
    if AXIS == 0:
        tl.store(out0_ptr + tl.arange(0, B)[:, None] * C + tl.arange(0, C)[None, :], r)
    elif AXIS == 1:
        tl.store(out0_ptr + tl.arange(0, A)[:, None] * C + tl.arange(0, C)[None, :], r)
    else:
        tl.store(out0_ptr + tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :], r)
    tl.store(y_ptr + offsets, e * 3.0)
    tl.store(out1_ptr + tl.arange(0, 1), tl.sum(tl.sum(tl.sum(e, axis=2), axis=1), axis=0)
             + tl.zeros([1], dtype=tl.float32))


@settings(max_examples=15, deadline=None)
@given(a=st.sampled_from([1, 2, 8]), b=st.sampled_from([1, 4, 16]), c=st.sampled_from([1, 2, 32]),
       axis=st.integers(0, 2))
@example(a=2, b=8, c=1, axis=1)  # chunks of the reduction across rows of width 1
def test_shared_value_reduced_along_any_axis(a, b, c, axis):
    g = torch.Generator().manual_seed(a * 100 + b * 10 + c + axis)
    x = torch.randn(a, b, c, generator=g)
    shape = [a, b, c]
    del shape[axis]
    out0, out1, y = torch.empty(*shape), torch.empty(1), torch.empty(a, b, c)
    shared_2d[(1,)](x, out0, out1, y, A=a, B=b, C=c, AXIS=axis)
    e = torch.exp(x.double()) * 0.5 + 1.0
    torch.testing.assert_close(out0.double(), e.sum(axis), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.double(), e * 3.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out1.double(), e.sum().reshape(1), rtol=1e-5, atol=1e-4)
