"""Scheduling choices that change the generated code's shape: which loops run in vector
tiles. Each case checks the schedule it expects and the results against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.runtime import program_of


def _ty(shape):
    return f"Tensor[F32, [{', '.join(str(d) for d in shape)}], @host]"


def _outer_vector_loops(stmts) -> int:
    """Vector loops with loops inside them (rows processed `width` at a time)."""
    count = 0
    for stmt in stmts:
        if isinstance(stmt, L.For):
            if stmt.kind == "vector" and any(isinstance(s, L.For) for s in stmt.body):
                count += 1
            count += _outer_vector_loops(stmt.body)
    return count


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,axis", [((37, 19), 0), ((5, 33, 9), 1), ((9, 3, 40), 0),
                                        ((36, 72), 0), ((8, 21), 0)])
def test_row_passes_along_a_strided_axis_run_many_rows_per_tile(op, shape, axis):
    """softmax over a non-contiguous axis: the loop over the contiguous neighbours of each
    row runs in vector tiles (narrow tails included), its reductions vertical."""
    source = f"fn f(x: {_ty(shape)}) -> {_ty(shape)} {{ return {op}(x, axis={axis}); }}"
    module = compile_program(program_from_text(source, "rows.kina"))
    # One outer tile loop per step of the row pass (the steps are split into nests of
    # their own, tilegen/fission.py).
    assert _outer_vector_loops(program_of(module).plans["f"].kernel.body) >= 1
    rng = np.random.default_rng(sum(shape) + axis)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[::7] = -1e9  # masked entries: whole vectors of them underflow
    want = _softmax(x.astype(np.float64), axis)
    if op == "log_softmax":
        shifted = x.astype(np.float64) - x.max(axis=axis, keepdims=True)
        want = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    np.testing.assert_allclose(module.f(x), want, rtol=2e-6, atol=1e-6)


def test_strided_stores_keep_the_inner_loop_vectorised():
    """A plain row-major nest is not turned inside out: its inner loop stays the tiled one."""
    source = f"fn f(x: {_ty((6, 40))}) -> {_ty((6, 40))} {{ return softmax(x, axis=1); }}"
    module = compile_program(program_from_text(source, "rows.kina"))
    assert _outer_vector_loops(program_of(module).plans["f"].kernel.body) == 0
    x = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
    np.testing.assert_allclose(module.f(x), _softmax(x.astype(np.float64), 1), rtol=2e-6,
                               atol=1e-7)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("source,shape,reference", [
    ("exp(x) * 2.0", (300_007,), lambda x: np.exp(x.astype(np.float64)) * 2.0),
    ("softmax(x, axis=0)", (64, 4099), lambda x: _softmax(x.astype(np.float64), 0)),
])
def test_large_vector_loops_split_their_tiles_across_threads(source, shape, reference,
                                                             threads, monkeypatch):
    """A top-level vector loop with enough work runs whole tiles on each thread, the tail
    tile on the last (sizes not multiples of 16); the schedule prints and parses back."""
    from tilegen.loopir import format_kernel
    from tilegen.loopir_parse import parse_kernel

    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    text = f"fn f(x: {_ty(shape)}) -> {_ty(shape)} {{ return {source}; }}"
    module = compile_program(program_from_text(text, "threads.kina"))
    kernel = program_of(module).plans["f"].kernel
    top = kernel.body[0]
    assert top.kind == "vector" and top.threads == (threads if threads > 1 else 1)
    assert parse_kernel(format_kernel(kernel)) == kernel
    x = np.random.default_rng(threads).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(module.f(x), reference(x), rtol=2e-6, atol=1e-7)
