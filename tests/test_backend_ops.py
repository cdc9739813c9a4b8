"""Every registry op compiled by tilegen (JIT and .so) against the reference interpreter,
on hypothesis-generated shapes that include sizes that are not multiples of 16."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import interpret, parse_ir, program_from_text
from kina_frontend.ops import REGISTRY
from kina_frontend.ops.activations import UNARY_ACTIVATIONS
from kina_frontend.ops.compare import COMPARISON_OPS
from tilegen.api import compile_program

DTYPES = {"F32": np.float32, "F64": np.float64, "BF16": ml_dtypes.bfloat16}
CAST_PAIRS = [(s, t) for s in ("F32", "F64", "I64", "BF16", "BOOL")
              for t in ("F32", "F64", "I64", "BF16", "BOOL")
              if s != t and not (s in ("I64", "BOOL") and t in ("I64", "BOOL"))] + \
    [("I64", "BOOL"), ("BOOL", "I64")]

ODD_SIZES = (1, 3, 17, 31, 33)
SIZES = st.sampled_from(ODD_SIZES + (2, 4, 8, 16, 64))


def _ty(shape, dtype="F32"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _shape(draw, rank_min=1, rank_max=3, limit=4096):
    rank = draw(st.integers(rank_min, rank_max))
    shape = tuple(draw(SIZES) for _ in range(rank))
    while np.prod(shape) > limit:
        shape = shape[1:] + (1,)
    return shape


def _floats(rng, shape, positive=False):
    data = rng.standard_normal(shape).astype(np.float32)
    return np.abs(data) + np.float32(0.25) if positive else data


@st.composite
def op_cases(draw, opname):
    """(source, inputs) for one program exercising `opname`."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if opname in ("add", "sub", "mul", "div"):
        shape = _shape(draw)
        literal = draw(st.booleans())
        b = "2.5" if literal else "b"
        params = f"a: {_ty(shape)}" + ("" if literal else f", b: {_ty(shape)}")
        inputs = [_floats(rng, shape)] + ([] if literal else [_floats(rng, shape,
                                                                      opname == "div")])
        return (f"fn f({params}) -> {_ty(shape)} {{ return {opname}(a, {b}); }}", inputs)
    if opname in ("neg", "exp", "log", "sqrt", "tanh") + UNARY_ACTIVATIONS:
        shape = _shape(draw)
        data = _floats(rng, shape, opname in ("log", "sqrt", "rsqrt")) * np.float32(
            4 if opname in ("erf", "gelu", "gelu_tanh", "sigmoid", "silu") else 1)
        return (f"fn f(a: {_ty(shape)}) -> {_ty(shape)} {{ return {opname}(a); }}", [data])
    if opname == "pow":
        shape = _shape(draw)
        p = draw(st.sampled_from([2, 3, -1, 0.5, -0.5, 1.7, 0, -2.25]))
        return (f"fn f(a: {_ty(shape)}) -> {_ty(shape)} {{ return pow(a, {p}); }}",
                [_floats(rng, shape, True)])
    if opname in COMPARISON_OPS + ("maximum", "minimum"):
        shape = _shape(draw)
        out = _ty(shape, "BOOL") if opname in COMPARISON_OPS else _ty(shape)
        data = [np.round(_floats(rng, shape)) for _ in range(2)]  # ties
        if draw(st.booleans()):
            return (f"fn f(a: {_ty(shape)}) -> {out} {{ return {opname}(a, 0.0); }}", data[:1])
        return (f"fn f(a: {_ty(shape)}, b: {_ty(shape)}) -> {out} {{ return {opname}(a, b); }}",
                data)
    if opname == "where":
        shape = _shape(draw)
        other = draw(st.sampled_from(["b", "-1e9"]))
        return (f"fn f(c: {_ty(shape, 'BOOL')}, a: {_ty(shape)}, b: {_ty(shape)}) -> "
                f"{_ty(shape)} {{ return where(c, a, {other}); }}",
                [rng.random(shape) < 0.5, _floats(rng, shape), _floats(rng, shape)])
    if opname in ("layer_norm", "rms_norm"):
        shape = _shape(draw)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        width = (shape[axis % len(shape)],)
        names = ("x", "g", "b") if opname == "layer_norm" else ("x", "g")
        params = ", ".join(f"{n}: {_ty(shape if n == 'x' else width)}" for n in names)
        data = [_floats(rng, shape) * np.float32(3) + np.float32(2)] + \
            [_floats(rng, width) for _ in names[1:]]
        return (f"fn f({params}) -> {_ty(shape)} {{ return {opname}({', '.join(names)}, "
                f"axis={axis}, eps=1e-5); }}", data)
    if opname == "concat":
        shape = _shape(draw, 1, 3, 1024)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        widths = [draw(SIZES) for _ in range(draw(st.integers(1, 3)))]
        shapes = [shape[:axis % len(shape)] + (w,) + shape[axis % len(shape) + 1:]
                  for w in widths]
        out = shape[:axis % len(shape)] + (sum(widths),) + shape[axis % len(shape) + 1:]
        params = ", ".join(f"x{k}: {_ty(s)}" for k, s in enumerate(shapes))
        names = ", ".join(f"x{k}" for k in range(len(shapes)))
        return (f"fn f({params}) -> {_ty(out)} {{ return concat({names}, axis={axis}); }}",
                [_floats(rng, s) for s in shapes])
    if opname == "slice":
        shape = _shape(draw)
        axis = draw(st.integers(0, len(shape) - 1))
        start = draw(st.integers(0, shape[axis] - 1))
        size = draw(st.integers(1, shape[axis] - start))
        out = shape[:axis] + (size,) + shape[axis + 1:]
        return (f"fn f(a: {_ty(shape)}) -> {_ty(out)} {{ return exp(slice(a, axis={axis}, "
                f"start={start}, size={size})); }}", [_floats(rng, shape)])
    if opname == "iota":
        shape = _shape(draw)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        return (f"fn f() -> {_ty(shape, 'I64')} {{ return iota(shape={list(shape)}, "
                f"axis={axis}); }}", [])
    if opname == "fill":
        shape = _shape(draw)
        return (f"fn f(a: {_ty(shape)}) -> {_ty(shape)} {{ return add(a, 0.75); }}",
                [_floats(rng, shape)])
    if opname in ("sum", "mean", "max", "min", "argmax", "softmax", "log_softmax"):
        shape = _shape(draw)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        positive_axis = axis % len(shape)
        out = shape if opname in ("softmax", "log_softmax") else \
            shape[:positive_axis] + shape[positive_axis + 1:]
        dtype = "I64" if opname == "argmax" else "F32"
        data = _floats(rng, shape)
        if opname in ("argmax", "max", "min") and draw(st.booleans()):
            data = np.round(data)  # many ties: argmax must pick the first
        return (f"fn f(a: {_ty(shape)}) -> {_ty(out, dtype)} "
                f"{{ return {opname}(a, axis={axis}); }}", [data])
    if opname == "matmul":
        rank = draw(st.integers(2, 4))
        batch = tuple(draw(st.sampled_from((1, 2, 3))) for _ in range(rank - 2))
        m, k, n = draw(SIZES), draw(SIZES), draw(SIZES)
        a, b, c = batch + (m, k), batch + (k, n), batch + (m, n)
        return (f"fn f(a: {_ty(a)}, b: {_ty(b)}) -> {_ty(c)} {{ return matmul(a, b); }}",
                [_floats(rng, a), _floats(rng, b)])
    if opname == "transpose":
        shape = _shape(draw, 2, 4, 2048)
        perm = list(draw(st.permutations(range(len(shape)))))
        out = tuple(shape[p] for p in perm)
        return (f"fn f(a: {_ty(shape)}) -> {_ty(out)} {{ return transpose(a, {perm}); }}",
                [_floats(rng, shape)])
    if opname == "reshape":
        shape = _shape(draw)
        total = int(np.prod(shape))
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        first = draw(st.sampled_from(divisors))
        out = (first, total // first)
        return (f"fn f(a: {_ty(shape)}) -> {_ty(out)} {{ return reshape(a, {list(out)}); }}",
                [_floats(rng, shape)])
    if opname == "broadcast":
        shape = _shape(draw, 1, 2, 256)
        src = tuple(1 if draw(st.booleans()) else d for d in shape)
        out = (draw(st.sampled_from((1, 3, 5))),) + shape
        return (f"fn f(a: {_ty(src)}) -> {_ty(out)} {{ return broadcast(a, {list(out)}); }}",
                [_floats(rng, src)])
    if opname == "gather":
        rows, width = draw(SIZES), draw(SIZES)
        ids_shape = _shape(draw, 1, 2, 256)
        out = ids_shape + (width,)
        return (f"fn f(t: {_ty((rows, width))}, i: {_ty(ids_shape, 'I64')}) -> {_ty(out)} "
                f"{{ return gather(t, i); }}",
                [_floats(rng, (rows, width)), rng.integers(0, rows, ids_shape)])
    if opname == "scatter_add":
        rows, width = draw(SIZES), draw(SIZES)
        ids_shape = _shape(draw, 1, 2, 256)
        ids = rng.integers(0, rows, ids_shape)
        return (f"fn f(u: {_ty(ids_shape + (width,))}, i: {_ty(ids_shape, 'I64')}) -> "
                f"{_ty((rows, width))} {{ return scatter_add(u, i, {rows}); }}",
                [_floats(rng, ids_shape + (width,)), ids])
    if opname == "cast":
        shape = _shape(draw)
        source, target = draw(st.sampled_from(CAST_PAIRS))
        if source == "I64":
            data = rng.integers(-1000, 1000, shape)
        elif source == "BOOL":
            data = rng.random(shape) < 0.5
        else:
            data = (rng.standard_normal(shape) * 100).astype(DTYPES[source])
            data.flat[::3] = 0  # cast to BOOL: zeros are false
        return (f"fn f(a: {_ty(shape, source)}) -> {_ty(shape, target)} "
                f"{{ return cast(a, {target}); }}", [data])
    if opname == "one_hot":
        n = draw(SIZES)
        ids_shape = _shape(draw, 1, 2, 256)
        return (f"fn f(i: {_ty(ids_shape, 'I64')}) -> {_ty(ids_shape + (n,))} "
                f"{{ return one_hot(i, {n}); }}", [rng.integers(0, n, ids_shape)])
    raise KeyError(opname)


COVERED = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "fill", "sum",
           "max", "argmax", "softmax", "log_softmax", "matmul", "transpose", "reshape",
           "broadcast", "gather", "one_hot", "scatter_add", "cast", "pow", "where", "iota",
           "maximum", "minimum", "mean", "min", "layer_norm", "rms_norm", "concat", "slice") + \
    UNARY_ACTIVATIONS + \
    COMPARISON_OPS


