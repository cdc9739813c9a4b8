"""A dot's four-vector-wide `b` read by the micro-kernel where it lies in memory
(dot_operands.py): only when every row starts at row 0 plus whole panel rows, checked at
run time; otherwise (other row strides, rows out of order, wrap-around offsets, a masked
load, a store to b's memory before the dot, bounds checks on) the load goes through the
frame as before. Checked against float64 torch, at tile heights that leave a partial
register block, and that attention's V takes the path. All on the FMA kernel
(TILEGEN_TRITON_AMX=0): where the host has AMX, dots of 32 x 32 tiles and more pack b for
AMX instead (amx_dot.py, tests/test_triton_amx_dot.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend import dot_operands  # noqa: E402

D = 64  # four f32 vectors on AVX-512: b's rows are the micro-kernel's panels


@pytest.fixture(autouse=True)
def fma_kernel(monkeypatch):
    monkeypatch.setenv("TILEGEN_TRITON_AMX", "0")


@triton.jit
def dot_rows(a_ptr, b_ptr, c_ptr, out_ptr, row_stride, wrap, M: tl.constexpr,
             K: tl.constexpr, N: tl.constexpr, LAYOUT: tl.constexpr, MASKED: tl.constexpr,
             CLOBBER: tl.constexpr):
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    if LAYOUT == 0:  # rows at a runtime stride (64: in place)
        rows = rk * row_stride
    elif LAYOUT == 1:  # rows in reverse order: each row contiguous, not in place
        rows = (K - 1 - rk) * row_stride
    else:  # wrap-around rows (a `% wrap` offset): two rows may coincide
        rows = (rk % wrap) * row_stride
    b_ptrs = b_ptr + rows[:, None] + rn[None, :]
    if MASKED:
        b = tl.load(b_ptrs, mask=rn[None, :] < N - 3, other=0.5)
    else:
        b = tl.load(b_ptrs)
    if CLOBBER:  # b's memory overwritten after the load, before the dot reads it
        tl.store(b_ptrs, tl.zeros((K, N), dtype=tl.float32) - 7.0)
    c = tl.load(c_ptr + rm[:, None] * N + rn[None, :])
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b, c))


def _run(m, k, row_stride, layout=0, masked=False, clobber=False, wrap=1, debug=False,
         kernel=dot_rows):
    generator = torch.Generator().manual_seed(m * 100 + k + row_stride + layout)
    a = torch.randn(m, k, generator=generator)
    storage = torch.randn(k * max(row_stride, D) + D, generator=generator)
    c = torch.randn(m, D, generator=generator)
    out = torch.empty(m, D)
    rk = torch.arange(k)
    rows = {0: rk, 1: k - 1 - rk, 2: rk % wrap}[layout] * row_stride
    b = storage[rows[:, None] + torch.arange(D)[None, :]].clone()
    if masked:
        b[:, D - 3:] = 0.5
    kernel[(1,)](a, storage, c, out, row_stride, wrap, M=m, K=k, N=D, LAYOUT=layout,
                   MASKED=masked, CLOBBER=clobber, debug=debug)
    expected = (a.double() @ b.double() + c.double()).float()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    if clobber:
        assert (storage[rows[:, None] + torch.arange(D)[None, :]] == -7.0).all()


@pytest.mark.parametrize("m,k", [(16, 16), (32, 64), (128, 32), (2, 16)])
def test_rows_at_the_panel_stride_are_read_in_place(m, k):
    _run(m, k, D)


@pytest.mark.parametrize("row_stride", [80, 65, 128, 0])
def test_other_row_strides_go_through_the_frame(row_stride):
    """80 and 65 elements: each row contiguous but not 64 apart; 0: every row the same."""
    _run(32, 16, row_stride)


@pytest.mark.parametrize("layout,wrap", [(1, 1), (2, 5), (2, 16)])
def test_rows_out_of_order_or_wrapped_go_through_the_frame(layout, wrap):
    """Reversed rows start 64 elements apart but in the wrong order; `% 5` rows repeat;
    `% 16` with K = 16 is the identity and may go in place."""
    _run(16, 16, D, layout=layout, wrap=wrap)


def test_masked_load_and_store_before_the_dot():
    _run(32, 32, D, masked=True)
    _run(32, 32, D, clobber=True)


def test_bounds_checks_keep_the_frame_copy():
    _run(16, 16, D, debug=True)


def test_attention_and_the_generated_dot_take_the_path(monkeypatch):
    """rows_in_place is emitted for attention's V (not for its K^T, a transposed read) and
    for the unmasked dot above; a masked b and a clobbered one are not read in place."""
    from tests.test_triton_tutorials_2 import attention

    calls = []
    original = dot_operands.rows_in_place

    def spy(e, lazy, rows, row_elements):
        calls.append((lazy.op.result.type.shape, row_elements))
        return original(e, lazy, rows, row_elements)

    monkeypatch.setattr(dot_operands, "rows_in_place", spy)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    q, k, v = (torch.randn(1, 2, 128, D) * 0.5 for _ in range(3))
    out = attention(q, k, v, False, 0.125, BLOCK_M=32, BLOCK_N=64)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
    assert calls == [((64, D), D)]
    calls.clear()
    fresh = triton.jit(dot_rows.fn)  # compiled here, not taken from this process's cache
    _run(16, 16, D, kernel=fresh)
    assert calls == [((16, D), D)]
    calls.clear()
    _run(16, 16, D, masked=True, kernel=fresh)
    _run(16, 16, D, clobber=True, kernel=fresh)
    assert calls == []
