"""The AMX gemm (tilegen/gemm_amx.py): which operands it reads in place
(`a_read_in_place`), and products whose A is read there -- depth tails from their padded
slab, the matrix's ragged last rows from packed ones -- against the exact products of the
bf16 inputs (NumPy float64), with infinities placed where a read past a row's last depth
would meet B's zero padding; how two threads split a product (gemm_tiles.splits_columns:
whichever split packs fewer elements a thread, counted here by walking the blocks; the
columns in single tiles of 16); and panels of at most 16 columns on the kernel of one column
of tiles, at C's right edge and at the end of a thread's share."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen.api import compile_program
from tilegen.gemm_amx import a_read_in_place, hands_out_panels, packs_b_panel_at_a_time
from tilegen.gemm_bf16 import amx_tiles, amx_usable, is_amx_block
from tilegen.gemm_tiles import splits_columns
from tilegen.loopir import Gemm, GemmTiles
from tilegen.pipeline import codegen
from tilegen.runtime import program_of
from tilegen.target import host_target

BF16 = ml_dtypes.bfloat16
HOST_AMX, NO_AMX_REASON = amx_usable(host_target())
pytestmark = pytest.mark.skipif(not HOST_AMX, reason=f"no AMX-BF16 here: {NO_AMX_REASON}")


def _ty(shape, dtype="BF16"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _compile(source, monkeypatch, threads=2):
    monkeypatch.setenv("TILEGEN_BF16_DOT", "amx")
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    return compile_program(program_from_text(source))


def _row_strides(module, name="f"):
    """a_read_in_place of each gemm of `name` (all of them AMX gemms)."""
    kernel = program_of(module).plans[name].kernel
    buffers = {buffer.name: buffer for buffer in kernel.buffers}
    gemms = [s for s in kernel.body if isinstance(s, Gemm)]
    assert gemms and all(is_amx_block(g.tiles) for g in gemms)
    return [a_read_in_place(g, buffers) for g in gemms]


def _matmul(m, k, n, a_type="BF16"):
    return (f"fn f(a: {_ty((m, k), a_type)}, b: {_ty((k, n))}) -> {_ty((m, n), 'F32')} "
            "{ return matmul(a, b); }")


@pytest.mark.parametrize("k,stride", [(1000, 1000), (37, 37), (1152, 1152), (1024, None),
                                      (2048, None), (1280, None)])
def test_row_major_bf16_a_is_read_in_place_unless_its_rows_alias_in_l1(k, stride,
                                                                       monkeypatch):
    # 2 KB and 4 KB rows put a block's 32 rows on 2-4 L1 sets; 1152 x 2 bytes spreads them.
    assert _row_strides(_compile(_matmul(64, k, 64), monkeypatch)) == [stride]


def test_batched_a_is_read_in_place_and_others_are_packed(monkeypatch):
    source = f"""
