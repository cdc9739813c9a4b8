"""The Python wrapper of compiled functions: argument checks, out=, id range checks."""

from __future__ import annotations

import numpy as np
import pytest

import tilegen
from tilegen.api import compile_source
from tilegen.runtime import ArgumentError, IdOutOfRangeError

SOURCE = """
fn embed(table: Tensor[F32, [8, 4], @host], ids: Tensor[I64, [2, 3], @host])
    -> Tensor[F32, [2, 3, 4], @host] {
  return gather(table, ids);
}
fn classes(ids: Tensor[I64, [5], @host]) -> Tensor[F32, [5, 7], @host] {
  return one_hot(ids, 7);
}
fn twice(x: Tensor[F32, [3, 17], @host]) -> (Tensor[F32, [3, 17], @host],
                                             Tensor[F32, [3], @host]) {
  return (mul(x, 2.0), sum(x, axis=1));
}
fn two_tables(small: Tensor[F32, [3, 2], @host], big: Tensor[F32, [9, 2], @host],
              x: Tensor[F32, [4, 2], @host], ids: Tensor[I64, [4], @host])
    -> (Tensor[F32, [4, 2], @host], Tensor[F32, [4, 2], @host], Tensor[F32, [4, 2], @host]) {
  return (mul(x, 3.0), gather(big, ids), gather(small, ids));
}
fn computed(x: Tensor[F32, [4, 9], @host], table: Tensor[F32, [5, 2], @host])
    -> Tensor[F32, [4, 2], @host] {
  return gather(table, argmax(x, axis=1));
}
"""


@pytest.fixture(scope="module", params=[True, False], ids=["jit", "so"])
def module(request):
    return compile_source(SOURCE, "guards.kina", jit=request.param)


def test_gather_and_one_hot_ids_out_of_range(module):
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    ids = np.array([[0, 1, 2], [3, 8, 5]])
    with pytest.raises(IdOutOfRangeError, match=r"id 8 at position \[1, 1\] of argument 'ids'"):
        module.embed(table, ids)
    with pytest.raises(IdOutOfRangeError, match=r"id -1 at position \[0, 2\]"):
        module.embed(table, np.array([[0, 1, -1], [0, 0, 0]]))
    with pytest.raises(IdOutOfRangeError, match=r"one_hot .* id 7 at position \[4\]"):
        module.classes(np.array([0, 1, 2, 3, 7]))
    good = module.embed(table, np.array([[0, 1, 2], [3, 7, 5]]))
    np.testing.assert_array_equal(good, table[np.array([[0, 1, 2], [3, 7, 5]])])


def test_parameter_ids_are_checked_before_anything_is_written(module):
    small, big = np.ones((3, 2), np.float32), np.ones((9, 2), np.float32)
    x = np.ones((4, 2), np.float32)
    outs = tuple(np.full((4, 2), -7.0, np.float32) for _ in range(3))
    # Valid for `big` (9 rows), not for `small` (3 rows): the second gather's limit is
    # checked on its own, and no result -- not even the first, which needs no ids -- is
    # written before the bad id is found.
    with pytest.raises(IdOutOfRangeError, match=r"gather .* id 5 at position \[2\] "
                                                r"of argument 'ids'"):
        module.two_tables(small, big, x, np.array([0, 1, 5, 8]), out=outs)
    for out in outs:
        np.testing.assert_array_equal(out, np.full((4, 2), -7.0, np.float32))
    with pytest.raises(IdOutOfRangeError, match=r"id 9 at position \[3\]"):
        module.two_tables(small, big, x, np.array([0, 1, 2, 9]), out=outs)
    ids = np.array([2, 0, 1, 1])
    tripled, from_big, from_small = module.two_tables(small * 2, big * 5, x, ids)
    np.testing.assert_array_equal(tripled, np.full((4, 2), 3.0, np.float32))
    np.testing.assert_array_equal(from_big, np.full((4, 2), 5.0, np.float32))
    np.testing.assert_array_equal(from_small, np.full((4, 2), 2.0, np.float32))


def test_computed_ids_are_checked(module):
    x = np.zeros((4, 9), np.float32)
    x[2, 6] = 1.0  # argmax 6 is outside the 5-row table
    table = np.ones((5, 2), np.float32)
    with pytest.raises(IdOutOfRangeError, match=r"id 6 at position \[2\] of a computed ids"):
        module.computed(x, table)


