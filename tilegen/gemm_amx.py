"""Packed BF16 matrix multiply on AMX: `tdpbf16ps`, a 16 x 16 f32 tile += 16 x 32 bf16 times
32 x 16 bf16 per instruction.

An AMX gemm is a bf16 `Gemm` (tilegen/gemm_bf16.py) whose register block is whole tiles
(`is_amx_block`: mr = 32, or 16 for products of at most 16 rows; nr = 32), emitted for a
target with AMX-BF16 and AMX-TILE. It runs gemm.py's loop structure (column, depth and row
blocks, threads) and gemm_bf16's packing, with every panel padded to whole tiles:

    Ap[k / 32][r][k % 32]      slabs of 32 depths, mc rows of 64 bytes each, so a tile
                               of A (16 rows of a slab) is 1 KB of contiguous memory;
                               zeros from kc up to the next multiple of 32
    Bp[panel][p][j][2]         as the `vdpbf16ps` kernel packs it (pairs of depths
                               interleaved per column, which is AMX's "VNNI" layout),
                               32 columns per panel, zero pairs up to a multiple of 16

so a B tile (16 pairs x 16 columns, 64 bytes a row) is 16 rows of a panel 128 bytes apart,
and the panel's second tile starts 64 bytes in. A product of one row block of at least 8
register blocks packs B a panel at a time, each right before its kernel call, which
prefetches the next panel's part of B into L2 (`packs_b_panel_at_a_time`). Padding
depths are zero in both A and B: zero times anything finite is 0, and packing never
reads past the operands, so no Inf or NaN of uninitialised memory meets a zero.

A row-major bf16 A (a plain load, contiguous along k: `a_read_in_place`) is not packed:
tileloadd reads its tiles where it is, 16 rows at A's row stride, for every whole 32
depths; only the depth tail (kc % 32 depths, zero-padded to a slab of 32) and the
matrix's ragged last register block (whose rows past M do not exist) are packed as above.
That saves the packing's pass over A (about 12% of a one-thread 333 x 1000 x 777) where
the rows spread over L1's sets; rows 2 or 4 KB apart (K = 1024, 2048) fall on 2 to 4 sets
and are packed.

The micro-kernel keeps 2 x 2 accumulator tiles (C, 32 x 32 f32) in tile registers across
its depth loop (x86_amx phis) and loads 2 tiles of A and 2 of B per 32 depths: all 8 tile
registers; a B panel of at most 16 columns (C's last where N % 32 <= 16, or the last of a
thread's share: threads split columns in tiles of 16, `column_unit`) runs on the kernel of
one column of tiles, and a ragged last block of at most 16 rows on one row of tiles. It
is written with LLVM's shape-carrying intrinsics
(`llvm.x86.tileloadd64.internal`, `tdpbf16ps.internal`, `tilestored64.internal`), whose
row and byte-column operands are constants, so LLVM writes the tile configuration and
the `ldtilecfg` itself (and `tilerelease` on return). The accumulators start from C
itself when the block is whole and not the first depth block, from a zero constant when it
is the first, and from a 32 x 32 staging block on the stack for the ragged blocks at the
edges of C, which are copied in and out under row and column masks.

Tile instructions need the operating system's consent (target.amx_tile_permission):
gemm_bf16.bf16_kernel asks for it before it picks AMX, and takes another kernel when it is
refused. The code asks again itself before its first tile instruction (once per loaded
copy, `request_tile_data`), since a library may be loaded by a program that never asked;
a refusal there ends the call with STATUS_NO_TILE_DATA (KINA_ERROR_NO_TILE_DATA in the C
ABI), never SIGILL.
"""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L
from .gemm import PACKED_EMITTERS, _smin, splits_columns
from .gemm_bf16 import (
    AMX_DEPTH,
    AMX_TILE_ROWS,
    LANES,
    Bf16DotEmitter,
    NamedLLVMType,
    amx_usable,
    bf16_row_stride,
    is_amx_block,
    operand_pointer,
)
from .micro_kernel import I64, PTR, declare_intrinsic, element_pointer, splat
from .target import ARCH_REQ_XCOMP_PERM, SYS_ARCH_PRCTL, XFEATURE_XTILEDATA