fn f(x: {_ty((5, 67, 39))}, y: {_ty((5, 39, 48))}, w: {_ty((41, 66))}, r: {_ty((70, 41))},
     h: {_ty((70, 41), 'F32')}) -> ({_ty((5, 67, 48), 'F32')}, {_ty((66, 70), 'F32')},
     {_ty((70, 66), 'F32')}) {{
  let batched = matmul(x, y);
  let across = matmul(transpose(w, [1, 0]), transpose(r, [1, 0]));
  let rounded = matmul(cast(h, BF16), w);
  return (batched, across, rounded);
}}"""
    assert _row_strides(_compile(source, monkeypatch)) == [39, None, None]


def _check(got, a, b):
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    exact = np.matmul(wide_a, wide_b)
    bound = a.shape[-1] * 2.0 ** -24 * np.matmul(np.abs(wide_a), np.abs(wide_b))
    assert np.max(np.abs(got - exact) - bound) <= 1e-30


# Depth tails of 8, 31 and 1 after whole steps, one and two depth blocks (1037 in one: a
# last block of 13 would be folded in, amx_depth_block; 2111 and 2049 as 1056 + the rest),
# ragged last rows (333, 45: 13 rows, on the
# kernel of one row of tiles; 17 on the one of two) and whole ones, products of at most
# 16 rows (one row of tiles throughout: 13 packed, 16 read in place), one and two threads.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(333, 1000, 777), (45, 63, 70), (64, 33, 40),
                                   (17, 1037, 50), (13, 2111, 33), (16, 200, 40),
                                   (96, 2049, 64)])
def test_products_of_a_read_in_place(m, k, n, threads, monkeypatch):
    module = _compile(_matmul(m, k, n), monkeypatch, threads)
    assert _row_strides(module) == [k]
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    b[0] = np.where(b[0] == 0, 1, b[0])
    # Infinities at depth 0 of every third row: a tile that read past the last depth of
    # the row above would multiply them by B's zero padding (NaN in a finite row).
    a[::3, 0] = np.inf
    got = module.f(a, b)
    finite = np.ones(m, bool)
    finite[::3] = False
    _check(got[finite], a[finite], b)
    assert np.array_equal(got[~finite], np.broadcast_to(np.sign(b[0].astype(np.float32))
                                                        * np.float32(np.inf),
                                                        got[~finite].shape))


@pytest.mark.parametrize("k,kc", [(1000, 1000), (1024, 1024), (1100, 1100), (1152, 1152),
                                  (1279, 1279), (1280, 1024), (2048, 1024), (2100, 1056),
                                  (3100, 1056), (4608, 1024)])
def test_a_short_last_depth_block_is_spread_over_the_others(k, kc):
    # Each depth block sweeps all of C: 1152 = 1024 + 128 took a second pass for an eighth
    # of the work; a last block of a quarter of AMX_MAX_KC or more stays.
    assert amx_tiles(4096, 384, k, host_target()).kc == kc


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n,packed", [(70, 1100, 50, False), (37, 1152, 45, False),
                                          (45, 2100, 40, False), (33, 1061, 70, True)])
def test_products_over_folded_depth_blocks(m, k, n, packed, threads, monkeypatch):
    # Blocks deeper than 1024 (1100 with a tail of 12 past whole steps, 2100 as 1056 + 1044)
    # with A read in place and packed (a cast operand), against the exact product.
    a_type = "F32" if packed else "BF16"
    source = (f"fn f(a: {_ty((m, k), a_type)}, b: {_ty((k, n))}) -> {_ty((m, n), 'F32')} "
              + ("{ return matmul(cast(a, BF16), b); }" if packed else
                 "{ return matmul(a, b); }"))
    module = _compile(source, monkeypatch, threads)
    assert _row_strides(module) == [None if packed else k]
    (gemm,) = [s for s in program_of(module).plans["f"].kernel.body if isinstance(s, Gemm)]
    assert gemm.tiles.kc > 1024
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    _check(module.f(a.astype(np.float32) if packed else a, b), a, b)


def test_batched_products_of_a_read_in_place(monkeypatch):
    source = f"fn f(x: {_ty((3, 70, 45))}, y: {_ty((3, 45, 50))}) -> " \
             f"{_ty((3, 70, 50), 'F32')} {{ return matmul(x, y); }}"
    module = _compile(source, monkeypatch)
    assert _row_strides(module) == [45]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 70, 45)).astype(BF16)
    y = rng.standard_normal((3, 45, 50)).astype(BF16)
    _check(module.f(x, y), x, y)


def _packed_per_thread(m, n, tiles, threads, by_columns):
    """The elements (per unit of depth) the busiest thread packs, walking its blocks: A's
    rows once per column block it runs, B's columns once."""
    def share(extent, unit):
        units = -(-extent // unit)
        per = -(-units // threads)
        return min(extent, per * unit)
    if by_columns:
        columns = share(n, tiles.nr)
        a = sum(m for _ in range(0, columns, tiles.nc))
        return a + columns
    rows = share(m, tiles.mr)
    return sum(rows for _ in range(0, n, tiles.nc)) + n


# Rows 2, 3 and 4 KB apart (packed, a_read_in_place), ragged last rows (45: 13 in a block
# of 32; 37), two depth blocks (1536 = 1024 + 512), a batch, one and two threads.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch,m,k,n", [((), 45, 1536, 70), ((), 100, 2048, 33),
                                         ((2,), 37, 1024, 50)])
