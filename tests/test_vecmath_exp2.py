"""vecmath's exp2 (2^f by its own polynomial on the exact fraction of x, then 2^n): within
1 ulp of float64/long-double exp2 over the whole range for f32 and f64, on AVX-512
(vscalefps, vrangeps), without it (x86-64-v3: clamps, two exact powers of two) and on
scalars; subnormal results rounded once; special values as NumPy; vectors that all
underflow give exact zeros. The functions are JIT-compiled here straight from
`MathLibrary` (a loop over W-lane chunks), so no Kina op or Triton kernel is needed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

from tilegen import vecmath
from tilegen.target import LLVM_LOCK, host_target, named_target, new_target_machine

from .test_vecmath import remez_f32

N = 1 << 21
_ENGINES = []  # keep the engines (and so the code) alive for the module's lifetime


def _exp2_function(target_name: str, dtype, width: int):
    """y[i] = exp2(x[i]) for i < n (n a multiple of max(width, 1)), built for the target."""
    target = host_target() if target_name == "host" else named_target(target_name)
    if not target.runs_on_host:
        pytest.skip(f"{target_name} does not run on this CPU")
    scalar = ir.DoubleType() if dtype == np.float64 else ir.FloatType()
    ty = ir.VectorType(scalar, width) if width else scalar
    step = max(width, 1)
    module = ir.Module(name="exp2_test")
    module.triple = target.triple
    i64, ptr = ir.IntType(64), ir.PointerType(ir.IntType(8))
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), "run")
    entry = function.append_basic_block("entry")
    loop, body, done = (function.append_basic_block(name) for name in ("loop", "body", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    index = b.phi(i64)
    index.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed("<", index, function.args[2]), body, done)
    b.position_at_end(body)
    source = b.bitcast(b.gep(b.bitcast(function.args[0], scalar.as_pointer()), [index]),
                       ty.as_pointer())
    result = vecmath.MathLibrary(module, target).call(b, "exp2", b.load(source, align=1))
    destination = b.bitcast(b.gep(b.bitcast(function.args[1], scalar.as_pointer()), [index]),
                            ty.as_pointer())
    b.store(result, destination, align=1)
    index.add_incoming(b.add(index, ir.Constant(i64, step)), body)
    b.branch(loop)
    b.position_at_end(done)
    b.ret_void()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    with LLVM_LOCK:
        engine = llvm.create_mcjit_compiler(parsed, new_target_machine(target))
        engine.finalize_object()
    _ENGINES.append(engine)
    native = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        engine.get_function_address("run"))

    def run(x: np.ndarray) -> np.ndarray:
        padded = np.zeros(-(-x.size // step) * step, dtype)
        padded[: x.size] = x
        out = np.empty_like(padded)
        native(padded.ctypes.data, out.ctypes.data, padded.size)
        return out[: x.size]
    return run


# (target, lanes of f32, lanes of f64): AVX-512's 16/8 lanes, AVX2's 8/4, and scalars.
_BUILDS = [("host", 16, 8), ("x86-64-v3", 8, 4), ("x86-64-v3", 0, 0)]


def _ulps(got: np.ndarray, x: np.ndarray, dtype) -> np.ndarray:
    exact = np.exp2(x.astype(np.longdouble))  # 64-bit significand: exact enough for f64
    with np.errstate(over="ignore"):
        rounded = exact.astype(dtype)
    spacing = np.spacing(np.abs(rounded)).astype(np.longdouble)
    same_inf = np.isinf(got) & np.isinf(rounded)
    error = np.abs(got.astype(np.longdouble) - exact) / spacing
    return np.where(same_inf, 0.0, error.astype(np.float64))


def _inputs(dtype, rng) -> np.ndarray:
    """Uniform over the whole finite-result range, |x| < 1 by random bit patterns (every
    exponent, subnormal x included), both ends (overflow, subnormal results), integers and
    half-integers (f = 0, f = +-1/2), all in an odd count."""
    top, bottom = (1024.0, -1075.0) if dtype == np.float64 else (128.0, -150.0)
    bits = np.uint64 if dtype == np.float64 else np.uint32
    one = np.array(1.0, dtype).view(bits)
    small = rng.integers(0, one, N // 4, dtype=bits).view(dtype)
    small[::2] *= -1
    halves = np.arange(2 * bottom, 2 * top) / 2
    return np.concatenate([
        rng.uniform(bottom, top, N // 2), small, rng.uniform(bottom, bottom + 30, N // 8),
        rng.uniform(top - 2, top, N // 8 + 3), halves]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("target_name,f32_lanes,f64_lanes", _BUILDS)
def test_exp2_within_1_ulp(target_name, f32_lanes, f64_lanes, dtype):
    lanes = f32_lanes if dtype == np.float32 else f64_lanes
    exp2 = _exp2_function(target_name, dtype, lanes)
    x = _inputs(dtype, np.random.default_rng(3 + lanes))
    if lanes == 0:
        x = x[::16]  # a scalar loop: fewer inputs, same regions
    got = exp2(x)
    error = _ulps(got, x, dtype)
    exact = np.exp2(x.astype(np.longdouble))
    # Subnormal results of at most 9 bits, where the polynomial's error is far below their
    # spacing: rounded once (a product through a subnormal intermediate would round twice).
    deep = exact < np.finfo(dtype).smallest_subnormal * 2**9
    print(f"exp2 {np.dtype(dtype).name} {target_name} x{lanes}: max {error.max():.3f} ulp, "
          f"deep subnormals max {error[deep].max():.4f} ulp")
    assert error.max() <= 1.0
    assert error[deep].max() <= 0.5 + 2.0**-10


_SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 127.0, 128.0,
            127.99999, -126.0, -149.0, -149.5, -150.0, -150.00002, -151.0, 1023.0, 1024.0,
            -1022.0, -1074.0, -1075.0, -1075.5, 1e30, -1e30, 3e38, -3e38, 1e-45, -1e-45]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("target_name,f32_lanes,f64_lanes", _BUILDS)
def test_exp2_special_values(target_name, f32_lanes, f64_lanes, dtype):
    exp2 = _exp2_function(target_name, dtype, f32_lanes if dtype == np.float32 else f64_lanes)
    with np.errstate(over="ignore"):
        x = np.array(_SPECIAL, dtype)
    got = exp2(x)
    with np.errstate(all="ignore"):
        want = np.exp2(x.astype(np.longdouble)).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-7 if dtype == np.float32
                               else 3e-16, atol=0)
    assert not np.signbit(got[want == 0]).any()  # underflow and exp2(-inf) give +0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp2_vectors_that_all_underflow_give_exact_zeros(dtype):
    """A vector whose lanes are all below the bound (-150 / -1075) returns +0 without the
    polynomial; one lane at or above it, or NaN, keeps the whole vector computed."""
    lanes = 16 if dtype == np.float32 else 8
    bound = -150.0 if dtype == np.float32 else -1075.0
    exp2 = _exp2_function("host", dtype, lanes)
    groups = [np.resize([-1e6, -np.inf, bound - 0.5, -3e4], lanes),
              np.r_[np.full(lanes - 1, -1e6), bound + 0.75],
              np.r_[np.full(lanes - 1, -1e6), np.nan],
              np.r_[np.full(lanes - 1, -1e6), -3.0]]
    x = np.concatenate(groups).astype(dtype)
    got = exp2(x)
    want = np.exp2(x.astype(np.longdouble)).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert not np.signbit(got[:lanes]).any()


def test_exp2_f32_polynomial_is_the_documented_fit():
    """The stored coefficients are the fit described at vecmath._EXP2_F32 (test_vecmath's
    Remez exchange for 2^f on |f| <= 1/2), within 0.1 ulp of 2^f before rounding."""
    refit = remez_f32(6, 0.5, lambda f: np.expm1(f * np.log(2)) / f)
    np.testing.assert_allclose(refit, vecmath._EXP2_F32, rtol=2.0**-21, atol=0)
    f = np.linspace(-0.5, 0.5, 200001)
    p = 1 + sum(c * f ** (k + 1) for k, c in enumerate(vecmath._EXP2_F32))
    error = (np.abs(p - np.exp2(f)) * np.where(f < 0, 2.0**24, 2.0**23)).max()
    assert error < 0.1
