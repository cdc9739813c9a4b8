"""The reference interpreter against independent oracles, one per registry op.

The interpreter is the oracle for every compiled kernel, so it is checked here against
formulas written in this file -- explicit Python loops, `math` in float64, `np.tile`,
`np.einsum` -- never against the op's own `reference` function. Each Kina program is
built as source text and goes through the whole frontend (`program_from_text`).
Shapes come from hypothesis and include the awkward sizes 1, 3 and 17.
"""

from __future__ import annotations

import functools
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_frontend import interpret, load_program, parse_ir, program_from_text, specialize
from kina_frontend.interpreter import InterpreterError, main_outputs
from kina_frontend.ops import REGISTRY
from kina_frontend.ops.indexing import IdOutOfRange

REPO = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=15, deadline=None)
DIMS = st.sampled_from([1, 2, 3, 17])
SMALL_DIMS = st.sampled_from([1, 2, 3, 5])


def ktype(dtype: str, shape) -> str:
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


@functools.cache
def compiled(text: str):
    return program_from_text(text, "op_test.kina")


def run(text: str, *args: np.ndarray) -> tuple[np.ndarray, ...]:
    return interpret(compiled(text), "f", *args)


def unary_program(expr: str, shape, dtype="F32", out_dtype=None, out_shape=None) -> str:
    out = ktype(out_dtype or dtype, shape if out_shape is None else out_shape)
    return f"fn f(x: {ktype(dtype, shape)}) -> {out} {{\n  return {expr};\n}}\n"


def floats(seed: int, shape, low=-3.0, high=3.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def ints(seed: int, shape, low=-50, high=50) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, size=shape, dtype=np.int64)


