"""Packed b panels kept across the K loops of a persistent kernel (panel_cache.py): the
loop nested in a loop over tiles, b's pointers computed from the trip (tutorial 09), the
key holding what b reads from outside the loop, and the program's own stores checked at
launch to be apart from b (a program must see what it wrote)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = triton.language

import tilegen.triton_backend  # noqa: E402
from tests.test_triton_tutorials_2 import matmul_kernel_persistent  # noqa: E402
from tilegen.triton_backend import panel_cache  # noqa: E402

tilegen.triton_backend.register()


@pytest.fixture
def plans(monkeypatch):
    """The Reuse (or None) static_conditions gives each deferred dot compiled."""
    found = []
    conditions = panel_cache.static_conditions

    def spy(e, loop, dot, advancing):
        result = conditions(e, loop, dot, advancing)
        found.append(result)
        return result
    monkeypatch.setattr(panel_cache, "static_conditions", spy)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    return found


@pytest.mark.parametrize("m,n,k,block_m,block_n,block_k,programs,half", [
    (77, 150, 203, 32, 64, 32, 3, True),  # masks on every edge, uneven tiles per program
    (130, 97, 70, 16, 32, 16, 1, False),  # one program: every tile after the first reuses
    (64, 200, 45, 32, 64, 16, 2, True),
])
def test_persistent_matmul_keeps_b_across_its_tiles(plans, m, n, k, block_m, block_n,
                                                    block_k, programs, half):
    generator = torch.Generator().manual_seed(5)
    dtype = torch.float16 if half else torch.float32
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    for _launch in range(2):
        c = torch.full((m, n), 3.0, dtype=dtype)
        matmul_kernel_persistent[(programs,)](
            a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_SIZE_M=block_m,
            BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k, GROUP_SIZE_M=4, NUM_SMS=programs)
        expected = (a.double() @ b.double()).half().double()  # the kernel stores fp16
        torch.testing.assert_close(c.double(), expected, rtol=2e-3, atol=2e-3)
        b.mul_(-0.5)  # the same addresses, other values: the next launch must reload
    reuse, = plans
    assert reuse is not None and reuse.position is None
    assert reuse.disjoint == ((1, 2),)  # b (parameter 1) against c (parameter 2)
    assert [value.type.shape for value in reuse.keys] == [(block_n,)]  # offs_bn


@triton.jit
def chained_tiles(a_ptr, b_ptr, c_ptr, K, TILES, fill, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    """One program; tile t reads all of b (the same pointers each tile, b's `other` from
    before the loop) and stores its rows t*BM.. of c: with c the same tensor as b, tile
    t + 1 reads what tile t wrote."""
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    for t in range(TILES):
        outside = fill * t
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            depth = k * BK + rk
            a = tl.load(a_ptr + (t * BM + rm)[:, None] * K + depth[None, :],
                        mask=depth[None, :] < K, other=0.0)
            b = tl.load(b_ptr + depth[:, None] * BN + rn[None, :], mask=depth[:, None] < K,
                        other=outside)
            acc = tl.dot(a, b, acc)
        tl.store(c_ptr + (t * BM + rm)[:, None] * BN + rn[None, :], acc)


def _chained_expected(a, b, c, tiles, block_m, block_k):
    """The kernel's order in float64: tile t's rows of c from the b of that moment (with
    c the same tensor as b, the rows earlier tiles wrote)."""
    k = a.shape[1]
    same = c.data_ptr() == b.data_ptr()
    b, c = b.double().clone(), c.double().clone()
    for t in range(tiles):
        rows = slice(t * block_m, (t + 1) * block_m)
        result = a[rows].double() @ (c if same else b)[:k]
        c[rows] = result
    return c


def test_writes_into_b_are_seen_by_the_program_that_wrote_them(plans):
    """The launch finds b and c in one storage and the kernel packs b every tile (it had
    packed the first tile's b once for all three); apart, the panels are kept."""
    block_m, block_n, block_k, k, tiles = 16, 32, 16, 40, 3
    generator = torch.Generator().manual_seed(9)
    a = torch.randn(tiles * block_m, k, generator=generator) * 0.2
    for aliased in (True, False, True):
        b = torch.randn(tiles * block_m, block_n, generator=generator) * 0.2
        c = b if aliased else torch.zeros(tiles * block_m, block_n)
        expected = _chained_expected(a, b, c, tiles, block_m, block_k)
        chained_tiles[(1,)](a, b, c, k, tiles, 0.0, BM=block_m, BN=block_n, BK=block_k)
        torch.testing.assert_close(c.double(), expected, rtol=1e-5, atol=1e-5)
    reuse, = plans
    assert reuse is not None and reuse.disjoint == ((1, 2),)
    assert [value.type.shape for value in reuse.keys] == [()]  # `outside`, a scalar
