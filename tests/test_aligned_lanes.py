"""`//` and `%` of a vector tile's lane variable decided by the tile's alignment
(tilegen/affine.py `split_aligned_lanes`, used by codegen_memory for every vector tile):
the rewrite against the original, lane by lane, over generated indices; where it must not
apply; and a compiled product whose A is a reshaped transpose (MiniLM's attention output),
which now loads contiguously instead of gathering, against NumPy."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tilegen import loopir as L
from tilegen.affine import split_aligned_lanes
from tilegen.api import compile_program

K, ROW, BASE = L.Var("k"), L.Var("i"), "k.base"


def _c(value: int) -> L.Const:
    return L.Const(value, L.I64)


def _eval(expr: L.Expr, env: dict[str, int]) -> int:
    if isinstance(expr, L.Const):
        return int(expr.value)
    if isinstance(expr, L.Var):
        return env[expr.name]
    lhs, rhs = _eval(expr.lhs, env), _eval(expr.rhs, env)
    operations = {"add": lambda: lhs + rhs, "sub": lambda: lhs - rhs,
                  "mul": lambda: lhs * rhs, "floordiv": lambda: lhs // rhs,
                  "mod": lambda: lhs % rhs}
    return operations[expr.op]()


def _binary(op, lhs, rhs):
    return L.Binary(op, lhs, rhs, L.I64)


def _has_lane_division(expr: L.Expr) -> bool:
    if isinstance(expr, L.Binary):
        if expr.op in ("floordiv", "mod") and "k" in L.free_vars(expr.lhs):
            return True
        return _has_lane_division(expr.lhs) or _has_lane_division(expr.rhs)
    return False


@settings(max_examples=300, deadline=None)
@given(width=st.sampled_from([4, 8, 16]), aligned=st.sampled_from([0, 1, 4, 8, 16, 32, 48]),
       row=st.integers(1, 70), offset=st.integers(0, 40), divisor=st.integers(1, 200),
       outer=st.integers(1, 7), base_tiles=st.integers(0, 40), i=st.integers(0, 30))
def test_rewrite_agrees_with_the_original_on_every_lane(width, aligned, row, offset, divisor,
                                                        outer, base_tiles, i):
    # (i * row + k + offset) // divisor % outer and (...) % divisor, the shapes a reshape of
    # a transpose makes, for lanes k = base + l of a tile whose base is a multiple of
    # `aligned` (0: the base is 0).
    flat = L.add(L.add(L.mul(ROW, _c(row)), K), _c(offset))
    expr = L.add(_binary("mod", _binary("floordiv", flat, _c(divisor)), _c(outer)),
                 L.mul(_binary("mod", flat, _c(divisor)), _c(3)))
    split = split_aligned_lanes(expr, "k", BASE, width, aligned)
    base = 0 if aligned == 0 else base_tiles * aligned
    for lane in range(width):
        env = {"i": i, "k": base + lane, BASE: base}
        assert _eval(split, env) == _eval(expr, env), (split, env)
    decided = aligned != 1 and np.gcd.reduce([aligned, row, offset, divisor]) >= width
    assert _has_lane_division(split) == (not decided)


@pytest.mark.parametrize("expr", [
    _binary("floordiv", L.mul(K, _c(2)), _c(32)),   # the lane scaled: left as it is
    _binary("floordiv", L.add(K, _c(3)), _c(32)),   # an offset off the alignment
    _binary("mod", K, _c(8)),                       # a divisor below the width
    _binary("floordiv", L.add(K, L.Var("j")), _c(32)),  # another lane-varying name
])
def test_rewrite_leaves_what_the_alignment_does_not_decide(expr):
    assert split_aligned_lanes(expr, "k", BASE, 16, 16, frozenset({"j"})) == expr


def test_reshaped_transpose_operand_loads_contiguously(tmp_path, monkeypatch, capsys):
    # context @ w with context = reshape(transpose(heads, [0, 2, 1, 3]), [B * T, H * Dh]):
    # A's index is heads[(i * 96 + k) // 1632 % 2, k // 32 % 3, i % 17, k % 32], which
    # packing read with one gather per 16 depths before.
    from tilegen.compile import main

    source = """fn f(h: Tensor[F32, [2, 3, 17, 32], @host], w: Tensor[F32, [96, 40], @host])
    -> Tensor[F32, [34, 40], @host] {
  return reshape(transpose(h, [0, 2, 1, 3]), [34, 96]) @ w;
}
"""
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "2")
    module = compile_program(program_from_text(source))
    rng = np.random.default_rng(7)
    h = rng.standard_normal((2, 3, 17, 32)).astype(np.float32)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    expected = h.astype(np.float64).transpose(0, 2, 1, 3).reshape(34, 96) @ w
    np.testing.assert_allclose(module.f(h, w), expected, rtol=1e-5, atol=1e-4)
    path = tmp_path / "f.kina"
    path.write_text(source)
    assert main([str(path), "--emit", "llvm"]) == 0
    assert not re.search(r"call .*@llvm\.masked\.gather", capsys.readouterr().out)