def test_plain_bf16_a_is_packed_by_copying_its_rows(batch, m, k, n, threads, monkeypatch):
    source = f"fn f(x: {_ty((*batch, m, k))}, y: {_ty((*batch, k, n))}) -> " \
             f"{_ty((*batch, m, n), 'F32')} {{ return matmul(x, y); }}"
    module = _compile(source, monkeypatch, threads)
    assert _row_strides(module) == [None]
    # copy_a_slabs: its bits in 64-byte rows (v32i16), not through f32.
    assert "llvm.masked.load.v32i16" in "".join(_llvm_functions(module).values())
    rng = np.random.default_rng(m + k)
    x = rng.standard_normal((*batch, m, k)).astype(BF16)
    y = rng.standard_normal((*batch, k, n)).astype(BF16)
    _check(module.f(x, y), x, y)


@pytest.mark.parametrize("m,n", [(1024, 1024), (2048, 2048), (333, 777), (600, 1100),
                                 (4096, 384), (333, 333), (64, 3000), (3000, 600)])
def test_two_threads_split_the_way_that_packs_less(m, n):
    tiles = amx_tiles(m, n, 2048, host_target())
    rows = _packed_per_thread(m, n, tiles, 2, False)
    columns = _packed_per_thread(m, n, tiles, 2, True)
    if rows != columns:
        assert splits_columns(m, n, tiles, 2) == (columns < rows), (rows, columns)
    # One column block (the f32 kernel's panels of up to 2048 columns): columns iff n > m.
    wide = GemmTiles(14, 32, 256, 98, -(-min(n, 2048) // 32) * 32)
    if n <= 2048:
        assert splits_columns(m, n, wide, 2) == (n > m)


# k = 1300: two depth blocks (1024 + 276; a last block under 256 deep would be folded into
# one longer block with narrower panels, amx_depth_block).
@pytest.mark.parametrize("m,k,n", [(1024, 1024, 1024), (1100, 1300, 1000)])
def test_square_products_split_by_columns(m, k, n, monkeypatch):
    # 512-column AMX panels: two threads splitting 1024 columns each pack half of B and
    # all of A once, where splitting the rows packed all of B and half of A twice.
    module = _compile(_matmul(m, k, n), monkeypatch)
    (gemm,) = [s for s in program_of(module).plans["f"].kernel.body if isinstance(s, Gemm)]
    assert gemm.tiles.nc < n and splits_columns(m, n, gemm.tiles, gemm.threads)
    rng = np.random.default_rng(k)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    two = module.f(a, b)
    _check(two, a, b)
    assert np.array_equal(two, _compile(_matmul(m, k, n), monkeypatch, threads=1).f(a, b))


@pytest.mark.parametrize("m,k,n", [(600, 1030, 1100), (2048, 2048, 2048)])
def test_a_thread_share_of_columns_is_one_column_block(m, k, n, monkeypatch):
    # Shares of 560 and 1024 columns, wider than the half of L2 a B block of depth 1024
    # took (512 columns): one column block each, so each thread packs all of A once, not
    # twice (2048^3 only compiled). The odd shape's product against the exact one.
    module = _compile(_matmul(m, k, n), monkeypatch)
    gemm = _gemm_of(module)
    share = -(-n // 32) * 16
    assert gemm.threads == 2 and splits_columns(m, n, gemm.tiles, 2)
    assert gemm.tiles.nc >= share, gemm.tiles
    if m < 2048:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((m, k)).astype(BF16)
        b = rng.standard_normal((k, n)).astype(BF16)
        _check(module.f(a, b), a, b)


def _gemm_of(module, name="f"):
    (gemm,) = [s for s in program_of(module).plans[name].kernel.body if isinstance(s, Gemm)]
    return gemm


def _llvm_functions(module, name="f"):
    """The LLVM IR of `name`'s kernel, by function name."""
    text = str(codegen([program_of(module).plans[name]]))
    functions, current = {}, None
    for line in text.splitlines():
        if line.startswith("define"):
            current = line.split("@", 1)[1].split("(", 1)[0].strip('"')
            functions[current] = []
        elif current is not None:
            functions[current].append(line)
    return {name: "\n".join(lines) for name, lines in functions.items()}


# Panels of at most 16 columns run on the kernel of one column of tiles: C's last panel
# where N % 32 is 1..16 (777 = 24 x 32 + 9, 8, 16, 48, 80, 400), and a thread's last panel
# where a column split in 16-column tiles ends its share half-way into one (112 columns of
# 20 rows: 48 + 64; 333 x 777: 384 + 393). Wider ragged panels (17, 31, 49, and 20 at the
# end of 116 = 64 + 52) stay on the 32-column kernel under column masks; products of at
# most 16 rows (13) on the one-row kernels; depth tails from the padded slab; B transposed
# (packed along k) as well. (A product of fewer than 8 columns is no packed gemm.) Every
# product has the work for two threads.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(333, 1000, 777), (300, 250, 17), (200, 170, 31),
                                   (150, 150, 49), (1000, 130, 8), (700, 100, 16),
                                   (96, 230, 48), (40, 1037, 80), (20, 500, 112),
                                   (20, 500, 116),
                                   (13, 200, 777), (70, 90, 400)])
@pytest.mark.parametrize("transposed_b", [False, True])
def test_ragged_column_edges(m, k, n, threads, transposed_b, monkeypatch):
    b_shape = (n, k) if transposed_b else (k, n)
    b_operand = "transpose(b, [1, 0])" if transposed_b else "b"
    module = _compile(f"fn f(a: {_ty((m, k))}, b: {_ty(b_shape)}) -> {_ty((m, n), 'F32')} "
                      f"{{ return matmul(a, {b_operand}); }}", monkeypatch, threads)
    gemm = _gemm_of(module)
    kernels = [name for name in _llvm_functions(module) if name.startswith("tilegen.gemm.amx.")]
    assert any("x16.of32" in name for name in kernels) == _narrow_panel(m, n, gemm, threads), \
        kernels
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal(b_shape).astype(BF16)
    got = module.f(a, b)
    wide_b = b.T if transposed_b else b
    _check(got, a, wide_b)
    if threads == 2:
        assert np.array_equal(got, _compile(
            f"fn f(a: {_ty((m, k))}, b: {_ty(b_shape)}) -> {_ty((m, n), 'F32')} "
            f"{{ return matmul(a, {b_operand}); }}", monkeypatch, 1).f(a, b))


def _narrow_panel(m, n, gemm, threads):
    """Whether some thread's last panel has 1..16 columns: C's last (N % 32), or the last
    of a share of a column split in tiles of 16, thread t of c taking tiles
    [t u / c, (t + 1) u / c) for any c the runtime may give (1 to `threads`). Where the
    threads take panels from a counter instead, only C's last."""
    if not splits_columns(m, n, gemm.tiles, threads) or hands_out_panels(gemm):
        return 0 < n % 32 <= 16
    units = -(-n // 16)
    widths = {min((t + 1) * units // c * 16, n) - t * units // c * 16
              for c in range(1, threads + 1) for t in range(c)}
    return any(0 < width % 32 <= 16 for width in widths)


@pytest.mark.parametrize("m,k,n,units", [(20, 500, 112, 7), (13, 200, 777, 49)])
def test_two_threads_split_columns_in_single_tiles(m, k, n, units, monkeypatch):
    # 777 columns in 49 tiles of 16: 384 + 393 columns, where 25 panels of 32 split
    # 416 + 361 and thread 0 did 7 % more than half.
    module = _compile(_matmul(m, k, n), monkeypatch)
    gemm = _gemm_of(module)
    assert splits_columns(m, n, gemm.tiles, 2) and not hands_out_panels(gemm)
    (parallel,) = [text for name, text in _llvm_functions(module).items() if ".par" in name]
    # Thread t's share is units [t units / 2, (t + 1) units / 2), times 16 columns.
    products = set(re.findall(r'= mul i64 %"[.\w]+", (\d+)$', parallel, re.MULTILINE))
    assert {str(units), "16"} <= products
    assert "atomicrmw add" not in parallel
    if n == 777:
        assert "25" not in products  # panels of 32


# One row block and one depth block, B packed a panel at a time, the columns split: the
# threads take panels from a shared count, even threads from C's left end and odd ones
# from its right (each claiming its next panel before it works on the current one). Every
# panel is computed by one thread in one order, so the result is the one-thread result bit
# for bit, whichever thread took which panel; odd N puts a narrow panel at the right end.
# Ragged last blocks of 13, 0, 12, 8, 14 and 20 rows; N % 32 of 9, 12, 29, 9, 2 and 30; A
# read in place, packed (1024 deep: 2 KB rows alias in L1) or computed (an F32 A rounded).
@pytest.mark.parametrize("m,k,n,a_type", [(333, 1000, 777, "BF16"), (256, 640, 300, "BF16"),
                                          (300, 1000, 317, "BF16"), (264, 333, 1001, "BF16"),
                                          (270, 100, 290, "BF16"), (308, 900, 350, "BF16"),
                                          (264, 1024, 400, "BF16"), (300, 700, 333, "F32")])
def test_one_block_products_hand_out_panels(m, k, n, a_type, monkeypatch):
    source = _matmul(m, k, n, a_type).replace("matmul(a, b)", "matmul(cast(a, BF16), b)") \
        if a_type == "F32" else _matmul(m, k, n)
    module = _compile(source, monkeypatch)
    gemm = _gemm_of(module)
    assert hands_out_panels(gemm) and packs_b_panel_at_a_time(gemm)
    assert gemm.tiles.mc >= m and gemm.tiles.kc >= k
    (parallel,) = [text for name, text in _llvm_functions(module).items() if ".par" in name]
    assert parallel.count("atomicrmw add") == 4  # a ticket and an end's count, twice
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    operand = a if a_type == "BF16" else a.astype(np.float32)  # exact in bf16: no rounding
    got = module.f(operand, b)
    _check(got, a, b)
    alone = _compile(source, monkeypatch, threads=1)
    assert not hands_out_panels(_gemm_of(alone))
    expected = alone.f(operand, b)
    for _ in range(20):  # the panels fall to the threads differently from call to call
        assert np.array_equal(module.f(operand, b), expected)


def test_batched_ragged_column_edges(monkeypatch):
    # Batch entries split across threads (no column split) with C's last panel 16 wide;
    # two batch axes, so each kernel branch computes the entry's offset in C itself.
    source = f"fn f(x: {_ty((2, 3, 70, 45))}, y: {_ty((2, 3, 45, 80))}) -> " \
             f"{_ty((2, 3, 70, 80), 'F32')} {{ return matmul(x, y); }}"
    rng = np.random.default_rng(80)
    x = rng.standard_normal((2, 3, 70, 45)).astype(BF16)
    y = rng.standard_normal((2, 3, 45, 80)).astype(BF16)
    for threads in (1, 2):
        module = _compile(source, monkeypatch, threads)
        assert any("x16.of32" in name for name in _llvm_functions(module))
        _check(module.f(x, y), x, y)


@pytest.mark.parametrize("m,k,n,one_panel", [(333, 1000, 777, True), (300, 2049, 100, True),
                                             (260, 600, 90, True), (1024, 1024, 1024, False),
                                             (16, 384, 1536, False), (100, 1000, 300, False)])
def test_b_packed_a_panel_at_a_time_for_one_row_block(m, k, n, one_panel, monkeypatch):
    # One row block of 8 or more register blocks (A fits half of L2; 10 x 32 depth steps
    # prefetch the next panel's 1000 rows of B): each panel packed before its kernel call.
    module = _compile(_matmul(m, k, n), monkeypatch)
    gemm = _gemm_of(module)
    assert packs_b_panel_at_a_time(gemm) == one_panel
    if one_panel:
        assert gemm.tiles.mc >= m


# Products with B packed a panel at a time: several depth blocks (2049 = 2 x 1024 + 1),
# narrow and ragged column edges, a column split, B transposed (nothing to prefetch), a
# batch; 1 and 2 threads.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n,transposed_b", [(300, 2049, 100, False), (260, 600, 90, True),
                                                (333, 1000, 777, True), (257, 130, 999, False)])
def test_products_with_b_packed_a_panel_at_a_time(m, k, n, transposed_b, threads,
                                                  monkeypatch):
    b_shape = (n, k) if transposed_b else (k, n)
    b_operand = "transpose(b, [1, 0])" if transposed_b else "b"
    module = _compile(f"fn f(a: {_ty((m, k))}, b: {_ty(b_shape)}) -> {_ty((m, n), 'F32')} "
                      f"{{ return matmul(a, {b_operand}); }}", monkeypatch, threads)
    assert packs_b_panel_at_a_time(_gemm_of(module))
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal(b_shape).astype(BF16)
    _check(module.f(a, b), a, b.T if transposed_b else b)


def test_batched_products_with_b_packed_a_panel_at_a_time(monkeypatch):
    source = f"fn f(x: {_ty((2, 300, 520))}, y: {_ty((2, 520, 70))}) -> " \
             f"{_ty((2, 300, 70), 'F32')} {{ return matmul(x, y); }}"
    module = _compile(source, monkeypatch)
    assert packs_b_panel_at_a_time(_gemm_of(module))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 300, 520)).astype(BF16)
    y = rng.standard_normal((2, 520, 70)).astype(BF16)
    _check(module.f(x, y), x, y)


