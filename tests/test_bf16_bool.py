"""BF16 and BOOL at the call boundary and in compiled code, consts as numbers, and the
vectorised erf.

- BF16 arguments are ml_dtypes.bfloat16 arrays (through the native entry and the Python
  path alike), results come back as ml_dtypes arrays; rounding is to nearest, ties to even,
  checked bit by bit against an integer formula written here;
- BOOL arrays are NumPy bool_, one byte per element, read and written as such;
- a wrong dtype (float16 for BF16, uint8 for BOOL) is a clear ArgumentError;
- a const where a number is expected is that const's value.
(The vectorised erf is checked in test_vecmath.py.)
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

import tilegen
from kina_frontend import KinaError, interpret, program_from_text
from tilegen.api import compile_program

BF16 = np.dtype(ml_dtypes.bfloat16)


def _compile(source: str, jit: bool = True):
    return compile_program(program_from_text(source), jit=jit)


def _round_bits(value: float) -> int:
    """bf16 bits of the f32 `value`: round to nearest, ties to even (finite values)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def test_bf16_rounding_is_to_nearest_even_bit_for_bit():
    # Every tie and near-tie pattern of the low half, for a spread of exponents and signs.
    highs = [0x3F80, 0x3F81, 0x4049, 0xC049, 0x0001, 0x7F7F, 0x8080]
    lows = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF]
    values = np.array([(h << 16) | low for h in highs for low in lows], np.uint32).view(np.float32)
    module = _compile(f"fn f(x: Tensor[F32, [{values.size}], @host]) -> "
                      f"Tensor[BF16, [{values.size}], @host] {{ return cast(x, BF16); }}")
    got = module.f(values)
    assert got.dtype == BF16
    expected = [_round_bits(float(v)) for v in values]
    assert got.view(np.uint16).tolist() == expected


def test_bf16_nan_and_inf_survive_rounding():
    values = np.array([np.nan, np.inf, -np.inf, 3.4e38, -3.4e38], np.float32)
    module = _compile("fn f(x: Tensor[F32, [5], @host]) -> Tensor[BF16, [5], @host] "
                      "{ return cast(x, BF16); }")
    got = module.f(values).astype(np.float32)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf
    assert got[3] == np.inf and got[4] == -np.inf  # above the largest bf16: rounds to inf


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("size", [1, 17, 33, 100])
def test_bf16_arithmetic_rounds_once_per_op(jit, size):
    source = (f"fn f(a: Tensor[BF16, [{size}], @host], b: Tensor[BF16, [{size}], @host]) -> "
              f"Tensor[BF16, [{size}], @host] {{ return add(mul(a, b), a); }}")
    rng = np.random.default_rng(size)
    a, b = (rng.standard_normal(size).astype(BF16) for _ in range(2))
    got = _compile(source, jit).f(a, b)
    product = [_round_bits(float(x) * float(y)) for x, y in zip(a.astype(np.float32),
                                                               b.astype(np.float32),
                                                               strict=True)]
    product_values = np.array(product, np.uint16).view(BF16).astype(np.float32)
    want = [_round_bits(float(np.float32(p) + np.float32(x)))
            for p, x in zip(product_values, a.astype(np.float32), strict=True)]
    assert got.dtype == BF16 and got.view(np.uint16).tolist() == want


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("shape", [(1,), (5,), (17,), (33,), (3, 49), (2, 3, 21), (7, 13)])
def test_bf16_tail_stores_stay_inside_the_result(jit, shape):
    """A row whose vector tail has one lane (length 1 mod 4) once had its tail stored as 4
    bytes by LLVM 22 (a masked truncating store with one constant lane): the element after
    each row, past the end for the last one, was overwritten. The result here is a view
    into a larger canvas whose next elements must keep their canary."""
    dims = ", ".join(map(str, shape))
    source = (f"fn f(a: Tensor[F32, [{dims}], @host]) -> Tensor[BF16, [{dims}], @host] "
              "{ return cast(a * 2.0, BF16); }")
    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    count = int(np.prod(shape))
    canvas = np.full(count + 16, 7.0, np.float32).astype(BF16)
    result = canvas[:count].reshape(shape)
    _compile(source, jit).f(a, out=result)
    assert np.array_equal(result.astype(np.float32), (a * 2).astype(BF16).astype(np.float32))
    assert np.all(canvas[count:].astype(np.float32) == 7.0)


