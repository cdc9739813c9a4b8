"""Splitting loops whose index is divided by a constant (tilegen/divsplit.py): the split
where it removes the division, no split where it would not, and results against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tilegen import config, pipeline
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.divsplit import split_divided_loops_pass
from tilegen.loopir_parse import parse_kernel
from tilegen.pipeline import lower, prepare
from tilegen.runtime import program_of
from tilegen.target import host_target


def _ty(shape):
    return f"Tensor[F32, [{', '.join(str(d) for d in shape)}], @host]"


def _merge_heads_source(batch, heads, t, width):
    """Attention's context: p @ v per head, heads merged back into the token rows."""
    p, v = _ty((batch, heads, t, t)), _ty((batch, heads, t, width))
    out = _ty((batch * t, heads * width))
    return (f"fn f(p: {p}, v: {v}) -> {out} {{ return reshape(transpose(matmul(p, v), "
            f"[0, 2, 1, 3]), [{batch * t}, {heads * width}]); }}")


def _divisions(stmts) -> int:
    count = 0
    for stmt in L.statements(stmts):
        exprs = (stmt.value,) if isinstance(stmt, L.Let) else \
            (*stmt.index, stmt.value) if isinstance(stmt, L.Store) else ()
        for expr in exprs:
            count += sum(isinstance(e, L.Binary) and e.op in ("floordiv", "mod")
                         for e in L.subexpressions(expr))
    return count


def _lowered(source):
    options = config.load()
    return lower(prepare(program_from_text(source, "divsplit.kina"), "f", options), options)


def test_merged_heads_lose_their_divisions_and_run_in_vector_tiles():
    kernel = _lowered(_merge_heads_source(1, 3, 5, 9))
    assert _divisions(kernel.body) == 5  # (i1 // 9) % 3 in p and in v, i1 % 9
    split = split_divided_loops_pass(kernel, host_target())
    assert _divisions(split.body) == 0
    (nest,) = split.body
    assert [loop.extent for loop in L.perfect_nest(nest)] == [5, 3, 9]
    assert parse_kernel(L.format_kernel(split), verify=True) == split
    module = compile_program(program_from_text(_merge_heads_source(1, 3, 5, 9), "m.kina"))
    (scheduled,) = program_of(module).plans["f"].kernel.body
    loops = list(L.statements([scheduled]))
    assert any(isinstance(s, L.For) and s.kind == "vector" and s.extent == 9 for s in loops)


def _loops(text_body: str) -> L.Kernel:
    return parse_kernel("kernel @k\n  input  x: f32[60]\n  output y: f32[60]\n{\n"
                        + text_body + "}\n", verify=True)


def test_no_split_without_a_single_divisor_of_the_extent():
    """Each loop reads x at a division inside a sum (so the vectorizer cannot tile it, and
    only the divisors decide)."""
    kept = [
        "(((i % 7) * 8) + (i // 7))",  # 7 does not divide 60
        "((i // 4) + (i // 5))",  # two divisors: no one split removes both
        "((i * 2) // 6)",  # split by 6, (2 * i_r) // 6 would stay
    ]
    for index in kept:
        kernel = _loops(f"  for i in 0..60 {{\n    y[i] = sum[k < 2]((x[{index}] * x[k]))\n"
                        "  }\n")
        assert split_divided_loops_pass(kernel, host_target()) == kernel, index
    divided = _loops("  for i in 0..60 {\n    y[i] = sum[k < 2]((x[(i // 6)] * x[k]))\n"
                     "  }\n")
    assert split_divided_loops_pass(divided, host_target()) != divided


def test_split_names_are_fresh():
    kernel = _loops("  for i in 0..60 {\n    for i_q in 0..1 {\n      y[i] = sum[k < 2]"
                    "((x[(((i // 6) * 6) + (i % 6))] * x[(k + i_q)]))\n    }\n  }\n")
    split = split_divided_loops_pass(kernel, host_target())
    names = [s.var.name for s in L.statements(split.body) if isinstance(s, L.For)]
    assert names == ["i_q_2", "i_r", "i_q"]
    assert parse_kernel(L.format_kernel(split), verify=True) == split


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 2), heads=st.integers(1, 5), t=st.integers(1, 19),
       width=st.integers(2, 37))
def test_merged_heads_match_numpy_and_the_unsplit_kernel(batch, heads, t, width):
    source = _merge_heads_source(batch, heads, t, width)
    module = compile_program(program_from_text(source, "m.kina"))
    rng = np.random.default_rng(batch * 1000 + heads * 100 + t * 10 + width)
    p = rng.standard_normal((batch, heads, t, t)).astype(np.float32)
    v = rng.standard_normal((batch, heads, t, width)).astype(np.float32)
    want = np.transpose(p.astype(np.float64) @ v, (0, 2, 1, 3)).reshape(batch * t, -1)
    got = module.f(p, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    passes = tuple(entry for entry in pipeline.SCHEDULE_PASSES
                   if entry[0] != "split-divided-loops")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "SCHEDULE_PASSES", passes)
        patch.setenv("TILEGEN_MEMORY_CACHE", "0")  # not the split module compiled above
        patch.delenv("TILEGEN_CACHE_DIR", raising=False)
        unsplit = compile_program(program_from_text(source, "m.kina"))
    np.testing.assert_array_equal(got, unsplit.f(p, v))


def test_a_loop_the_vectorizer_tiles_already_is_not_split():
    """y[i] = x[i // 4] stores contiguously along i (its vector loop gathers x): split, the
    vector loop would be the remainder's 4 iterations, too short for a tile."""
    kernel = _loops("  for i in 0..60 {\n    y[i] = x[(i // 4)]\n  }\n")
    assert split_divided_loops_pass(kernel, host_target()) == kernel