def elementwise(fn, *arrays: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Apply a Python scalar function element by element (float64 / int arithmetic)."""
    out = np.empty(arrays[0].shape, dtype=dtype)
    for index in np.ndindex(*arrays[0].shape):
        out[index] = fn(*(a[index].item() for a in arrays))
    return out


shapes = st.lists(DIMS, min_size=1, max_size=3).map(tuple)
seeds = st.integers(0, 2**31 - 1)


# ---- the registry walk --------------------------------------------------------------------

# Every op -> the tests in this file that check it against an independent oracle.
ORACLE_TESTS = {
    "add": ["test_binary_f32", "test_binary_i64", "test_number_literal_operands"],
    "sub": ["test_binary_f32", "test_binary_i64", "test_number_literal_operands"],
    "mul": ["test_binary_f32", "test_binary_i64", "test_number_literal_operands"],
    "div": ["test_binary_f32", "test_number_literal_operands"],
    "neg": ["test_unary_f32", "test_neg_i64"],
    "exp": ["test_unary_f32"],
    "log": ["test_unary_f32", "test_log_sqrt_edges"],
    "sqrt": ["test_unary_f32", "test_log_sqrt_edges"],
    "tanh": ["test_unary_f32"],
    "fill": ["test_number_literal_operands"],
    "cast": ["test_cast", "test_source_casts"],
    **{op: ["test_activations"] for op in ("relu", "gelu", "gelu_tanh", "erf", "sigmoid",
                                           "silu", "rsqrt", "abs")},
    **{op: ["test_comparisons"] for op in ("less", "less_equal", "greater", "greater_equal",
                                           "equal", "not_equal")},
    "pow": ["test_pow"],
    "maximum": ["test_maximum_minimum"],
    "minimum": ["test_maximum_minimum"],
    "where": ["test_where"],
    "iota": ["test_iota"],
    "mean": ["test_mean_min"],
    "layer_norm": ["test_norms"],
    "concat": ["test_concat_slice"],
    "slice": ["test_concat_slice"],
    "rms_norm": ["test_norms"],
    "min": ["test_mean_min"],
    "gather": ["test_gather", "test_out_of_range_ids"],
    "scatter_add": ["test_scatter_add", "test_out_of_range_ids"],
    "one_hot": ["test_one_hot", "test_out_of_range_ids"],
    "broadcast": ["test_broadcast"],
    "reshape": ["test_reshape"],
    "transpose": ["test_transpose"],
    "matmul": ["test_matmul"],
    "sum": ["test_sum", "test_i64_reductions"],
    "max": ["test_max", "test_i64_reductions"],
    "argmax": ["test_argmax_first_index_on_ties", "test_argmax_explicit_ties",
               "test_i64_reductions"],
    "softmax": ["test_softmax"],
    "log_softmax": ["test_log_softmax"],
}


def test_every_registry_op_has_an_oracle_test() -> None:
    missing = sorted(set(REGISTRY) - set(ORACLE_TESTS))
    assert not missing, f"ops without an interpreter test: {missing}"
    stale = sorted(set(ORACLE_TESTS) - set(REGISTRY))
    assert not stale, f"tests for ops no longer in the registry: {stale}"
    for names in ORACLE_TESTS.values():
        for name in names:
            assert callable(globals().get(name)), name


# ---- elementwise --------------------------------------------------------------------------

UNARY = {"neg": lambda v: -v, "exp": math.exp, "tanh": math.tanh,
         "log": math.log, "sqrt": math.sqrt}


@SETTINGS
@given(shapes, seeds, st.sampled_from(sorted(UNARY)))
def test_unary_f32(shape, seed, op) -> None:
    positive = op in ("log", "sqrt")
    x = floats(seed, shape, 0.05 if positive else -3.0, 3.0)
    (out,) = run(unary_program(f"{op}(x)", shape), x)
    expected = elementwise(UNARY[op], x)
    assert out.dtype == np.float32 and out.shape == shape
    if op == "neg":
        np.testing.assert_array_equal(out, expected)
    else:  # a correctly rounded float64 result, rounded once more: within an ulp or two
        np.testing.assert_allclose(out, expected, rtol=3e-7, atol=1e-30)


def test_log_sqrt_edges() -> None:
    x = np.array([0.0, -1.0, 1.0, 4.0], dtype=np.float32)
    (log_out,) = run(unary_program("log(x)", (4,)), x)
    (sqrt_out,) = run(unary_program("sqrt(x)", (4,)), x)
    assert log_out[0] == -np.inf and np.isnan(log_out[1]) and log_out[2] == 0.0
    assert sqrt_out[0] == 0.0 and np.isnan(sqrt_out[1]) and sqrt_out[3] == 2.0


BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
          "mul": lambda a, b: a * b, "div": lambda a, b: a / b}


def binary_program(op: str, shape, dtype: str) -> str:
    t = ktype(dtype, shape)
    return f"fn f(a: {t}, b: {t}) -> {t} {{\n  return {op}(a, b);\n}}\n"


@SETTINGS
@given(shapes, seeds, st.sampled_from(sorted(BINARY)))
def test_binary_f32(shape, seed, op) -> None:
    a, b = floats(seed, shape), floats(seed + 1, shape)
    if op == "div":
        b = np.where(np.abs(b) < 0.1, np.float32(0.5), b).astype(np.float32)
    (out,) = run(binary_program(op, shape, "F32"), a, b)
    # float64 then one rounding to float32 is the correctly rounded float32 result for
    # + - * / (53 >= 2 * 24 + 2), so equality is exact.
    np.testing.assert_array_equal(out, elementwise(BINARY[op], a, b))


@SETTINGS
@given(shapes, seeds, st.sampled_from(["add", "sub", "mul"]))
def test_binary_i64(shape, seed, op) -> None:
    a, b = ints(seed, shape), ints(seed + 1, shape)
    (out,) = run(binary_program(op, shape, "I64"), a, b)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, elementwise(BINARY[op], a, b, dtype=np.int64))


@SETTINGS
@given(shapes, seeds)
def test_neg_i64(shape, seed) -> None:
    i = ints(seed, shape)
    (out,) = run(unary_program("-x", shape, "I64"), i)
    np.testing.assert_array_equal(out, elementwise(lambda v: -v, i, dtype=np.int64))


LITERAL_FORMS = [
    ("x * 0.5", lambda v: v * 0.5),
    ("2.0 - x", lambda v: 2.0 - v),
    ("x + 3", lambda v: v + 3.0),
    ("div(x, 4.0)", lambda v: v / 4.0),
    ("1.0 / x", lambda v: 1.0 / v),
    ("add(-1.5, x)", lambda v: -1.5 + v),
]


@SETTINGS
@given(shapes, seeds, st.sampled_from(range(len(LITERAL_FORMS))))
def test_number_literal_operands(shape, seed, form) -> None:
    expr, scalar_fn = LITERAL_FORMS[form]
    x = floats(seed, shape, 0.5, 3.0)
    text = unary_program(expr, shape)
    assert "fill" in [op.op for op in compiled(text).function("f").body]
    (out,) = run(text, x)
    np.testing.assert_array_equal(out, elementwise(scalar_fn, x))
    # I64 tensors take integer literals.
    i = ints(seed, shape)
    (out_i,) = run(unary_program("x * 3 - 7", shape, "I64"), i)
    np.testing.assert_array_equal(out_i, elementwise(lambda v: v * 3 - 7, i, dtype=np.int64))


# ---- reductions ---------------------------------------------------------------------------

@st.composite
def shape_and_axis(draw, max_rank=3):
    shape = tuple(draw(st.lists(DIMS, min_size=1, max_size=max_rank)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return shape, axis


def rows(x: np.ndarray, axis: int):
    """Yield (output index, the 1-D row along axis) for every position of the other dims."""
    axis %= x.ndim
    rest = x.shape[:axis] + x.shape[axis + 1:]
    for out_index in np.ndindex(*rest):
        row = [x[out_index[:axis] + (k,) + out_index[axis:]].item() for k in range(x.shape[axis])]
        yield out_index, row


def reduce_with(x: np.ndarray, axis: int, fn, dtype) -> np.ndarray:
    axis %= x.ndim
    out = np.empty(x.shape[:axis] + x.shape[axis + 1:], dtype=dtype)
    for index, row in rows(x, axis):
        out[index] = fn(row)
    return out


def map_rows(x: np.ndarray, axis: int, fn) -> np.ndarray:
    axis %= x.ndim
    out = np.empty(x.shape, dtype=np.float64)
    for index, row in rows(x, axis):
        for k, value in enumerate(fn(row)):
            out[index[:axis] + (k,) + index[axis:]] = value
    return out


def reduce_program(op: str, shape, axis: int, dtype="F32", out_dtype=None) -> str:
    out_shape = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
    return unary_program(f"{op}(x, axis={axis})", shape, dtype, out_dtype, out_shape)


@SETTINGS
@given(shape_and_axis(), seeds)
def test_sum(shape_axis, seed) -> None:
    shape, axis = shape_axis
    x = floats(seed, shape)
    (out,) = run(reduce_program("sum", shape, axis), x)
    expected = reduce_with(x, axis, math.fsum, np.float64)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * shape[axis])


@SETTINGS
@given(shape_and_axis(), seeds)
def test_max(shape_axis, seed) -> None:
    shape, axis = shape_axis
    x = floats(seed, shape)
    (out,) = run(reduce_program("max", shape, axis), x)
    np.testing.assert_array_equal(out, reduce_with(x, axis, max, np.float32))


def first_index_of_max(row) -> int:
    best = 0
    for k, value in enumerate(row):
        if value > row[best]:  # strictly greater: an equal later value never wins
            best = k
    return best


@SETTINGS
@given(shape_and_axis(), seeds)
def test_argmax_first_index_on_ties(shape_axis, seed) -> None:
    shape, axis = shape_axis
    # Values from {0, 1, 2}: most rows of length > 2 hold a tied maximum.
    x = np.random.default_rng(seed).integers(0, 3, size=shape).astype(np.float32)
    (out,) = run(reduce_program("argmax", shape, axis, out_dtype="I64"), x)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, reduce_with(x, axis, first_index_of_max, np.int64))


def test_argmax_explicit_ties() -> None:
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 0, 5], [-1, -1, -2, -1]], np.float32)
    (out,) = run(reduce_program("argmax", (4, 4), 1, out_dtype="I64"), x)
    np.testing.assert_array_equal(out, [1, 0, 3, 0])
    (down,) = run(reduce_program("argmax", (4, 4), 0, out_dtype="I64"), x)
    np.testing.assert_array_equal(down, [1, 0, 0, 2])


@SETTINGS
@given(shape_and_axis(), seeds)
def test_i64_reductions(shape_axis, seed) -> None:
    shape, axis = shape_axis
    i = ints(seed, shape, -3, 3)
    (total,) = run(reduce_program("sum", shape, axis, "I64"), i)
    (biggest,) = run(reduce_program("max", shape, axis, "I64"), i)
    (where,) = run(reduce_program("argmax", shape, axis, "I64"), i)
    np.testing.assert_array_equal(total, reduce_with(i, axis, sum, np.int64))
    np.testing.assert_array_equal(biggest, reduce_with(i, axis, max, np.int64))
    np.testing.assert_array_equal(where, reduce_with(i, axis, first_index_of_max, np.int64))


def softmax_row(row):
    top = max(row)
    weights = [math.exp(v - top) for v in row]
    total = math.fsum(weights)
    return [w / total for w in weights]


def log_softmax_row(row):
    # Written through log-sum-exp around the mean rather than the max, on purpose.
    centre = math.fsum(row) / len(row)
    lse = centre + math.log(math.fsum(math.exp(v - centre) for v in row))
    return [v - lse for v in row]


@SETTINGS
@given(shape_and_axis(), seeds)
def test_softmax(shape_axis, seed) -> None:
    shape, axis = shape_axis
    x = floats(seed, shape, -6.0, 6.0)
    (out,) = run(unary_program(f"softmax(x, axis={axis})", shape), x)
    np.testing.assert_allclose(out, map_rows(x, axis, softmax_row), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(out.sum(axis=axis), 1.0, rtol=1e-5)


@SETTINGS
@given(shape_and_axis(), seeds)
def test_log_softmax(shape_axis, seed) -> None:
    shape, axis = shape_axis
    x = floats(seed, shape, -6.0, 6.0)
    (out,) = run(unary_program(f"log_softmax(x, axis={axis})", shape), x)
    np.testing.assert_allclose(out, map_rows(x, axis, log_softmax_row), rtol=1e-5, atol=2e-6)


def test_softmax_survives_large_logits_and_the_mask() -> None:
    x = np.array([[1000.0, 999.0, -1e9], [0.0, -1e9, -1e9]], np.float32)
    (out,) = run(unary_program("softmax(x, axis=1)", (2, 3)), x)
    np.testing.assert_allclose(out[0], softmax_row([1000.0, 999.0, -1e9]), rtol=1e-6)
    np.testing.assert_array_equal(out[1], [1.0, 0.0, 0.0])


# ---- layout -------------------------------------------------------------------------------

@st.composite
def broadcast_case(draw):
    target = tuple(draw(st.lists(SMALL_DIMS | st.just(17), min_size=1, max_size=4)))
    rank = draw(st.integers(0, len(target)))
    suffix = target[len(target) - rank:]
    source = tuple(1 if draw(st.booleans()) else d for d in suffix)
    return source, target


@SETTINGS
@given(broadcast_case(), seeds)
def test_broadcast(case, seed) -> None:
    source, target = case
    x = floats(seed, source)
    text = unary_program(f"broadcast(x, [{', '.join(map(str, target))}])", source,
                         out_shape=target)
    (out,) = run(text, x)
    # np.tile-style: pad the rank with leading 1s, then repeat every size-1 dim.
    padded = x.reshape((1,) * (len(target) - len(source)) + source)
    reps = tuple(t if p == 1 else 1 for p, t in zip(padded.shape, target, strict=True))
    np.testing.assert_array_equal(out, np.tile(padded, reps))


@st.composite
def reshape_case(draw):
    source = tuple(draw(st.lists(SMALL_DIMS, min_size=0, max_size=3)))
    count = math.prod(source)
    # Factor the count into a random target shape.
    target, rest = [], count
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        factor = draw(st.sampled_from(divisors))
        target.append(factor)
        rest //= factor
    target.append(rest)
    infer = draw(st.integers(-1, len(target) - 1))
    return source, tuple(target), infer


@SETTINGS
@given(reshape_case(), seeds)
def test_reshape(case, seed) -> None:
    source, target, infer = case
    x = floats(seed, source)
    written = ["-1" if k == infer else str(d) for k, d in enumerate(target)]
    text = unary_program(f"reshape(x, [{', '.join(written)}])", source, out_shape=target)
    (out,) = run(text, x)
    # Row-major: the k-th element of x in index order is the k-th element of the result.
    flat = [x[index] for index in np.ndindex(*source)]
    expected = np.empty(target, np.float32)
    for k, index in enumerate(np.ndindex(*target)):
        expected[index] = flat[k]
    np.testing.assert_array_equal(out, expected)


@st.composite
def transpose_case(draw):
    shape = tuple(draw(st.lists(DIMS, min_size=1, max_size=4)))
    perm = tuple(draw(st.permutations(range(len(shape)))))
    return shape, perm


@SETTINGS
@given(transpose_case(), seeds)
def test_transpose(case, seed) -> None:
    shape, perm = case
    x = floats(seed, shape)
    out_shape = tuple(shape[p] for p in perm)
    text = unary_program(f"transpose(x, [{', '.join(map(str, perm))}])", shape,
                         out_shape=out_shape)
    (out,) = run(text, x)
    expected = np.empty(out_shape, np.float32)
    for index in np.ndindex(*out_shape):
        source_index = [0] * len(shape)
        for i, p in enumerate(perm):  # result dim i is x's dim perm[i]
            source_index[p] = index[i]
        expected[index] = x[tuple(source_index)]
    np.testing.assert_array_equal(out, expected)


# ---- linear algebra and indexing -----------------------------------------------------------

@st.composite
def matmul_case(draw):
    batch = tuple(draw(st.lists(SMALL_DIMS, min_size=0, max_size=2)))
    m, k, n = draw(DIMS), draw(DIMS), draw(DIMS)
    return batch, m, k, n


@SETTINGS
@given(matmul_case(), seeds)
def test_matmul(case, seed) -> None:
    batch, m, k, n = case
    a, b = floats(seed, batch + (m, k)), floats(seed + 1, batch + (k, n))
    text = (f"fn f(a: {ktype('F32', batch + (m, k))}, b: {ktype('F32', batch + (k, n))})\n"
            f"    -> {ktype('F32', batch + (m, n))} {{\n  return a @ b;\n}}\n")
    (out,) = run(text, a, b)
    expected = np.einsum("...ik,...kj->...ij", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * k)


@st.composite
def gather_case(draw):
    rows_, width = draw(DIMS), draw(DIMS)
    ids_shape = tuple(draw(st.lists(DIMS, min_size=1, max_size=2)))
    return rows_, width, ids_shape


@SETTINGS
@given(gather_case(), seeds)
def test_gather(case, seed) -> None:
    rows_, width, ids_shape = case
    table = floats(seed, (rows_, width))
    ids = np.random.default_rng(seed).integers(0, rows_, size=ids_shape, dtype=np.int64)
    text = (f"fn f(table: {ktype('F32', (rows_, width))}, ids: {ktype('I64', ids_shape)})\n"
            f"    -> {ktype('F32', ids_shape + (width,))} {{\n"
            f"  return gather(table, ids);\n}}\n")
    (out,) = run(text, table, ids)
    expected = np.empty(ids_shape + (width,), np.float32)
    for index in np.ndindex(*ids_shape):
        row = int(ids[index])
        for j in range(width):
            expected[index + (j,)] = table[row, j]
    np.testing.assert_array_equal(out, expected)


@SETTINGS
@given(st.lists(DIMS, min_size=1, max_size=2).map(tuple), DIMS, seeds)
def test_one_hot(ids_shape, n, seed) -> None:
    ids = np.random.default_rng(seed).integers(0, n, size=ids_shape, dtype=np.int64)
    text = (f"fn f(ids: {ktype('I64', ids_shape)}) -> {ktype('F32', ids_shape + (n,))} {{\n"
            f"  return one_hot(ids, {n});\n}}\n")
    (out,) = run(text, ids)
    expected = np.zeros(ids_shape + (n,), np.float32)
    for index in np.ndindex(*ids_shape):
        expected[index + (int(ids[index]),)] = 1.0
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


@st.composite
def scatter_case(draw):
    rows_, width = draw(DIMS), draw(DIMS)
    ids_shape = tuple(draw(st.lists(DIMS, min_size=1, max_size=2)))
    return rows_, width, ids_shape


@SETTINGS
@given(scatter_case(), seeds)
def test_scatter_add(case, seed) -> None:
    rows_, width, ids_shape = case
    updates = floats(seed, ids_shape + (width,))
    # Few distinct rows, so repeated ids (which must accumulate) are the common case.
    ids = np.random.default_rng(seed).integers(0, min(rows_, 3), size=ids_shape, dtype=np.int64)
    text = (f"fn f(u: {ktype('F32', ids_shape + (width,))}, ids: {ktype('I64', ids_shape)})\n"
            f"    -> {ktype('F32', (rows_, width))} {{\n"
            f"  return scatter_add(u, ids, {rows_});\n}}\n")
    (out,) = run(text, updates, ids)
    expected = np.zeros((rows_, width), np.float64)
    magnitude = np.zeros((rows_, width), np.float64)
    for index in np.ndindex(*ids_shape):
        for j in range(width):
            expected[int(ids[index]), j] += updates[index + (j,)]
            magnitude[int(ids[index]), j] += abs(updates[index + (j,)])
    # float32 accumulation of n terms: |error| <= n * eps * sum |terms| (Higham's bound).
    terms = int(np.prod(ids_shape))
    bound = terms * np.finfo(np.float32).eps * magnitude + 1e-30
    assert np.all(np.abs(out - expected) <= bound)


CAST_IR = """func @f(%x: {src}[4]) -> ({dst}[4]) {{
  %y = cast(%x) {{dtype = "{dst}"}} : {dst}[4]
  return %y
}}
"""


@pytest.mark.parametrize("src, dst, values", [
    ("i64", "f32", [0, -7, 2**24 + 1, 2**40 + 3]),   # large ints round to nearest
    ("f32", "f64", [0.1, -2.5, 3e38, 1e-40]),
    ("f64", "f32", [0.1, 1 + 2**-30, -1e30, 1e-50]),
])
def test_cast(src: str, dst: str, values) -> None:
    # cast is internal (the compiler emits it), so the program is written as tensor IR.
    program = parse_ir(CAST_IR.format(src=src, dst=dst))
    x = np.array(values, {"i64": np.int64, "f32": np.float32, "f64": np.float64}[src])
    (out,) = interpret(program, "f", x)
    if dst == "f32":  # struct's 'f' packs a Python float to the nearest float32
        expected = [struct.unpack("f", struct.pack("f", float(v)))[0] for v in x.tolist()]
        assert out.dtype == np.float32
    else:
        expected = [float(v) for v in x.tolist()]
        assert out.dtype == np.float64
    assert out.tolist() == expected


@pytest.mark.parametrize("bad", [8, -1, 1000])
def test_out_of_range_ids(bad: int) -> None:
    gather_text = (f"fn f(t: {ktype('F32', (8, 4))}, ids: {ktype('I64', (1, 3))})\n"
                   f"    -> {ktype('F32', (1, 3, 4))} {{\n  return gather(t, ids);\n}}\n")
    ids = np.array([[1, bad, 2]], np.int64)
    # The message leads with the Kina source location of the op that met the id.
    with pytest.raises(IdOutOfRange, match=rf"^op_test.kina:3:10: gather: id {bad} at position "
                                           r"\[0, 1\] is out of range \[0, 8\)"):
        run(gather_text, np.zeros((8, 4), np.float32), ids)
    one_hot_text = (f"fn f(ids: {ktype('I64', (1, 3))}) -> {ktype('F32', (1, 3, 8))} {{\n"
                    f"  return one_hot(ids, 8);\n}}\n")
    with pytest.raises(IdOutOfRange, match=rf"^op_test.kina:2:10: one_hot: id {bad} at "
                                           r"position \[0, 1\]"):
        run(one_hot_text, ids)
    scatter_text = (f"fn f(u: {ktype('F32', (1, 3, 4))}, ids: {ktype('I64', (1, 3))})\n"
                    f"    -> {ktype('F32', (8, 4))} {{\n  return scatter_add(u, ids, 8);\n}}\n")
    with pytest.raises(IdOutOfRange, match=rf"scatter_add: id {bad} at position \[0, 1\]"):
        run(scatter_text, np.zeros((1, 3, 4), np.float32), ids)


def test_wrong_argument_dtype_or_shape_is_a_clear_error() -> None:
    text = unary_program("exp(x)", (2, 3))
    with pytest.raises(InterpreterError, match=r"argument 'x' must be f32\[2, 3\], got "
                                               r"float64\[2, 3\]"):
        run(text, np.zeros((2, 3)))
    with pytest.raises(InterpreterError, match=r"got float32\[3, 2\]"):
        run(text, np.zeros((3, 2), np.float32))
    with pytest.raises(InterpreterError, match="expected 1 argument"):
        run(text)


# ---- whole programs -----------------------------------------------------------------------

def test_function_calls_and_tuple_results() -> None:
    text = f"""
fn halves(x: {ktype('F32', (2, 3))}) -> ({ktype('F32', (2, 3))}, {ktype('F32', (2, 3))}) {{
  return (x * 0.5, x - x * 0.5);
}}
fn f(x: {ktype('F32', (2, 3))}) -> {ktype('F32', (2, 3))} {{
  let (a, b) = halves(x);
  return a + b;
}}
"""
    x = floats(3, (2, 3))
    (out,) = run(text, x)
    np.testing.assert_array_equal(out, elementwise(lambda v: v * 0.5 + (v - v * 0.5), x))
    assert [op.op for op in compiled(text).function("f").body] == ["call", "add"]


def patterned(k: int, rows_: int, cols: int) -> np.ndarray:
    """BRIEF section 3: W_k[i, j] = (((3i + 5j + 7k + 1) mod 9) - 4) / 8."""
    w = np.empty((rows_, cols), np.float32)
    for i in range(rows_):
        for j in range(cols):
            w[i, j] = (((3 * i + 5 * j + 7 * k + 1) % 9) - 4) / 8
    return w


def storylm0_numpy(ids, embed, mask, scale, wq, wk, wv, wo, lm_head) -> np.ndarray:
    """The brief's forward algebra written directly in float64 NumPy, B = 1, H = 2, Dh = 2."""
    t_len = ids.shape[1]
    x = embed.astype(np.float64)[ids[0]]                                   # [T, 4]

    def heads(w):  # [T, 4] -> [2, T, 2]
        return (x @ w).reshape(t_len, 2, 2).transpose(1, 0, 2)

    q, k, v = heads(wq), heads(wk), heads(wv)
    out = np.zeros((2, t_len, 2))
    for h in range(2):
        scores = q[h] @ k[h].T * float(scale.reshape(())) + mask[0, 0]
        scores = scores - scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        p = p / p.sum(axis=1, keepdims=True)
        out[h] = p @ v[h]
    o = out.transpose(1, 0, 2).reshape(t_len, 4)
    return ((x + o @ wo) @ lm_head)[None]                                  # [1, T, 8]


def storylm0_inputs(t_len: int, ids):
    mask = np.where(np.arange(t_len)[None, :] <= np.arange(t_len)[:, None], 0.0, -1e9)
    return (np.array([ids], np.int64), patterned(0, 8, 4),
            mask.astype(np.float32).reshape(1, 1, t_len, t_len),
            np.full((1, 1, 1, 1), 1 / math.sqrt(2), np.float32),
            patterned(1, 4, 4), patterned(2, 4, 4), patterned(3, 4, 4), patterned(4, 4, 4),
            patterned(5, 4, 8))


@pytest.fixture(scope="module")
def forward_program():
    return specialize(load_program(REPO / "examples" / "storylm0_forward.kina"))


@pytest.mark.parametrize("ids", [[1, 2, 3, 4], [1, 4, 2, 6], [0, 0, 7, 7]])
def test_storylm0_forward_matches_hand_written_numpy(forward_program, ids) -> None:
    inputs = storylm0_inputs(4, ids)
    (logits,) = interpret(forward_program, "storylm0_forward", *inputs)
    assert logits.shape == (1, 4, 8) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, storylm0_numpy(*inputs), rtol=1e-5, atol=1e-6)


