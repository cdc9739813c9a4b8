"""Packed BF16 matrix multiply on AVX512-BF16: `vdpbf16ps`, two bf16 products per f32 lane.

A `Gemm` of dtype bf16 has bf16 operands (their element expressions give f32 values that are
exactly bf16, from bf16 loads or a rounding cast) and an f32 result, accumulated in f32. It
runs the loop structure of tilegen/gemm.py (column, depth and row blocks, threads) with
16-bit panels laid out for the instruction, which multiplies pairs along k:

    Ap[r * stride + k]                 rows as they are (k and k + 1 are already neighbours)
    Bp[panel][p][j][2]                 depth pair p = (B[2p, j], B[2p + 1, j]) interleaved
                                       per column, nr columns per panel (zeros past N)

A block's odd depth is padded with a zero row of B and a zero column of A (pack_a already
writes zeros up to its vector width). A plain row-major bf16 A with even depths whose
register block puts at most 6 rows on one L1 set (rows_per_set) is not packed
(dot_a_in_place): the kernel broadcasts its pairs where A is, at A's row stride, and only
the matrix's ragged last register block, whose rows past M do not exist, is packed at that
stride. Such an A costs no packing, so threads split its product's columns more readily
(gemm_tiles.splits_columns).

The micro-kernel broadcasts one 32-bit pair of A per row (a 32-bit broadcast) against
nr / 16 vectors of B pairs: mr x nr / 16 accumulators, 12 x 2 for the default 12 x 32
block, as in the f32 kernel, over depth blocks of up to 1024 (dot_depth_block), its block
of C prefetched at each call's start. What bounds it is the instruction's issue rate
(docs/architecture.md, "BF16 on vdpbf16ps").

`vdpbf16ps` flushes bf16 subnormal inputs to zero and rounds its f32 sum to nearest-even;
the products of normal bf16 values are exact in f32, so results differ from a widening f32
gemm only in the order of the f32 additions. This module also chooses the kernel of every
bf16 product (`bf16_kernel`): AMX (tilegen/gemm_amx.py, the same panels padded to whole
tiles) where the target has it and the OS grants tile data, else this one where the
instruction is there and faster than the f32 kernel, else -- or with TILEGEN_BF16_DOT=0 --
an f32 `Gemm` over the widened operands (`gemm_dtype`, `dot_available`).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import replace

from llvmlite import ir

from . import loopir as L
from .codegen_values import Val
from .config import Config
from .gemm import _GemmEmitter
from .gemm_tiles import column_block, default_tiles, l2_column_block
from .micro_kernel import I64, declare_intrinsic, element_pointer, micro_kernel_shell, splat
from .schedule import flat_coefficient
from .target import Target, amx_tile_permission

I16, I32 = ir.IntType(16), ir.IntType(32)
LANES = 16  # f32 accumulator lanes; a B vector holds 16 pairs
DOT_FEATURE = "+avx512bf16"
HALF_RATE_FEATURE = "+amx-bf16"
AMX_FEATURES = ("+amx-tile", "+amx-bf16")
# AMX blocks (tilegen/gemm_amx.py): a tile is 16 rows of 64 bytes (16 f32 or 32 bf16).
AMX_TILE_ROWS = 16
AMX_DEPTH = 32  # bf16 depths per tile row of A (16 pairs per tile of B)
AMX_ROWS, AMX_COLUMNS = 32, 32
AMX_MAX_KC = 1024
# A is read in place (by AMX's tiles, or the dot kernel's broadcasts) only when its row
# stride in bytes has no power-of-two factor above this, so a block's rows fall on many of
# L1's 64 sets: at 2 and 4 KB (1024^3, 2048^3) 32 rows fell on 2 to 4 and an AMX product
# ran 20-30% slower than on packed A, while 333 x 1000 x 777 (2000 bytes) ran about 5%
# faster without packing A (one-thread timings); the dot kernel's 12 rows, 4 KB apart,
# ran 2048^3 about 10% slower.
SPREAD_ROW_BYTES = 256
# The dot kernel's register block reads mr rows of A at a time, one 4-byte pair each, so
# what matters there is how many of those rows share an L1 set: L1D has 64 sets of 64-byte
# lines (4 KB a way) and at least 8 ways on every x86-64 core with AVX512-BF16 (Zen 4 and
# 5: 32 KB, 8 ways; Intel: 32 KB 8-way or 48 KB 12-way). On Zen 4, two threads, ad hoc A/B
# in one process: rows 2 KB apart (1024^3: 6 of 12 rows a set) ran in place as fast as
# packed, and 2-2.5 % faster with the threads splitting the columns (splits_columns,
# a_in_place); rows 4 KB apart (2048^3: all 12 on one set) ran 10 % slower.
L1_SETS, LINE_BYTES = 64, 64
DOT_ROWS_PER_SET = 6


class NamedLLVMType(ir.Type):
    """An LLVM type llvmlite.ir does not have, printed by its name: `bfloat`, the element
    of the `<32 x bfloat>` operands of LLVM 22's `llvm.x86.avx512bf16.dpbf16ps.512`, and
    `x86_amx`, a tile register's value (tilegen/gemm_amx.py)."""

    def __init__(self, name: str):
        self.name = name

    def _to_string(self) -> str:
        return self.name

    def __eq__(self, other) -> bool:
        return isinstance(other, NamedLLVMType) and other.name == self.name

    def __hash__(self) -> int:
        return hash((NamedLLVMType, self.name))


