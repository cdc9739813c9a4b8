"""libdevice / tl.math functions on the tilegen backend: vecmath's vectorised asin and acos
(accuracy against float64 NumPy over every region of [-1, 1], special values; f64),
and that a libdevice call with the meaning of a TTIR op (exp, sqrt, floor, ...) is vector
code, not one libm call per lane."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402


@triton.jit
def asin_acos(x_ptr, asin_ptr, acos_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(asin_ptr + offsets, libdevice.asin(x), mask=mask)
    tl.store(acos_ptr + offsets, libdevice.acos(x), mask=mask)


def _run_asin_acos(x: np.ndarray, block: int = 1024):
    xt = torch.from_numpy(x)
    asin, acos = torch.empty_like(xt), torch.empty_like(xt)
    compiled = asin_acos[(triton.cdiv(x.size, block),)](xt, asin, acos, x.size, BLOCK=block)
    return asin.numpy(), acos.numpy(), compiled


def _ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(exact.astype(got.dtype))).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def _hard_inputs() -> np.ndarray:
    """Random bit patterns of every exponent below 1 (subnormals included), every f32 just
    around 1/2 (the switch between the two branches) and just below 1 (sqrt of a tiny z),
    the inputs whose asin is just below 1 (where pi/2 - 2y rounds at twice the result's
    ulp), all with both signs; an odd count so the last program's mask cuts a vector."""
    rng = np.random.default_rng(14)
    random_bits = rng.integers(0, 0x3F800000, 1 << 21, dtype=np.uint32)
    half = np.float32(0.5).view(np.uint32)
    one = np.float32(1.0).view(np.uint32)
    near_half = np.arange(half - (1 << 16), half + (1 << 16), dtype=np.uint32)
    below_one = np.arange(one - (1 << 17), one + 1, dtype=np.uint32)
    near_sin_one = np.float32(np.sin(1.0)).view(np.uint32)
    around = np.arange(near_sin_one - (1 << 17), near_sin_one + (1 << 17), dtype=np.uint32)
    positive = np.concatenate([random_bits, near_half, below_one, around]).view(np.float32)
    return np.concatenate([positive, -positive, np.float32([0.3])])


def test_asin_acos_f32_within_1_2_ulp():
    x = _hard_inputs()
    assert x.size % 1024
    asin, acos, _ = _run_asin_acos(x)
    exact_asin, exact_acos = np.arcsin(x.astype(np.float64)), np.arccos(x.astype(np.float64))
    asin_error, acos_error = _ulps(asin, exact_asin), _ulps(acos, exact_acos)
    print(f"asin: max {asin_error.max():.3f} ulp at {x[asin_error.argmax()]!r}; "
          f"acos: max {acos_error.max():.3f} ulp at {x[acos_error.argmax()]!r}")
    assert asin_error.max() <= 1.2
    assert acos_error.max() <= 1.2
    assert np.array_equal(np.signbit(asin), np.signbit(x))  # odd, -0 included


def test_asin_acos_special_values():
    x = np.float32([0.0, -0.0, 1.0, -1.0, 1.0000001, -1.0000001, 2.0, -3.0, np.inf, -np.inf,
                    np.nan, 1e-40, -1e-40, 1e-30])
    asin, acos, _ = _run_asin_acos(x)
    with np.errstate(invalid="ignore"):
        exact_asin = np.arcsin(x.astype(np.float64)).astype(np.float32)
        exact_acos = np.arccos(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(asin, exact_asin)  # NaN outside [-1, 1], pi/2 at 1
    np.testing.assert_array_equal(acos, exact_acos)
    number = ~np.isnan(exact_asin)
    np.testing.assert_array_equal(np.signbit(asin[number]), np.signbit(exact_asin[number]))


def test_asin_takes_the_vector_path():
    """The kernel's LLVM IR computes asin on 16-lane vectors (one vector sqrt) and calls
    no libm asinf / acosf."""
    _, _, compiled = _run_asin_acos(np.linspace(-1, 1, 2049, dtype=np.float32))
    llir = compiled.asm["llir"]
    assert not re.search(r'@"?(asinf|acosf)\b', llir)
    assert re.search(r'call <16 x float> @"?llvm\.sqrt\.v16f32', llir)


@triton.jit
def asin_any(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, libdevice.asin(x) + 3 * libdevice.acos(x), mask=mask)


def test_asin_acos_f64_is_libm_per_lane():
    x = torch.rand(3001, dtype=torch.float64) * 2 - 1
    out = torch.empty_like(x)
    asin_any[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    torch.testing.assert_close(out, torch.asin(x) + 3 * torch.acos(x), rtol=1e-14, atol=1e-14)


@triton.jit
def libdevice_ops(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    positive = libdevice.fabs(x) + 0.5
    total = libdevice.exp(x) + libdevice.log(positive) + libdevice.sqrt(positive)
    total += libdevice.floor(x * 3) + libdevice.ceil(y * 3) + libdevice.trunc(x * 5)
    total += libdevice.erf(x) + libdevice.exp2(y) + libdevice.fmin(x, y)
    total += libdevice.fmax(x, y) + libdevice.copysign(y, x) + libdevice.log2(positive)
    tl.store(out_ptr + offsets, total, mask=mask)


def test_libdevice_calls_with_an_op_of_their_own_are_vector_code():
    x, y = torch.randn(2, 5003) * 2
    out = torch.empty_like(x)
    compiled = libdevice_ops[(triton.cdiv(x.numel(), 512),)](x, y, out, x.numel(), BLOCK=512)
    positive = x.abs() + 0.5
    reference = (torch.exp(x) + torch.log(positive) + torch.sqrt(positive)
                 + torch.floor(x * 3) + torch.ceil(y * 3) + torch.trunc(x * 5)
                 + torch.erf(x) + torch.exp2(y) + torch.fmin(x, y) + torch.fmax(x, y)
                 + torch.copysign(y, x) + torch.log2(positive))
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    llir = compiled.asm["llir"]
    libm = re.findall(r'declare .*@"?(expf|logf|sqrtf|floorf|ceilf|truncf|erff|exp2f|fminf|'
                      r'fmaxf|copysignf)"?\(', llir)
    assert not libm, f"libm called per lane for {libm}"