def test_storylm0_main_returns_its_sink_outputs(forward_program) -> None:
    inputs = storylm0_inputs(4, [1, 2, 3, 4])
    main = forward_program.main
    assert [v.name for v in main_outputs(main)] == ["logits"]
    (logits,) = interpret(forward_program, "main", placeholders=inputs)
    np.testing.assert_allclose(logits, storylm0_numpy(*inputs), rtol=1e-5, atol=1e-6)
    with pytest.raises(InterpreterError, match="no value supplied for placeholder 8"):
        interpret(forward_program, "main", placeholders=inputs[:8])


def test_storylm0_rollout_rows_decode_greedy_and_sampled() -> None:
    program = specialize(load_program(REPO / "examples" / "storylm0_rollout.kina"))
    row = np.array([[[0.5, 2.0, 2.0, -1.0, 0.0, 1.0, 1.5, 2.0]]], np.float32)
    (greedy,) = interpret(program, "greedy_row", row)
    np.testing.assert_array_equal(greedy, [[1]])  # first of the tied maxima
    u = np.random.RandomState(42).uniform(1e-6, 1 - 1e-6, size=(1, 1, 8)).astype(np.float32)
    temperature = np.full((1, 1), 0.8, np.float32)
    (sampled,) = interpret(program, "sample_row", row, u, temperature)
    scores = [row[0, 0, j] / 0.8 - math.log(-math.log(u[0, 0, j])) for j in range(8)]
    assert sampled[0, 0] == first_index_of_max(scores)