BF16_PAIRS = ir.VectorType(NamedLLVMType("bfloat"), 2 * LANES)
F32_VECTOR = ir.VectorType(ir.FloatType(), LANES)


def dot_available(options: Config, features: str | None = None) -> bool:
    """Whether bf16 products use `vdpbf16ps` when they do not use AMX, for a target CPU with
    `features` (today the compile's target, options.target). Never without AVX512-BF16;
    with it, as TILEGEN_BF16_DOT says, and by default only on CPUs without AMX-BF16: the
    Intel server cores that have AMX issue a zmm `vdpbf16ps` at a quarter of the zmm FMA
    rate, with twice the products (scripts/bf16_peaks.py on this project's Xeon: 0.47 per
    cycle against 1.85-1.9, on the same ports; a ceiling of 111 GF/s per core at 3.7 GHz
    against 220). That ceiling is below what the f32 kernel reaches (1024^3 on one thread:
    the dot kernel 93-103 GF/s, the f32 kernel 132-141, ad hoc), while AMD Zen 4 and 5
    issue it at the FMA rate."""
    if features is None:
        features = options.target.features
    enabled = set(features.split(","))
    if DOT_FEATURE not in enabled or options.bf16_kernel == "widen":
        return False
    return options.bf16_kernel == "dot" or HALF_RATE_FEATURE not in enabled


def amx_usable(target: Target) -> tuple[bool, str]:
    """Whether code for `target` may use AMX-BF16 tiles, and why not if it may not: the
    target's features must have them, and where the code runs here (JIT, `--run`) Linux
    must grant this process tile data (target.amx_tile_permission); code for a machine
    elsewhere (`--emit asm`, a library) asks nothing of this one."""
    enabled = set(target.features.split(","))
    missing = [f[1:] for f in AMX_FEATURES if f not in enabled]
    if missing:
        return False, f"target {target.name} ({target.cpu}) has no {', '.join(missing)}"
    if target.runs_on_host:
        return amx_tile_permission()
    return True, ""


_warned: set[str] = set()


def bf16_kernel(options: Config) -> str:
    """The kernel for products of bf16 operands: "amx" (tilegen/gemm_amx.py), "dot"
    (`vdpbf16ps`) or "widen" (the f32 kernel on operands widened while packing).
    TILEGEN_BF16_DOT (options.bf16_kernel) auto and amx take AMX where amx_usable says so;
    when a CPU has AMX but this process may not use it, the choice falls back to the
    next kernel with a RuntimeWarning (once per reason), never to code that would die
    of SIGILL."""
    if options.bf16_kernel in ("auto", "amx"):
        usable, why = amx_usable(options.target)
        if usable:
            return "amx"
        target_has_amx = all(f in options.target.features.split(",") for f in AMX_FEATURES)
        if (target_has_amx or options.bf16_kernel == "amx") and why not in _warned:
            _warned.add(why)
            warnings.warn(f"tilegen: BF16 matmul without AMX: {why}; using "
                          f"{'vdpbf16ps' if dot_available(options) else 'f32 widening'}",
                          RuntimeWarning, stacklevel=2)
    return "dot" if dot_available(options) else "widen"


