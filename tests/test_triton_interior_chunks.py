"""Interior chunks without edge masks (interior.py): sweeps whose comparisons `A + f < B`
hold on a prefix run that prefix with plain loads and stores and the rest as before.
Results against torch / NumPy at row lengths that are not multiples of the vector width
or BLOCK_SIZE, every comparison form, bounds next to the integer limits, and the IR."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tests.test_triton_tutorials import (  # noqa: E402
    _layer_norm_fwd_fused,
    softmax_kernel_simple,
)
from tests.test_triton_tutorials_2 import LayerNorm  # noqa: E402


def _softmax(x: torch.Tensor, block: int) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))
    softmax_kernel_simple[(x.shape[0],)](y, x, x.stride(0), y.stride(0), x.shape[1],
                                         BLOCK_SIZE=block)
    return y


@pytest.mark.parametrize("cols,block", [(781, 1024), (1000, 1024), (1024, 1024),
                                        (1025, 2048), (80, 128), (97, 128), (1, 128)])
def test_softmax_rows_of_odd_lengths(cols, block):
    torch.manual_seed(cols)
    x = torch.randn(7, cols) * 3
    reference = torch.softmax(x.double(), dim=1).float()
    torch.testing.assert_close(_softmax(x, block), reference, rtol=1e-5, atol=1e-6)


def test_softmax_leaves_the_bytes_past_each_row():
    """Rows of a wider buffer: the store must not write past n_cols in the interior."""
    torch.manual_seed(3)
    wide = torch.randn(5, 1040)
    x = wide[:, :1001]
    y_wide = torch.full((5, 1040), 7.0)
    y = y_wide[:, :1001]
    softmax_kernel_simple[(5,)](y, x, x.stride(0), y.stride(0), 1001, BLOCK_SIZE=1024)
    torch.testing.assert_close(y, torch.softmax(x.double(), dim=1).float(),
                               rtol=1e-5, atol=1e-6)
    assert torch.all(y_wide[:, 1001:] == 7.0)


@pytest.mark.parametrize("rows,cols,block", [(37, 1531, 512), (5, 4096, 1024),
                                             (3, 4100, 1024), (4, 100, 16), (2, 95, 128)])
def test_layer_norm_forward_loops_with_an_edge_trip(rows, cols, block):
    torch.manual_seed(rows)
    x = torch.randn(rows, cols) * 2 + 0.5
    w, b = torch.rand(cols), torch.randn(cols)
    y = torch.empty_like(x)
    mean, rstd = torch.empty(rows), torch.empty(rows)
    _layer_norm_fwd_fused[(rows,)](x, y, w, b, mean, rstd, x.stride(0), cols, 1e-5,
                                   BLOCK_SIZE=block)
    x64 = x.double()
    reference = torch.nn.functional.layer_norm(x64, (cols,), w.double(), b.double(), 1e-5)
    torch.testing.assert_close(y, reference.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mean, x64.mean(1).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,cols", [(67, 1000), (33, 1024), (9, 257)])
def test_layer_norm_backward_at_odd_widths(rows, cols):
    torch.manual_seed(cols)
    x = (torch.randn(rows, cols) * 0.5 - 1).requires_grad_(True)
    w = torch.rand(cols).requires_grad_(True)
    b = torch.rand(cols).requires_grad_(True)
    dy = torch.randn(rows, cols)
    grads = torch.autograd.grad(LayerNorm.apply(x, (cols,), w, b, 1e-5), (x, w, b), dy)
    x64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    expected = torch.autograd.grad(
        torch.nn.functional.layer_norm(x64, (cols,), w64, b64, 1e-5), (x64, w64, b64),
        dy.double())
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4)


@triton.jit
def _flags(out_ptr, start, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    values = start + lanes
    if KIND == 0:
        flag = values < n
    elif KIND == 1:
        flag = values <= n
    elif KIND == 2:
        flag = n > values
    else:
        flag = n >= values
    tl.store(out_ptr + lanes, tl.where(flag, 1, 0).to(tl.int32))


_I32 = 2**31
_BOUNDS = [(0, 781), (-5, 100), (0, 0), (100, 50), (7, 1031), (-3000, -2500),
           (_I32 - 100, _I32 - 1), (_I32 - 50, -3), (-_I32, -_I32 + 20),
           (2**40, 2**40 + 500), (-(2**62), 2**62), (2**63 - 100, 2**63 - 1),
           (-(2**63), -(2**63) + 17)]


def _expected_flags(start: int, n: int, kind: int, block: int) -> np.ndarray:
    bits = 32 if -_I32 <= start < _I32 and -_I32 <= n < _I32 else 64
    lanes = np.arange(block, dtype=object) + start
    wrapped = np.array([(v + 2**(bits - 1)) % 2**bits - 2**(bits - 1) for v in lanes],
                       dtype=object)
    test = {0: wrapped < n, 1: wrapped <= n, 2: n > wrapped, 3: n >= wrapped}[kind]
    return test.astype(np.int32)


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
@pytest.mark.parametrize("start,n", _BOUNDS)
def test_comparisons_near_the_integer_limits(start, n, kind):
    out = torch.full((1024,), -1, dtype=torch.int32)
    _flags[(1,)](out, start, n, KIND=kind, BLOCK=1024)
    np.testing.assert_array_equal(out.numpy(), _expected_flags(start, n, kind, 1024))


@triton.jit
def _through_a_broadcast(out_ptr, n_big, n_small, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    small = tl.arange(0, 16) < n_small
    repeated = tl.reshape(tl.broadcast_to(small[None, :], (BLOCK // 16, 16)), (BLOCK,))
    flag = (lanes < n_big) & repeated
    tl.store(out_ptr + lanes, tl.where(flag, 1, 0).to(tl.int32))


@pytest.mark.parametrize("n_big,n_small", [(1000, 5), (1024, 16), (37, 0)])
def test_a_comparison_read_through_a_broadcast_is_not_folded(n_big, n_small):
    out = torch.full((512,), -1, dtype=torch.int32)
    _through_a_broadcast[(1,)](out, n_big, n_small, BLOCK=512)
    lanes = np.arange(512)
    expected = ((lanes < n_big) & (lanes % 16 < n_small)).astype(np.int32)
    np.testing.assert_array_equal(out.numpy(), expected)


def _program(llir: str) -> list[str]:
    start = llir.index(".program\"")
    return llir[start:llir.index("\n}", start)].splitlines()


def _tensor_accesses(llir: str) -> tuple[int, int]:
    """(plain, masked) 16-lane float loads and stores through addresses made from integers
    (tensor memory; the frame is addressed by `getelementptr`) in the program function."""
    lines = _program(llir)
    from_ints = {m.group(1) for line in lines
                 if (m := re.match(r"\s*(%\"[^\"]+\") = inttoptr", line))}
    plain = 0
    for line in lines:
        m = re.search(r"(?:load <16 x float>, ptr|store <16 x float> %\"[^\"]+\", ptr) "
                      r"(%\"[^\"]+\")", line)
        if m and m.group(1) in from_ints:
            plain += 1
    masked = sum("llvm.masked.load.v16f32" in line or "llvm.masked.store.v16f32" in line
                 for line in lines if "call" in line)
    return plain, masked


def test_softmax_interior_reads_and_writes_without_masks():
    x = torch.randn(3, 781)
    y = torch.empty_like(x)
    compiled = softmax_kernel_simple[(3,)](y, x, x.stride(0), y.stride(0), 781,
                                           BLOCK_SIZE=1024)
    plain, masked = _tensor_accesses(compiled.asm["llir"])
    # the row max's and sum's interior loads and the store's interior, each a loop body
    assert plain >= 4 + 4 + 1
    assert masked > 0  # the edge keeps its masks


def test_layer_norm_forward_interior_trips_without_masks():
    x = torch.randn(2, 1531)
    w, b = torch.rand(1531), torch.randn(1531)
    y = torch.empty_like(x)
    mean, rstd = torch.empty(2), torch.empty(2)
    compiled = _layer_norm_fwd_fused[(2,)](x, y, w, b, mean, rstd, x.stride(0), 1531, 1e-5,
                                           BLOCK_SIZE=512)
    plain, masked = _tensor_accesses(compiled.asm["llir"])
    # the two accumulating loops read x; the last reads x, w, b and stores y
    assert plain >= 4 + 4 + 4 + 4
    assert masked > 0


def test_short_rows_are_left_whole():
    """Rows of at most four chunks are unrolled and not split."""
    x = torch.randn(3, 50)
    y = torch.empty_like(x)
    compiled = softmax_kernel_simple[(3,)](y, x, x.stride(0), y.stride(0), 50,
                                           BLOCK_SIZE=64)
    assert _tensor_accesses(compiled.asm["llir"])[0] == 0
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)
