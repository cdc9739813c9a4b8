"""The generated exp/log stay within 2 ulp over the whole float range (brief §3 accuracy:
greedy decoding has a 3e-5 logit margin), and special values follow IEEE/NumPy.

The f32 exp (a degree-5 minimax polynomial) was also checked on every f32 input in
[-104, 88.73] (the rest saturate): max 1.91 ulp; the sweeps below keep its hard regions."""

from __future__ import annotations

import math
import re

import mpmath
import numpy as np
import pytest

from tilegen import vecmath
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
    error = _ulp_error(got, np.exp(x.astype(np.float64)), np.float32).max()
    print(f"exp f32 uniform sweep: max {error:.3f} ulp")
    assert error <= 2.0


def _hard_exp_f32_inputs(rng, size):
    """Subnormal results, |x| <= 1, every exponent of |x| < 2 (subnormal x included), and
    the overflow edge."""
    quarter = size // 4
    small = rng.integers(0, 0x40000000, quarter).astype(np.uint32).view(np.float32)  # |x| < 2
    small[::2] *= -1
    return np.concatenate([
        rng.uniform(-104.0, -87.0, quarter), rng.uniform(-1.0, 1.0, quarter), small,
        rng.uniform(86.0, 88.72, size - 3 * quarter)]).astype(np.float32)


def _check_hard_exp_f32(exp_f32, label):
    x = _hard_exp_f32_inputs(np.random.default_rng(5), N + 3)
    got = exp_f32(x)
    exact = np.exp(x.astype(np.float64))
    error = _ulp_error(got, exact, np.float32)
    deep = exact < 2.0**-140  # subnormal results: vscalefps / the split 2^n round once
    print(f"exp f32 hard regions ({label}): max {error.max():.3f} ulp, "
          f"results below 2^-140: max {error[deep].max():.4f} ulp")
    assert error.max() <= 2.0
    assert error[deep].max() <= 0.5 + 2.0**-10


def test_exp_f32_hard_regions_within_2_ulp(math_module):
    _check_hard_exp_f32(math_module.exp_f32, "host")


def test_exp_f32_without_avx512_within_2_ulp(monkeypatch):
    """The generic path (clamp, two exact powers of two) on the same polynomial, as the
    AVX2 target (no AVX-512) builds it."""
    monkeypatch.delenv("TILEGEN_CACHE_DIR", raising=False)  # keep this build off the disk
    size = N + 3
    module = compile_source(f"fn exp_generic_f32(x: Tensor[F32, [{size}], @host]) -> "
                            f"Tensor[F32, [{size}], @host] {{ return exp(x); }}",
                            "vecmath_generic.kina", target="x86-64-v3")
    _check_hard_exp_f32(module.exp_generic_f32, "generic")
    x = np.ones(size, np.float32)
    with np.errstate(over="ignore"):  # 1e300 -> inf
        x[: len(SPECIAL_EXP)] = SPECIAL_EXP
    got = module.exp_generic_f32(x)[: len(SPECIAL_EXP)]
    with np.errstate(all="ignore"):
        want = np.exp(x[: len(SPECIAL_EXP)])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=3e-7)
    assert not np.signbit(got[want == 0]).any()


def _fit_exp_f32(degree=5, grid=20001):
    """The fit documented at vecmath._EXP_F32: p(r) = 1 + c1 r + ... + c_degree r^degree,
    minimax for the error in f32 ulps of e^r on |r| <= vecmath._EXP_REDUCED_BOUND."""
    return remez_f32(degree, vecmath._EXP_REDUCED_BOUND, lambda r: np.expm1(r) / r, grid)