# ---- the transformer op set ---------------------------------------------------------------

def _gelu(v: float) -> float:
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


ACTIVATIONS = {
    "relu": lambda v: v if v > 0 else 0.0, "gelu": _gelu, "gelu_tanh": _gelu_tanh,
    "erf": math.erf, "sigmoid": lambda v: 1.0 / (1.0 + math.exp(-v)),
    "silu": lambda v: v / (1.0 + math.exp(-v)), "rsqrt": lambda v: 1.0 / math.sqrt(v),
    "abs": abs,
}


@SETTINGS
@given(shapes, seeds, st.sampled_from(sorted(ACTIVATIONS)))
def test_activations(shape, seed, op) -> None:
    x = floats(seed, shape, 0.05 if op == "rsqrt" else -6.0, 6.0)
    (out,) = run(unary_program(f"{op}(x)", shape), x)
    assert out.dtype == np.float32 and out.shape == shape
    # 1 + erf / 1 + tanh cancel for x < -3: two float64 evaluations differ there by ~1e-16
    # absolute, which is a large relative error on gelu values of ~1e-10.
    np.testing.assert_allclose(out, elementwise(ACTIVATIONS[op], x), rtol=3e-7, atol=1e-15)


@SETTINGS
@given(shapes, seeds, st.sampled_from([2, 3, -1, 0.5, 1.7, 0]))
def test_pow(shape, seed, p) -> None:
    x = floats(seed, shape, 0.05, 3.0)
    (out,) = run(unary_program(f"pow(x, {p})", shape), x)
    np.testing.assert_allclose(out, elementwise(lambda v: v ** p, x), rtol=3e-7)