I1, I8, I16, I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
F32 = ir.FloatType()
TILE_BYTES = 64  # bytes per tile row: 16 f32 or 32 bf16
TILE_COLUMNS = 16  # f32 columns of an accumulator tile
PREFETCH_STEPS = 2  # how many depth steps (of 32) ahead the kernel prefetches A and B
# Whether the depth loop also prefetches the next register block's C (for writing):
# 2048^3 on one thread ran 3-5% faster with it (C of 16 MB comes from L3), the smaller
# products within noise.
PREFETCH_C = True
# Rows of the next B panel's source a kernel call prefetches per depth step (kc = 1000 rows
# within 10 register blocks x 32 steps: 333 x 1000 x 777 prefetches all of them).
AHEAD_ROWS = 4
# A is read in place only when its row stride in bytes has no power-of-two factor above
# this, so a block's 32 rows fall on at least 16 of L1's 64 sets: at 2 and 4 KB (1024^3,
# 2048^3) they fell on 2 to 4 and the product ran 20-30% slower than on packed A, while
# 333 x 1000 x 777 (2000 bytes) ran about 5% faster without packing A (one-thread timings).
SPREAD_ROW_BYTES = 256
# The kernel status when Linux refuses tile data (runtime.py and cabi.py report it).
STATUS_NO_TILE_DATA = -2


TILE = NamedLLVMType("x86_amx")  # a tile register's value


def _round_up(b: ir.IRBuilder, value, multiple: int):
    return b.and_(b.add(value, ir.Constant(I64, multiple - 1)), ir.Constant(I64, -multiple))


