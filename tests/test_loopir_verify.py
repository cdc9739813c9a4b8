"""The loop-IR verifier, `.loops` files as a starting point, and op names as enums that
codegen dispatches on from tables (an unknown op is an error, never some other op)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from llvmlite import ir

import tilegen
from kina_frontend import KinaError
from tilegen import config, pipeline
from tilegen import loopir as L
from tilegen.codegen import KernelCodegen
from tilegen.loopir_verify import LoopIRVerifyError, verify_kernel
from tilegen.pipeline import EMITTERS
from tilegen.unary_emit import UNARY_EMIT
from tilegen.vecmath import MathLibrary

LOOP_I, LOOP_J = L.Var("i"), L.Var("j")
X = L.Buffer("x", L.F32, (4,), L.BufferRole.INPUT)
OUT = L.Buffer("o", L.F32, (4,), L.BufferRole.OUTPUT)


def _kernel(*body: L.Stmt, buffers=(X, OUT), sites=()) -> L.Kernel:
    return L.Kernel("k", tuple(buffers), tuple(body), ("x",), ("o",), tuple(sites))


def _loop(*body: L.Stmt, var=LOOP_I, extent=4, **schedule) -> L.For:
    return L.For(var, extent, tuple(body), **schedule)


# tilegen's exp is within 2 ulp of the correctly rounded value.
EXP_RTOL = 5e-7


def _x(index=LOOP_I) -> L.Load:
    return L.Load("x", (index,), L.F32)


def _store(value: L.Expr, index=LOOP_I) -> L.Store:
    return L.Store("o", (index,), value)


def test_a_well_formed_kernel_verifies():
    row_sum = L.Reduce(L.ReduceOp.SUM, LOOP_J, 4, _x(LOOP_J), L.F32, 4)
    verify_kernel(_kernel(_loop(L.Let(L.Var("s", L.F32), row_sum),
                                _store(L.Var("s", L.F32) * _x()))))


BROKEN = {
    "unknown unary op 'sin'": _kernel(_loop(_store(L.Unary("sin", _x(), L.F32)))),
    "unknown binary op 'pow'": _kernel(_loop(_store(L.Binary("pow", _x(), _x(), L.F32)))),
    "unknown reduction 'prod'": _kernel(_loop(_store(L.Reduce("prod", LOOP_J, 4, _x(LOOP_J),
                                                              L.F32)))),
    "unknown loop kind 'simd'": _kernel(_loop(_store(_x()), kind="simd")),
    "variable 'j' is used where it is not defined": _kernel(_loop(_store(_x(LOOP_J)))),
    "variable 'i' is defined twice": _kernel(_loop(_loop(_store(_x())), extent=1)),
    "reduction index 'i' shadows": _kernel(_loop(_store(L.Reduce("sum", LOOP_I, 4, _x(), L.F32)))),
    "vector width 12 is not a power of two": _kernel(_loop(_store(_x()), kind="vector",
                                                           width=12)),
    "reduction vector width 128": _kernel(_loop(_store(
        L.Reduce("sum", LOOP_J, 4, _x(LOOP_J), L.F32, 128)))),
    "index 0 of 'o' (i) ranges over [0, 4], outside [0, 3]": _kernel(_loop(
        _store(_x(L.const(0))), extent=5)),
    "index 0 of 'x' ((i + 1)) ranges over [1, 4]": _kernel(_loop(_store(_x(LOOP_I + L.const(1))))),
    "stores to the input 'x'": _kernel(_loop(L.Store("x", (LOOP_I,), _x()))),
    "stores a f64 value to 'o'": _kernel(_loop(_store(L.Cast(_x(), L.F64)))),
    "'add' of f32 and i64": _kernel(_loop(_store(L.Binary("add", _x(), LOOP_I, L.F32)))),
    "'exp' of i64 (floats only)": _kernel(_loop(_store(L.Cast(L.Unary("exp", LOOP_I, L.I64),
                                                              L.F32)))),
    "'o' has rank 1 but is indexed with 2": _kernel(_loop(L.Store("o", (LOOP_I, LOOP_I), _x()))),
    "unknown element type 'f16'": _kernel(_loop(_store(_x())),
                                          buffers=(X, replace(OUT, dtype="f16"))),
    "id check names site 0, but the kernel has 0": _kernel(_loop(_store(L.Cast(
        L.CheckedId(LOOP_I, 4, 0, (LOOP_I,)), L.F32)))),
    "threads=2 on a serial loop": _kernel(_loop(_store(_x()), threads=2)),
    "loop extent 0": _kernel(_loop(_store(_x(L.const(0))), extent=0)),
    "stores a value that varies across the lanes of vector loop 'i' to one element":
        _kernel(_loop(_store(_x(), index=L.const(0)), kind="vector", width=4)),
    "parallel loop inside the tile of vector loop 'i'": _kernel(_loop(
        _loop(_store(_x()), var=LOOP_J, extent=2, kind="parallel", width=2),
        kind="vector", width=4)),
    "argmax cannot run in vector tiles": _kernel(_loop(_store(L.Cast(
        L.Reduce("argmax", LOOP_J, 4, _x(LOOP_J), L.I64, 4), L.F32)))),
    "'add' of i1 (no arithmetic on booleans)": _kernel(_loop(_store(L.Select(
        L.Binary("add", L.Binary("lt", _x(), _x(), L.BOOL), L.Binary("lt", _x(), _x(), L.BOOL),
                 L.BOOL), _x(), _x(), L.F32)))),
    "the iterations of vector loop 'i' may touch one element": _kernel(_loop(
        L.Store("o", (L.const(0),), L.const(0.0, L.F32)), kind="vector", width=4)),
    "gemm operand B reads index 'i'": _kernel(L.Gemm(
        "o", (L.Var("b"),), (1,), LOOP_I, LOOP_J, L.Var("k"), 2, 2, 4, _x(L.Var("k")),
        _x(LOOP_I), L.F32, L.GemmTiles(12, 32, 256, 96, 1024)),
        buffers=(X, L.Buffer("o", L.F32, (1, 2, 2), L.BufferRole.OUTPUT))),
}


@pytest.mark.parametrize("problem", BROKEN)
def test_each_broken_invariant_is_named(problem):
    with pytest.raises(LoopIRVerifyError) as info:
        verify_kernel(BROKEN[problem], after="a-pass")
    assert problem in str(info.value)
    assert "loop IR @k after a-pass" in str(info.value)


def test_verifier_errors_show_the_statement():
    with pytest.raises(LoopIRVerifyError, match=re.escape("in `o[i] = sin(x[i])`")):
        verify_kernel(BROKEN["unknown unary op 'sin'"])


# ---- codegen dispatch ---------------------------------------------------------------------

def _build(kernel: L.Kernel) -> ir.Module:
    module = ir.Module()
    target = config.load().target
    KernelCodegen(module, kernel, "k", MathLibrary(module, target), target, EMITTERS).build()
    return module


@pytest.mark.parametrize("op", ["f", "sin", "i"])
def test_codegen_rejects_an_unknown_unary_op(op):
    # 'f' and 'i' are methods of vecmath's emitter: codegen used to compile them silently
    # as a call of a helper computing something else; 'sin' was an AttributeError.
    kernel = _kernel(_loop(_store(L.Unary(op, _x(), L.F32))))
    with pytest.raises(KinaError, match=f"unknown unary op '{op}'"):
        _build(kernel)


def test_codegen_rejects_an_unknown_reduction():
    # The combine step used to take any unknown reduction as an argmax.
    kernel = _kernel(_loop(_store(L.Cast(L.Reduce("prod", LOOP_J, 4, _x(LOOP_J), L.F32), L.F32))))
    with pytest.raises(KinaError, match="unknown reduction op 'prod'"):
        _build(kernel)


def test_every_unary_op_has_exactly_one_emitter():
    assert set(UNARY_EMIT) == set(L.UnaryOp)


def test_enum_members_equal_their_names():
    assert L.Unary(L.UnaryOp.EXP, LOOP_I, L.F32) == L.Unary("exp", LOOP_I, L.F32)
    assert str(L.Unary(L.UnaryOp.EXP, LOOP_I, L.F32)) == "exp(i)"
    assert tuple(L.BinaryOp) == L.BINARY_OPS and tuple(L.ReduceOp) == L.REDUCE_OPS


# ---- TILEGEN_VERIFY: the verifiers run inside the compiler --------------------------------

def _drop_loop_variable(kernel: L.Kernel, options) -> L.Kernel:
    """A broken pass: every loop's variable renamed where it is defined, not where used."""
    def rename(stmt):
        if isinstance(stmt, L.For):
            return replace(stmt, var=L.Var(stmt.var.name + "_lost"),
                           body=tuple(rename(s) for s in stmt.body))
        return stmt
    return replace(kernel, body=tuple(rename(s) for s in kernel.body))