COMPARE = {"less": float.__lt__, "less_equal": float.__le__, "greater": float.__gt__,
           "greater_equal": float.__ge__, "equal": float.__eq__, "not_equal": float.__ne__}


@SETTINGS
@given(shapes, seeds, st.sampled_from(sorted(COMPARE)))
def test_comparisons(shape, seed, op) -> None:
    x, y = np.round(floats(seed, shape)), np.round(floats(seed + 1, shape))
    x.flat[0] = np.nan  # every ordered comparison with NaN is false, not_equal true
    text = (f"fn f(x: {ktype('F32', shape)}, y: {ktype('F32', shape)}) -> "
            f"{ktype('BOOL', shape)} {{ return {op}(x, y); }}")
    (out,) = run(text, x, y)
    assert out.dtype == np.bool_
    expected = elementwise(COMPARE[op], x, y, dtype=np.bool_)
    np.testing.assert_array_equal(out, expected)


@SETTINGS
@given(shapes, seeds, st.sampled_from(["maximum", "minimum"]))
def test_maximum_minimum(shape, seed, op) -> None:
    x, y = floats(seed, shape), floats(seed + 1, shape)
    pick = max if op == "maximum" else min
    text = (f"fn f(x: {ktype('F32', shape)}, y: {ktype('F32', shape)}) -> "
            f"{ktype('F32', shape)} {{ return {op}(x, y); }}")
    (out,) = run(text, x, y)
    np.testing.assert_array_equal(out, elementwise(pick, x, y))