class AmxEmitter(Bf16DotEmitter):
    """Bf16DotEmitter's packing with panels padded to whole tiles, and the AMX
    micro-kernel."""

    def __init__(self, cg, gemm: L.Gemm):
        super().__init__(cg, gemm)
        self.tile_depth = -(-gemm.tiles.kc // AMX_DEPTH) * AMX_DEPTH  # the deepest panel
        # A's row stride in elements when its tiles are read where A is (a_read_in_place).
        self.a_row_stride = a_read_in_place(gemm, cg.buffers)
        # A block: tile_depth / 32 slabs of mc rows x 32 depths (a_offset); read in place,
        # the same for the matrix's ragged last register block, then one slab for the depth
        # tail (`tail_slab`). gemm.py sizes the block as mc x a_stride.
        tail = AMX_DEPTH if self.a_row_stride is not None else 0
        self.a_stride = self.tile_depth + tail
        self.direct = None  # (pointer to A's block, rows read in place): pack_a sets it
        # Threads split the columns in single tiles, so a share may end half-way into a
        # panel; that panel, and C's last one where N % 32 <= 16, run on the kernel of one
        # column of tiles, which does half the products of the panel's.
        self.column_unit = TILE_COLUMNS
        g, nr = gemm, gemm.tiles.nr
        self.narrow_panels = 0 < g.n % nr <= TILE_COLUMNS or \
            splits_columns(g.m, g.n, gemm.tiles, g.threads)
        self.panel_at_a_time = packs_b_panel_at_a_time(gemm)
        self.b_block = None  # pack_b's (jc, nc, pc) when panel_at_a_time
        stride = bf16_row_stride(gemm, cg.buffers, gemm.b_elem, gemm.j, gemm.k)
        self.b_row_stride = stride if stride is not None and stride > 0 else None

    def rows(self, row_lo, row_hi, col_lo=0, col_hi=None) -> None:
        self.request_tile_data()
        super().rows(row_lo, row_hi, col_lo, col_hi)

    def request_tile_data(self) -> None:
        """Ask Linux for tile data once per loaded copy of the code (a flag in the module),
        before the first tile instruction: the JIT's process has asked already
        (gemm_bf16.bf16_kernel), but a library may be loaded by any program. A refusal
        ends the kernel with STATUS_NO_TILE_DATA instead of SIGILL."""
        b, module = self.b, self.cg.module
        name = "tilegen.gemm.amx.granted"
        granted = module.globals.get(name)
        if granted is None:
            granted = ir.GlobalVariable(module, I8, name)
            granted.initializer = ir.Constant(I8, 0)
            granted.linkage = "internal"
        asked = b.load_atomic(granted, "monotonic", 1)
        with b.if_then(b.icmp_unsigned("==", asked, ir.Constant(I8, 0)), likely=False):
            syscall = self.cg.declare("syscall", ir.FunctionType(I64, [I64], var_arg=True))
            status = b.call(syscall, [self.const(SYS_ARCH_PRCTL),
                                      self.const(ARCH_REQ_XCOMP_PERM),
                                      self.const(XFEATURE_XTILEDATA)])
            with b.if_then(b.icmp_signed("!=", status, self.const(0)), likely=False):
                self.cg.exit_with(self.const(STATUS_NO_TILE_DATA))
            b.store_atomic(ir.Constant(I8, 1), granted, "monotonic", 1)

    def panel_depth(self, kc):
        return _round_up(self.b, kc, AMX_DEPTH)

    def b_panel_elements(self) -> int:
        return self.tile_depth * (self.tiles.nr if self.panel_at_a_time else self.tiles.nc)

    def pack_b(self, packed, jc, nc, pc, kc) -> None:
        """The block's panels (pack_b_panels); with `panel_at_a_time` only where the block
        is: micro_tiles packs each panel before its kernel call."""
        if self.panel_at_a_time:
            self.b_block = (jc, nc, pc)
            return
        self.pack_b_panels(packed, jc, nc, pc, kc)

    def pack_b_panels(self, packed, jc, nc, pc, kc) -> None:
        """gemm_bf16's panels, then zero pairs from ceil(kc / 2) to the panel's depth."""
        super().pack_b(packed, jc, nc, pc, kc)
        b, nr = self.b, self.tiles.nr
        depth = self.panel_depth(kc)
        zero = ir.Constant(ir.VectorType(I16, 2 * LANES), None)

        def panel(jr, carried):
            def pair(p, carried):
                for part in range(self.vectors_per_row):
                    offset = b.add(b.add(b.mul(jr, depth), b.mul(p, self.const(2 * nr))),
                                   self.const(part * 2 * LANES))
                    b.store(zero, self.gep(packed, offset), align=2)
                return carried
            self.cg.loop(self.written_pairs(kc), b.ashr(depth, self.const(1)), 1, [], pair)
            return carried
        self.cg.loop(self.const(0), nc, nr, [], panel)

    def a_offset(self, row, k):
        """A packed in slabs of 32 depths, each mc rows of 64 bytes: a tile of A (16 rows of
        one slab) is 1 KB of contiguous memory, which tileloadd reads faster than 16 rows
        at a row stride (and a stride of a power of two would put the rows in two L1
        sets). k is a multiple of 16, so a 16-depth vector stays in its row."""
        b = self.b
        slab = b.mul(b.ashr(k, self.const(5)), self.const(self.tiles.mc * AMX_DEPTH))
        return b.add(slab, b.add(b.mul(row, self.const(AMX_DEPTH)),
                                 b.and_(k, self.const(AMX_DEPTH - 1))))

    def pack_a(self, packed, ic, mc, pc, kc) -> None:
        """The slabs of A's block; read in place, only what tiles of A cannot read where it
        is: the matrix's ragged last register block (its rows past M do not exist) and the
        depths past the last whole 32 (a tile row is 32 depths; past kc it must read
        zeros, not the next row)."""
        if self.a_row_stride is None:
            self.pack_a_slabs(packed, ic, mc, pc, kc)
            return
        b = self.b
        direct = self.direct_rows(ic, mc)
        self.direct = (self.a_pointer(ic, pc), direct)
        with b.if_then(b.icmp_signed("<", direct, mc)):
            self.pack_a_slabs(packed, b.add(ic, direct), b.sub(mc, direct), pc, kc)
        whole = b.and_(kc, self.const(-AMX_DEPTH))
        with b.if_then(b.icmp_signed("<", whole, kc)):
            self.pack_a_slabs(self.tail_slab(packed), ic, direct, b.add(pc, whole),
                              b.sub(kc, whole))

    def direct_rows(self, ic, mc):
        """The rows of the A block [ic, ic + mc) read in place: whole register blocks, the
        last one past mc too where A has those rows (they belong to the next thread's block
        or are never stored: the kernel stores only rows below its `rows`)."""
        b, mr = self.b, self.tiles.mr
        up = _round_up(b, mc, mr)
        exists = b.icmp_signed("<=", b.add(ic, up), self.const(self.g.m))
        return b.select(exists, up, b.and_(mc, self.const(-mr)))

    def tail_slab(self, packed):
        """Where the depth tail's slab (mc rows x 32 depths) of an A read in place goes."""
        return self.gep(packed, self.const(self.tiles.mc * self.tile_depth))

    def a_pointer(self, row, depth):
        """&A[row, depth] (the batch entry from the gemm's batch variables)."""
        return operand_pointer(self.cg, self.g.a_elem, {self.g.i: row, self.g.k: depth})

    def pack_a_slabs(self, packed, ic, mc, pc, kc) -> None:
        """gemm_bf16's rows (zeros from kc up to a multiple of 16), then zeros up to the next
        multiple of 32 where that is further."""
        super().pack_a(packed, ic, mc, pc, kc)
        b = self.b
        written = _round_up(b, kc, LANES)
        zero = ir.Constant(ir.VectorType(I16, LANES), None)
        with b.if_then(b.icmp_signed("<", written, self.panel_depth(kc))):
            def row(r, carried):
                b.store(zero, self.gep(packed, self.a_offset(r, written)), align=2)
                return carried
            self.cg.loop(self.const(0), mc, 1, [], row)

    def micro_kernel(self) -> ir.Function:
        return self.kernel(self.tiles.mr, self.tiles.nr)

    def kernel(self, rows: int, columns: int) -> ir.Function:
        """The micro-kernel of rows x columns (whole tiles) on this gemm's B panels."""
        return amx_micro_kernel(self.cg.module, rows, columns, self.tiles.nr)

    def micro_tiles(self, packed_a, packed_b, ic, mc, row_hi, jc, nc, kc, first,
                    col_end) -> None:
        """gemm.py's micro_tiles with one kernel call per B micro-panel for all of the A
        block's register blocks (amx_micro_kernel's `blocks`); with A read in place, one
        for the rows read there and one for a packed ragged last block. A panel of at most
        16 columns runs on kernels of one column of tiles (`narrow_panels`)."""
        g, b, mr = self.g, self.b, self.tiles.mr
        steps = self.micro_steps(kc)
        slabs = (self.const(TILE_BYTES), self.const(self.tiles.mc * TILE_BYTES), steps)

        def call(kernel, a, b_panel, row0, col0, blocks, layout, tail, ahead=None):
            ahead = ahead or (b_panel, self.const(0), self.const(0))  # nothing ahead
            b.call(kernel, [a, b_panel, steps, self.c_pointer(row0, col0), self.const(g.n),
                            b.sub(row_hi, row0), b.sub(col_end, col0), first, blocks,
                            *layout, tail, *ahead])

        def ragged(columns, a, b_panel, row0, col0):
            """The packed ragged last block: on one row of tiles when it has at most 16
            rows (333 = 10 x 32 + 13), half the products of a 32-row block."""
            if mr == AMX_TILE_ROWS:
                call(self.kernel(mr, columns), a, b_panel, row0, col0, self.const(1), slabs, a)
                return
            short = b.icmp_signed("<=", b.sub(row_hi, row0), self.const(AMX_TILE_ROWS))
            self.choose(short, (AMX_TILE_ROWS, mr), lambda rows: call(
                self.kernel(rows, columns), a, b_panel, row0, col0, self.const(1), slabs, a))

        def columns_of(columns, col0, b_panel, ahead):
            kernel = self.kernel(mr, columns)
            if self.a_row_stride is None:
                blocks = b.sdiv(_round_up(b, mc, mr), self.const(mr))
                call(kernel, packed_a, b_panel, ic, col0, blocks, slabs, packed_a, ahead)
                return
            a, direct = self.direct
            in_place = (self.const(2 * self.a_row_stride), self.const(TILE_BYTES),
                        b.ashr(kc, self.const(5)))
            call(kernel, a, b_panel, ic, col0, b.sdiv(direct, self.const(mr)), in_place,
                 self.tail_slab(packed_a), ahead)
            with b.if_then(b.icmp_signed("<", direct, mc)):
                ragged(columns, packed_a, b_panel, b.add(ic, direct), col0)

        def panel(jr, carried):
            col0 = b.add(jc, jr)
            ahead = None
            if self.panel_at_a_time:
                nr, (_, _, pc) = self.const(self.tiles.nr), self.b_block
                self.pack_b_panels(packed_b, col0, _smin(b, b.sub(nc, jr), nr), pc, kc)
                b_panel = packed_b
                ahead = self.next_panel_source(b.add(col0, nr), b.add(jc, nc), pc, kc)
            else:
                b_panel = self.gep(packed_b, self.b_panel_offset(jr, kc))
            if not self.narrow_panels:
                columns_of(self.tiles.nr, col0, b_panel, ahead)
                return carried
            narrow = b.icmp_signed("<=", b.sub(col_end, col0), self.const(TILE_COLUMNS))
            self.choose(narrow, (TILE_COLUMNS, self.tiles.nr),
                        lambda columns: columns_of(columns, col0, b_panel, ahead))
            return carried
        self.cg.loop(self.const(0), nc, self.tiles.nr, [], panel)

    def next_panel_source(self, column, block_end, pc, kc):
        """(pointer, row stride in bytes, rows) of what the next panel packs of a plain
        row-major B: kc rows of 64 bytes from B[pc, column], which the kernel call on this
        panel prefetches into L2; no rows past the block's last panel. None (nothing to
        prefetch) for other operands."""
        b, g = self.b, self.g
        if self.b_row_stride is None:
            return None
        inside = b.icmp_signed("<", column, block_end)
        pointer = operand_pointer(self.cg, g.b_elem,
                                  {g.k: pc, g.j: b.select(inside, column, self.const(0))})
        return (pointer, self.const(2 * self.b_row_stride), b.select(inside, kc, self.const(0)))

    def choose(self, condition, choices, emit) -> None:
        """emit(choices[0]) where `condition` holds, emit(choices[1]) where not, each in a
        scope of its own: a value one branch computes (the batch entry's offset in C) is no
        value in the other."""
        with self.b.if_else(condition) as (then, otherwise):
            for choice, branch in zip(choices, (then, otherwise), strict=True):
                with branch:
                    self.cg.push_scope()
                    emit(choice)
                    self.cg.pop_scope()

    def micro_steps(self, kc):
        return self.b.ashr(self.panel_depth(kc), self.const(5))  # steps of AMX_DEPTH


def amx_micro_kernel(module: ir.Module, mr: int, nr: int,
                     panel_columns: int | None = None) -> ir.Function:
    """`void mk(ptr a, ptr b, i64 steps, ptr c, i64 ldc, i64 rows, i64 cols, i1 first,
    i64 blocks, i64 row_bytes, i64 step_bytes, i64 main_steps, ptr tail, ptr ahead,
    i64 ahead_stride, i64 ahead_rows)`:
    micro_kernel.micro_kernel_function's signature (steps counting 32 depths) with `blocks`
    register blocks of mr rows one after the other: for q < blocks,
    C[q mr + r, j] (+)= sum over d < 32 steps of A[q mr + r, d] * B[d, j] for q mr + r < rows
    and j < cols (at most nr), B read from the first nr columns of its pair-interleaved
    panel of panel_columns (default nr; 32 for the 16-column kernel) and A's 32 depths of
    row r at step s from a + r row_bytes + s step_bytes for s < main_steps (slabs of packed
    rows: 64 and mc x 64 bytes; A in place: its row stride and 64), from the slab at `tail`
    (rows 64 bytes apart) for the steps after. Step s of block q also prefetches into L2
    rows AHEAD_ROWS (q steps + s).. (below ahead_rows) of a strip of 64 bytes at `ahead`,
    ahead_stride bytes a row (_prefetch_ahead).
    One call per B micro-panel and A block: `ldtilecfg` and `tilerelease` cost about as
    much as a block's 32 x 32 x 1024 products, so they are paid once per call."""
    panel_columns = panel_columns or nr
    name = f"tilegen.gemm.amx.{mr}x{nr}" + ("" if panel_columns == nr else
                                            f".of{panel_columns}")
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    row_tiles, column_tiles = mr // AMX_TILE_ROWS, nr // TILE_COLUMNS
    load = declare_intrinsic(module, "llvm.x86.tileloadd64.internal", TILE,
                             [I16, I16, PTR, I64])
    dot = declare_intrinsic(module, "llvm.x86.tdpbf16ps.internal", TILE,
                            [I16, I16, I16, TILE, TILE, TILE])
    store = declare_intrinsic(module, "llvm.x86.tilestored64.internal", ir.VoidType(),
                              [I16, I16, PTR, I64, TILE])
    zeros = _zero_rows(module)

    fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, PTR, I64, I64, I64, I1, I64,
                                           I64, I64, I64, PTR, PTR, I64, I64])
    function = ir.Function(module, fnty, name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    function.attributes.add("noinline")
    (a_first, bp, steps, c_first, ldc, rows_first, cols, first, blocks,
     row_bytes, step_bytes, main_steps, tail_first, ahead, ahead_stride,
     ahead_rows) = function.args
    for arg in (bp, c_first):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(function.append_basic_block("entry"))

    def const(value, typ=I64):
        return ir.Constant(typ, value)

    tile_rows, tile_bytes = const(AMX_TILE_ROWS, I16), const(TILE_BYTES, I16)
    tile_bytes_wide = const(TILE_BYTES)  # the row stride of a compact tile
    byte = I8
    stage = b.alloca(ir.ArrayType(F32, mr * nr), name="stage")
    stage.align = 64
    c_stride = b.mul(ldc, const(4))
    stage_stride = const(4 * nr)
    vector = ir.VectorType(F32, LANES)
    masks = _column_masks(module, b, cols, nr)

    # The loop over register blocks.
    before = b.block
    outer = function.append_basic_block("block")
    finished = function.append_basic_block("finished")
    b.cbranch(b.icmp_signed(">", blocks, const(0)), outer, finished)
    b.position_at_end(outer)
    block = b.phi(I64, name="q")
    block.add_incoming(const(0), before)
    a = element_pointer(b, a_first, b.mul(block, b.mul(row_bytes, const(mr))), byte)
    tail = element_pointer(b, tail_first, b.mul(block, const(mr * TILE_BYTES)), byte)
    c = element_pointer(b, c_first, b.mul(b.mul(block, const(mr)), c_stride), byte)
    rows = b.sub(rows_first, b.mul(block, const(mr)))
    whole = b.and_(b.icmp_signed(">=", rows, const(mr)), b.icmp_signed(">=", cols, const(nr)))

    def ragged_rows(move):
        """move(staged, in_c, mask, masked_load, masked_store) for each vector of the
        block's rows of C that exist (below `rows`), and its place in the staging block."""
        for r in range(mr):
            with b.if_then(b.icmp_signed("<", const(r), rows)):
                for part, (mask, masked_load, masked_store) in enumerate(masks):
                    staged = element_pointer(b, stage, const(r * nr + part * LANES), F32)
                    in_c = element_pointer(b, c, b.add(b.mul(const(r), ldc),
                                                       const(part * LANES)), F32)
                    move(staged, in_c, mask, masked_load, masked_store)

    def stage_in(staged, in_c, mask, masked_load, _masked_store):
        value = b.call(masked_load, [in_c, const(4, I32), mask, ir.Constant(vector, None)])
        b.store(value, staged, align=4)

    def stage_out(staged, in_c, mask, _masked_load, masked_store):
        b.call(masked_store, [b.load(staged, typ=vector, align=4), in_c, const(4, I32), mask])

    # A ragged block (not first) starts from C's values copied into the staging block.
    with b.if_then(b.and_(b.not_(whole), b.not_(first))):
        ragged_rows(stage_in)
    start = b.select(whole, c, stage)
    start_stride = b.select(whole, c_stride, stage_stride)
    start = b.select(first, zeros, start)
    start_stride = b.select(first, const(0), start_stride)

    def c_tile(base, stride, tr, tc):
        offset = b.add(b.mul(const(tr * AMX_TILE_ROWS), stride), const(tc * TILE_BYTES))
        return element_pointer(b, base, offset, byte)

    initial = [b.call(load, [tile_rows, tile_bytes, c_tile(start, start_stride, tr, tc),
                             start_stride])
               for tr in range(row_tiles) for tc in range(column_tiles)]

    # The depth loop: per 32 depths, row_tiles A tiles and column_tiles B tiles.
    entry = b.block
    loop = function.append_basic_block("depth")
    done = function.append_basic_block("store")
    b.cbranch(b.icmp_signed(">", steps, const(0)), loop, done)
    b.position_at_end(loop)
    step = b.phi(I64, name="step")
    step.add_incoming(const(0), entry)
    accumulators = []
    for value in initial:
        phi = b.phi(TILE)
        phi.add_incoming(value, entry)
        accumulators.append(phi)
    b_row_bytes = const(2 * 2 * panel_columns)  # one depth pair of the panel's columns
    in_main = b.icmp_signed("<", step, main_steps)
    a_step = b.select(in_main, element_pointer(b, a, b.mul(step, step_bytes), byte), tail)
    a_stride = b.select(in_main, row_bytes, tile_bytes_wide)
    a_tiles = [b.call(load, [tile_rows, tile_bytes, element_pointer(
        b, a_step, b.mul(a_stride, const(tr * AMX_TILE_ROWS)), byte), a_stride])
        for tr in range(row_tiles)]
    b_step = b.mul(step, const(AMX_DEPTH // 2 * 2 * 2 * panel_columns))  # 16 pairs a step
    b_tiles = [b.call(load, [tile_rows, tile_bytes, element_pointer(
        b, bp, b.add(b_step, const(tc * TILE_BYTES)), byte), b_row_bytes])
        for tc in range(column_tiles)]
    _prefetch(module, b, a, bp, b.add(step, const(PREFETCH_STEPS)), mr, nr, panel_columns,
              row_bytes, step_bytes)
    if PREFETCH_C:
        _prefetch_next_c(module, b, c, c_stride, step, mr, nr)
    _prefetch_ahead(module, b, ahead, ahead_stride, ahead_rows,
                    b.add(b.mul(block, steps), step))
    updated = [b.call(dot, [tile_rows, tile_bytes, tile_bytes,
                            accumulators[tr * column_tiles + tc], a_tiles[tr], b_tiles[tc]])
               for tr in range(row_tiles) for tc in range(column_tiles)]
    following = b.add(step, const(1), flags=("nsw",))
    latch = b.block
    step.add_incoming(following, latch)
    for phi, value in zip(accumulators, updated, strict=True):
        phi.add_incoming(value, latch)
    b.cbranch(b.icmp_signed("<", following, steps), loop, done)

    # Whole blocks go straight to C; ragged ones through the staging block, then under masks.
    b.position_at_end(done)
    finals = []
    for start_value, value in zip(initial, updated, strict=True):
        final = b.phi(TILE)
        final.add_incoming(start_value, entry)
        final.add_incoming(value, latch)
        finals.append(final)
    out = b.select(whole, c, stage)
    out_stride = b.select(whole, c_stride, stage_stride)
    for index, final in enumerate(finals):
        tr, tc = divmod(index, column_tiles)
        b.call(store, [tile_rows, tile_bytes, c_tile(out, out_stride, tr, tc), out_stride,
                       final])
    with b.if_then(b.not_(whole)):
        ragged_rows(stage_out)
    following_block = b.add(block, const(1))
    block.add_incoming(following_block, b.block)
    b.cbranch(b.icmp_signed("<", following_block, blocks), outer, finished)
    b.position_at_end(finished)
    b.ret_void()
    return function


def _prefetch_ahead(module, b, ahead, stride, rows, step) -> None:
    """Prefetch into L2 rows AHEAD_ROWS * step.. of the strip of B at `ahead` (`stride`
    bytes a row, `rows` rows of 64 bytes, each on one or two lines), the next panel's
    source, which the packing after this call then reads from L2 instead of L3. Rows past
    the end prefetch row 0 again: no branch in the depth loop."""
    prefetch = declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(),
                                 [PTR, I32, I32, I32])
    read, l2, data = (ir.Constant(I32, value) for value in (0, 2, 1))
    for line in range(AHEAD_ROWS):
        row = b.add(b.mul(step, ir.Constant(I64, AHEAD_ROWS)), ir.Constant(I64, line))
        row = b.select(b.icmp_signed("<", row, rows), row, ir.Constant(I64, 0))
        start = element_pointer(b, ahead, b.mul(row, stride), I8)
        for offset in (0, TILE_BYTES - 1):
            b.call(prefetch, [element_pointer(b, start, ir.Constant(I64, offset), I8), read,
                              l2, data])


def _prefetch_next_c(module, b, c, c_stride, step, mr: int, nr: int) -> None:
    """Prefetch for writing row `step % mr` of the next register block's C (nr f32, 2
    lines): over a block of mr steps or more, its whole C arrives before its loads and
    stores. Past the last block the lines may lie outside C; a prefetch never faults."""
    prefetch = declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(),
                                 [PTR, I32, I32, I32])
    write, keep, data = (ir.Constant(I32, value) for value in (1, 3, 1))
    row = b.add(b.and_(step, ir.Constant(I64, mr - 1)), ir.Constant(I64, mr))
    start = element_pointer(b, c, b.mul(row, c_stride), I8)
    for line in range(nr * 4 // 64):
        b.call(prefetch, [element_pointer(b, start, ir.Constant(I64, 64 * line), I8), write,
                          keep, data])


def _prefetch(module, b, a, bp, step, mr: int, nr: int, panel_columns: int, row_bytes,
              step_bytes) -> None:
    """Prefetch into L1 the A rows and B panel lines of depth step `step` (mr rows of 64
    bytes, row_bytes apart, and the first nr columns of 16 pairs of a panel of
    panel_columns: 32 contiguous lines for a 32-column kernel). The hardware prefetchers do not keep
    tileloadd fed from L2 (on this project's Xeon the 1024^3 product ran about 1.7x faster
    with these, in noisy one-thread timings); past the end of a panel or of A's whole
    steps they touch lines nobody reads, which a prefetch never faults on."""
    prefetch = declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(),
                                 [PTR, I32, I32, I32])
    read, keep, data = (ir.Constant(I32, value) for value in (0, 3, 1))
    a_step = element_pointer(b, a, b.mul(step, step_bytes), I8)
    for line in range(mr):  # one 64-byte row of the step per line
        b.call(prefetch, [element_pointer(b, a_step, b.mul(row_bytes, ir.Constant(I64, line)),
                                          I8), read, keep, data])
    pair_bytes = 2 * 2 * panel_columns
    b_step = b.mul(step, ir.Constant(I64, AMX_DEPTH // 2 * pair_bytes))
    for pair in range(AMX_DEPTH // 2):
        for line in range(2 * 2 * nr // 64):
            offset = ir.Constant(I64, pair * pair_bytes + 64 * line)
            b.call(prefetch, [element_pointer(b, bp, b.add(b_step, offset), I8), read, keep,
                              data])


def _column_masks(module, b, cols, nr):
    """Per vector of a row of nr f32: (lanes below cols, masked load, masked store)."""
    vector = ir.VectorType(F32, LANES)
    mask_type = ir.VectorType(I1, LANES)
    masked_load = declare_intrinsic(module, "llvm.masked.load.v16f32.p0", vector,
                                    [PTR, I32, mask_type, vector])
    masked_store = declare_intrinsic(module, "llvm.masked.store.v16f32.p0", ir.VoidType(),
                                     [vector, PTR, I32, mask_type])
    steps = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
    return [(b.icmp_signed("<", b.add(splat(b, ir.Constant(I64, part * LANES), LANES), steps),
                           splat(b, cols, LANES)), masked_load, masked_store)
            for part in range(nr // LANES)]


def _zero_rows(module: ir.Module) -> ir.GlobalVariable:
    """128 zero bytes: the first depth block's accumulators load from here with a row
    stride of 0 (the second column of tiles starts 64 bytes in)."""
    name = "tilegen.gemm.amx.zeros"
    found = module.globals.get(name)
    if found is not None:
        return found
    zeros = ir.GlobalVariable(module, ir.ArrayType(I8, 2 * TILE_BYTES), name)
    zeros.initializer = ir.Constant(ir.ArrayType(I8, 2 * TILE_BYTES), None)
    zeros.global_constant = True
    zeros.linkage = "internal"
    zeros.align = 64
    return zeros


def packs_b_panel_at_a_time(gemm: L.Gemm) -> bool:
    """Whether each B panel is packed right before its kernel call (into one panel's
    space, the call prefetching the next panel's part of a plain row-major B into L2)
    instead of the whole B block before the first: with one row block (amx_tiles takes
    all of M when A fits half of L2) of enough register blocks that one call's depth
    steps prefetch all kc rows of the next panel (333 x 1000 x 777: 10 blocks x 32 steps
    x AHEAD_ROWS >= 1000). Smaller products keep packing B whole, along its rows."""
    tiles = gemm.tiles
    steps = -(-tiles.kc // AMX_DEPTH)
    return gemm.m <= tiles.mc and gemm.m // tiles.mr * steps * AHEAD_ROWS >= tiles.kc


def a_read_in_place(gemm: L.Gemm, buffers) -> int | None:
    """A's row stride in elements when the kernel reads A's tiles where A is instead of
    packing them: A is a plain load of a bf16 buffer, contiguous along k, its rows a
    positive stride apart (an affine index in i, k and the batch variables). None
    otherwise: a cast, computed or transposed operand is packed, its element expression
    evaluated while packing."""
    row_stride = bf16_row_stride(gemm, buffers, gemm.a_elem, gemm.k, gemm.i)
    if row_stride is None or row_stride <= 0:
        return None
    row_bytes = 2 * row_stride
    if row_bytes & -row_bytes > SPREAD_ROW_BYTES:
        return None
    return row_stride


def bf16_emitter(cg, gemm: L.Gemm):
    """The emitter of a bf16 gemm: AMX for a block of whole tiles where gemm_bf16.amx_usable
    says so (the lowering picks such blocks only when bf16_kernel chose AMX; a .loops file
    may have them anywhere), else `vdpbf16ps`."""
    if is_amx_block(gemm.tiles) and amx_usable(cg.target)[0]:
        return AmxEmitter(cg, gemm)
    return Bf16DotEmitter(cg, gemm)


PACKED_EMITTERS[L.BF16_STORAGE] = bf16_emitter
