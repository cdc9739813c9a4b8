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
prefetches the next panel's part of B into L2 (`packs_b_panel_at_a_time`); when such a
product is one depth block deep and its threads split the columns, they take its panels
from a shared count, not fixed shares (`hands_out_panels`, `AmxEmitter.panels_from`).
Padding depths are zero in both A and B: zero times anything finite is 0, and packing never
reads past the operands, so no Inf or NaN of uninitialised memory meets a zero.

A row-major bf16 A (a plain load, contiguous along k: `a_read_in_place`) is not packed:
tileloadd reads its tiles where it is, 16 rows at A's row stride, for every whole 32
depths; only the depth tail (kc % 32 depths, zero-padded to a slab of 32) and the
matrix's ragged last register block (whose rows past M do not exist) are packed as above.
That saves the packing's pass over A (about 12% of a one-thread 333 x 1000 x 777) where
the rows spread over L1's sets; rows 2 or 4 KB apart (K = 1024, 2048) fall on 2 to 4 sets
and are packed. Such an A's slabs (and the parts of one read in place that are packed)
are copied as bits, a 64-byte row of a slab per load and store (`copy_a_slabs`); other
operands (casts, fused producers, transposed) go through gemm_bf16's f32 packing.
(Reading A in place at K = 2048 was tried again with the packed flavour's runs and
`tileloaddt1`, in a C model of the kernel: 15 ns a `tdpbf16ps` against 13 on packed slabs
with A on a cache line, 27-29 ns with A 16 or 32 bytes past one, as NumPy's arrays are.)

The micro-kernel (tilegen/amx_kernel.py) keeps 2 x 2 accumulator tiles (C, 32 x 32 f32)
in tile registers across its depth loop (x86_amx phis) and loads 2 tiles of A and 2 of B
per 32 depths: all 8 tile registers; on packed A it goes over the call's register blocks
in runs of up to 16 depth steps, so B's part of a run stays in L1. A B panel of at most 16
columns (C's last where N % 32 <= 16, or the last of a thread's share: threads split
columns in tiles of 16, `column_unit`) runs on the kernel of one column of tiles, and a
ragged last block of at most 16 rows on one row of tiles. Each register block of the A
block has a compact slot of 32 x 32 f32 past the A block's slabs (`kept_slots`): between
runs its accumulators wait there, not in C (whose rows 8 KB apart at N = 2048 fall on
one L1 set pair), so a call reads C at most once, in its first run, and writes it once,
in its last. The accumulators start from a zero constant in the first depth block, from C
itself when the block is whole, and from the slot for the ragged blocks at the edges of
C, whose C is copied in and out under row and column masks.

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
from .amx_kernel import AHEAD_ROWS, TILE_BYTES, TILE_COLUMNS, amx_micro_kernel
from .gemm import PACKED_EMITTERS, batches_in_parallel, column_share_widths
from .gemm_bf16 import (
    AMX_DEPTH,
    AMX_TILE_ROWS,
    LANES,
    Bf16DotEmitter,
    amx_usable,
    bf16_row_stride,
    is_amx_block,
    operand_pointer,
    rows_spread,
)
from .gemm_tiles import splits_columns
from .micro_kernel import I64, PTR, declare_intrinsic, element_pointer, smin
from .target import ARCH_REQ_XCOMP_PERM, SYS_ARCH_PRCTL, XFEATURE_XTILEDATA

I1, I8, I16, I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
# Rows of A that copy_a_slabs copies side by side, slab by slab.
COPY_ROWS = 4
# The kernel status when Linux refuses tile data (runtime.py and cabi.py report it).
STATUS_NO_TILE_DATA = -2




def _round_up(b: ir.IRBuilder, value, multiple: int):
    return b.and_(b.add(value, ir.Constant(I64, multiple - 1)), ir.Constant(I64, -multiple))


class AmxEmitter(Bf16DotEmitter):
    """Bf16DotEmitter's packing with panels padded to whole tiles, and the AMX
    micro-kernel."""

    def __init__(self, cg, gemm: L.Gemm):
        super().__init__(cg, gemm)
        self.dot_a_stride = None  # the dot kernel's A in place; AMX reads A its own way
        self.tile_depth = -(-gemm.tiles.kc // AMX_DEPTH) * AMX_DEPTH  # the deepest panel
        # A's row stride in elements when its tiles are read where A is (a_read_in_place).
        self.a_row_stride = a_read_in_place(gemm, cg.buffers)
        # A block: tile_depth / 32 slabs of mc rows x 32 depths (a_offset); read in place,
        # the same for the matrix's ragged last register block, then one slab for the depth
        # tail (`tail_slab`). gemm.py sizes the block as mc x a_stride.
        # Past both, mc rows of nr f32 (2 nr bf16 each): the kernel's compact C slots
        # (`kept_slots`).
        tail = AMX_DEPTH if self.a_row_stride is not None else 0
        self.a_stride = self.tile_depth + tail + 2 * gemm.tiles.nr
        self.direct = None  # (pointer to A's block, rows read in place): pack_a sets it
        # Threads split the columns in single tiles, so a share may end half-way into a
        # panel; that panel, and C's last one where N % 32 <= 16, run on the kernel of one
        # column of tiles, which does half the products of the panel's.
        self.column_unit = TILE_COLUMNS
        self.narrow_panels = has_narrow_panels(gemm)
        self.panel_at_a_time = packs_b_panel_at_a_time(gemm)
        self.b_block = None  # pack_b's (jc, nc, pc) when panel_at_a_time
        stride = bf16_row_stride(gemm, cg.buffers, gemm.b_elem, gemm.j, gemm.k)
        self.b_row_stride = stride if stride is not None and stride > 0 else None
        # A's row stride in elements when it is a plain row-major bf16 load, read in place
        # or not: its slabs are then packed by copying 64-byte rows (copy_a_slabs).
        stride = bf16_row_stride(gemm, cg.buffers, gemm.a_elem, gemm.k, gemm.i)
        self.a_plain_stride = stride if stride is not None and stride > 0 else None

    def rows(self, row_lo, row_hi, col_lo=0, col_hi=None) -> None:
        self.request_tile_data()
        super().rows(row_lo, row_hi, col_lo, col_hi)

    def hands_out_panels(self) -> bool:
        return hands_out_panels(self.g)

    def panels_from(self, counter) -> None:
        """All of C, one B micro-panel at a time, each thread claiming the index of its
        next panel from `counter` (an i64 every thread of the region adds to) while it
        works on the current one, so the call on this panel can prefetch the next one's
        part of B (next_panel_source) as with a fixed share. The product is one row block
        and one depth block (hands_out_panels), so A is packed (or set up to be read in
        place) once per thread, as `rows` does for a share."""
        self.request_tile_data()
        with self.packed_panels() as (packed_a, packed_b):
            self._panels_from(counter, packed_a, packed_b)

    def _panels_from(self, counter, packed_a, packed_b) -> None:
        t, g, b = self.tiles, self.g, self.b
        zero, rows, columns = self.const(0), self.const(g.m), self.const(g.n)
        kc = self.const(g.k_extent)
        self.whole_depth_block = kc if g.k_extent % self.lanes == 0 else None
        self.pack_a(packed_a, zero, rows, zero, kc)

        panels = self.const(-(-g.n // t.nr))
        one = self.const(1)
        from_back = b.trunc(b.and_(self.cg.thread_number, one), I1)
        front, back = (element_pointer(b, counter, self.const(index), I64) for index in (1, 2))

        def claim():
            """A ticket from the shared count, then the next panel from the front (even
            threads) or the back (odd threads): tickets below the panel count give
            distinct panels, and two threads work at opposite ends of C (panels handed
            out in turn put two threads' stores on every panel boundary's lines, where
            C's rows are not whole lines, and ran 20-25% slower)."""
            ticket = b.atomic_rmw("add", counter, one, "monotonic")
            taken = b.select(from_back, back, front)
            place = b.atomic_rmw("add", taken, one, "monotonic")
            index = b.select(from_back, b.sub(b.sub(panels, one), place), place)
            return b.select(b.icmp_signed("<", ticket, panels), index, panels)
        before = b.block
        test = b.append_basic_block("panels.test")
        work = b.append_basic_block("panels.work")
        done = b.append_basic_block("panels.done")
        first_claim = claim()
        b.branch(test)
        b.position_at_end(test)
        panel = b.phi(I64, name="panel")
        panel.add_incoming(first_claim, before)
        b.cbranch(b.icmp_signed("<", panel, panels), work, done)
        b.position_at_end(work)
        following = claim()
        column = b.mul(panel, self.const(t.nr))
        width = smin(b, self.const(t.nr), b.sub(columns, column))
        self.pack_b(packed_b, column, width, zero, kc)
        self.micro_tiles(packed_a, packed_b, zero, rows, rows, column, width, kc,
                         ir.Constant(I1, 1), columns,
                         next_column=b.mul(following, self.const(t.nr)))
        panel.add_incoming(following, b.block)
        b.branch(test)
        b.position_at_end(done)

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
        if ragged_rows(self.g):
            with b.if_then(b.icmp_signed("<", direct, mc)):
                self.pack_a_slabs(packed, b.add(ic, direct), b.sub(mc, direct), pc, kc)
        if self.depth_tails():
            whole = b.and_(kc, self.const(-AMX_DEPTH))
            with b.if_then(b.icmp_signed("<", whole, kc)):
                self.pack_a_slabs(self.tail_slab(packed), ic, direct, b.add(pc, whole),
                                  b.sub(kc, whole))

    def depth_tails(self) -> bool:
        """Whether a depth block can end past a multiple of 32 (K or the depth block not
        whole tiles deep)."""
        return self.g.k_extent % AMX_DEPTH != 0 or self.tiles.kc % AMX_DEPTH != 0

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

    def kept_slots(self, packed):
        """The kernel's scratch for C (amx_micro_kernel's `kept`: mr x nr f32 per register
        block of the A block, 64-byte aligned as mc is whole blocks): after A's slabs and
        tail slab in the A block."""
        rows = self.a_stride - 2 * self.tiles.nr
        return self.gep(packed, self.const(self.tiles.mc * rows))

    def a_pointer(self, row, depth):
        """&A[row, depth] (the batch entry from the gemm's batch variables)."""
        return operand_pointer(self.cg, self.g.a_elem, {self.g.i: row, self.g.k: depth})

    def pack_a_slabs(self, packed, ic, mc, pc, kc) -> None:
        """gemm_bf16's rows (zeros from kc up to a multiple of 16), then zeros up to the next
        multiple of 32 where that is further; a plain row-major A by copy_a_slabs."""
        if self.a_plain_stride is not None:
            self.copy_a_slabs(packed, ic, mc, pc, kc)
            return
        super().pack_a(packed, ic, mc, pc, kc)
        b = self.b
        written = _round_up(b, kc, LANES)
        zero = ir.Constant(ir.VectorType(I16, LANES), None)
        with b.if_then(b.icmp_signed("<", written, self.panel_depth(kc))):
            def row(r, carried):
                b.store(zero, self.gep(packed, self.a_offset(r, written)), align=2)
                return carried
            self.cg.loop(self.const(0), mc, 1, [], row)

    def copy_a_slabs(self, packed, ic, mc, pc, kc) -> None:
        """The slabs of a plain row-major bf16 A as its bits: per group of COPY_ROWS rows and
        slab, each row's 32 depths as one 64-byte load (masked past kc: zeros up to the
        slab's end) and one aligned store. gemm_bf16's rows went through f32, 32 bytes at
        a time, a row's stores 16 KB apart; a C model of the copy (2048 x 2048 in blocks of
        256 x 1024) ran 0.53 ms that way and 0.38 ms this way."""
        b = self.b
        lanes = 2 * LANES  # bf16 in 64 bytes
        vector = ir.VectorType(I16, lanes)
        masked_load = declare_intrinsic(self.cg.module, "llvm.masked.load.v32i16.p0", vector,
                                        [PTR, I32, ir.VectorType(I1, lanes), vector])
        whole = b.ashr(kc, self.const(5))  # slabs whose 32 depths are all inside kc
        steps = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
        inside = b.icmp_signed("<", steps, self.cg.splat(
            b.and_(kc, self.const(AMX_DEPTH - 1)), lanes))  # the partial slab's depths

        def group(r0, carried):
            rows = [b.add(r0, self.const(q)) for q in range(COPY_ROWS)]
            sources = [self.a_pointer(b.add(ic, row), pc) for row in rows]

            def slab(s, carried, masked=False):
                depth = b.shl(s, self.const(5))
                for row, source in zip(rows, sources, strict=True):
                    with b.if_then(b.icmp_signed("<", row, mc)):
                        at = self.gep(source, depth)
                        value = b.call(masked_load, [at, ir.Constant(I32, 2), inside,
                                                     ir.Constant(vector, None)]) \
                            if masked else b.load(at, typ=vector, align=2)
                        b.store(value, self.gep(packed, self.a_offset(row, depth)), align=64)
                return carried
            self.cg.loop(self.const(0), whole, 1, [], slab)
            with b.if_then(b.icmp_signed("<", b.shl(whole, self.const(5)), kc)):
                slab(whole, [], masked=True)
            return carried
        self.cg.loop(self.const(0), mc, COPY_ROWS, [], group)

    def micro_kernel(self) -> ir.Function:
        return self.kernel(self.tiles.mr, self.tiles.nr)

    def kernel(self, rows: int, columns: int, a_in_place: bool = False) -> ir.Function:
        """The micro-kernel of rows x columns (whole tiles) on this gemm's B panels, in the
        flavour for A in packed slabs or read in place (amx_kernel.py)."""
        return amx_micro_kernel(self.cg.module, rows, columns, self.tiles.nr, a_in_place)

    def micro_tiles(self, packed_a, packed_b, ic, mc, row_hi, jc, nc, kc, first,
                    col_end, next_column=None) -> None:
        """gemm.py's micro_tiles with one kernel call per B micro-panel for all of the A
        block's register blocks (amx_micro_kernel's `blocks`); with A read in place, one
        for the rows read there and one for a packed ragged last block. A panel of at most
        16 columns runs on kernels of one column of tiles (`narrow_panels`). With
        `next_column` (panels_from), the call prefetches the B of the thread's next panel,
        which starts there, instead of the block's next one."""
        g, b, mr = self.g, self.b, self.tiles.mr
        steps = self.micro_steps(kc)
        slabs = (self.const(TILE_BYTES), self.const(self.tiles.mc * TILE_BYTES), steps)

        def call(kernel, a, b_panel, row0, col0, blocks, layout, tail, ahead=None):
            ahead = ahead or (b_panel, self.const(0), self.const(0))  # nothing ahead
            b.call(kernel, [a, b_panel, steps, self.c_pointer(row0, col0), self.const(g.n),
                            b.sub(row_hi, row0), b.sub(col_end, col0), first, blocks,
                            *layout, tail, *ahead, self.kept_slots(packed_a)])

        def ragged(columns, a, b_panel, row0, col0):
            """The packed ragged last block (ragged_rows of M): on one row of tiles when
            it has at most 16 rows (333 = 10 x 32 + 13), half the products of a 32-row
            block."""
            rows = AMX_TILE_ROWS if ragged_rows(g) <= AMX_TILE_ROWS else mr
            call(self.kernel(rows, columns), a, b_panel, row0, col0, self.const(1), slabs, a)

        def columns_of(columns, col0, b_panel, ahead):
            if self.a_row_stride is None:
                blocks = b.sdiv(_round_up(b, mc, mr), self.const(mr))
                call(self.kernel(mr, columns), packed_a, b_panel, ic, col0, blocks, slabs,
                     packed_a, ahead)
                return
            kernel = self.kernel(mr, columns, a_in_place=True)
            a, direct = self.direct
            in_place = (self.const(2 * self.a_row_stride), self.const(TILE_BYTES),
                        b.ashr(kc, self.const(5)))
            call(kernel, a, b_panel, ic, col0, b.sdiv(direct, self.const(mr)), in_place,
                 self.tail_slab(packed_a), ahead)
            if ragged_rows(g):
                with b.if_then(b.icmp_signed("<", direct, mc)):
                    ragged(columns, packed_a, b_panel, b.add(ic, direct), col0)

        def panel(jr, carried):
            col0 = b.add(jc, jr)
            ahead = None
            if self.panel_at_a_time:
                nr, (_, _, pc) = self.const(self.tiles.nr), self.b_block
                self.pack_b_panels(packed_b, col0, smin(b, b.sub(nc, jr), nr), pc, kc)
                b_panel = packed_b
                if next_column is None:  # the block's next panel
                    ahead = self.next_panel_source(b.add(col0, nr), b.add(jc, nc), pc, kc)
                else:  # the thread's next panel (panels_from)
                    ahead = self.next_panel_source(next_column, self.const(g.n), pc, kc)
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


def has_narrow_panels(gemm: L.Gemm) -> bool:
    """Whether a B panel of the product can have at most 16 columns (and run on the
    kernels of one column of tiles): the last of a thread's column range (all N, or its
    share of a column split) when the range's width is 1..16 past a multiple of 32. The
    kernels of a flavour the product never runs are not emitted: each cost LLVM 20-40 ms
    to optimise and compile."""
    nr = gemm.tiles.nr
    widths = {gemm.n} if hands_out_panels(gemm) else column_share_widths(gemm, TILE_COLUMNS)
    return any(0 < width % nr <= TILE_COLUMNS for width in widths)


def hands_out_panels(gemm: L.Gemm) -> bool:
    """Whether the threads that split the columns take B micro-panels one at a time from a
    shared counter (AmxEmitter.panels_from, gemm._run_panels_in_parallel): a product of
    one row block and one depth block that packs B a panel at a time
    (packs_b_panel_at_a_time), where each panel's work is the same whichever thread does
    it and no packing of A is repeated. Panels of at most 16 columns are then only C's
    last (N % 32 <= 16)."""
    return not batches_in_parallel(gemm) and \
        splits_columns(gemm.m, gemm.n, gemm.tiles, gemm.threads) and \
        packs_b_panel_at_a_time(gemm) and gemm.k_extent <= gemm.tiles.kc


def ragged_rows(gemm: L.Gemm) -> int:
    """The rows of the matrix's ragged last register block (M mod mr; 0 when every block
    is whole), the only block a row block of A read in place packs (direct_rows: row blocks
    start at multiples of mr and end at one or at M)."""
    return gemm.m % gemm.tiles.mr


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
    return row_stride if rows_spread(2 * row_stride) else None


def bf16_emitter(cg, gemm: L.Gemm):
    """The emitter of a bf16 gemm: AMX for a block of whole tiles where gemm_bf16.amx_usable
    says so (the lowering picks such blocks only when bf16_kernel chose AMX; a .loops file
    may have them anywhere), else `vdpbf16ps`."""
    if is_amx_block(gemm.tiles) and amx_usable(cg.target)[0]:
        return AmxEmitter(cg, gemm)
    return Bf16DotEmitter(cg, gemm)


PACKED_EMITTERS[L.BF16_STORAGE] = bf16_emitter
