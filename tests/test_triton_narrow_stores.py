"""Masked stores of narrow integer and bf16 tiles with one active lane (the case LLVM 22's
x86 backend miscompiles when the mask is a constant: docs/architecture.md "A masked store
with one lane is a scalar store"): each writes exactly its lanes, with the bound a
constexpr, a runtime int (1 is specialised to a constant) or larger, on 4- to 32-lane
blocks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

import tilegen.triton_backend  # noqa: E402,F401


@triton.jit
def _scaled_runtime_bound(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0)
    tl.store(y_ptr + offsets, (x * 2).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scaled_constexpr_bound(x_ptr, y_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < N
    x = tl.load(x_ptr + offsets, mask=mask, other=0)
    tl.store(y_ptr + offsets, (x * 2).to(y_ptr.dtype.element_ty), mask=mask)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.bfloat16])
@pytest.mark.parametrize("block", [4, 8, 16, 32])
@pytest.mark.parametrize("kernel", [_scaled_runtime_bound, _scaled_constexpr_bound])
def test_a_masked_narrow_store_writes_only_its_lanes(dtype, block, kernel):
    source = torch.int32 if dtype != torch.bfloat16 else torch.float32
    x = torch.arange(1, block + 1, dtype=source)
    for n in (1, 2, block - 1):
        y = torch.full((block + 8,), 9, dtype=dtype)
        if kernel is _scaled_constexpr_bound:
            kernel[(1,)](x, y, N=n, BLOCK=block)
        else:
            kernel[(1,)](x, y, n, BLOCK=block)
        expected = torch.full((block + 8,), 9, dtype=dtype)
        expected[:n] = (x[:n] * 2).to(dtype)
        assert torch.equal(y, expected), (n, y.tolist())