@SETTINGS
@given(shapes, seeds)
def test_where(shape, seed) -> None:
    cond = np.random.default_rng(seed).random(shape) < 0.5
    x = floats(seed, shape)
    text = (f"fn f(c: {ktype('BOOL', shape)}, x: {ktype('F32', shape)}) -> "
            f"{ktype('F32', shape)} {{ return where(c, x, 2.5); }}")
    (out,) = run(text, cond, x)
    np.testing.assert_array_equal(out, elementwise(lambda c, v: v if c else 2.5, cond, x))


@SETTINGS
@given(shapes, st.integers(0, 2))
def test_iota(shape, axis) -> None:
    axis = axis % len(shape)
    (out,) = interpret(compiled(f"fn f() -> {ktype('I64', shape)} {{ return iota(shape="
                                f"{list(shape)}, axis={axis}); }}"), "f")
    for index in np.ndindex(*shape):
        assert out[index] == index[axis]


@SETTINGS
@given(shapes, seeds, st.sampled_from(["mean", "min"]))
def test_mean_min(shape, seed, op) -> None:
    x = floats(seed, shape)
    axis = len(shape) - 1
    text = unary_program(f"{op}(x, axis={axis})", shape, out_shape=shape[:-1])
    (out,) = run(text, x)
    for index in np.ndindex(*shape[:-1]):
        row = [float(x[index + (j,)]) for j in range(shape[-1])]
        want = math.fsum(row) / len(row) if op == "mean" else min(row)
        np.testing.assert_allclose(out[index], want, rtol=1e-6, atol=1e-7)