def test_bf16_matmul_accumulates_in_f32():
    source = ("fn f(a: Tensor[BF16, [3, 19], @host], b: Tensor[BF16, [19, 5], @host]) -> "
              "Tensor[F32, [3, 5], @host] { return matmul(a, b); }")
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((3, 19)).astype(BF16), rng.standard_normal((19, 5)).astype(BF16)
    got = _compile(source).f(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_wrong_element_types_are_clear_errors():
    module = _compile("fn f(x: Tensor[BF16, [4], @host], m: Tensor[BOOL, [4], @host]) -> "
                      "Tensor[BF16, [4], @host] { return where(m, x, 0.0); }")
    x, m = np.ones(4, BF16), np.array([True, False, True, False])
    np.testing.assert_array_equal(module.f(x, m).astype(np.float32), [1, 0, 1, 0])
    with pytest.raises(tilegen.ArgumentError, match="bfloat16"):
        module.f(np.ones(4, np.float16), m)
    with pytest.raises(tilegen.ArgumentError, match="bool"):
        module.f(x, m.astype(np.uint8))
    # The native entry itself takes ml_dtypes' bfloat16 and bool_ arrays (None: it ran the
    # kernel) and declines other dtypes (the Python path then raises).
    entry = module.f.__self__.__globals__["_entry"]
    out = np.empty(4, BF16)
    assert entry(x, m, out) is None
    assert entry(np.ones(4, np.float16), m, out) is not None
    assert entry(x, m.astype(np.uint8), out) is not None
    assert entry(x, m, np.empty(4, np.uint16)) is not None
    module.f(x, m, out=out)  # the native entry writes a bf16 output in place
    np.testing.assert_array_equal(out.astype(np.float32), [1, 0, 1, 0])
    with pytest.raises(tilegen.ArgumentError):
        module.f(x, m, out=np.empty(4, np.float32))


def test_bool_outputs_are_bytes_of_zero_and_one():
    module = _compile("fn f(x: Tensor[F32, [37], @host]) -> Tensor[BOOL, [37], @host] "
                      "{ return less(x, 0.0); }")
    x = np.random.default_rng(1).standard_normal(37).astype(np.float32)
    got = module.f(x)
    assert got.dtype == np.bool_ and set(got.view(np.uint8).tolist()) <= {0, 1}
    np.testing.assert_array_equal(got, x < 0)


def test_consts_are_numbers_where_numbers_are_expected():
    source = """
const N = 7;
const H = 2;
const D = H * 3;
fn f(x: Tensor[F32, [N, D], @host], ids: Tensor[I64, [N], @host])
    -> (Tensor[F32, [D], @host], Tensor[F32, [N, D], @host], Tensor[I64, [N], @host]) {
  return (sum(x, axis=0) / N, pow(x * D, H) + 1e-3 * (N - 1), ids * N);
}"""
    rng = np.random.default_rng(0)
    x, ids = rng.standard_normal((7, 6)).astype(np.float32), rng.integers(0, 9, 7)
    mean, scaled, times = _compile(source).f(x, ids)
    np.testing.assert_allclose(mean, x.sum(axis=0) / 7, rtol=1e-6)
    np.testing.assert_allclose(scaled, (x * 6) ** 2 + 1e-3 * 6, rtol=1e-5)
    np.testing.assert_array_equal(times, ids * 7)
    program = program_from_text(source)
    np.testing.assert_allclose(interpret(program, "f", x, ids)[0], x.sum(axis=0) / 7,
                               rtol=1e-6)


def test_a_tensor_named_like_a_const_is_the_tensor():
    with pytest.raises(KinaError, match="is a const dimension, not a tensor"):
        program_from_text("const N = 3;\nfn f(x: Tensor[F32, [N], @host]) -> "
                          "Tensor[F32, [N], @host] { return exp(N); }")


def _bf16_type(shape, dtype="BF16") -> str:
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


_ROW = (5, 33)
BF16_PROGRAMS = {
    **{op: (f"{op}(a)", ("a",)) for op in ("neg", "exp", "tanh", "relu", "gelu", "gelu_tanh",
                                           "erf", "sigmoid", "silu", "abs")},
    **{op: (f"{op}(p)", ("p",)) for op in ("log", "sqrt", "rsqrt")},
    **{op: (f"{op}(a, b)", ("a", "b")) for op in ("add", "sub", "mul", "div", "maximum",
                                                   "minimum")},
    "pow": ("pow(a, 3)", ("a",)),
    "softmax": ("softmax(a, axis=1)", ("a",)),
    "log_softmax": ("log_softmax(a, axis=0)", ("a",)),
    "layer_norm": ("layer_norm(a, g, c, axis=1)", ("a", "g", "c")),
    "rms_norm": ("rms_norm(a, g, axis=1)", ("a", "g")),
    "where": ("where(less(a, b), a, 0.5)", ("a", "b")),
    "slice_concat": ("concat(slice(a, axis=1, start=3, size=30), slice(b, axis=1, start=0, "
                     "size=3), axis=1)", ("a", "b")),
}


@pytest.mark.parametrize("name", sorted(BF16_PROGRAMS))
def test_bf16_programs_round_once_from_f32(name):
    """Every float op on BF16 operands computes in f32 and rounds its result once: the
    compiled bf16 results are the reference's (f32 NumPy, rounded) within one bf16 ulp, and
    nearly all are bit-identical (f32 kernels a few f32 ulps off the reference cross a bf16
    rounding boundary rarely). Row kernels work on f32 rows for this."""
    expr, names = BF16_PROGRAMS[name]
    shapes = {"a": _ROW, "b": _ROW, "p": _ROW, "g": (33,), "c": (33,)}
    params = ", ".join(f"{n}: {_bf16_type(shapes[n])}" for n in names)
    program = program_from_text(f"fn f({params}) -> {_bf16_type(_ROW)} {{ return {expr}; }}")
    rng = np.random.default_rng(len(name))
    inputs = [(np.abs(rng.standard_normal(shapes[n])) + 0.1 if n == "p" else
               rng.standard_normal(shapes[n]) * 2).astype(BF16) for n in names]
    (want,) = interpret(program, "f", *inputs)
    got = compile_program(program).f(*inputs)
    assert got.dtype == BF16 == want.dtype
    bits_got, bits_want = got.view(np.int16).astype(np.int64), want.view(np.int16).astype(
        np.int64)
    apart = np.abs(bits_got - bits_want)  # same sign: adjacent patterns are 1 ulp apart
    if name in ("gelu", "gelu_tanh"):
        # 1 + erf (1 + tanh) cancels in f32 for x < -3, as in PyTorch's f32 formula: there the
        # error is absolute (~1e-7), not relative, where gelu(x) itself is ~1e-6.
        tail = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= 2e-7
        apart = np.where(tail, 0, apart)
    assert apart.max() <= 1
    assert np.mean(bits_got == bits_want) >= 0.98


def test_bf16_gradients_compile_like_the_interpreter():
    source = """
fn loss(x: Tensor[BF16, [4, 8], @host], g: Tensor[BF16, [8], @host],
        b: Tensor[BF16, [8], @host]) -> Tensor[BF16, [], @host] {
  return sum(sum(gelu(layer_norm(x, g, b, axis=1)), axis=1), axis=0);
}
fn grad(x: Tensor[BF16, [4, 8], @host], g: Tensor[BF16, [8], @host],
        b: Tensor[BF16, [8], @host]) -> (Tensor[BF16, [], @host], Tensor[BF16, [4, 8], @host],
                                         Tensor[BF16, [8], @host], Tensor[BF16, [8], @host]) {
  let (v, dx, dg, db) = reverseMode(loss, wrt=[x, g, b])(x, g, b);
  return (v, dx, dg, db);
}"""
    program = program_from_text(source)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 8)).astype(BF16), rng.standard_normal(8).astype(BF16),
            rng.standard_normal(8).astype(BF16)]
    want = interpret(program, "grad", *args)
    got = compile_program(program).grad(*args)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == BF16
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2**-7,
                                   atol=1e-3)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum"])
def test_arithmetic_on_bool_is_a_type_error(op):
    """i1 arithmetic wraps (true + true compiled to false, NumPy says true): no BOOL form."""
    source = (f"fn f(a: Tensor[BOOL, [3], @host], b: Tensor[BOOL, [3], @host])\n"
              f"    -> Tensor[BOOL, [3], @host] {{\n  return {op}(a, b);\n}}\n")
    with pytest.raises(KinaError) as caught:
        program_from_text(source, "bool.kina")
    assert caught.value.code == "K400" and "bool.kina:3" in str(caught.value)


def test_neg_of_bool_is_a_type_error():
    with pytest.raises(KinaError, match="K400"):
        program_from_text("fn f(a: Tensor[BOOL, [3], @host]) -> Tensor[BOOL, [3], @host] {\n"
                          "  return neg(a);\n}\n", "bool.kina")