def gemm_dtype(options: Config) -> str:
    """The `Gemm` dtype for a product of bf16 operands: bf16 (16-bit panels, on the AMX or
    the dot-product kernel) or f32 (the same operands widened while packing, on the f32
    kernel)."""
    return L.F32 if bf16_kernel(options) == "widen" else L.BF16_STORAGE


def bf16_tiles(m: int, n: int, k: int, options: Config, threads: int = 1) -> L.GemmTiles:
    """The blocks of a bf16 gemm on `threads` threads: AMX tiles (amx_tiles) when
    bf16_kernel picks AMX, else the f32 register and cache blocks with deeper depth blocks
    (dot_depth_block: all of k up to 1024)."""
    if bf16_kernel(options) == "amx":
        return amx_tiles(m, n, k, options.target, threads)
    tiles = default_tiles(L.F32, m, n, k, options.target)
    kc = dot_depth_block(k)
    return replace(tiles, kc=kc, nc=l2_column_block(n, tiles.nr, kc, 2, options.target))


def dot_depth_block(k: int) -> int:
    """kc of the vdpbf16ps kernel for a depth of k: as AMX's (amx_depth_block), all of k up
    to 1024. Its B micro-panel (kc x 32 bf16, 64 KB at 1024) then outgrows L1 and
    streams from L2, which on Zen 4 feeds the 128 bytes of B and 48 of A a 24-cycle step
    needs with room to spare, while every depth block loads and stores all of C once more.
    Two threads on Zen 4 (ad hoc A/B in one process, torch bf16 alongside): 2048^3 ran in
    45.8-47.9 ms with kc = 256 (the f32 kernel's 3/4 of L1 doubled, as before), 45.1-47.4
    with 512, 41.0-45.0 with 1024; 1024^3 5.55, 5.29-5.38 and 5.26-5.31 ms."""
    return amx_depth_block(k)