def test_every_registry_op_is_covered():
    missing = sorted(set(REGISTRY) - set(COVERED))
    assert not missing, f"ops without a backend differential test: {missing}"


def _norm_rounding(source, inputs):
    """What f32 rounding alone may move a norm's output by: the row mean is rounded to
    half an ulp of the row's largest |x|, and the output multiplies that by the row's
    1/std and by gamma. Rows of nearly equal values (width 2, say) are ill-conditioned:
    NumPy's own f32 two-pass layer norm misses the float64 reference by as much."""
    x, gamma = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
    axis = int(re.search(r"axis=(-?\d+)", source).group(1)) % x.ndim
    centred = x - x.mean(axis=axis, keepdims=True) if "layer_norm" in source else x
    rstd = 1 / np.sqrt((centred ** 2).mean(axis=axis, keepdims=True) + 1e-5)
    along = [1] * x.ndim
    along[axis] = -1
    largest = np.max(np.abs(x), axis=axis, keepdims=True)
    return 4 * 2.0 ** -24 * largest * rstd * np.abs(gamma).reshape(along)


ROUNDING = {"layer_norm": _norm_rounding, "rms_norm": _norm_rounding}


def _assert_within(got, expected, rtol, atol):
    """assert_allclose with a per-element atol (NumPy's takes a number only)."""
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    same_nan = np.isnan(got) == np.isnan(expected)
    with np.errstate(invalid="ignore"):
        close = (got == expected) | (np.abs(got - expected) <= atol + rtol * np.abs(expected))
    bad = ~(close | (np.isnan(got) & np.isnan(expected))) | ~same_nan
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} elements off, first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]!r}, "
                           f"expected {expected[bad][0]!r}")