def remez_f32(degree, half_width, quotient, grid=20001):
    """p(r) = 1 + c1 r + ... + c_degree r^degree for g(r) = 1 + r quotient(r) (g = e^r, 2^r)
    on |r| <= half_width, minimax for the error in f32 ulps of g (g in [1/2, 1) below 0, in
    [1, 2) above). As p(r) - g(r) = r (q(r) - quotient(r)) with q = c1 + c2 r + ..., this is
    a weighted fit of q (a Haar basis, so the Remez exchange applies) with weight
    |r| / ulp(g(r)). Each coefficient is rounded to f32 in turn and the remaining ones
    refitted."""
    r = half_width * np.sin(np.linspace(-np.pi / 2, np.pi / 2, grid))
    r = r[r != 0]
    weight = np.abs(r) * np.where(r < 0, 2.0**24, 2.0**23)
    coefficients: list[float] = []
    while len(coefficients) < degree:
        target = quotient(r) - sum(c * r**k for k, c in enumerate(coefficients))
        basis = r[:, None] ** np.arange(len(coefficients), degree)
        free = basis.shape[1]
        nodes = half_width * np.sin(np.linspace(-np.pi / 2, np.pi / 2, free + 1))
        reference = np.clip(np.searchsorted(r, nodes), 0, r.size - 1)
        for _ in range(100):
            signs = (-1.0) ** np.arange(free + 1)
            system = np.column_stack([basis[reference], signs / weight[reference]])
            solution = np.linalg.solve(system, target[reference])[:free]
            error = weight * (basis @ solution - target)
            # One extremum per run of equal sign; keep the free + 1 largest at the ends.
            runs = np.split(np.arange(r.size), np.flatnonzero(np.diff(np.sign(error))) + 1)
            peaks = [run[np.argmax(np.abs(error[run]))] for run in runs]
            while len(peaks) > free + 1:
                peaks.pop(0 if abs(error[peaks[0]]) < abs(error[peaks[-1]]) else -1)
            if len(peaks) < free + 1 or np.array_equal(peaks, reference):
                break
            reference = np.array(peaks)
        coefficients.append(float(np.float32(solution[0])))
    return coefficients


def _polynomial_ulps(coefficients) -> float:
    """Max error of 1 + c1 r + ... in f32 ulps of e^r on the reduced interval (exact
    arithmetic, before the evaluation's own roundings)."""
    half_width = vecmath._EXP_REDUCED_BOUND
    rr = np.linspace(-half_width, half_width, 200001)
    p = 1 + sum(c * rr ** (k + 1) for k, c in enumerate(coefficients))
    return float((np.abs(p - np.exp(rr)) * np.where(rr < 0, 2.0**24, 2.0**23)).max())


def test_exp_f32_polynomial_is_the_documented_fit():
    """The stored coefficients are the fit described at vecmath._EXP_F32 (to a few f32
    ulps: another LAPACK may round a float64 solve differently), and they are within
    1.08 ulp of e^r before rounding."""
    refit = _fit_exp_f32()
    np.testing.assert_allclose(refit, vecmath._EXP_F32, rtol=2.0**-21, atol=0)
    error = _polynomial_ulps(vecmath._EXP_F32)
    print(f"exp f32 polynomial: max {error:.3f} ulp before rounding "
          f"(refit: {_polynomial_ulps(refit):.3f})")
    assert error < 1.08


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


SPECIAL_EXP = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, 89.0, -103.9, -104.0,
               1e-30, 1e-40, -1e-40, 104.5, -104.5, 1e30, -1e30, 3.4e38, -3.4e38, 709.7, 709.8,
               -745.1, -745.3, 1e300, -1e300]
SPECIAL_LOG = [np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, 1e-45, 1e-40, 3.4e38]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values_follow_numpy(math_module, dtype):
    suffix = "f32" if dtype == np.float32 else "f64"
    for op, values, reference in (("exp", SPECIAL_EXP, np.exp), ("log", SPECIAL_LOG, np.log)):
        x = np.ones(N + 3, dtype)
        with np.errstate(over="ignore"):  # 1e300 -> inf in float32
            x[: len(values)] = values
        got = getattr(math_module, f"{op}_{suffix}")(x)[: len(values)]
        with np.errstate(all="ignore"):
            want = reference(x[: len(values)])
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=op)
        finite = ~np.isnan(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=3e-7 if dtype == np.float32
                                   else 5e-16, err_msg=op)
        assert not np.signbit(got[want == 0]).any(), op  # exp(-inf) and underflow: +0


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


