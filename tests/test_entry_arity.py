"""The native entry of a wide function (issue 17, item 5): its code grows linearly with the
number of inputs and outputs, and its output-overlap check still declines every overlap.

A 16-input, 16-output function took 4.2 s of LLVM time on its first call: the check that
no output overlaps another buffer was a straight-line chain of outputs x buffers
comparisons, which O3 handled in superlinear time. It is now a loop over the outputs
around a vector loop over the buffers.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegen
from kina_frontend import program_from_text
from tilegen.pipeline import codegen, plan_program, to_llvm

WIDTH = 4  # elements per buffer


def _source(arity: int) -> str:
    params = ", ".join(f"a{i}: Tensor[F32, [{WIDTH}], @host]" for i in range(arity))
    results = ", ".join(f"Tensor[F32, [{WIDTH}], @host]" for _ in range(arity))
    body = ", ".join(f"a{i} * {i + 1}.0" for i in range(arity))
    return f"fn wide({params}) -> ({results}) {{\n  return ({body});\n}}\n"


def _entry_instructions(arity: int) -> int:
    """Instructions of the native entry, its overlap check and its keyword front
    (everything but the kernel itself) as they go into LLVM's optimiser: what O3 spends
    its time on. (O3's output is no measure: the SLP vectoriser folded the old chain into
    a few vector compares, after seconds of work.)"""
    (plan,) = plan_program(program_from_text(_source(arity)))
    parsed = to_llvm(codegen([plan]), plan.target, optimize_module=False)
    return sum(len(list(block.instructions))
               for function in parsed.functions
               if function.name.startswith((plan.entry_symbol, plan.call_symbol))
               for block in function.blocks)


def test_entry_code_grows_linearly_with_arity() -> None:
    counts = {arity: _entry_instructions(arity) for arity in (4, 8, 16)}
    # Per-argument code doubles when the arity doubles; a comparison per output and buffer
    # pair would quadruple it.
    growth = (counts[16] - counts[8]) / (counts[8] - counts[4])
    assert growth < 2.3, counts


@pytest.fixture(scope="module")
def wide():
    return tilegen.compile_source(_source(16), "wide.kina").wide


def _native_entry(function):
    """The METH_FASTCALL entry behind the keyword front (None when taken, NotImplemented
    when it declines and leaves the call to the validating slow path)."""
    return function.__self__.__globals__["_entry"]


def test_wide_entry_runs_disjoint_buffers(wide) -> None:
    inputs = [np.full(WIDTH, i, np.float32) for i in range(16)]
    # Outputs packed end to end in one array: touching is not overlapping.
    block = np.zeros(16 * WIDTH, np.float32)
    outputs = [block[i * WIDTH:(i + 1) * WIDTH] for i in range(16)]
    assert _native_entry(wide)(*inputs, *outputs) is None
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.full(WIDTH, i * (i + 1), np.float32))


@pytest.mark.parametrize("shift", [0, 1, WIDTH - 1])
def test_wide_entry_declines_every_overlap(wide, shift: int) -> None:
    """Each output overlapping each other buffer (an input or another output, in every
    lane of the vector check), by `shift` elements: the entry declines, and the call
    raises ArgumentError."""
    entry = _native_entry(wide)
    for out in range(16, 32):
        for other in range(32):
            if other == out:
                continue
            block = np.zeros(64 * WIDTH, np.float32)
            buffers = [block[2 * i * WIDTH:(2 * i + 1) * WIDTH] for i in range(32)]
            start = 2 * other * WIDTH + shift
            buffers[out] = block[start:start + WIDTH]
            assert entry(*buffers) is NotImplemented, (out, other, shift)
            with pytest.raises(tilegen.ArgumentError, match="overlaps"):
                wide(*buffers[:16], out=tuple(buffers[16:]))