def _compare(source, inputs, jit, rounding=None):
    program = parse_ir(source[3:]) if source.startswith("IR:") else program_from_text(source)
    (expected,) = interpret(program, "f", *inputs)
    got = compile_program(program, jit=jit).f(*inputs)
    assert got.dtype == expected.dtype
    if expected.dtype in (np.int64, np.bool_, DTYPES["BF16"]):
        # Integers, BOOL and BF16 exactly: a BF16 result is its f32 value rounded once.
        np.testing.assert_array_equal(got.view(np.uint16) if expected.dtype == DTYPES["BF16"]
                                      else got, expected.view(np.uint16) if
                                      expected.dtype == DTYPES["BF16"] else expected)
    else:
        scale = max(1.0, float(np.max(np.abs(expected))))
        atol = 2e-6 * scale
        if rounding is not None:
            atol = atol + rounding(source, inputs)
        _assert_within(got, expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("opname", COVERED)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_op_matches_interpreter_jit(opname, data):
    source, inputs = data.draw(op_cases(opname))
    _compare(source, inputs, jit=True, rounding=ROUNDING.get(opname))


@pytest.mark.parametrize("opname", COVERED)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_op_matches_interpreter_shared_library(opname, data):
    source, inputs = data.draw(op_cases(opname))
    _compare(source, inputs, jit=False, rounding=ROUNDING.get(opname))


@pytest.mark.parametrize("size", ODD_SIZES)
def test_softmax_rows_of_odd_width(size):
    rng = np.random.default_rng(size)
    source = f"fn f(a: {_ty((5, size))}) -> {_ty((5, size))} {{ return softmax(a, axis=1); }}"
    x = rng.standard_normal((5, size)).astype(np.float32) * 10
    got = compile_program(program_from_text(source)).f(x)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_argmax_nan_and_ties_follow_numpy():
    source = f"fn f(a: {_ty((4, 5))}) -> {_ty((4,), 'I64')} {{ return argmax(a, axis=1); }}"
    x = np.array([[1, 3, 3, 0, 3], [np.nan, 1, np.nan, 2, 0], [-np.inf] * 5, [0, 2, 2, np.inf, 1]],
                 dtype=np.float32)
    got = compile_program(program_from_text(source)).f(x)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))