# ---- erf ----------------------------------------------------------------------------------

def _fit_erf_f64():
    """The fit described at vecmath._ERF_F64_POLY: erf(a)/a on u = a^2/8 - 1, a in [0, 4],
    Chebyshev interpolation at 4000 nodes, degree 20, converted to monomials."""
    from numpy.polynomial import chebyshev

    nodes = np.cos(np.pi * (np.arange(4000) + 0.5) / 4000)
    a = np.sqrt((nodes + 1) * 8)
    values = np.array([math.erf(v) / v for v in a])
    return chebyshev.cheb2poly(chebyshev.chebfit(nodes, values, 20))


def test_erf_polynomial_is_the_documented_fit():
    np.testing.assert_allclose(_fit_erf_f64(), vecmath._ERF_F64_POLY, rtol=1e-9, atol=1e-15)
    a = np.linspace(1e-6, vecmath.ERF_CLAMP, 400001)
    u = a * a / 8 - 1
    poly = np.zeros_like(u)
    for coefficient in reversed(vecmath._ERF_F64_POLY):
        poly = poly * u + coefficient
    exact = np.array([math.erf(v) for v in a])
    assert np.max(np.abs(a * poly - exact) / exact) < 2e-11


class _DepthBuilder:
    """Values as (number, multiply-adds on the longest path to it), for
    vecmath._interleaved_horner without LLVM."""

    def fmul(self, x, y):
        return (x[0] * y[0], max(x[1], y[1]) + 1)


def _fma(x, y, z):
    return (x[0] * y[0] + z[0], max(x[1], y[1], z[1]) + 1)


