"""The native entry of a function with more arrays than `fastcall.STRAIGHT_LINE_ARRAYS`:
its argument checks are a loop over a table of the arguments (`<symbol>.arrays`), so its
code is the same for any arity (MiniLM's 102 arrays were 4 500 straight-line
instructions), and it must decline every argument the straight-line checks decline.

Each case hands the entry one wrong argument among right ones, at the first, a middle and
the last position (an off-by-one in the table walk shows at the ends), and expects
NotImplemented (the slow path then raises the precise error, as the call shows).
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegen
from kina_frontend import program_from_text
from tilegen.fastcall import STRAIGHT_LINE_ARRAYS
from tilegen.pipeline import codegen, plan_program, to_llvm

# The parameters of the wide function, cycling through ranks 0-3 and four element types
# (with odd extents) so that each table row differs from its neighbours.
KINDS = [("F32", np.float32, [3, 5]), ("I64", np.int64, [7]), ("F64", np.float64, []),
         ("BOOL", np.bool_, [2, 3, 4]), ("F32", np.float32, [11])]


def _params(count: int):
    return [KINDS[i % len(KINDS)] for i in range(count)]


def _source(count: int) -> str:
    params = ", ".join(f"a{i}: Tensor[{kind}, {shape}, @host]"
                       for i, (kind, _, shape) in enumerate(_params(count)))
    # The result reads the first and the last parameters (both [3, 5] or [11] F32 ...).
    return (f"fn wide({params}) -> Tensor[F32, [3, 5], @host] {{\n"
            f"  return add(a0, a{count - 1 - (count - 1) % len(KINDS)});\n}}\n")


COUNT = STRAIGHT_LINE_ARRAYS + 7  # inputs; with the output past the straight-line limit


def _inputs():
    rng = np.random.default_rng(7)
    arrays = []
    for _, dtype, shape in _params(COUNT):
        if dtype == np.bool_:
            arrays.append(rng.integers(0, 2, shape).astype(np.bool_))
        elif dtype == np.int64:
            arrays.append(rng.integers(0, 9, shape).astype(np.int64))
        else:
            arrays.append(np.asarray(rng.standard_normal(shape), dtype))
    return arrays


@pytest.fixture(scope="module")
def wide():
    return tilegen.compile_source(_source(COUNT), "wide.kina").wide


def _entry(function):
    return function.__self__.__globals__["_entry"]


def test_wide_entry_runs_right_arguments(wide) -> None:
    inputs = _inputs()
    out = np.empty((3, 5), np.float32)
    assert _entry(wide)(*inputs, out) is None
    last = COUNT - 1 - (COUNT - 1) % len(KINDS)
    np.testing.assert_array_equal(out, inputs[0] + inputs[last])


def test_wide_entry_accepts_every_type_number_of_a_dtype(wide) -> None:
    """int64 arrays of either NumPy type number ('l' and 'q' are both 64-bit here)."""
    inputs = _inputs()
    for code in "lq":
        if np.dtype(code) != np.int64:
            continue
        changed = [a.astype(code) if a.dtype == np.int64 else a for a in inputs]
        assert _entry(wide)(*changed, np.empty((3, 5), np.float32)) is None, code


def _wrong(array: np.ndarray, how: str):
    if how == "dtype":
        return array.astype(np.float64 if array.dtype != np.float64 else np.float32)
    if how == "rank":
        return array.reshape(array.shape + (1,))
    if how == "dims":
        return np.zeros(array.shape[:-1] + (array.shape[-1] + 1,), array.dtype) \
            if array.shape else np.zeros((1,), array.dtype)
    if how == "strided":
        if not array.shape:
            return None  # a scalar cannot be strided
        doubled = np.repeat(array, 2, axis=-1)
        return doubled[..., ::2]
    if how == "big-endian":
        return None if array.dtype == np.bool_ else array.astype(array.dtype.newbyteorder(">"))
    if how == "not an array":
        return array.tolist()
    raise ValueError(how)


@pytest.mark.parametrize("how", ["dtype", "rank", "dims", "strided", "big-endian",
                                 "not an array"])
@pytest.mark.parametrize("position", [0, COUNT // 2, COUNT - 1])
def test_wide_entry_declines_a_wrong_input(wide, how: str, position: int) -> None:
    inputs = _inputs()
    bad = _wrong(inputs[position], how)
    if bad is None:
        pytest.skip(f"no {how} form of a {inputs[position].dtype} {inputs[position].shape}")
    right = list(inputs)
    inputs[position] = bad
    assert _entry(wide)(*inputs, np.empty((3, 5), np.float32)) is NotImplemented
    if how in ("strided", "big-endian", "not an array"):  # which the slow path converts
        try:
            result = wide(*inputs)
        except (tilegen.ArgumentError, TypeError, ValueError):
            return  # a list of floats where an int64 array belongs, say
        np.testing.assert_array_equal(result, wide(*right))
    else:
        with pytest.raises((tilegen.ArgumentError, TypeError, ValueError)):
            wide(*inputs)


@pytest.mark.parametrize("how", ["dtype", "rank", "dims", "strided", "read-only"])
def test_wide_entry_declines_a_wrong_output(wide, how: str) -> None:
    out = np.empty((3, 5), np.float32)
    if how == "read-only":
        out.flags.writeable = False
    else:
        out = _wrong(out, how)
    assert _entry(wide)(*_inputs(), out) is NotImplemented
    with pytest.raises((tilegen.ArgumentError, TypeError, ValueError)):
        wide(*_inputs(), out=out)


def _entry_instructions(count: int) -> int:
    (plan,) = plan_program(program_from_text(_source(count)))
    parsed = to_llvm(codegen([plan]), plan.target, optimize_module=False)
    return sum(len(list(block.instructions))
               for function in parsed.functions if function.name == plan.entry_symbol
               for block in function.blocks)


def test_wide_entry_code_does_not_grow_with_arity() -> None:
    assert _entry_instructions(COUNT) == _entry_instructions(4 * COUNT)
