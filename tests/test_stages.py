"""The stage table (tilegen/stages.py): every stage is listed, printable with --emit and
verified after it runs, for the examples and for generated programs; codegen's own
decisions print (emit-plan) and match the code it generates."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import Source, load_source, parse_ir
from kina_frontend.verify import verify_program
from tilegen import config, stages
from tilegen import loopir as L
from tilegen.compile import main
from tilegen.loopir import format_kernel
from tilegen.loopir_parse import parse_kernels
from tilegen.pipeline import SCHEDULE_PASSES

from .progen import generate_program

EXAMPLES = ("storylm0_forward", "storylm0_nll_step")


def _cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def _context(text_or_name: str, *, is_source: bool = False) -> stages.Context:
    source = Source("<generated>", text_or_name) if is_source else load_source(text_or_name)
    return stages.context(source, options=config.load())


def test_list_stages_prints_the_table_in_order():
    code, out = _cli("--list-stages")
    assert code == 0
    names = out.splitlines()
    assert names == list(stages.NAMES)
    # The front end, then one stage per schedule pass between lowering and `loops`, then
    # LLVM, exactly in the order the compiler runs them.
    passes = [name for name, _ in SCHEDULE_PASSES]
    assert names[:6] == ["tokens", "ast", "types", "tensor", "prepared", "lowered"]
    assert names[6:6 + len(passes)] == passes
    assert names[6 + len(passes):] == ["loops", "emit-plan", "llvm", "llvm-opt", "asm", "obj",
                                      "mlir"]


@pytest.mark.parametrize("stage", [s for s in stages.STAGES if not s.binary],
                         ids=lambda s: s.name)
def test_emit_prints_every_text_stage(stage):
    code, out = _cli("storylm0_forward.kina", "--emit", stage.name)
    assert code == 0
    assert out == stages.emit(stage.name, _context("storylm0_forward.kina"))
    assert out.strip(), stage.name


def test_emit_obj_writes_object_code(tmp_path):
    target = tmp_path / "kernels.o"
    code, out = _cli("storylm0_forward.kina", "--emit", "obj", "-o", str(target))
    assert code == 0 and "bytes of object code" in out
    data = target.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert data == stages.emit("obj", _context("storylm0_forward.kina"))


def test_each_schedule_stage_is_its_pass_applied_to_the_stage_before():
    ctx = _context("storylm0_nll_step.kina")
    artifacts = dict((stage.name, result) for stage, result in
                     stages.run_stages(set(stages.NAMES), ctx, verify=True))
    before = "lowered"
    for name, pass_fn in SCHEDULE_PASSES:
        expected = [pass_fn(plan.kernel, ctx.options) for plan in artifacts[before]]
        assert [plan.kernel for plan in artifacts[name]] == expected, name
        before = name
    assert artifacts["loops"] == artifacts[before]
    # At least one pass changes something here, so the per-pass stages are not all equal.
    assert artifacts["lowered"] != artifacts["loops"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_stage_verifies_on_the_examples(example):
    ctx = _context(f"{example}.kina")
    seen = [stage.name for stage, _ in stages.run_stages(set(stages.NAMES), ctx, verify=True)]
    assert seen == list(stages.NAMES)


@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.integers(0, 10_000), st.integers(2, 10))
def test_generated_programs_pass_every_stage_with_the_verifiers(seed, steps):
    generated = generate_program(np.random.default_rng(seed), steps)
    ctx = _context(generated.source, is_source=True)
    artifacts = dict((stage.name, result) for stage, result in
                     stages.run_stages(set(stages.NAMES) - {"obj"}, ctx, verify=True))
    assert "asm" in artifacts and "mlir" in artifacts
    # `loops` and `emit-plan` read back as the same kernels (the plan's notes are comments).
    kernels = [plan.kernel for plan in artifacts["loops"]]
    for name in ("loops", "emit-plan"):
        text = stages.BY_NAME[name].show(artifacts[name], ctx)
        assert list(parse_kernels(text)) == kernels, name


def test_prepared_is_tensor_ir_that_reads_back():
    ctx = _context("storylm0_nll_step.kina")
    artifacts = dict(stages.run_stages({"prepared"}, ctx))
    text = stages.BY_NAME["prepared"].show(artifacts[stages.BY_NAME["prepared"]], ctx)
    program = parse_ir(text)
    verify_program(program)
    assert program.functions == artifacts[stages.BY_NAME["prepared"]]  # spans aside
    # reverseMode is expanded and every call inlined.
    assert "reverse_mode" not in text and " call " not in text


def test_tilegen_verify_knob(monkeypatch):
    monkeypatch.setenv("TILEGEN_VERIFY", "1")
    assert config.load().verify
    monkeypatch.setenv("TILEGEN_VERIFY", "0")
    assert not config.load().verify


def test_stages_before_the_input_are_an_error():
    from kina_frontend import KinaError

    with pytest.raises(KinaError, match="--emit tensor: that stage is not computed from "
                                        "'loops'"):
        stages.needed({"tensor"}, start="loops")


# ---- emit-plan: codegen's decisions, as printed, are the ones codegen takes ----------------

def _one_loop_kernel(extent: int, width: int) -> L.Kernel:
    i = L.Var("i")
    return L.Kernel("k", (L.Buffer("x", L.F32, (extent,), L.BufferRole.INPUT),
                          L.Buffer("o", L.F32, (extent,), L.BufferRole.OUTPUT)),
                    (L.For(i, extent, (L.Store("o", (i,), L.Unary(
                        L.UnaryOp.EXP, L.Load("x", (i,), L.F32), L.F32)),),
                        L.LoopKind.VECTOR, width),), ("x",), ("o",))


def _llvm_of(kernel: L.Kernel) -> str:
    from tilegen.loopfile import kernel_plan
    from tilegen.pipeline import codegen, to_llvm

    options = config.load()
    return str(to_llvm(codegen([kernel_plan(kernel, options)]), options.target,
                       optimize_module=False))


@pytest.mark.parametrize(("extent", "tail", "active"), [(37, 8, 5), (35, 4, 3), (36, 4, 4),
                                                        (45, 16, 13)])
def test_tail_tile_width_printed_is_the_one_generated(extent, tail, active):
    from tilegen.emitplan import annotate

    kernel = _one_loop_kernel(extent, 16)
    note = annotate(kernel)
    assert f"then a {tail}-lane tail tile" in note
    assert (f"{active} of its lanes active" in note) == (active < tail)
    ir_text = _llvm_of(kernel)
    masked = re.findall(r"llvm\.masked\.store\.v(\d+)f32", ir_text)
    if active < tail:
        assert masked and set(masked) == {str(tail)}
    else:
        assert not masked and f"store <{tail} x float>" in ir_text


def test_unrolled_tiles_have_no_loop_and_longer_runs_do():
    from tilegen.emitplan import annotate

    short, long = _one_loop_kernel(64, 16), _one_loop_kernel(16 * 6, 16)
    assert "4 tile(s) of 16 unrolled" in annotate(short)
    assert "6 tile(s) of 16 in a loop" in annotate(long)
    loop_block = re.compile(r"^loop(\.\d+)?:", re.M)  # codegen's counted-loop header
    assert not loop_block.search(_llvm_of(short))
    assert loop_block.search(_llvm_of(long))


def _row_sums_kernel(rows: int, extent: int, width: int) -> L.Kernel:
    """`o[row] = sum[r < extent vector<width>](x[row, r])` for each row."""
    row, r = L.Var("row"), L.Var("r")
    total = L.Reduce(L.ReduceOp.SUM, r, extent, L.Load("x", (row, r), L.F32), L.F32, width)
    return L.Kernel("k", (L.Buffer("x", L.F32, (rows, extent), L.BufferRole.INPUT),
                          L.Buffer("o", L.F32, (rows,), L.BufferRole.OUTPUT)),
                    (L.For(row, rows, (L.Store("o", (row,), total),)),), ("x",), ("o",))


def test_joint_reductions_are_printed_where_codegen_joins_them():
    from tilegen.emitplan import annotate

    kernel = _row_sums_kernel(7, 32, 16)
    note = annotate(kernel)
    assert "joint sum reductions: 1 group(s) of 4 + a pair + a single trip" in note
    # Joined: the four accumulators meet in shuffles, not in one fadd reduction each.
    ir_text = _llvm_of(kernel)
    assert ir_text.count("llvm.vector.reduce.fadd") < 7
    assert "shufflevector" in ir_text


def test_emit_plan_of_the_golden_example_reads_back_as_the_golden():
    ctx = _context("storylm0_forward.kina")
    plan_text = stages.emit("emit-plan", ctx)
    loops_text = stages.emit("loops", ctx)
    assert "#" in plan_text and "#" not in loops_text
    assert [format_kernel(k) for k in parse_kernels(plan_text)] == \
        [format_kernel(k) for k in parse_kernels(loops_text)]


# ---- the docs are the table -----------------------------------------------------------------

def _table_rows(path: str, header: str) -> list[list[str]]:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / path).read_text()
    block = text[text.index(header):].split("\n\n")[0]
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in block.splitlines()[2:]]


def test_architecture_md_shows_the_stage_table():
    rows = _table_rows("docs/architecture.md", "| stage | reads | `--emit` prints |")
    assert rows == [[f"`{s.name}`", f"`{stages.source_of(s)}`", s.prints]
                    for s in stages.STAGES]


def test_readme_lists_every_stage_in_order():
    rows = _table_rows("README.md", "| `--emit` | prints |")
    assert [row[0] for row in rows] == [f"`{name}`" for name in stages.NAMES]


def test_two_lane_row_sums_are_not_joined():
    # Found by tests/test_reschedule.py: four 2-lane accumulators joined in one shuffle tree
    # reached a zero-lane shuffle (invalid LLVM IR). Such loops now run trip by trip.
    from tilegen.emitplan import annotate
    from tilegen.loopfile import kernel_plan
    from tilegen.runtime import jit_module

    kernel = _row_sums_kernel(7, 9, 2)
    assert "joint" not in annotate(kernel)
    x = np.random.default_rng(5).standard_normal((7, 9)).astype(np.float32)
    module = jit_module([kernel_plan(kernel, config.load())])
    np.testing.assert_allclose(module.k(x), x.sum(axis=1, dtype=np.float64), rtol=1e-5)
