"""Loads fused into their reader (fused_loads.py): a contiguous load read by one
elementwise op, view, reduction or store is read from memory where its reader evaluates it.
Triton's semantics is that a load reads the whole tile where it stands, so every case where
a later write could be seen is checked against torch: stores that overwrite, through other
or shifted addresses, what the same statement or a later one reads; loads used after a
store, after a loop and inside one; masks on every edge of odd sizes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402


@triton.jit
def shifted_update(src_ptr, dst_ptr, n, shift, BLOCK: tl.constexpr):
    """dst[i] = 2 src[i - shift] + 1 for i in [0, n): one program, one tile."""
    offsets = tl.arange(0, BLOCK)
    mask = (offsets < n) & (offsets - shift >= 0) & (offsets - shift < n)
    x = tl.load(src_ptr + offsets - shift, mask=mask, other=0.0)
    tl.store(dst_ptr + offsets, x * 2 + 1, mask=offsets < n)


@pytest.mark.parametrize("shift", [1, -1, 17, -3, 0])
@pytest.mark.parametrize("n", [1000, 37])
def test_store_over_the_tile_a_fused_load_reads(shift, n):
    """In place through shifted addresses (src and dst the same tensor): a chunk written
    early must not be seen by a later chunk's read (shift > 0 would read its own output)."""
    x = torch.randn(n)
    expected = torch.ones(n)
    lanes = torch.arange(n)
    inside = (lanes - shift >= 0) & (lanes - shift < n)
    expected[inside] = x[(lanes - shift)[inside]] * 2 + 1
    shifted_update[(1,)](x, x, n, shift, BLOCK=1024)
    torch.testing.assert_close(x, expected)


def test_store_into_an_overlapping_view():
    """dst is a view of src's storage starting 5 elements later (other tensor arguments,
    overlapping bytes): the run-time range check takes the stored path."""
    storage = torch.randn(1100)
    src, dst = storage[:1000], storage[5:1005]
    expected = storage.clone()
    expected[5:1005] = src.clone() * 2 + 1
    shifted_update[(1,)](src, dst, 1000, 0, BLOCK=1024)
    torch.testing.assert_close(storage, expected)


@triton.jit
def swap_through_stores(a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(a_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(a_ptr + offsets, b + 1, mask=mask)  # a is read after this store
    tl.store(b_ptr + offsets, a - 1, mask=mask)


def test_load_read_after_a_store_to_its_addresses():
    a, b = torch.randn(1037), torch.randn(1037)
    a0, b0 = a.clone(), b.clone()
    swap_through_stores[(triton.cdiv(1037, 128),)](a, b, 1037, BLOCK=128)
    torch.testing.assert_close(a, b0 + 1)
    torch.testing.assert_close(b, a0 - 1)


@triton.jit
def load_across_a_loop(x_ptr, out_ptr, n, trips, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    before = tl.load(x_ptr + offsets, mask=mask) * 3
    for _ in range(trips):  # each trip changes x; `before` is the value before the loop
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)
    inside = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(trips):
        inside += tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(x_ptr + offsets, before, mask=mask)
    tl.store(out_ptr + offsets, before + inside, mask=mask)


def test_load_used_after_and_inside_loops_that_store():
    x = torch.randn(301)
    x0 = x.clone()
    out = torch.empty(301)
    load_across_a_loop[(1,)](x, out, 301, 3, BLOCK=512)
    before = x0 * 3
    inside = (x0 + 3) + 2 * before  # the first trip reads x0 + 3, the next two `before`
    torch.testing.assert_close(out, before + inside)
    torch.testing.assert_close(x, before)


@triton.jit
def centred_rows(x_ptr, out_ptr, sums_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
    total = tl.sum(x, axis=0)
    tl.store(out_ptr + row * stride + cols, x - tl.max(x, axis=0), mask=cols < n_cols)
    tl.store(sums_ptr + row, total)


def test_load_with_several_readers_around_a_store():
    """A load read by two reductions and by the subtraction a store writes, in place when
    out is x (the range check's same-layout case) and into another tensor."""
    x = torch.randn(29, 300) - 0.5
    out, sums = torch.empty_like(x), torch.empty(29)
    centred_rows[(29,)](x, out, sums, 300, x.stride(0), BLOCK=512)
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out, x - x.max(1, keepdim=True).values)
    expected = x - x.max(1, keepdim=True).values
    centred_rows[(29,)](x, x, sums, 300, x.stride(0), BLOCK=512)
    torch.testing.assert_close(x, expected)


@triton.jit
def row_statistics(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x * x, axis=0) + tl.max(x * 2, axis=0))


def test_fused_load_takes_the_register_path():
    """Read by `x * x` (one reader) and `x * 2` (a second), each feeding a reduction, the
    load is read from memory by each: the frame holds no copy of the 2 KB tile."""
    x = torch.randn(37, 203)
    out = torch.empty(37)
    compiled = row_statistics[(37,)](x, out, 203, x.stride(0), BLOCK=512)
    torch.testing.assert_close(out, (x * x).sum(1) + (x * 2).max(1).values, rtol=1e-5,
                               atol=1e-4)
    assert compiled.metadata.tilegen_frame_bytes < 512 * 4


@triton.jit
def last_block(x_ptr, out_ptr, trips, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    p = x_ptr + offsets
    last = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(trips):
        last = tl.load(p, mask=offsets < 61) * 2.0 + last * 0.0  # carried, read lazily
        p += BLOCK  # an advancing pointer tile: its offset changes at the end of the trip
    tl.store(out_ptr + offsets, last, mask=offsets < 61)


def test_fused_load_carried_out_of_a_loop_that_advances_its_pointer():
    x = torch.randn(5 * 64)
    out = torch.zeros(64)
    last_block[(1,)](x, out, 5, BLOCK=64)
    torch.testing.assert_close(out[:61], x[4 * 64:4 * 64 + 61] * 2)
