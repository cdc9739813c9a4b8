"""Hostile calls into compiled functions never crash the process (JIT and .so).

Every call in HOSTILE runs in a child process (this file run as a script, once per mode),
because a wrong pointer or a missed check would kill the process rather than fail a test.
The parent asserts the child exited normally -- no signal, exit status 0 -- and that each
call ended as EXPECTED says: either it worked and matched NumPy, or it raised the named
exception with a message naming the argument, what was expected and what was given.

    python tests/test_robustness_calls.py jit      # the child, by hand: one JSON line per call
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

SOURCE = """
fn embed(table: Tensor[F32, [8, 4], @host], ids: Tensor[I64, [2, 3], @host])
    -> Tensor[F32, [2, 3, 4], @host] {
  return gather(table, ids);
}
fn classes(ids: Tensor[I64, [5], @host]) -> Tensor[F32, [5, 7], @host] {
  return one_hot(ids, 7);
}
fn twice(x: Tensor[F32, [3, 17], @host])
    -> (Tensor[F32, [3, 17], @host], Tensor[F32, [3], @host]) {
  return (mul(x, 2.0), sum(x, axis=1));
}
fn scalar(x: Tensor[F32, [], @host]) -> Tensor[F32, [], @host] {
  return exp(x);
}
fn rows(x: Tensor[F32, [3, 17], @host])
    -> (Tensor[F32, [3], @host], Tensor[I64, [3], @host], Tensor[F32, [3, 17], @host]) {
  return (max(x, axis=1), argmax(x, axis=1), softmax(x, axis=1));
}
fn unary(x: Tensor[F32, [3, 17], @host])
    -> (Tensor[F32, [3, 17], @host], Tensor[F32, [3, 17], @host],
        Tensor[F32, [3, 17], @host], Tensor[F32, [3, 17], @host]) {
  return (exp(x), log(x), sqrt(x), 1.0 / x);
}
fn mm(a: Tensor[F32, [64, 64], @host], b: Tensor[F32, [64, 64], @host])
    -> Tensor[F32, [64, 64], @host] {
  return matmul(a, b);
}
fn big(x: Tensor[F32, [64, 1024], @host]) -> Tensor[F32, [64, 1024], @host] {
  return softmax(x, axis=1);
}
fn computed(x: Tensor[F32, [4, 9], @host], table: Tensor[F32, [5, 2], @host])
    -> Tensor[F32, [4, 2], @host] {
  return gather(table, argmax(x, axis=1));
}
"""

# ---- the hostile calls (run in the child) ---------------------------------------------------

TABLE = np.arange(32, dtype=np.float32).reshape(8, 4)
IDS = np.array([[0, 1, 2], [3, 7, 5]], dtype=np.int64)
X = np.linspace(-2, 2, 51, dtype=np.float32).reshape(3, 17)


def _embed_ok(m, table=TABLE, ids=IDS):
    return m.embed(table, ids), np.asarray(table, np.float32)[np.asarray(ids)]


def _unaligned(shape, dtype=np.float32) -> np.ndarray:
    count = int(np.prod(shape))
    size = np.dtype(dtype).itemsize
    return np.frombuffer(bytearray(count * size + 1), dtype, count=count, offset=1).reshape(shape)


def _unaligned_copy(array: np.ndarray) -> np.ndarray:
    buffer = bytearray(array.nbytes + 1)
    buffer[1:] = array.tobytes()
    return np.frombuffer(buffer, array.dtype, offset=1).reshape(array.shape)


def _strided(array: np.ndarray) -> np.ndarray:
    """The same values in a buffer with a row stride twice the row length."""
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
    wide[..., ::2] = array
    return wide[..., ::2]


class _Sub(np.ndarray):
    pass


class _BadArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("no array here")


def _twice_out(m, out):
    result = m.twice(X, out=out)
    return result, (X * 2, X.sum(axis=1))


def _twice_ok(m, x):
    return m.twice(x), (np.asarray(x, np.float32) * 2, np.asarray(x, np.float32).sum(axis=1))


def _special_rows() -> np.ndarray:
    x = X.copy()
    x[0, 3] = np.nan  # a NaN row
    x[1, 5] = np.inf  # a +inf row
    x[2, :] = -np.inf  # a row of -inf
    return x


def _rows_reference(x: np.ndarray):
    with np.errstate(all="ignore"):
        shifted = x - x.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        return x.max(axis=1), x.argmax(axis=1), e / e.sum(axis=1, keepdims=True)


def _unary_reference(x: np.ndarray):
    with np.errstate(all="ignore"):
        return np.exp(x), np.log(x), np.sqrt(x), np.float32(1.0) / x


def _special_values() -> np.ndarray:
    x = X.copy()
    x[0, :6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0]
    x[1, :3] = [100.0, -100.0, 1e-45]  # exp overflow and underflow, a subnormal
    return x


def _mm_nan(m):
    a = np.eye(64, dtype=np.float32)
    a[3, 7] = np.nan
    b = np.ones((64, 64), np.float32)
    b[10, 20] = np.inf
    with np.errstate(all="ignore"):
        return m.mm(a, b), a @ b


def _big_nan_row(m):
    x = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    x[5, 100] = np.nan
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return m.big(x), e / e.sum(axis=1, keepdims=True)


def _after_error(m):
    """A failed id check leaves no state behind: the next call works."""
    bad = IDS.copy()
    bad[1, 1] = 8
    with contextlib.suppress(IndexError):
        m.embed(TABLE, bad)
    return _embed_ok(m)


def _readonly_out(m):
    out = np.empty((3, 17), np.float32)
    out.setflags(write=False)
    return m.twice(X, out=(out, np.empty(3, np.float32)))


def _overlapping_outs(m):
    buffer = np.empty(3 * 17 + 3, np.float32)
    return m.twice(X, out=(buffer[:51].reshape(3, 17), buffer[50:53]))


HOSTILE: dict[str, Callable] = {
    # arity
    "no arguments": lambda m: m.embed(),
    "one argument of two": lambda m: m.embed(TABLE),
    "three arguments of two": lambda m: m.embed(TABLE, IDS, IDS),
    "a thousand arguments": lambda m: m.embed(*[TABLE] * 1000),
    "keyword arguments": lambda m: (m.embed(table=TABLE, ids=IDS), TABLE[IDS]),
    "unknown keyword": lambda m: m.embed(TABLE, IDS, bogus=1),
    # element types
    "float64 table": lambda m: m.embed(TABLE.astype(np.float64), IDS),
    "float16 table": lambda m: m.embed(TABLE.astype(np.float16), IDS),
    "complex table": lambda m: m.embed(TABLE.astype(np.complex64), IDS),
    "int32 ids": lambda m: m.embed(TABLE, IDS.astype(np.int32)),
    "uint64 ids": lambda m: m.embed(TABLE, IDS.astype(np.uint64)),
    "float ids": lambda m: m.embed(TABLE, IDS.astype(np.float32)),
    "bool ids": lambda m: m.embed(TABLE, IDS.astype(bool)),
    "longlong ids": lambda m: _embed_ok(m, ids=IDS.astype(np.longlong)),
    "object table": lambda m: m.embed(TABLE.astype(object), IDS),
    "string array table": lambda m: m.embed(TABLE.astype(str), IDS),
    "structured table": lambda m: m.embed(np.zeros((8, 4), "f4,f4"), IDS),
    # ranks and shapes
    "1-d table": lambda m: m.embed(TABLE.reshape(32), IDS),
    "3-d table": lambda m: m.embed(TABLE.reshape(2, 4, 4), IDS),
    "transposed shape": lambda m: m.embed(TABLE.reshape(4, 8), IDS),
    "empty table": lambda m: m.embed(np.zeros((0, 4), np.float32), IDS),
    "0-d table": lambda m: m.embed(np.float32(1.0), IDS),
    "ids with an extra axis": lambda m: m.embed(TABLE, IDS.reshape(1, 2, 3)),
    # layouts that must work (copied or read as they are)
    "fortran-order table": lambda m: _embed_ok(m, table=np.asfortranarray(TABLE)),
    "transposed view": lambda m: _embed_ok(m, table=np.ascontiguousarray(TABLE.T).T),
    "strided table": lambda m: _embed_ok(m, table=_strided(TABLE)),
    "strided ids": lambda m: _embed_ok(m, ids=_strided(IDS)),
    "negative strides": lambda m: _embed_ok(m, table=TABLE[::-1, ::-1]),
    "zero strides (broadcast_to)": lambda m: _embed_ok(
        m, table=np.broadcast_to(TABLE[:1], (8, 4))),
    "unaligned table": lambda m: _embed_ok(m, table=_unaligned_copy(TABLE)),
    "unaligned ids": lambda m: _embed_ok(m, ids=_unaligned_copy(IDS)),
    "read-only inputs": lambda m: _embed_ok(m, table=np.frombuffer(
        TABLE.tobytes(), np.float32).reshape(8, 4)),
    "ndarray subclass": lambda m: _embed_ok(m, table=TABLE.view(_Sub)),
    "np.matrix table": lambda m: _embed_ok(m, table=np.asmatrix(TABLE)),
    "masked table (data is used, like np.asarray)": lambda m: (
        m.embed(np.ma.masked_array(TABLE, mask=TABLE > 3), IDS), TABLE[IDS]),
    "python list ids": lambda m: _embed_ok(m, ids=IDS.tolist()),
    "0-d scalar array": lambda m: (m.scalar(np.array(1.5, np.float32)),
                                   np.exp(np.float32(1.5))),
    "numpy float32 scalar": lambda m: (m.scalar(np.float32(1.5)), np.exp(np.float32(1.5))),
    "same array twice": lambda m: _twice_ok(m, X),
    # odd objects
    "None": lambda m: m.embed(None, IDS),
    "a string": lambda m: m.embed("table", IDS),
    "a dict": lambda m: m.embed({"table": TABLE}, IDS),
    "a python float for a 0-d F32": lambda m: m.scalar(1.5),
    "a huge python int": lambda m: m.scalar(10**100),
    "a ragged list": lambda m: m.embed([[1.0], [2.0, 3.0]], IDS),
    "python float list table": lambda m: m.embed(TABLE.tolist(), IDS),
    "__array__ raises": lambda m: m.embed(_BadArray(), IDS),
    "a generator": lambda m: m.embed((row for row in TABLE), IDS),
    "1-element array for 0-d": lambda m: m.scalar(np.ones(1, np.float32)),
    # outputs
    "out as a list": lambda m: _twice_out(m, [np.empty((3, 17), np.float32),
                                              np.empty(3, np.float32)]),
    "out unaligned": lambda m: _twice_out(m, (_unaligned((3, 17)), _unaligned((3,)))),
    "out np.matrix": lambda m: _twice_out(m, (np.asmatrix(np.empty((3, 17), np.float32)),
                                              np.empty(3, np.float32))),
    "out too few": lambda m: m.twice(X, out=(np.empty((3, 17), np.float32),)),
    "out one array for two results": lambda m: m.twice(X, out=np.empty((3, 17), np.float32)),
    "out None inside": lambda m: m.twice(X, out=(None, np.empty(3, np.float32))),
    "out wrong dtype": lambda m: m.twice(X, out=(np.empty((3, 17), np.float64),
                                                 np.empty(3, np.float32))),
    "out wrong shape": lambda m: m.twice(X, out=(np.empty((17, 3), np.float32),
                                                 np.empty(3, np.float32))),
    "out non-contiguous": lambda m: m.twice(X, out=(np.empty((17, 3), np.float32).T,
                                                    np.empty(3, np.float32))),
    "out strided": lambda m: m.twice(X, out=(_strided(np.empty((3, 17), np.float32)),
                                             np.empty(3, np.float32))),
    "out read-only": _readonly_out,
    "out is an input": lambda m: m.twice(X, out=(X, np.empty(3, np.float32))),
    "outs overlap each other": _overlapping_outs,
    # NaN and inf propagate as float math does (NumPy is the reference)
    "nan and inf through max/argmax/softmax": lambda m: (m.rows(_special_rows()),
                                                         _rows_reference(_special_rows())),
    "nan, inf, zeros, negatives through exp/log/sqrt/div": lambda m: (
        m.unary(_special_values()), _unary_reference(_special_values())),
    "nan and inf through matmul": _mm_nan,
    "a nan row in a large softmax": _big_nan_row,
    # ids
    "gather id too large": lambda m: m.embed(TABLE, np.array([[0, 1, 2], [3, 8, 5]])),
    "gather negative id": lambda m: m.embed(TABLE, np.array([[0, 1, -1], [0, 0, 0]])),
    "gather int64 min": lambda m: m.embed(TABLE, np.full((2, 3), np.iinfo(np.int64).min)),
    "gather int64 max": lambda m: m.embed(TABLE, np.full((2, 3), np.iinfo(np.int64).max)),
    "one_hot id too large": lambda m: m.classes(np.array([0, 1, 2, 3, 7])),
    "one_hot negative id": lambda m: m.classes(np.array([-1, 1, 2, 3, 4])),
    "one_hot ids in range": lambda m: (m.classes(np.array([0, 6, 2, 3, 4])),
                                       np.eye(7, dtype=np.float32)[[0, 6, 2, 3, 4]]),
    "computed ids out of range": lambda m: m.computed(
        np.eye(4, 9, 6, dtype=np.float32), np.ones((5, 2), np.float32)),
    "a valid call after an id error": _after_error,
}

# What each call must end in: "ok" (ran and matched NumPy), or the exception type and
# regular expressions its message must match (the argument, the expectation, the value).
ARG = "ArgumentError"
TYPE = "TypeError|ArgumentError"
IDS_ERR = "IdOutOfRangeError"
EXPECTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "no arguments": (TYPE, ("table", "ids")),
    "one argument of two": (TYPE, ("ids",)),
    "three arguments of two": (TYPE, (r"2 (positional )?argument", "3")),
    "a thousand arguments": (TYPE, (r"2 (positional )?argument", "1000")),
    "keyword arguments": ("ok", ()),
    "unknown keyword": (TYPE, ("bogus",)),
    "float64 table": (ARG, ("'table'", "float32", "float64")),
    "float16 table": (ARG, ("'table'", "float32", "float16")),
    "complex table": (ARG, ("'table'", "float32", "complex64")),
    "int32 ids": (ARG, ("'ids'", "int64", "int32")),
    "uint64 ids": (ARG, ("'ids'", "int64", "uint64")),
    "float ids": (ARG, ("'ids'", "int64", "float32")),
    "bool ids": (ARG, ("'ids'", "int64", "bool")),
    "longlong ids": ("ok", ()),
    "object table": (ARG, ("'table'", "float32", "object")),
    "string array table": (ARG, ("'table'", "float32", "str")),
    "structured table": (ARG, ("'table'", "float32", "void")),
    "1-d table": (ARG, ("'table'", r"\[8, 4\]", r"\[32\]")),
    "3-d table": (ARG, ("'table'", r"\[8, 4\]", r"\[2, 4, 4\]")),
    "transposed shape": (ARG, ("'table'", r"\[8, 4\]", r"\[4, 8\]")),
    "empty table": (ARG, ("'table'", r"\[8, 4\]", r"\[0, 4\]")),
    "0-d table": (ARG, ("'table'", r"\[8, 4\]", r"\[\]")),
    "ids with an extra axis": (ARG, ("'ids'", r"\[2, 3\]", r"\[1, 2, 3\]")),
    "fortran-order table": ("ok", ()),
    "transposed view": ("ok", ()),
    "strided table": ("ok", ()),
    "strided ids": ("ok", ()),
    "negative strides": ("ok", ()),
    "zero strides (broadcast_to)": ("ok", ()),
    "unaligned table": ("ok", ()),
    "unaligned ids": ("ok", ()),
    "read-only inputs": ("ok", ()),
    "ndarray subclass": ("ok", ()),
    "np.matrix table": ("ok", ()),
    "masked table (data is used, like np.asarray)": ("ok", ()),
    "python list ids": ("ok", ()),
    "0-d scalar array": ("ok", ()),
    "numpy float32 scalar": ("ok", ()),
    "same array twice": ("ok", ()),
    "None": (ARG, ("'table'", "float32", "object")),
    "a string": (ARG, ("'table'", "float32", "str")),
    "a dict": (ARG, ("'table'", "float32", "object")),
    "a python float for a 0-d F32": (ARG, ("'x'", "float32", "float64")),
    "a huge python int": (ARG, ("'x'", "float32", "object")),
    "a ragged list": (ARG, ("'table'", "not an array")),
    "python float list table": (ARG, ("'table'", "float32", "float64")),
    "__array__ raises": (ARG, ("'table'", "not an array", "no array here")),
    "a generator": (ARG, ("'table'", "float32", "object")),
    "1-element array for 0-d": (ARG, ("'x'", r"\[\]", r"\[1\]")),
    "out as a list": ("ok", ()),
    "out unaligned": ("ok", ()),
    "out np.matrix": ("ok", ()),
    "out too few": (ARG, ("out=", "2", "1")),
    "out one array for two results": (ARG, ("out=", "2", "1")),
    "out None inside": (ARG, (r"out\[0\]", "NumPy array", "NoneType")),
    "out wrong dtype": (ARG, (r"out\[0\]", "float32", "float64")),
    "out wrong shape": (ARG, (r"out\[0\]", r"\[3, 17\]", r"\[17, 3\]")),
    "out non-contiguous": (ARG, (r"out\[0\]", "C-contiguous")),
    "out strided": (ARG, (r"out\[0\]", "C-contiguous")),
    "out read-only": (ARG, (r"out\[0\]", "read-only")),
    "out is an input": (ARG, (r"out\[0\]", "overlaps")),
    "outs overlap each other": (ARG, (r"out\[1\]", "overlaps")),
    "nan and inf through max/argmax/softmax": ("ok", ()),
    "nan, inf, zeros, negatives through exp/log/sqrt/div": ("ok", ()),
    "nan and inf through matmul": ("ok", ()),
    "a nan row in a large softmax": ("ok", ()),
    "gather id too large": (IDS_ERR, ("gather", "'ids'", "id 8", r"\[1, 1\]", r"\[0, 8\)")),
    "gather negative id": (IDS_ERR, ("'ids'", "id -1", r"\[0, 2\]", r"\[0, 8\)")),
    "gather int64 min": (IDS_ERR, ("'ids'", "id -9223372036854775808", r"\[0, 0\]")),
    "gather int64 max": (IDS_ERR, ("'ids'", "id 9223372036854775807", r"\[0, 0\]")),
    "one_hot id too large": (IDS_ERR, ("one_hot", "'ids'", "id 7", r"\[4\]", r"\[0, 7\)")),
    "one_hot negative id": (IDS_ERR, ("one_hot", "'ids'", "id -1", r"\[0\]")),
    "one_hot ids in range": ("ok", ()),
    "computed ids out of range": (IDS_ERR, ("computed ids", "id 6", r"\[0, 5\)")),
    "a valid call after an id error": ("ok", ()),
}

# Byte order and out= edge cases (once known bugs, now fixed in tilegen/runtime.py).
HOSTILE.update({
    "big-endian table": lambda m: _embed_ok(m, table=TABLE.astype(">f4")),
    "big-endian ids": lambda m: _embed_ok(m, ids=IDS.astype(">i8")),
    "big-endian out": lambda m: _twice_out(m, (np.empty((3, 17), ">f4"),
                                               np.empty(3, np.float32))),
    "out is an int": lambda m: m.twice(X, out=3),
})
EXPECTED.update({
    # Inputs in the other byte order are converted; an output must be native.
    "big-endian table": ("ok", ()),
    "big-endian ids": ("ok", ()),
    "big-endian out": (ARG, (r"out\[0\]", "big-endian", ">f4")),
    "out is an int": (ARG, ("out=", "int")),
})


# ---- the child ------------------------------------------------------------------------------

def _same(got, want) -> bool:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    if len(got) != len(want):
        return False
    for have, expected in zip(got, want, strict=True):
        have, expected = np.asarray(have), np.asarray(expected)
        if have.shape != expected.shape:
            return False
        if expected.dtype.kind in "iub":
            if not np.array_equal(have, expected):
                return False
        elif not np.allclose(have, expected, rtol=2e-5, atol=1e-6, equal_nan=True):
            return False
    return True


def child(mode: str) -> None:
    """Compile SOURCE in `mode` and run every hostile call, one JSON line each."""
    from tilegen.api import compile_source

    module = compile_source(SOURCE, "hostile.kina", jit=(mode == "jit"))
    for label, call in HOSTILE.items():
        print(json.dumps({"start": label}), flush=True)
        try:
            got, want = call(module)
        except Exception as error:  # noqa: BLE001 -- recorded and judged by the parent
            record = {"outcome": type(error).__name__, "message": str(error)}
        else:
            record = {"outcome": "ok" if _same(got, want) else "wrong",
                      "message": f"got {got!r}\nwant {want!r}"}
        print(json.dumps({"label": label, **record}), flush=True)
    print(json.dumps({"done": True}), flush=True)


# ---- the parent -----------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["jit", "so"])
def outcomes(request) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, __file__, request.param], capture_output=True,
                            text=True, timeout=300, env=env, cwd=REPO)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    started = [line["start"] for line in lines if "start" in line]
    # A negative status is a signal (SIGSEGV, SIGABRT ...): the call that started last did it.
    assert result.returncode == 0, (
        f"{request.param} child ended with status {result.returncode} during "
        f"{started[-1] if started else 'compilation'!r}\n{result.stderr[-3000:]}")
    assert lines and lines[-1] == {"done": True}, result.stderr[-3000:]
    return {line["label"]: line for line in lines if "label" in line}


def _judge(record: dict, expected: tuple[str, tuple[str, ...]]) -> None:
    kinds, fragments = expected
    outcome, message = record["outcome"], record["message"]
    assert re.fullmatch(kinds, outcome), f"{outcome}: {message}"
    if outcome == "ok":
        return
    for fragment in fragments:
        assert re.search(fragment, message), f"{fragment!r} not in the message: {message}"


@pytest.mark.parametrize("label", EXPECTED)
def test_hostile_call(outcomes, label):
    _judge(outcomes[label], EXPECTED[label])


def test_every_hostile_call_has_an_expectation():
    assert set(HOSTILE) == set(EXPECTED)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "so"])
def test_function_without_results_compiles(jit):
    from tilegen.api import compile_source

    source = "fn g(x: Tensor[F32, [2], @host]) { let v = exp(x); }\n"
    module = compile_source(source, f"noresult-{jit}.kina", jit=jit)
    assert module.g(np.ones(2, np.float32)) in ((), None)


# ---- docs/errors.md: the runtime errors section runs as written -----------------------------

ERRORS_MD = REPO / "docs" / "errors.md"


def _runtime_section() -> str:
    text = ERRORS_MD.read_text()
    return text[text.index("## Runtime errors"):text.index("## Robustness")]


def child_docs(directory: str) -> None:
    """Run every `>>>` example of the section as one doctest session in `directory`."""
    import doctest
    import io

    section = _runtime_section()
    guards = re.search(r"use `guards.kina`:\n\n```kina\n(.*?)```", section, re.S).group(1)
    os.chdir(directory)
    Path("guards.kina").write_text(guards)
    session = "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))
    test = doctest.DocTestParser().get_doctest(session, {}, "errors.md", str(ERRORS_MD), 0)
    report = io.StringIO()
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=report.write)
    print(json.dumps({"attempted": result.attempted, "failed": result.failed,
                      "report": report.getvalue()}))


def test_errors_md_runtime_examples_are_verbatim(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TILEGEN_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, __file__, "docs", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["attempted"] >= 20
    assert outcome["failed"] == 0, outcome["report"]
    # The shell session: the scripts print exactly the documented line for `broken`.
    shell = re.search(r"```text\n(\$ python scripts/validate_train.py.*?)```",
                      _runtime_section(), re.S).group(1).splitlines()
    for command, expected in zip(shell[::2], shell[1::2], strict=True):
        script = REPO / command.split()[2]
        run = subprocess.run([sys.executable, str(script), *command.split()[3:]], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 2
        assert run.stderr.strip() == expected


if __name__ == "__main__":
    if sys.argv[1] == "docs":
        child_docs(sys.argv[2])
    else:
        child(sys.argv[1])
