"""Reductions over long rows (several independent accumulators, lanes folded by halves) and
loop-carried tiles that are only reduced after their loop (partials.py: folded in
registers instead of kept in the frame), against torch and NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
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