SOURCE = ("fn f(x: Tensor[F32, [37], @host]) -> Tensor[F32, [37], @host] {\n"
          "  return exp(x);\n}\n")


def test_tilegen_verify_catches_a_broken_pass(monkeypatch):
    monkeypatch.setattr(pipeline, "SCHEDULE_PASSES",
                        pipeline.SCHEDULE_PASSES + (("broken", _drop_loop_variable),))
    monkeypatch.setenv("TILEGEN_VERIFY", "1")
    monkeypatch.setenv("TILEGEN_MEMORY_CACHE", "0")
    with pytest.raises(KinaError, match="loop IR @f after broken: variable 'i0' is used "
                                        "where it is not defined"):
        tilegen.compile_source(SOURCE, functions=["f"]).f  # noqa: B018


def test_tilegen_verify_runs_the_tensor_verifier_on_prepared_functions(monkeypatch):
    from kina_frontend.tensor_ir import Function

    def broken_prepare(program, name, max_ops):
        function = program.function(name)
        return Function(function.name, function.params, function.body * 2,
                        function.results)

    monkeypatch.setattr(pipeline, "prepare_for_codegen", broken_prepare)
    monkeypatch.setenv("TILEGEN_VERIFY", "1")
    with pytest.raises(KinaError, match="prepared tensor IR: @f: .* defined twice"):
        pipeline.prepare(tilegen_program(), "f", config.load())