# Only the kernels a product can run are in its module (each cost LLVM 20-40 ms): for an A
# read in place (k = 230: 460-byte rows), the packed kernel of its ragged last block only
# when M is no multiple of 32, on one row of tiles for 1..16 ragged rows (45 = 32 + 13) and
# on two for 17..31 (57 = 32 + 25, 23); an A packed throughout (k = 256: 512-byte rows alias
# in L1) on its one kernel; the 16-column kernels only for a narrow last panel (80, 400 =
# 12 x 32 + 16). Products of at most 16 rows on one row of tiles. One thread (no column
# split: test_ragged_column_edges has those); each against the exact product.
@pytest.mark.parametrize("m,k,n,expected", [
    (64, 230, 96, {"32x32.in_place"}),
    (45, 230, 96, {"32x32.in_place", "16x32"}),
    (57, 230, 96, {"32x32.in_place", "32x32"}),
    (23, 230, 90, {"32x32.in_place", "32x32"}),
    (13, 230, 80, {"16x32.in_place", "16x16.of32.in_place", "16x32", "16x16.of32"}),
    (57, 256, 96, {"32x32"}),
    (57, 256, 400, {"32x32", "32x16.of32"}),
])
def test_only_the_kernels_a_product_runs_are_emitted(m, k, n, expected, monkeypatch):
    module = _compile(_matmul(m, k, n), monkeypatch, threads=1)
    kernels = {name.removeprefix("tilegen.gemm.amx.") for name in _llvm_functions(module)
               if name.startswith("tilegen.gemm.amx.")}
    assert kernels == expected
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    _check(module.f(a, b), a, b)


def test_products_of_a_module_share_their_kernels(monkeypatch):
    # Two odd-shaped products in one function: each kernel once, the union of what the
    # two run (the first's A read in place, 64 rows in whole blocks, a 16-column last
    # panel; the second's A packed, 45 rows), each product against the exact one.
    source = (f"fn f(a: {_ty((64, 230))}, b: {_ty((230, 80))}, c: {_ty((45, 256))}, "
              f"d: {_ty((256, 96))}) -> ({_ty((64, 80), 'F32')}, {_ty((45, 96), 'F32')}) "
              "{ return (matmul(a, b), matmul(c, d)); }")
    module = _compile(source, monkeypatch, threads=1)
    kernels = [name.removeprefix("tilegen.gemm.amx.") for name in _llvm_functions(module)
               if name.startswith("tilegen.gemm.amx.")]
    assert sorted(kernels) == sorted({"32x32.in_place", "32x16.of32.in_place", "32x32"})
    rng = np.random.default_rng(7)
    a, b, c, d = (rng.standard_normal(shape).astype(BF16)
                  for shape in ((64, 230), (230, 80), (45, 256), (256, 96)))
    first, second = module.f(a, b, c, d)
    _check(first, a, b)
    _check(second, c, d)