def test_wrong_arity_dtype_shape(module):
    table = np.zeros((8, 4), np.float32)
    ids = np.zeros((2, 3), np.int64)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'ids'"):
        module.embed(table)
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        module.embed(table, ids, ids)
    with pytest.raises(ArgumentError, match="takes 2 argument"):
        module.embed.__self__.slow_path(table)
    with pytest.raises(ArgumentError, match="'table' must have dtype float32, got float64"):
        module.embed(table.astype(np.float64), ids)
    with pytest.raises(ArgumentError, match=r"'ids' must have shape \[2, 3\], got \[3, 2\]"):
        module.embed(table, ids.reshape(3, 2))
    with pytest.raises(ArgumentError, match="'ids' must have dtype int64, got int32"):
        module.embed(table, ids.astype(np.int32))


def test_non_contiguous_inputs_are_copied(module):
    base = np.random.default_rng(0).standard_normal((17, 3)).astype(np.float32)
    view = base.T  # Fortran-ordered view of shape [3, 17]
    doubled, sums = module.twice(view)
    np.testing.assert_allclose(doubled, 2 * view)
    np.testing.assert_allclose(sums, view.sum(axis=1), rtol=1e-6)


def test_out_arrays(module):
    x = np.ones((3, 17), np.float32)
    out = (np.empty((3, 17), np.float32), np.empty(3, np.float32))
    result = module.twice(x, out=out)
    assert result[0] is out[0] and result[1] is out[1]
    np.testing.assert_array_equal(out[1], np.full(3, 17, np.float32))
    with pytest.raises(ArgumentError, match="out= needs 2"):
        module.twice(x, out=out[:1])
    readonly = np.empty((3, 17), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        module.twice(x, out=(readonly, out[1]))
    with pytest.raises(ArgumentError, match="overlaps"):
        module.twice(x, out=(x, out[1]))
    with pytest.raises(ArgumentError, match="C-contiguous"):
        module.twice(x, out=(np.empty((17, 3), np.float32).T, out[1]))


def test_every_call_form_of_the_native_front(module):
    """The function handed out is a native builtin that runs `f(*inputs, out=...)` itself
    and gives every other form to the Python wrapper: each form returns the same values,
    and no call leaks or drops a reference (out arrays, None, the inputs)."""
    import gc
    import inspect
    import sys

    twice = module.twice
    assert str(inspect.signature(twice)) == "(x, *, out=None)"
    x = np.arange(51, dtype=np.float32).reshape(3, 17)
    want = (2 * x, x.sum(axis=1))
    out = (np.empty((3, 17), np.float32), np.empty(3, np.float32))
    forms = [
        lambda: twice(x),                                # outputs allocated by the wrapper
        lambda: twice(x, out=out),                       # the native path
        lambda: twice(x, out=list(out)),                 # a list: the wrapper
        lambda: twice(x, **{"out": out}),                # keyword built at run time
        lambda: twice(x, out=("o" + "ut") and out),
    ]
    for form in forms:
        result = form()
        for got, expected in zip(result, want, strict=True):
            np.testing.assert_array_equal(got, expected)
    # Garbage left by earlier tests holds references to None too: collect it first, and
    # keep the collector from freeing more of it in the middle of the count.
    gc.collect()
    gc.disable()
    try:
        counts = [sys.getrefcount(o) for o in (x, out, out[0], out[1], None)]
        for _ in range(2000):
            for form in forms:
                form()
        after = [sys.getrefcount(o) for o in (x, out, out[0], out[1], None)]
    finally:
        gc.enable()
    assert after == counts
    result = twice(x, out=out)
    assert result is out  # one tuple: handed back as given
    single = np.empty((2, 3, 4), np.float32)
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    ids = np.array([[0, 7, 3], [1, 1, 2]], np.int64)
    before = sys.getrefcount(single)
    for _ in range(1000):
        assert module.embed(table, ids, out=single) is single
    assert sys.getrefcount(single) == before
    np.testing.assert_array_equal(single, table[ids])
    with pytest.raises(TypeError, match="unexpected keyword argument 'outs'"):
        twice(x, outs=out)
    with pytest.raises(TypeError, match="takes 1 positional argument but 2 positional"):
        twice(x, x, out=out)
    with pytest.raises(IdOutOfRangeError):
        module.embed(table, ids + 5, out=single)


def test_nan_and_inf_propagate(module):
    x = np.ones((3, 17), np.float32)
    x[0, 3] = np.nan
    x[1, 0] = np.inf
    doubled, sums = module.twice(x)
    assert np.isnan(doubled[0, 3]) and np.isnan(sums[0])
    assert np.isinf(doubled[1, 0]) and np.isinf(sums[1])


def test_module_reports_unknown_function(module):
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        module.nope  # noqa: B018


def test_package_exports():
    assert tilegen.IdOutOfRangeError is IdOutOfRangeError
    assert callable(tilegen.compile_file)