def tilegen_program():
    from kina_frontend import program_from_text

    return program_from_text(SOURCE.replace("exp(x)", "exp(neg(x))"))


# ---- .loops files -------------------------------------------------------------------------

LOOPS = """kernel @heads
  input  x: f32[3x5x2]
  output out0: f32[5x3x2]
{
  for a in 0..5 {
    for b in 0..3 {
      for c in 0..2 {
        out0[a, b, c] = exp(x[b, a, c])
      }
    }
  }
}
"""


def test_compile_file_takes_a_loops_file(tmp_path):
    path = tmp_path / "heads.loops"
    path.write_text(LOOPS)
    module = tilegen.compile_file(path)
    x = np.random.default_rng(3).standard_normal((3, 5, 2)).astype(np.float32)
    np.testing.assert_allclose(module.heads(x), np.exp(x.transpose(1, 0, 2)), rtol=EXP_RTOL)


def test_a_loops_file_from_emit_loops_computes_what_the_kina_file_does(tmp_path):
    from storylm import fixture, reference

    path = tmp_path / "forward.loops"
    result = _cli("storylm0_forward.kina", "--emit", "loops")
    assert result.returncode == 0, result.stderr
    path.write_text(result.stdout)
    module = tilegen.compile_file(path, functions=["storylm0_forward"])
    w = fixture.load_checkpoint()
    ids = np.array([[1, 2, 3, 4]], np.int64)
    args = (ids, w.embed, fixture.causal_mask(4), w.scale, w.wq, w.wk, w.wv, w.wo, w.lm_head)
    np.testing.assert_allclose(module.storylm0_forward(*args),
                               reference.forward(*args), rtol=1e-5, atol=1e-6)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tilegen.compile", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_cli_runs_and_links_a_loops_file(tmp_path):
    path = tmp_path / "heads.loops"
    path.write_text(LOOPS)
    run = _cli(str(path), "--run")
    assert run.returncode == 0, run.stderr
    x = np.random.default_rng(0).standard_normal((3, 5, 2)).astype(np.float32)
    expected = np.exp(x.transpose(1, 0, 2)).astype(np.float32)
    total = re.search(r"out0: f32\[5, 3, 2\]  sum=(\S+)", run.stdout)
    assert total and float(total[1]) == pytest.approx(float(expected.sum(dtype=np.float64)),
                                                      rel=1e-6)
    library = tmp_path / "heads.so"
    linked = _cli(str(path), "-o", str(library))
    assert linked.returncode == 0, linked.stderr
    loaded = tilegen.load_library(str(library))
    np.testing.assert_allclose(loaded.heads(x), expected, rtol=EXP_RTOL)
    printed = _cli(str(path), "--emit", "emit-plan", "--emit", "asm")
    assert printed.returncode == 0 and "unrolled (2 trips)" in printed.stdout
    assert _cli(str(path), "--emit", "tensor").returncode == 1


MALFORMED = {
    "unknown op": ("        out0[a, b, c] = exp(x[b, a, c])",
                   "        out0[a, b, c] = expm1(x[b, a, c])", "unknown op 'expm1'", (8, 25)),
    "undefined variable": ("x[b, a, c])", "x[b, d, c])", "unknown variable 'd'", (8, 34)),
    "duplicate variable": ("        out0[a, b, c] =",
                           "        let a: i64 = c\n        out0[a, b, c] =",
                           "variable 'a' is defined twice", (8, 9)),
    "bad width": ("for c in 0..2 {", "for c in 0..2 vector<6> {",
                  "vector width 6 is not a power of two", (7, 7)),
    "out of bounds": ("for b in 0..3", "for b in 0..4", "ranges over [0, 3], outside [0, 2]",
                      (8, 9)),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_loops_files_are_located_errors(case, tmp_path):
    old, new, message, (line, column) = MALFORMED[case]
    assert old in LOOPS
    path = tmp_path / "bad.loops"
    path.write_text(LOOPS.replace(old, new))
    result = _cli(str(path), "--run")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert f"bad.loops:{line}:{column}: error[K750]" in result.stderr, result.stderr
    with pytest.raises(KinaError) as info:
        tilegen.compile_file(path)
    assert (info.value.line, info.value.column) == (line, column)