def test_source_casts() -> None:
    x = np.array([-2.7, -0.0, 0.4, 1e30, np.nan, 3.5], np.float32)
    (as_int,) = run(unary_program("cast(x, I64)", (6,), out_dtype="I64"), x)
    assert as_int.tolist() == [-2, 0, 0, 2 ** 63 - 1, 0, 3]  # truncated, saturated, NaN -> 0
    (as_bool,) = run(unary_program("cast(x, BOOL)", (6,), out_dtype="BOOL"), x)
    assert as_bool.tolist() == [True, False, True, True, True, True]
    (as_bf16,) = run(unary_program("cast(x, BF16)", (6,), out_dtype="BF16"), x)
    for got, value in zip(as_bf16.view(np.uint16).tolist(), x.tolist(), strict=True):
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        if math.isnan(value):
            assert got & 0x7F80 == 0x7F80 and got & 0x7F
            continue
        # Round to nearest, ties to even, on the upper 16 bits.
        assert got == (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


@SETTINGS
@given(shapes, seeds, st.sampled_from(["layer_norm", "rms_norm"]))
def test_norms(shape, seed, op) -> None:
    x = floats(seed, shape) + np.float32(1)
    width = shape[-1]
    gamma, beta = floats(seed + 1, (width,)), floats(seed + 2, (width,))
    vec = ktype("F32", (width,))
    params = f"x: {ktype('F32', shape)}, g: {vec}" + (f", b: {vec}" if op == "layer_norm" else "")
    call = "layer_norm(x, g, b" if op == "layer_norm" else "rms_norm(x, g"
    text = f"fn f({params}) -> {ktype('F32', shape)} {{ return {call}, axis=-1, eps=0.001); }}"
    args = (x, gamma, beta) if op == "layer_norm" else (x, gamma)
    (out,) = run(text, *args)
    for index in np.ndindex(*shape[:-1]):
        row = [float(x[index + (j,)]) for j in range(width)]
        shift = math.fsum(row) / width if op == "layer_norm" else 0.0
        spread = math.fsum((v - shift) ** 2 for v in row) / width
        for j, v in enumerate(row):
            want = (v - shift) / math.sqrt(spread + 0.001) * float(gamma[j])
            if op == "layer_norm":
                want += float(beta[j])
            np.testing.assert_allclose(out[index + (j,)], want, rtol=2e-6, atol=2e-6)


@SETTINGS
@given(shapes, seeds, st.integers(1, 3))
def test_concat_slice(shape, seed, width) -> None:
    x = floats(seed, shape)
    y = floats(seed + 1, shape[:-1] + (width,))
    axis = len(shape) - 1
    joined = shape[:-1] + (shape[-1] + width,)
    text = (f"fn f(x: {ktype('F32', shape)}, y: {ktype('F32', shape[:-1] + (width,))}) -> "
            f"{ktype('F32', shape[:-1] + (width,))} {{\n"
            f"  let j = concat(x, y, axis={axis});\n"
            f"  return slice(j, axis={axis}, start={shape[-1]}, size={width});\n}}")
    (out,) = run(text, x, y)
    np.testing.assert_array_equal(out, y)  # the slice after x is y again
    text = (f"fn f(x: {ktype('F32', shape)}, y: {ktype('F32', shape[:-1] + (width,))}) -> "
            f"{ktype('F32', joined)} {{ return concat(x, y, axis={axis}); }}")
    (out,) = run(text, x, y)
    for index in np.ndindex(*joined):
        source = x if index[-1] < shape[-1] else y
        position = index[:-1] + (index[-1] % shape[-1] if source is y else index[-1],)
        if source is y:
            position = index[:-1] + (index[-1] - shape[-1],)
        assert out[index] == source[position]


def test_a_dead_gather_checks_no_ids_as_in_compiled_code():
    """A value nothing reads is not computed by either side (fuzz case 2025:444: the
    interpreter raised for an unused gather's bad id, the compiled code had dropped it)."""
    from tilegen.api import compile_program

    program = program_from_text("""
fn f(table: Tensor[F32, [4, 3], @host], ids: Tensor[I64, [2], @host])
    -> Tensor[F32, [4, 3], @host] {
  let unused = gather(table, ids);
  return exp(table);
}
""", "dead.kina")
    table = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    ids = np.array([0, 99], dtype=np.int64)
    (interpreted,) = interpret(program, "f", table, ids)
    np.testing.assert_allclose(interpreted, np.exp(table), rtol=1e-6)
    np.testing.assert_allclose(compile_program(program).f(table, ids), interpreted, rtol=1e-6)
