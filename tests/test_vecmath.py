"""The generated exp/log stay within 2 ulp over the whole float range (brief §3 accuracy:
greedy decoding has a 3e-5 logit margin), and special values follow IEEE/NumPy."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from tilegen.api import compile_source

N = 1 << 22  # 4M elements per sweep; the tail of each 16-lane loop is exercised too (N+3)


@pytest.fixture(scope="module")
def math_module():
    size = N + 3
    source = "\n".join(
        f"fn {op}_{dt.lower()}(x: Tensor[{dt}, [{size}], @host]) -> "
        f"Tensor[{dt}, [{size}], @host] {{ return {op}(x); }}"
        for op in ("exp", "log") for dt in ("F32", "F64"))
    return compile_source(source, "vecmath.kina")


def _ulp_error(got: np.ndarray, exact: np.ndarray, dtype) -> np.ndarray:
    """|got - exact| in units of the spacing of `dtype` at the exact value."""
    with np.errstate(over="ignore"):
        rounded = exact.astype(dtype)
    spacing = np.spacing(np.abs(rounded)).astype(np.float64)
    same_inf = np.isinf(got) & np.isinf(rounded) & (np.sign(got) == np.sign(rounded))
    return np.where(same_inf, 0.0, np.abs(got.astype(np.float64) - exact) / spacing)


def _sweep(values, dtype):
    padded = np.ones(N + 3, dtype)
    padded[: values.size] = values[: N + 3]
    return padded


def test_exp_f32_within_2_ulp(math_module):
    rng = np.random.default_rng(1)
    x = _sweep(rng.uniform(-103.97, 88.72, N + 3).astype(np.float32), np.float32)
    got = math_module.exp_f32(x)
    assert _ulp_error(got, np.exp(x.astype(np.float64)), np.float32).max() <= 2.0


def test_log_f32_within_2_ulp_over_all_positive_floats(math_module):
    rng = np.random.default_rng(2)
    # Random bit patterns cover every exponent, subnormals included.
    x = rng.integers(1, 0x7F800000, N + 3).astype(np.uint32).view(np.float32)
    got = math_module.log_f32(x)
    assert _ulp_error(got, np.log(x.astype(np.float64)), np.float32).max() <= 2.0


def test_f64_within_2_ulp_against_mpmath(math_module):
    rng = np.random.default_rng(3)
    x = np.ones(N + 3)
    x[:2000] = rng.uniform(-745.0, 709.0, 2000)
    got = math_module.exp_f64(x)[:2000]
    mpmath.mp.prec = 80
    exact = np.array([float(mpmath.exp(v)) for v in x[:2000]])
    assert _ulp_error(got, exact, np.float64).max() <= 2.0
    y = np.ones(N + 3)
    y[:2000] = np.abs(rng.standard_normal(2000)) * np.exp(rng.uniform(-700, 700, 2000))
    got = math_module.log_f64(y)[:2000]
    exact = np.array([float(mpmath.log(v)) for v in y[:2000]])
    assert _ulp_error(got, exact, np.float64).max() <= 2.0


def test_f64_sweep_against_numpy(math_module):
    rng = np.random.default_rng(4)
    x = rng.uniform(-745.0, 709.0, N + 3)
    assert _ulp_error(math_module.exp_f64(x), np.exp(x), np.float64).max() <= 2.0
    y = rng.integers(1, 0x7FF0000000000000, N + 3, dtype=np.int64).view(np.float64)
    assert _ulp_error(math_module.log_f64(y), np.log(y), np.float64).max() <= 2.0


SPECIAL_EXP = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, 89.0, -103.9, -104.0, 1e-30]
SPECIAL_LOG = [np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, 1e-45, 1e-40, 3.4e38]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values_follow_numpy(math_module, dtype):
    suffix = "f32" if dtype == np.float32 else "f64"
    for op, values, reference in (("exp", SPECIAL_EXP, np.exp), ("log", SPECIAL_LOG, np.log)):
        x = np.ones(N + 3, dtype)
        x[: len(values)] = values
        got = getattr(math_module, f"{op}_{suffix}")(x)[: len(values)]
        with np.errstate(all="ignore"):
            want = reference(x[: len(values)])
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=op)
        finite = ~np.isnan(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=3e-7 if dtype == np.float32
                                   else 5e-16, err_msg=op)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vectors_that_all_underflow_give_exact_zeros(math_module, dtype):
    """A vector whose lanes are all below the underflow bound skips the polynomial and
    returns +0: only when every lane is that low, NaN lanes excluded (masked softmax rows)."""
    lanes = 16 if dtype == np.float32 else 8
    bound = -104.5 if dtype == np.float32 else -746.0  # just below each type's bound
    low = [-1e9, -np.inf, -3e38, -800.0, bound]
    groups = [
        np.resize(low, lanes),                                  # all low: skipped
        np.r_[np.full(lanes - 1, -1e9), -50.0],                 # one lane normal
        np.r_[np.full(lanes - 1, -1e9), np.nan],                # NaN is never "low"
        np.r_[np.full(lanes - 1, -1e9), -103.0],                # just above the f32 bound
    ]
    values = np.concatenate(groups).astype(dtype)
    x = np.ones(N + 3, dtype)
    x[: values.size] = values  # the groups start on lane 0 of the loop's tiles
    got = getattr(math_module, f"exp_{'f32' if dtype == np.float32 else 'f64'}")(x)
    got = got[: values.size]
    with np.errstate(under="ignore"):
        want = np.exp(values.astype(np.float64)).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.all(np.signbit(got[:lanes]) == 0) and np.all(got[:lanes] == 0)
    np.testing.assert_allclose(got[finite], want[finite], rtol=3e-7, atol=1e-323)
