"""The packed micro-kernel matmul (tilegen/gemm.py) on shapes that hit every edge path:
rows not a multiple of mr, columns not a multiple of nr or of 16 lanes, depth beyond one
kc block, batches, transposed and broadcast operands, fused producers, f64, 1 and 2
threads, JIT and .so."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import interpret, program_from_text
from tilegen.api import compile_program
from tilegen.loopir import Gemm
from tilegen.runtime import program_of


def _ty(shape, dtype="F32"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _compile(source, threads, monkeypatch, jit=True):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    program = program_from_text(source)
    module = compile_program(program, jit=jit)
    return program, module


def _uses_gemm(plan) -> bool:
    return any(isinstance(s, Gemm) for s in plan.kernel.body)


SHAPES = [(64, 64, 64), (37, 300, 45), (13, 17, 29), (100, 513, 33), (12, 8, 64),
          (333, 1000, 777), (1, 64, 1024), (257, 31, 16),
          # narrow B (14-row register blocks) with several row and depth blocks
          (200, 600, 16), (197, 530, 9),
          # three depth blocks of 512, the last ragged
          (45, 1100, 50)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_gemm_matches_float64(m, k, n, threads, monkeypatch):
    source = (f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n))} "
              "{ return matmul(a, b); }")
    _, module = _compile(source, threads, monkeypatch)
    rng = np.random.default_rng(m * 7 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = module.f(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(k) * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(got - exact) <= bound + 1e-30)
    if m * n * k >= 1 << 16 and n >= 8 and k >= 8:
        assert _uses_gemm(program_of(module).plans["f"])


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_transposed_broadcast_and_fused_operands(threads, monkeypatch):
    source = f"""
fn f(q: {_ty((2, 3, 70, 40))}, k: {_ty((2, 3, 90, 40))}, w: {_ty((40, 50))},
     x: {_ty((2, 3, 70, 40))}) -> ({_ty((2, 3, 70, 90))}, {_ty((2, 3, 70, 50))}) {{
  let scores = matmul(q, transpose(k, [0, 1, 3, 2]));
  let projected = matmul(exp(mul(x, 0.1)), broadcast(w, [2, 3, 40, 50]));
  return (scores, projected);
}}"""
    program, module = _compile(source, threads, monkeypatch)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(s).astype(np.float32)
              for s in ((2, 3, 70, 40), (2, 3, 90, 40), (40, 50), (2, 3, 70, 40))]
    assert _uses_gemm(program_of(module).plans["f"])
    for got, want in zip(module.f(*inputs), interpret(program, "f", *inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_gemm_f64_and_shared_library(monkeypatch):
    source = (f"fn f(a: {_ty((150, 70), 'F64')}, b: {_ty((70, 45), 'F64')}) -> "
              f"{_ty((150, 45), 'F64')} {{ return matmul(a, b); }}")
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((150, 70)), rng.standard_normal((70, 45))
    for jit in (True, False):
        _, module = _compile(source, 2, monkeypatch, jit=jit)
        assert _uses_gemm(program_of(module).plans["f"])
        np.testing.assert_allclose(module.f(a, b), a @ b, rtol=1e-12, atol=1e-12)


def test_gather_inside_a_gemm_operand_reports_bad_ids(monkeypatch):
    source = f"""