def amx_tiles(m: int, n: int, k: int, target: Target, threads: int = 1) -> L.GemmTiles:
    """Register block: AMX_ROWS x 32 (2 x 2 accumulator tiles of 16 x 16 f32; one row of
    tiles for products of at most 16 rows); depth block all of k up to 1024 (a multiple of
    32 past it: a tile row of A holds 32 bf16), which was the fastest in noisy timings of
    1024^3 against 256, 384 and 512 (C is loaded and stored once per depth block), longer
    where that saves a short last block (amx_depth_block); the B block kc x nc half of L2,
    or up to all of it where one of `threads` column shares is wider than that, the A block
    at most a quarter of L2, or all of M where that fits half of L2 (333 x 1000: one row
    block, so gemm_amx packs B a panel at a time).
    A thread packs all of A once per column block of its share when threads split the
    columns, so its share in one block halves that packing: a one-thread 2048 x 2048 x 1024
    (2048^3's share on two threads) ran in 8.7-9.4 ms of CPU time with blocks of 1024
    columns against 9.7-10.4 with 512 (half of L2), ad hoc on a loaded machine. The B block
    need not stay in L2: each kernel call reads one micro-panel (kc x 32) from L2 or L3
    once, and its runs keep their part of it in L1."""
    mr = AMX_TILE_ROWS if m <= AMX_TILE_ROWS else AMX_ROWS
    kc = amx_depth_block(k)  # padded to whole tiles while packing
    unit = AMX_COLUMNS // 2  # gemm_amx's threads split columns in tiles of 16
    units = -(-n // unit)
    share = -(-units // threads) * unit
    share = -(-share // AMX_COLUMNS) * AMX_COLUMNS
    half = target.l2_bytes // 2 // (2 * kc)
    panel_columns = max(AMX_COLUMNS, min(max(share, half), 2 * half))
    nc = column_block(n, AMX_COLUMNS, panel_columns)
    rows = max(mr, target.l2_bytes // 4 // (2 * kc) // mr * mr)
    whole = -(-m // mr) * mr
    # All of M in one block when A (kc deep) fits half of L2: gemm_amx then packs each B
    # panel right before its kernel call, which prefetches the next one's part of B.
    mc = whole if whole * 2 * kc <= target.l2_bytes // 2 else min(rows, whole)
    return L.GemmTiles(mr, AMX_COLUMNS, kc, mc, nc)


def amx_depth_block(k: int) -> int:
    """kc for a depth of k: all of it up to AMX_MAX_KC; past that AMX_MAX_KC, unless the
    last block would be shorter than a quarter of it, which is spread over the others
    instead (kc a multiple of 32 but for a single block). Every depth block loads and stores
    all of C once: bf16x3's 1152 deep products (3 x 384) as 1024 + 128 swept C a second
    time for an eighth of the work (4096 x 384 x 1152 ran about 18% faster on one thread
    in one block, 4096 x 1536 x 1152 about 8%; ad hoc, loaded machine)."""
    whole, rest = divmod(k, AMX_MAX_KC)
    if whole == 0 or rest == 0 or rest * 4 >= AMX_MAX_KC:
        return min(AMX_MAX_KC, k)
    if whole == 1:
        return k
    per_block = -(-k // whole)
    return -(-per_block // AMX_DEPTH) * AMX_DEPTH


def is_amx_block(tiles: L.GemmTiles) -> bool:
    """Whether a bf16 gemm's register block is whole AMX tiles (mr 16 or 32, nr 32): how
    codegen tells an AMX gemm from a `vdpbf16ps` one (whose default mr is at most
    gemm_tiles.MAX_MR = 14), on a target with AMX."""
    return tiles.nr == AMX_COLUMNS and tiles.mr in (AMX_TILE_ROWS, AMX_ROWS)


def bf16_row_stride(gemm: L.Gemm, buffers, load: L.Expr, along: L.Var, rows: L.Var):
    """The stride in elements along `rows` of an operand that is a plain load of a bf16
    buffer, contiguous along `along` (an affine index in `along`, `rows` and the batch
    variables), so its bits can be read as they are; None for anything else (a cast, a
    computed or a transposed operand)."""
    if not isinstance(load, L.Load) or buffers[load.buffer].dtype != L.BF16_STORAGE:
        return None
    allowed = {along.name, rows.name, *(var.name for var in gemm.batch)}
    if any(not L.free_vars(component) <= allowed for component in load.index):
        return None
    strides = buffers[load.buffer].strides
    if flat_coefficient(load.index, strides, along.name) != 1:
        return None
    return flat_coefficient(load.index, strides, rows.name)


def operand_pointer(cg, load: L.Load, at: dict):
    """The address of `load`'s element with the gemm variables of `at` (Var -> i64 value)
    bound, the batch entry from the environment."""
    b = cg.b
    cg.push_scope()
    for var, value in at.items():
        cg.env[-1][var.name] = Val(value, False)
    offset = ir.Constant(I64, 0)
    for component, stride in zip(load.index, cg.buffers[load.buffer].strides, strict=True):
        offset = b.add(offset, b.mul(cg.expr(component).value, ir.Constant(I64, stride)))
    cg.pop_scope()
    return element_pointer(b, cg.pointers[load.buffer], offset, I16)


def dot_a_in_place(gemm: L.Gemm, buffers) -> int | None:
    """A's row stride in elements when the `vdpbf16ps` kernel broadcasts A's depth pairs
    from where A is instead of packing it: A is a plain load of a bf16 buffer, contiguous
    along k (bf16_row_stride), at most DOT_ROWS_PER_SET of a register block's rows share an
    L1 set (rows_per_set), and its depth blocks start and end on whole pairs (even K, kc
    and row stride), so no pair reaches past a block or a row. Two threads on Zen 4, ad
    hoc A/B against packing, torch alongside: 333 x 1000 x 777 (rows 2000 bytes apart)
    1.22-1.25 ms packed, 1.20-1.22 in place; 2048^3 (4 KB apart, all 12 rows of a block on
    one set) 40.3 against 45.1."""
    stride = bf16_row_stride(gemm, buffers, gemm.a_elem, gemm.k, gemm.i)
    if stride is None or stride <= 0 or stride % 2 or gemm.k_extent % 2 or gemm.tiles.kc % 2:
        return None
    return stride if rows_per_set(2 * stride, gemm.tiles.mr) <= DOT_ROWS_PER_SET else None


def rows_per_set(row_bytes: int, rows: int) -> int:
    """The most of `rows` rows, row_bytes apart, whose lines at one column share an L1 set
    (the base taken on a line's start)."""
    sets = Counter(r * row_bytes // LINE_BYTES % L1_SETS for r in range(rows))
    return max(sets.values())


def rows_spread(row_bytes: int) -> bool:
    """Whether rows `row_bytes` apart fall on many of L1's 64 sets: their stride has no
    power-of-two factor above SPREAD_ROW_BYTES, so 16 rows fall on at least 16 sets."""
    return row_bytes & -row_bytes <= SPREAD_ROW_BYTES


def _even(count):
    return (count + 1) // 2 * 2


class Bf16DotEmitter(_GemmEmitter):
    """_GemmEmitter with 16-bit panels, B interleaved in depth pairs, and the dpbf16ps
    micro-kernel."""

    shared_driver = False  # its block loops stay inline (gemm_driver.py is fp32/fp64's)

    def __init__(self, cg, gemm: L.Gemm):
        # Values while packing and the accumulators are f32; only the panels are 16-bit.
        super().__init__(cg, replace(gemm, dtype=L.F32))
        self.g = gemm
        self.packed_element = I16
        self.packed_bytes = 2
        # A's row stride in elements when the kernel reads A where it is (dot_a_in_place);
        # its pairs are then broadcast from A's rows, and only the matrix's ragged last
        # register block is packed, at the same stride.
        self.dot_a_stride = dot_a_in_place(gemm, cg.buffers)
        if self.dot_a_stride is not None:
            self.a_stride = self.dot_a_stride
        self.direct = None  # (&A[ic, pc], rows read in place): pack_a sets it

    @property
    def reads_a_in_place(self) -> bool:
        return self.dot_a_stride is not None

    def a_panel_elements(self) -> int:
        if self.dot_a_stride is None:
            return super().a_panel_elements()
        # One register block (the ragged last one); pack_a's last vector of a row may run
        # up to 15 elements past it.
        return self.tiles.mr * self.a_stride + LANES

    def pack_a(self, packed, ic, mc, pc, kc) -> None:
        """For an A read in place, only the rows of the block's last register block that
        A has not got past M: packed (zeros past M and kc) at A's row stride."""
        if self.dot_a_stride is None:
            super().pack_a(packed, ic, mc, pc, kc)
            return
        b, mr = self.b, self.tiles.mr
        whole = b.mul(b.sdiv(mc, self.const(mr)), self.const(mr))
        exists = b.icmp_signed("<=", b.add(ic, b.add(whole, self.const(mr))),
                               self.const(self.g.m))
        direct = b.select(exists, mc, whole)  # rows past mc that A has are never stored
        self.direct = (operand_pointer(self.cg, self.g.a_elem, {self.g.i: ic, self.g.k: pc}),
                       direct)
        with b.if_then(b.icmp_signed("<", direct, mc), likely=False):
            rest = b.sub(mc, direct)
            super().pack_a(packed, b.add(ic, direct), rest, pc, kc)
            super().zero_a_rows(packed, rest, kc)

    def zero_a_rows(self, packed, mc, kc) -> None:
        if self.dot_a_stride is None:  # else pack_a zeroed the packed block's rows
            super().zero_a_rows(packed, mc, kc)

    def a_block(self, packed_a, row):
        if self.dot_a_stride is None:
            return super().a_block(packed_a, row)
        b = self.b
        start, direct = self.direct
        in_place = element_pointer(b, start, b.mul(row, self.const(self.a_stride)), I16)
        packed = super().a_block(packed_a, b.sub(row, direct))
        return b.select(b.icmp_signed("<", row, direct), in_place, packed)

    def bits(self, value):
        """The bf16 bits of an f32 vector whose values are bf16 already (exact, no rounding:
        the operands come from bf16 loads or a rounding cast)."""
        wide = self.b.bitcast(value, ir.VectorType(I32, LANES))
        shifted = self.b.lshr(wide, ir.Constant(ir.VectorType(I32, LANES), [16] * LANES))
        return self.b.trunc(shifted, ir.VectorType(I16, LANES))

    def store_packed(self, value, pointer) -> None:
        self.b.store(self.bits(value), pointer, align=2)

    def b_panel_elements(self) -> int:
        return _even(self.tiles.kc) * self.tiles.nc

    def panel_depth(self, kc):
        """Rows a B panel holds for a depth block of kc: kc rounded up to whole pairs."""
        return self.b.and_(self.b.add(kc, self.const(1)), self.const(-2))

    def written_pairs(self, kc):
        """The depth pairs pack_b writes per panel: ceil(kc / 2) (a panel deeper than that,
        as AMX's, is zeroed past them by its emitter)."""
        return self.b.ashr(self.b.add(kc, self.const(1)), self.const(1))

    def pack_b(self, packed, jc, nc, pc, kc) -> None:
        """Bp[(jr / nr) * depth * nr + p * 2 nr + 2 j + h] = B[pc + 2p + h, jc + jr + j]
        (0 past the block's last column jc + nc - 1 and past kc): two depths per column,
        as dpbf16ps pairs them. Pairs of rows outside, panels inside, so B is read along its
        rows (about 5% of a one-thread 1024^3 AMX product against reading each panel's 64
        bytes per row, in noisy timings). The block ends at N or where this thread's share
        of a column split does, which for AMX may be in the middle of a panel."""
        if self._read_across(self.g.b_elem, self.g.j, self.g.k):
            self.pack_b_pairs_transposed(packed, jc, nc, pc, kc)
            return
        g, nr, b = self.g, self.tiles.nr, self.b
        depth = self.panel_depth(kc)
        last = self.const(g.k_extent - 1)
        limit = b.add(jc, nc)

        def pair(p, carried):
            k0 = b.add(pc, b.shl(p, self.const(1)))
            # Read the odd depth at an index inside B (its lanes are masked off anyway,
            # but a load that does not vary along j is not masked).
            k1 = b.add(k0, self.const(1))
            inside = b.icmp_signed("<", b.sub(k1, pc), kc)
            k1 = b.select(b.icmp_signed(">", k1, last), last, k1)

            def panel(jr, carried):
                offset = b.add(b.mul(jr, depth), b.mul(p, self.const(2 * nr)))
                for part in range(self.vectors_per_row):
                    first = b.add(b.add(jc, jr), self.const(part * LANES))
                    mask = self.lane_mask(first, limit)
                    even = self._tile_value(g.b_elem, g.j, first, mask, [(g.k, k0)])
                    odd_mask = b.and_(mask, self.cg.splat(inside, LANES))
                    odd = self._tile_value(g.b_elem, g.j, first, odd_mask, [(g.k, k1)])
                    pairs = self.interleave(even, odd)
                    b.store(pairs, self.gep(packed, b.add(offset, self.const(part * 2 * LANES))),
                            align=2)
                return carried
            self.cg.loop(self.const(0), nc, nr, [], panel)
            return carried
        self.cg.loop(self.const(0), self.written_pairs(kc), 1, [], pair)

    def interleave(self, even, odd):
        """Two f32 vectors of bf16 values as one vector of 16 (even, odd) bf16 pairs."""
        lanes = [lane // 2 + (lane % 2) * LANES for lane in range(2 * LANES)]
        return self.b.shuffle_vector(self.bits(even), self.bits(odd),
                                     ir.Constant(ir.VectorType(I32, 2 * LANES), lanes))

    def pack_b_pairs_transposed(self, packed, jc, nc, pc, kc) -> None:
        """pack_b for a B read along k (`x @ transpose(w)`): 16 columns x 16 depths at a
        time, each column loaded as one vector along k and the block transposed in
        registers (as gemm.py's pack_b_transposed), then the depth rows paired; columns
        from jc + nc on as zeros (as pack_b)."""
        g, nr, b = self.g, self.tiles.nr, self.b
        depth = self.panel_depth(kc)
        limit = b.add(jc, nc)
        whole = b.and_(kc, self.const(-LANES))  # depths in full chunks of 16

        def chunk(jr, k, partial: bool):
            depth_mask = self.lane_mask(k, kc)  # depths past kc load as zeros
            for part in range(self.vectors_per_row):
                def column(r, part=part):
                    index = b.add(b.add(jc, jr), self.const(part * LANES + r))
                    return index, b.icmp_signed("<", index, limit)
                rows = self._transposed_block(g.b_elem, g.k, b.add(pc, k), depth_mask, g.j,
                                              column)
                pairs = [self.interleave(rows[2 * p], rows[2 * p + 1])
                         for p in range(LANES // 2)]
                first_pair = b.ashr(k, self.const(1))
                for p, value in enumerate(pairs):
                    pair = b.add(first_pair, self.const(p))
                    pointer = self.gep(packed, b.add(b.add(
                        b.mul(jr, depth), b.mul(pair, self.const(2 * nr))),
                        self.const(part * 2 * LANES)))
                    if partial:  # only the pairs the panel holds
                        inside = b.icmp_signed("<", b.shl(pair, self.const(1)), kc)
                        with b.if_then(inside):
                            b.store(value, pointer, align=2)
                    else:
                        b.store(value, pointer, align=2)

        def panel(jr, carried):
            self.cg.loop(self.const(0), whole, LANES, [],
                          lambda k, carried: chunk(jr, k, False) or carried)
            with b.if_then(b.icmp_signed("<", whole, kc)):
                chunk(jr, whole, True)
            return carried
        self.cg.loop(self.const(0), nc, nr, [], panel)

    def micro_kernel(self) -> ir.Function:
        return dot_micro_kernel(self.cg.module, self.tiles.mr, self.tiles.nr, self.a_stride)

    def call_kernel(self, kernel, args) -> None:
        """C's last panel, when it has at most 16 columns (777 = 24 x 32 + 9), on a kernel of
        one vector of B a step: half the products of the full-width one. With two threads
        splitting 777 columns, the one with the ragged panel did 13 panels' products
        against the other's 12 and the other idled about 8 % of the call at the join."""
        last = self.g.n % self.tiles.nr
        if self.vectors_per_row < 2 or not 0 < last <= LANES:
            self.b.call(kernel, args)
            return
        columns = args[6]  # the call's `cols` (micro_kernel_function's signature)
        narrow = dot_micro_kernel(self.cg.module, self.tiles.mr, self.tiles.nr,
                                  self.a_stride, vectors=1)
        with self.b.if_else(self.b.icmp_signed("<=", columns, self.const(LANES))) as (
                then, otherwise):
            with then:
                self.b.call(narrow, args)
            with otherwise:
                self.b.call(kernel, args)

    def micro_steps(self, kc):
        return self.b.ashr(self.panel_depth(kc), self.const(1))

    def b_panel_offset(self, jr, kc):
        return self.b.mul(jr, self.panel_depth(kc))


def dot_micro_kernel(module: ir.Module, mr: int, nr: int, a_stride: int,
                     vectors: int | None = None) -> ir.Function:
    """The micro-kernel (signature of micro_kernel.micro_kernel_function, kc counting depth pairs):
    C[r, j] (+)= sum over pairs p of Ap[r, 2p] Bp[p, j, 0] + Ap[r, 2p + 1] Bp[p, j, 1], on B
    panels nr columns wide; with `vectors` only the first 16 x vectors of them (at most
    that many `cols`)."""
    parts = nr // LANES if vectors is None else vectors
    name = f"tilegen.gemm.bf16dot.{mr}x{nr}.s{a_stride}" + (
        "" if vectors is None else f".v{vectors}")
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    dot = declare_intrinsic(module, "llvm.x86.avx512bf16.dpbf16ps.512", F32_VECTOR,
                            [F32_VECTOR, BF16_PAIRS, BF16_PAIRS])

    def const(value):
        return ir.Constant(I64, value)

    def step(b, a, bp, p, accumulators):
        b_row = element_pointer(b, bp, b.mul(p, const(2 * nr)), I16)
        columns = [b.load(element_pointer(b, b_row, const(part * 2 * LANES), I16),
                          typ=BF16_PAIRS, align=4) for part in range(parts)]
        updated = []
        for r in range(mr):
            pair = b.load(element_pointer(b, a, b.add(b.shl(p, const(1)), const(r * a_stride)),
                                          I16), typ=I32, align=4)
            broadcast = b.bitcast(splat(b, pair, LANES), BF16_PAIRS)
            for part in range(parts):
                updated.append(b.call(dot, [accumulators[r * parts + part], broadcast,
                                            columns[part]]))
        return updated
    return micro_kernel_shell(module, name, L.F32, mr, parts, LANES, step, prefetch_c=True)