@pytest.mark.parametrize("size", (5, 36, 100))
def test_softmax_nan_and_inf_rows_follow_numpy(size):
    source = (f"fn f(x: {_ty((5, size))}) -> ({_ty((5, size))}, {_ty((5, size))}) "
              "{ return (softmax(x, axis=1), log_softmax(x, axis=1)); }")
    x = np.random.default_rng(size).random((5, size)).astype(np.float32)
    x[1, 2], x[2, :], x[3, 1] = np.nan, -np.inf, np.inf
    got_soft, got_log = compile_program(program_from_text(source)).f(x)
    with np.errstate(all="ignore"):
        shifted = x - x.max(axis=1, keepdims=True)
        want_soft = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        want_log = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    for got, want in ((got_soft, want_soft), (got_log, want_log)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_id_check_in_an_unrolled_loop_before_the_store():
    # Regression: values computed on an id check's error path were cached and reused by
    # the store after it (LLVM: "Instruction does not dominate all uses").
    source = """
fn f(a: Tensor[F64, [1, 2, 2], @host]) -> Tensor[F32, [2, 2, 1], @host] {
  return one_hot(argmax(a, axis=0), 1);
}"""
    got = compile_program(program_from_text(source)).f(np.ones((1, 2, 2)))
    np.testing.assert_array_equal(got, np.ones((2, 2, 1), np.float32))


TRANSFORMER_BLOCKS = {
    # A padding-masked softmax over attention scores, the mask built from positions.
    "masked_softmax": ("fn f(s: Tensor[F32, [2, 3, 37, 37], @host], keep: Tensor[BOOL, "
                       "[2, 3, 37, 37], @host]) -> Tensor[F32, [2, 3, 37, 37], @host] {\n"
                       "  let future = greater(iota(shape=[2, 3, 37, 37], axis=3), "
                       "iota(shape=[2, 3, 37, 37], axis=2));\n"
                       "  return softmax(where(keep, where(future, -1e9, s * 0.125), -1e9), "
                       "axis=3);\n}"),
    # A GELU epilogue on a matmul big enough for the packed kernel, then layer norm rows.
    "ffn_block": ("fn f(x: Tensor[F32, [67, 96], @host], w: Tensor[F32, [96, 161], @host], "
                  "g: Tensor[F32, [161], @host], b: Tensor[F32, [161], @host]) -> "
                  "Tensor[F32, [67, 161], @host] {\n"
                  "  return layer_norm(gelu(x @ w) + 1.0, g, b, axis=1, eps=1e-12);\n}"),
    "rms_silu": ("fn f(x: Tensor[F32, [33, 48], @host], g: Tensor[F32, [48], @host]) -> "
                 "Tensor[F32, [33, 48], @host] {\n"
                 "  return silu(rms_norm(x, g, axis=-1, eps=1e-6)) * sigmoid(x);\n}"),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMER_BLOCKS))
def test_transformer_blocks_match_the_interpreter(name):
    program = program_from_text(TRANSFORMER_BLOCKS[name])
    rng = np.random.default_rng(7)
    inputs = []
    for param in program.function("f").params:
        shape = param.type.concrete_shape
        inputs.append(rng.random(shape) < 0.8 if param.type.dtype.kina_name == "BOOL"
                      else rng.standard_normal(shape).astype(np.float32))
    (expected,) = interpret(program, "f", *inputs)
    got = compile_program(program).f(*inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