fn f(table: {_ty((50, 64))}, ids: {_ty((80,), 'I64')}, w: {_ty((64, 64))})
    -> {_ty((80, 64))} {{
  return matmul(gather(table, ids), w);
}}"""
    _, module = _compile(source, 2, monkeypatch)
    table = np.ones((50, 64), np.float32)
    w = np.ones((64, 64), np.float32)
    ids = np.arange(80) % 50
    np.testing.assert_allclose(module.f(table, ids, w), np.full((80, 64), 64.0))
    ids[77] = 50
    with pytest.raises(IndexError, match=r"id 50 at position \[77\]"):
        module.f(table, ids, w)


@pytest.mark.parametrize("target, register, accumulators", [
    ("skylake-avx512", "zmm", 24),  # the 12 x 32 register block of 32 vector registers
    ("x86-64-v3", "ymm", 12),  # AVX2's 16 registers: a 6 x 16 block
])
def test_micro_kernel_inner_loop_is_fma_without_spills(tmp_path, target, register,
                                                       accumulators):
    """`--emit asm`: the hottest loop of a 1024^3 matmul is a run of vfmadd...ps on the
    target's vector registers fed by broadcasts of A, with no stack traffic (no spills) from
    its label to its branch back."""
    import re
    import subprocess
    import sys

    source = tmp_path / "mm.kina"
    source.write_text("fn mm(a: Tensor[F32, [1024, 1024], @host], b: Tensor[F32, [1024, 1024],"
                      " @host]) -> Tensor[F32, [1024, 1024], @host] { return matmul(a, b); }\n")
    result = subprocess.run([sys.executable, "-m", "tilegen.compile", str(source), "--emit",
                             "asm", "--target", target], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    blocks = re.split(r"\n(?=\.LBB\d+_\d+:)", result.stdout)
    fma_counts = [len(re.findall(rf"vfmadd\d+ps\s+[^\n]*{register}", block))
                  for block in blocks]
    hottest = blocks[max(range(len(blocks)), key=fma_counts.__getitem__)]
    # The loop: its label to the branch back to it (what follows is the store of C).
    label = hottest.split(":", 1)[0]
    hottest = hottest.split(f"\t{label}\n", 1)[0]
    assert max(fma_counts) >= accumulators
    assert "vbroadcastss" in hottest or "{1to16}" in hottest
    assert "(%rsp)" not in hottest and "(%rbp)" not in hottest, hottest
    assert register != "ymm" or "zmm" not in result.stdout


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 300), n=st.integers(8, 300), k=st.integers(8, 700),
       transposed=st.booleans(), threads=st.sampled_from([1, 2]))
def test_generated_gemm_shapes(m, n, k, transposed, threads):
    """Random shapes across several row, column and depth blocks, B plain or a transposed
    view, against float64 with the float32 summation error bound."""
    import os

    b_type = _ty((n, k)) if transposed else _ty((k, n))
    b_expr = "transpose(b, [1, 0])" if transposed else "b"
    source = (f"fn f(a: {_ty((m, k))}, b: {b_type}) -> {_ty((m, n))} "
              f"{{ return matmul(a, {b_expr}); }}")
    previous = os.environ.get("TILEGEN_NUM_THREADS")
    os.environ["TILEGEN_NUM_THREADS"] = str(threads)
    try:
        module = compile_program(program_from_text(source))
    finally:
        if previous is None:
            del os.environ["TILEGEN_NUM_THREADS"]
        else:
            os.environ["TILEGEN_NUM_THREADS"] = previous
    rng = np.random.default_rng(m * 1_000_003 + n * 1009 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    b_math = b.T if transposed else b
    exact = a.astype(np.float64) @ b_math.astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(k) * (np.abs(a) @ np.abs(b_math)) + 1e-30
    assert np.all(np.abs(module.f(a, b) - exact) <= bound)


@pytest.mark.parametrize("dtype", ["F32", "F64"])
@pytest.mark.parametrize("m,n,k", [(12, 17, 401), (33, 40, 300), (130, 9, 513), (64, 256, 1024)])
def test_b_read_along_k_is_packed_by_transposing(m, n, k, dtype, monkeypatch):
    """B = transpose(w) * 2 + transpose(v) is contiguous along k: packed column vectors
    along k, transposed in registers (partial depth chunks, columns past N, f32 and f64)."""
    ty = lambda shape: _ty(shape, dtype)  # noqa: E731
    source = (f"fn f(a: {ty((m, k))}, w: {ty((n, k))}, v: {ty((n, k))}) -> {ty((m, n))} {{\n"
              f"  return matmul(a, add(mul(transpose(w, [1, 0]), 2.0), transpose(v, [1, 0])));\n"
              f"}}")
    _, module = _compile(source, 2, monkeypatch)
    assert _uses_gemm(program_of(module).plans["f"]), "expected the packed gemm path"
    numpy_type = np.float32 if dtype == "F32" else np.float64
    rng = np.random.default_rng(m + n + k)
    a, w, v = (rng.standard_normal(shape).astype(numpy_type) for shape in
               ((m, k), (n, k), (n, k)))
    b = (2 * w.astype(np.float64) + v).T
    exact = a.astype(np.float64) @ b
    eps = np.finfo(numpy_type).eps
    bound = 4 * eps * np.sqrt(k) * (np.abs(a) @ np.abs(b)) + 1e-300
    assert np.all(np.abs(module.f(a, w, v) - exact) <= bound)


@pytest.mark.parametrize("dtype", ["F32", "F64"])
@pytest.mark.parametrize("m,n,k", [(17, 40, 401), (33, 64, 300), (130, 9, 513), (301, 96, 77)])
def test_a_read_along_i_is_packed_by_transposing(m, n, k, dtype, monkeypatch):
    """A = transpose(x) + 1 is contiguous along i: packed by loading depth vectors along i
    and transposing in registers (partial row chunks, depth tails, several row blocks)."""
    ty = lambda shape: _ty(shape, dtype)  # noqa: E731
    source = (f"fn f(x: {ty((k, m))}, b: {ty((k, n))}) -> {ty((m, n))} {{\n"
              f"  return matmul(add(transpose(x, [1, 0]), 1.0), b);\n}}")
    _, module = _compile(source, 2, monkeypatch)
    assert _uses_gemm(program_of(module).plans["f"]), "expected the packed gemm path"
    numpy_type = np.float32 if dtype == "F32" else np.float64
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((k, m)).astype(numpy_type)
    b = rng.standard_normal((k, n)).astype(numpy_type)
    a = x.T.astype(np.float64) + 1.0
    exact = a @ b
    eps = np.finfo(numpy_type).eps
    bound = 4 * eps * np.sqrt(k) * (np.abs(a) @ np.abs(b)) + 1e-300
    assert np.all(np.abs(module.f(x, b) - exact) <= bound)


@pytest.mark.parametrize("rows,outputs,depth", [(5, 4, 37), (3, 2, 16), (7, 4, 100),
                                                 (6, 3, 33), (2, 4, 9)])
def test_short_rows_of_dot_products_sum_jointly(rows, outputs, depth, monkeypatch):
    """x @ w^T with 2 or 4 outputs per row and a long depth stays in the fused Reduce form
    (too small to pack); its per-row sums are finished together by shared shuffles (the
    p @ v of a narrow attention head); 3 outputs finish two together and one alone."""
    source = (f"fn f(x: {_ty((rows, depth))}, w: {_ty((outputs, depth))}) -> "
              f"{_ty((rows, outputs))} {{ return matmul(x, transpose(w, [1, 0])); }}")
    _, module = _compile(source, 1, monkeypatch)
    assert not _uses_gemm(program_of(module).plans["f"])
    rng = np.random.default_rng(rows * 100 + outputs * 10 + depth)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    w = rng.standard_normal((outputs, depth)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(depth) * (np.abs(x) @ np.abs(w.T))
    assert np.all(np.abs(module.f(x, w) - exact) <= bound + 1e-30)


@pytest.mark.parametrize("rows", [2, 3, 5, 6, 7, 9, 37])
@pytest.mark.parametrize("depth", [9, 36, 100])
def test_row_sums_and_maxima_finish_four_rows_at_a_time(rows, depth, monkeypatch):
    """Row sums and softmax's row maxima and sums: groups of four rows share one shuffle
    tree, then a pair and a single row take the rest (every remainder is hit)."""
    source = (f"fn sums(x: {_ty((rows, depth))}) -> {_ty((rows,))} {{ return sum(x, axis=1); }}\n"
              f"fn soft(x: {_ty((rows, depth))}) -> {_ty((rows, depth))} "
              f"{{ return softmax(x, axis=1); }}")
    _, module = _compile(source, 1, monkeypatch)
    rng = np.random.default_rng(rows * 1000 + depth)
    x = (rng.standard_normal((rows, depth)) * 3).astype(np.float32)
    x[rows // 2, depth - 1] = 40.0  # a row maximum in the tail tile
    # Rows whose exp would overflow were they shifted by anything but their maximum
    # (softmax is shift-invariant otherwise, so a wrong maximum would go unnoticed).
    x[::2] += np.linspace(-60, 60, depth, dtype=np.float32)
    wide = x.astype(np.float64)
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(depth) * np.abs(wide).sum(axis=1)
    assert np.all(np.abs(module.sums(x) - wide.sum(axis=1)) <= bound)
    e = np.exp(wide - wide.max(axis=1, keepdims=True))
    np.testing.assert_allclose(module.soft(x), e / e.sum(axis=1, keepdims=True),
                               rtol=2e-6, atol=1e-7)
    x[rows - 1, 0] = np.nan  # the last row: in the remainder, or the last of a group
    result = module.soft(x)
    assert np.isnan(result[rows - 1]).all() and not np.isnan(result[:rows - 1]).any()


def test_rows_past_m_in_the_packed_a_block_are_zeros(monkeypatch):
    """37 rows in register blocks of 12: the micro-kernel multiplies rows 37..47 of the
    packed A block too (and stores none of them). Those rows are zeroed, not left with what
    the cached heap block held: a denormal there made every FMA on it a microcode assist.
    The block is poisoned with denormals between two calls and read back."""
    import ctypes

    m, k, n = 37, 100, 50
    source = (f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n))} "
              "{ return matmul(a, b); }")
    _, module = _compile(source, 1, monkeypatch)
    (gemm,) = [s for s in program_of(module).plans["f"].kernel.body if isinstance(s, Gemm)]
    tiles = gemm.tiles
    assert not tiles.b_in_place and m % tiles.mr and tiles.mc >= -(-m // tiles.mr) * tiles.mr
    rng = np.random.default_rng(2)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    module.f(a, b)
    (slot,) = [s for s in program_of(module)._natives["f"].owner._slots if s]
    a_stride = -(-tiles.kc // 16) * 16
    floats = tiles.mc * a_stride + tiles.kc * tiles.nc
    block = np.ctypeslib.as_array((ctypes.c_float * floats).from_address(slot))
    block[:] = np.float32(1e-40)  # a denormal
    got = module.f(a, b)
    padding = block[:tiles.mc * a_stride].reshape(tiles.mc, a_stride)[m:, :k]
    assert not padding.any()
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4)


def test_depth_block_takes_at_most_twice_l1():
    # kc: the largest power of two up to 512 whose B micro-panel (kc x 2 vectors) fits in
    # twice L1 (docs/architecture.md, "Depth blocks").
    from dataclasses import replace

    from tilegen.gemm_tiles import depth_block
    from tilegen.target import NAMED_TARGETS

    zen4, avx2 = NAMED_TARGETS["znver4"], NAMED_TARGETS["x86-64-v3"]
    for target, kc in ((zen4, 512), (replace(zen4, l1d_bytes=48 << 10), 512),
                       (replace(zen4, l1d_bytes=16 << 10), 256), (avx2, 512),
                       (replace(avx2, l1d_bytes=8 << 10), 256)):
        assert depth_block(target) == kc
        assert kc * 2 * target.vector_bits // 8 <= 2 * target.l1d_bytes


def _function_bodies(llvm_ir: str) -> dict[str, str]:
    bodies, name = {}, None
    for line in llvm_ir.splitlines():
        if line.startswith("define "):
            name = line.split("@", 1)[1].split("(", 1)[0]
            bodies[name] = ""
        elif name is not None:
            bodies[name] += line + "\n"
            if line == "}":
                name = None
    return bodies


def test_packed_gemm_kernels_prefetch_their_block_of_c(tmp_path, capsys, monkeypatch):
    # Each packed micro-kernel (the inline kernel and the shared driver's) prefetches its
    # block of C for writing (rw = 1) into L2 (locality 2) before its depth loop: every
    # line of its 12 rows, the 128-byte row's last byte too, so 3 a row.
    from tilegen.compile import main

    monkeypatch.setenv("TILEGEN_NUM_THREADS", "1")
    path = tmp_path / "mm.kina"
    path.write_text(f"fn mm(a: {_ty((333, 1000))}, b: {_ty((1000, 777))}) -> "
                    f"{_ty((333, 777))} {{ return matmul(a, b); }}\n")
    assert main([str(path), "--target", "znver4", "--emit", "llvm"]) == 0
    kernels = {name: body for name, body in _function_bodies(capsys.readouterr().out).items()
               if name.startswith("tilegen.gemm.f32.")}
    assert kernels
    for name, body in kernels.items():
        prefetches = [line for line in body.splitlines() if "@llvm.prefetch.p0" in line]
        assert len(prefetches) == 12 * 3, name
        assert all(line.rstrip().endswith("i32 1, i32 2, i32 1)") for line in prefetches)
        assert body.index("@llvm.prefetch.p0") < body.index("@llvm.fma")


def test_column_blocks_keep_b_within_two_cores_l2_shared_out_evenly():
    # nc: whole micro-panels, at most 2048 columns and at most what keeps kc x nc within the
    # L2 of two cores, the columns spread evenly over the blocks that takes.
    from dataclasses import replace

    from tilegen.gemm_tiles import default_tiles, l2_column_block
    from tilegen.target import NAMED_TARGETS

    zen4 = NAMED_TARGETS["znver4"]  # 1 MB L2
    for (m, n, k), nc in (((2048, 2048, 2048), 1024), ((4096, 1536, 384), 768),
                          ((4096, 384, 1536), 384), ((333, 777, 1000), 800),
                          ((100, 3000, 512), 1024), ((64, 5000, 64), 1696)):
        tiles = default_tiles("f32", m, n, k, zen4)
        assert tiles.nc == nc and nc % tiles.nr == 0, (m, n, k, tiles)
        assert tiles.kc * (nc - tiles.nr) * 4 < 2 * zen4.l2_bytes
        blocks = -(-n // nc)
        assert n - (blocks - 1) * nc > nc - blocks * tiles.nr  # the last block is not a sliver
    assert default_tiles("f32", 2048, 2048, 2048, replace(zen4, l2_bytes=2 << 20)).nc == 2048
    assert l2_column_block(2048, 32, 1024, 2, zen4) == 1024  # bf16, 1024 deep
    assert l2_column_block(20, 16, 1 << 20, 8, zen4) == 16  # never under one micro-panel
