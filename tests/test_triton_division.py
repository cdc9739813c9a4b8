"""`/` by a value uniform over a tile (a scalar, a constant) is one reciprocal and two
multiplies per lane (elementwise.scaled_reciprocal): within 1.5 ulp of the exact quotient
(computed in float64 / exact fractions) over the whole range, IEEE's special values, and
`tl.div_rn` still an exact division."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402


@triton.jit
def _by_scalar(x_ptr, y_ptr, d, n, ROUNDED: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    if ROUNDED:
        y = tl.div_rn(x, d)
    else:
        y = x / d
    tl.store(y_ptr + offsets, y, mask=mask)


@triton.jit
def _by_loaded(x_ptr, d_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """The divisor a loaded scalar, as softmax's tl.sum result."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) / tl.load(d_ptr), mask=mask)


@triton.jit
def _by_constant(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) / 3.0, mask=mask)


def _dividends(dtype, count: int, seed: int) -> torch.Tensor:
    """Random bit patterns of finite values over every exponent, and some round ones."""
    rng = np.random.default_rng(seed)
    if dtype == torch.float32:
        bits = rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
    else:
        values = rng.integers(0, 2**64, count, dtype=np.uint64).view(np.float64)
    values = np.where(np.isfinite(values), values, 1.5)
    values[:6] = [0.0, -0.0, 1.0, -3.0, 7.0, 0.1]
    return torch.from_numpy(values.copy())


def _ulps(got: np.ndarray, x: np.ndarray, d: float, dtype) -> np.ndarray:
    """|got - x / d| in units of the last place of the correctly rounded quotient."""
    np_type = np.float32 if dtype == torch.float32 else np.float64
    out = np.zeros(len(x))
    for k, (g, v) in enumerate(zip(got, x, strict=True)):
        exact = Fraction(float(v)) / Fraction(d)
        try:
            with np.errstate(over="ignore"):
                rounded = np_type(float(exact))
        except OverflowError:
            rounded = np_type(np.inf if exact > 0 else -np.inf)
        if not np.isfinite(rounded):
            out[k] = 0.0 if g == rounded else np.inf
            continue
        ulp = Fraction(float(np.spacing(np.abs(rounded))))
        out[k] = float(abs(Fraction(float(g)) - exact) / ulp) if np.isfinite(g) else np.inf
    return out


_F32_DIVISORS = [3.0, -7.1, 0.1, 1.0, 2.0 ** 127 * 1.5, 3.4e38, 2.0 ** 126, 2.0 ** -126,
                 1.1e-38, 1e-40, 1.4e-45, -3e-42]
_F64_DIVISORS = [3.0, -7.1, 0.1, 2.0 ** 1023 * 1.5, 2.0 ** 1022, 2.0 ** -1022, 1e-310,
                 5e-324]


@pytest.mark.parametrize("dtype,divisor", [(torch.float32, d) for d in _F32_DIVISORS] +
                         [(torch.float64, d) for d in _F64_DIVISORS])
def test_division_by_a_scalar_is_within_one_and_a_half_ulp(dtype, divisor):
    x = _dividends(dtype, 1500, seed=len(str(divisor)))
    y = torch.empty_like(x)
    if dtype == torch.float32:  # a float argument is an f32 scalar
        d = float(np.float32(divisor))
        _by_scalar[(triton.cdiv(len(x), 256),)](x, y, d, len(x), ROUNDED=False, BLOCK=256)
    else:
        d = divisor
        _by_loaded[(triton.cdiv(len(x), 256),)](x, torch.tensor([d], dtype=dtype), y,
                                                  len(x), BLOCK=256)
    errors = _ulps(y.numpy(), x.numpy(), d, dtype)
    assert errors.max() <= 1.5, (divisor, errors.max())


def test_special_values_are_ieee():
    x = torch.tensor([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 3e38, 1e-45] * 2,
                     dtype=torch.float32)
    for d in [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0, float(np.float32(1e-45)), 3e38]:
        y = torch.empty_like(x)
        _by_scalar[(1,)](x, y, d, len(x), ROUNDED=False, BLOCK=32)
        with np.errstate(all="ignore"):
            expected = x.numpy() / np.float32(d)
        got = y.numpy()
        special = ~np.isfinite(expected) | (expected == 0)
        np.testing.assert_array_equal(got[special], expected[special], err_msg=f"d = {d}")
        # the signs of zeros and infinities too
        assert np.array_equal(np.signbit(got), np.signbit(expected)), d
        if np.isfinite(d) and d != 0:
            finite = np.isfinite(x.numpy())
            assert _ulps(got[finite], x.numpy()[finite], d, torch.float32).max() <= 1.5


@pytest.mark.parametrize("n", [1, 17, 1000])
def test_a_loaded_divisor_and_a_constant_one(n):
    torch.manual_seed(n)
    x = torch.randn(n) * 100
    d = torch.tensor([-0.37])
    y = torch.empty_like(x)
    _by_loaded[(triton.cdiv(n, 128),)](x, d, y, n, BLOCK=128)
    assert _ulps(y.numpy(), x.numpy(), float(d[0]), torch.float32).max() <= 1.5
    _by_constant[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
    assert _ulps(y.numpy(), x.numpy(), 3.0, torch.float32).max() <= 1.5


def test_div_rn_stays_exact():
    x = _dividends(torch.float32, 4096, seed=5)
    y = torch.empty_like(x)
    for d in [3.0, 0.1, 1e-40, 3.3e38]:
        _by_scalar[(16,)](x, y, d, len(x), ROUNDED=True, BLOCK=256)
        np.testing.assert_array_equal(y.numpy(), x.numpy() / np.float32(d))


def _vector_divisions(llir: str) -> int:
    return sum(" fdiv <" in line for line in llir.splitlines())


def test_the_lanes_multiply_and_div_rn_divides():
    x, y = torch.randn(300), torch.empty(300)
    fast = _by_scalar[(2,)](x, y, 3.0, 300, ROUNDED=False, BLOCK=256)
    rounded = _by_scalar[(2,)](x, y, 3.0, 300, ROUNDED=True, BLOCK=256)
    assert _vector_divisions(fast.asm["llir"]) == 0
    assert _vector_divisions(rounded.asm["llir"]) > 0
