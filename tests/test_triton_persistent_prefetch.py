"""The persistent softmax's loop (`for row_idx in tl.range(row_start, n_rows, row_step)`)
prefetches the row its next trip reads, `row_step * stride` bytes on, in the first sweep
over this trip's row (prefetch.Streams.next_trip): results at odd sizes and program
counts, with bounds checks on (the last trips' prefetches run past the tensor), and the IR
of the loops that must and must not prefetch."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tests.test_triton_tutorials import softmax_kernel  # noqa: E402


def _prefetch_targets(llir: str) -> list[str]:
    """The i64 expression each prefetch's address adds to its chunk's address, in the
    program function."""
    start = llir.index(".program\"")
    lines = llir[start:llir.index("\n}", start)].splitlines()
    defined = {m.group(1): m.group(2) for line in lines
               if (m := re.match(r"\s*(%\"[^\"]+\") = (.*)", line))}
    targets = []
    for line in lines:
        m = re.search(r"call void @\"llvm.prefetch.p0\"\(ptr (%\"[^\"]+\")", line)
        if m:
            source = defined[m.group(1)]  # inttoptr i64 %sum to ptr
            total = re.match(r"inttoptr i64 (%\"[^\"]+\")", source).group(1)
            targets.append(defined[total])
    return targets


def _persistent_softmax(x: torch.Tensor, programs: int, debug: bool = False):
    y = torch.full_like(x, float("nan"))
    rows, cols = x.shape
    compiled = softmax_kernel[(programs, 1, 1)](
        y, x, x.stride(0), y.stride(0), rows, cols, BLOCK_SIZE=triton.next_power_of_2(cols),
        num_stages=2, debug=debug)
    return y, compiled


@pytest.mark.parametrize("rows,cols,programs", [(37, 781, 8), (64, 1024, 3), (5, 2049, 2),
                                                (9, 1500, 1), (3, 600, 8)])
def test_persistent_softmax_at_odd_sizes(rows, cols, programs):
    torch.manual_seed(rows * cols)
    x = torch.randn(rows, cols) * 2
    y, _ = _persistent_softmax(x, programs, debug=True)
    torch.testing.assert_close(y, torch.softmax(x.double(), dim=1).float(), rtol=1e-5,
                               atol=1e-6)


def test_rows_of_a_padded_view():
    """Row stride larger than the row: the next trip's row is `step * stride` on."""
    torch.manual_seed(2)
    wide = torch.randn(20, 1100)
    x = wide[:, :1030]
    y, _ = _persistent_softmax(x, 4, debug=True)
    torch.testing.assert_close(y, torch.softmax(x.double(), dim=1).float(), rtol=1e-5,
                               atol=1e-6)


def test_the_persistent_loop_prefetches_its_next_row():
    x = torch.randn(16, 1024)
    _, compiled = _persistent_softmax(x, 4)
    targets = _prefetch_targets(compiled.asm["llir"])
    assert targets, "no prefetch in the persistent loop"
    # a run-time distance (the step times the row stride), not the constant 2 KB ahead
    assert all(not target.endswith(", 2048") for target in targets)


@triton.jit
def _carried_rows(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    """Rows reached through a carried pointer: not affine in the induction variable."""
    cols = tl.arange(0, BLOCK)
    row_ptr = x_ptr
    for row in range(0, n_rows):
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
        tl.store(y_ptr + row, tl.sum(x, axis=0))
        row_ptr += n_cols


def test_a_carried_row_pointer_does_not_prefetch_the_next_trip():
    x = torch.randn(6, 1000)
    y = torch.empty(6)
    compiled = _carried_rows[(1,)](x, y, 6, 1000, BLOCK=1024)
    torch.testing.assert_close(y, x.sum(1), rtol=1e-5, atol=1e-4)
    assert _prefetch_targets(compiled.asm["llir"]) == []