@pytest.mark.parametrize("chains", [1, 2, 4, 8])
@pytest.mark.parametrize("count", [1, 2, 5, 21])
def test_interleaved_horner_is_the_polynomial_with_short_chains(chains, count):
    rng = np.random.default_rng(count * 10 + chains)
    coefficients = rng.standard_normal(count)
    for u in (-0.9, 0.3, 1.0):
        value, depth = vecmath._interleaved_horner(
            _DepthBuilder(), _fma, (u, 0), [(c, 0) for c in coefficients], chains)
        assert value == pytest.approx(np.polyval(coefficients[::-1], u), rel=1e-12, abs=1e-12)
        # log2(chains) squarings, the chains in u^chains, log2(chains) joins.
        steps = chains.bit_length() - 1
        assert depth <= max(0, -(-count // chains) - 1) + 2 * steps + (chains > 1)


def test_erf_f32_multiply_adds_form_short_chains():
    # erf's 20 f64 multiply-adds as one Horner chain were its latency (4 cycles each): the
    # erf of 6.3M floats ran about 1.5x slower on one thread than with four chains.
    from kina_frontend import program_from_text
    from tilegen import pipeline

    source = "fn f(x: Tensor[F32, [4096], @host]) -> Tensor[F32, [4096], @host] { " \
             "return erf(x); }"
    text = str(pipeline.codegen(pipeline.plan_program(program_from_text(source))))
    depth: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r'\s*(%"?[\w.]+"?) = (?:call <16 x double> @"llvm\.fma\.v16f64"|fmul '
                         r'<16 x double>)(.*)', line)
        if match:
            used = re.findall(r'%"?[\w.]+"?', match.group(2))
            depth[match.group(1)] = 1 + max((depth.get(name, 0) for name in used), default=0)
    assert len(depth) >= 20
    assert max(depth.values()) <= 10


@pytest.fixture(scope="module")
def erf_module():
    size = N + 3
    source = "\n".join(
        f"fn erf_{dt.lower()}(x: Tensor[{dt}, [{size}], @host]) -> "
        f"Tensor[{dt}, [{size}], @host] {{ return erf(x); }}" for dt in ("F32", "F64"))
    return compile_source(source, "erf.kina")


def test_erf_f32_within_1_ulp(erf_module):
    # Every 517th f32 bit pattern of [0, 4.5] (2M values, every exponent) with alternating
    # signs, then 2M random patterns over the whole range; erf(x) rounds to +-1 beyond 3.92.
    magnitudes = np.arange(0, 0x40900000, 0x40900000 // (N // 2) + 1, dtype=np.uint32)
    signs = np.where(np.arange(magnitudes.size) % 2 == 0, 0, 0x80000000).astype(np.uint32)
    stepped = (magnitudes | signs).view(np.float32)
    rng = np.random.default_rng(5)
    anywhere = rng.integers(0, 0xFF800000, N // 2, dtype=np.uint64).astype(np.uint32).view(
        np.float32)
    dense = np.linspace(-4.5, 4.5, N // 2, dtype=np.float32)  # the curved part, densely
    for values in (stepped, anywhere, dense):
        values = values[~np.isnan(values)]
        got = erf_module.erf_f32(_sweep(values, np.float32))[: values.size]
        exact = np.vectorize(math.erf, otypes=[np.float64])(values.astype(np.float64))
        error = _ulp_error(got, exact, np.float32)
        print(f"erf f32: max {error.max():.3f} ulp at {values[error.argmax()]!r}")
        assert error.max() <= 1.0


def test_erf_special_values_and_f64(erf_module):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-40, 3.92, 10.0], np.float32)
    got = erf_module.erf_f32(_sweep(x, np.float32))[: x.size]
    assert np.isnan(got[0]) and got[1] == 1 and got[2] == -1
    assert got[3] == 0 and np.signbit(got[4]) and got[-1] == 1
    np.testing.assert_array_equal(got[5:7], (x[5:7].astype(np.float64) * 2 / math.sqrt(
        math.pi)).astype(np.float32))  # erf(x) = 2x / sqrt(pi) near 0
    rng = np.random.default_rng(6)
    y = rng.standard_normal(N + 3) * 3
    got = erf_module.erf_f64(y)
    exact = np.array([float(mpmath.erf(mpmath.mpf(v))) for v in y[:20000]])
    assert _ulp_error(got[:20000], exact, np.float64).max() <= 1.0  # libm's erf per lane


# ---- asin, acos (their f32 accuracy: tests/test_triton_math.py) ------------------------------

def _fit_asin_f32(degree=4, nodes=4000):
    """The fit described at vecmath._ASIN_F32: P(z) minimising the relative error
    z (P(z) - g(z)) of asin, g = (asin(sqrt z) - sqrt z) / z^1.5, on Chebyshev nodes in
    [0, 1/4], by Lawson's iteration (weighted least squares, each node's weight multiplied
    by its error), g in 40-digit mpmath."""
    mpmath.mp.dps = 40
    z = 0.125 * (np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes) + 1)
    g = np.array([float((mpmath.asin(mpmath.sqrt(v)) - mpmath.sqrt(v)) / mpmath.mpf(v) ** 1.5)
                  for v in z])
    basis = z[:, None] ** np.arange(degree + 1)
    weight = np.ones(nodes)
    for _ in range(200):
        scale = z * np.sqrt(weight)
        solution = np.linalg.lstsq(basis * scale[:, None], g * scale, rcond=None)[0]
        weight *= np.abs(z * (basis @ solution - g))
        weight /= weight.sum()
    return solution


def test_asin_polynomial_is_the_documented_fit():
    refit = _fit_asin_f32()
    np.testing.assert_allclose(refit, vecmath._ASIN_F32, rtol=2.0**-20, atol=0)
    z = np.linspace(0, 0.25, 200001)[1:]
    poly = np.zeros_like(z)
    for coefficient in reversed(vecmath._ASIN_F32):
        poly = poly * z + coefficient
    y = np.sqrt(z)
    relative = np.abs(y + y * z * poly - np.arcsin(y)) / np.arcsin(y)
    assert relative.max() < 6e-9  # 0.1 ulp of f32 before the evaluation's roundings
