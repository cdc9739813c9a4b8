"""Code generation for `Gemm`: BLIS-style packed matrix multiply in LLVM IR.

    for jc in 0..N by nc:                      B panel (kc x nc) is reused by every A block
      for pc in 0..K by kc:
        pack B[pc:pc+kc, jc:jc+nc] -> Bp       [nc/nr][kc][nr], zero-padded past N
        for ic in rows by mc:                  rows of this thread
          pack A[ic:ic+mc, pc:pc+kc] -> Ap     [mc][kc]: rows copied, static row stride
          for jr in 0..nc by nr:
            for ir in 0..mc by mr:             micro-kernel: mr x nr accumulators in
              C[ir.., jr..] (+)= Ap[ir..] Bp[jr..]     registers, broadcast A, vector B

A and B are read through the operands' element expressions, so transposed, broadcast or
reshaped operands are packed straight from their source buffers, and elementwise
producers are computed while packing. Rows are split across threads; each thread packs
into its own buffers. The micro-kernel's k loop keeps mr x (nr / lanes) vector
accumulators as loop-carried values, which LLVM allocates to registers (24 zmm for
12 x 32 floats) with the A broadcasts folded into the FMAs. Vector widths, the register
block and the depth block come from the `Target`.

For fp32/fp64 the loops above are one function per micro-kernel shared by every product of
a module, with the sizes and bounds as arguments, and each product only packs
(tilegen/gemm_driver.py; `_GemmEmitter.shared_driver`); the 16-bit emitters subclassing
`_GemmEmitter` generate the loops inline with each product.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager

from llvmlite import ir

from . import gemm_driver
from . import loopir as L
from .codegen_values import SCALAR_LLVM, Lane, Val, bind_flat_index, int_constant, zeros
from .micro_kernel import (
    I64,
    PTR,
    cache_line_aligned,
    element_pointer,
    micro_kernel_function,
    smin,
)
from .schedule import strided_load
from .target import Target

# Products of at least this many multiply-adds become a packed gemm (lower.gemm_pays);
# from GEMM_PARALLEL_WORK flops on they (and fused attention) run on every thread.
GEMM_MIN_WORK = 1 << 16
GEMM_PARALLEL_WORK = 1 << 21
# The register block leaves a quarter of the vector registers for the B row and the A
# broadcasts, and takes at most this many rows.
MAX_MR = 14
# Depth blocks are a power of two up to this: past it the A block (mc x kc) outgrows L2.
MAX_KC = 512


def supports(dtype: str) -> bool:
    """Whether the packed gemm handles `dtype` (the float types computed in their own
    type)."""
    return dtype in L.FLOAT_TYPES


def default_tiles(dtype: str, m: int, n: int, k: int, target: Target) -> L.GemmTiles:
    """The deterministic default tiling (autotuning may pick another candidate)."""
    lanes = target.lanes(dtype)
    nr = 2 * lanes if n > lanes else lanes
    mr = min(MAX_MR, target.vector_registers * 3 // 4 // (nr // lanes))
    kc = min(depth_block(target), k)
    mc = max(mr, min(96 // mr * mr, -(-m // mr) * mr))  # whole register blocks
    nc = column_block(n, nr)
    return L.GemmTiles(mr, nr, kc, mc, nc)


def depth_block(target: Target) -> int:
    """The depth block kc: the largest power of two (at most MAX_KC) whose B micro-panel of
    two vectors per depth takes at most twice L1 (512 for 32 or 48 KB and 64-byte vectors):
    it streams from L2 with room to spare, while each depth block loads and stores all of C
    (figures in docs/architecture.md, "Depth blocks")."""
    per_depth = 2 * target.vector_bits // 8
    kc = 1
    while 2 * kc <= min(MAX_KC, target.l1d_bytes * 2 // per_depth):
        kc *= 2
    return kc


def column_block(n: int, nr: int, limit: int = 2048) -> int:
    """The B panel width: whole micro-panels (a multiple of nr), at most about `limit`."""
    return min(-(-n // nr), max(1, limit // nr)) * nr


def splits_columns(m: int, n: int, tiles: L.GemmTiles, threads: int) -> bool:
    """Whether one batch entry's threads split the columns (each packing all of A once per
    column block of its part, and its part of B) rather than the rows (each packing its
    rows of A once per column block of all N, and all of B): whichever packs fewer
    elements per thread, the rows on a tie. With one column block that is columns when
    n > m; with several (AMX panels of 512 columns: 1024^3 on two threads packed 1.5 M
    elements a thread by rows, 1 M by columns, and ran ~15% faster) it can be columns."""
    if threads <= 1 or -(-n // tiles.nr) < threads:
        return False
    share = -(-n // threads)
    # Elements per thread times `threads` (the depth k is common to both and left out).
    by_rows = -(-n // tiles.nc) * m + n * threads
    by_columns = -(-share // tiles.nc) * m * threads + n
    return by_columns < by_rows


def operand_evaluations(m: int, n: int, batches: int, tiles: L.GemmTiles,
                        threads: int) -> tuple[int, int]:
    """How many times packing evaluates each element of A and of B (at most): A once per
    column block of each thread that packs it, B once per thread that packs it. An operand
    computed while packing (a fused producer) costs that many evaluations."""
    def blocks(columns: int) -> int:
        return -(-columns // tiles.nc)
    row_units = -(-m // tiles.mr)
    if threads > 1 and batches > 1 and batches * row_units >= 2:
        # (entry, row block) pairs split in contiguous runs: an entry's B is packed by
        # two threads at most, and by one when every thread has several entries.
        return blocks(n), 1 if batches >= 2 * threads else threads
    if splits_columns(m, n, tiles, threads):
        return threads * blocks(-(-n // threads)), 1
    return blocks(n), min(threads, row_units)


def emit_gemm(cg, gemm: L.Gemm) -> None:
    """Emit `gemm` into the kernel being generated by `cg` (a KernelCodegen)."""
    extents = gemm.batch_extents
    batches = math.prod(extents)
    row_units = -(-gemm.m // gemm.tiles.mr)
    if batches_in_parallel(gemm):
        _run_batches_in_parallel(cg, gemm, batches, row_units)
        return

    def run_batch(position: int, batch_values: list) -> None:
        if position == len(extents):
            _run_rows_in_parallel(cg, gemm, batch_values)
            return

        def body(index, carried):
            run_batch(position + 1, batch_values + [index])
            return carried
        cg.loop(0, extents[position], 1, [], body)

    run_batch(0, [])


def batches_in_parallel(gemm: L.Gemm) -> bool:
    """Whether emit_gemm's threads split the (batch entry, block of mr rows) pairs (each
    entry's columns whole) rather than each entry's rows or columns."""
    batches = math.prod(gemm.batch_extents)
    return gemm.threads > 1 and batches > 1 and batches * -(-gemm.m // gemm.tiles.mr) >= 2


def column_share_widths(gemm: L.Gemm, unit: int) -> set[int]:
    """The widths of the column ranges one `rows` call of `gemm` covers: all N, or where
    its threads split the columns (in units of `unit`, the emitter's column_unit) each
    share for every thread count the region can run on (1 to gemm.threads: the runtime
    caps it, and OpenMP may give fewer), thread t of c taking units [t u / c,
    (t + 1) u / c) of u (parallel.OutlinedCodegen.run_chunk)."""
    if batches_in_parallel(gemm) or not splits_columns(gemm.m, gemm.n, gemm.tiles,
                                                       gemm.threads):
        return {gemm.n}
    units = -(-gemm.n // unit)
    return {min((t + 1) * units // count * unit, gemm.n) - t * units // count * unit
            for count in range(1, gemm.threads + 1) for t in range(count)}


def _run_batches_in_parallel(cg, gemm: L.Gemm, batches: int, row_units: int) -> None:
    """One parallel region for the whole batch (not one per batch entry): the threads split
    the (batch entry, block of mr rows) pairs in contiguous runs, so each packs B only for
    the entries it works on and the fork/join is paid once."""
    mr = gemm.tiles.mr

    def body(child, lo, hi):
        b = child.b
        units = ir.Constant(I64, row_units)
        first = b.sdiv(lo, units)
        last = b.sdiv(b.add(hi, ir.Constant(I64, row_units - 1)), units)

        def entry(flat, carried):
            base = b.mul(flat, units)
            start = _smax(b, b.sub(lo, base), ir.Constant(I64, 0))
            stop = smin(b, b.sub(hi, base), units)
            child.push_scope()
            bind_flat_index(b, child.env[-1], gemm.batch, gemm.batch_extents, flat)
            emitter = _emitter(child, gemm)
            emitter.rows(b.mul(start, ir.Constant(I64, mr)), _row_end(child, stop, mr, gemm.m))
            _glue_region(child, emitter)
            child.pop_scope()
            return carried
        child.loop(first, last, 1, [], entry)
    cg.parallel(batches * row_units, gemm.threads, body)


def _run_rows_in_parallel(cg, gemm: L.Gemm, batch_values: list) -> None:
    mr = gemm.tiles.mr
    row_units = -(-gemm.m // mr)
    # The columns split in the emitter's units (nr, or one AMX tile of 16: 777 columns as
    # 384 + 393 instead of 416 + 361).
    unit = _emitter(cg, gemm).column_unit
    column_units = -(-gemm.n // unit)

    def column_body(child, lo, hi):
        b = child.b
        emitter = _emitter(child, gemm)
        emitter.rows(ir.Constant(I64, 0), ir.Constant(I64, gemm.m),
                     b.mul(lo, ir.Constant(I64, unit)),
                     smin(b, b.mul(hi, ir.Constant(I64, unit)), ir.Constant(I64, gemm.n)))
        _glue_region(child, emitter)

    def row_body(child, lo, hi):
        emitter = _emitter(child, gemm)
        emitter.rows(child.b.mul(lo, ir.Constant(I64, mr)), _row_end(child, hi, mr, gemm.m))
        _glue_region(child, emitter)

    # The batch indices reach the threads through the captured environment.
    cg.push_scope()
    for var, value in zip(gemm.batch, batch_values, strict=True):
        cg.env[-1][var.name] = _val(value)
    if splits_columns(gemm.m, gemm.n, gemm.tiles, gemm.threads):
        # Wider than tall (x @ lm_head), or square over several column blocks: split the
        # columns, so each thread packs only its part of B instead of all of it.
        if _emitter(cg, gemm).hands_out_panels():
            _run_panels_in_parallel(cg, gemm)
        else:
            cg.parallel(column_units, gemm.threads, column_body)
    elif gemm.threads > 1 and row_units >= 2:
        cg.parallel(row_units, gemm.threads, row_body)
    else:
        _emitter(cg, gemm).rows(ir.Constant(I64, 0), ir.Constant(I64, gemm.m))
    cg.pop_scope()


# The name under which a region of handed-out panels sees its counter (a pointer to i64).
PANEL_COUNTER = "gemm.next_panel"


def _run_panels_in_parallel(cg, gemm: L.Gemm) -> None:
    """The threads take C's B micro-panels one at a time from a shared counter (the
    emitter's `panels_from`), not a fixed share each: with fixed shares the faster thread
    of each call idled at the join (perf figures in docs/architecture.md)."""
    b = cg.b
    counter = b.alloca(I64, size=ir.Constant(I64, 3), name="gemm.panel_counters")
    for index in range(3):  # tickets, panels taken from the front, from the back
        b.store(ir.Constant(I64, 0), element_pointer(b, counter, ir.Constant(I64, index), I64))
    cg.push_scope()
    cg.env[-1][PANEL_COUNTER] = _val(counter)

    def body(child, lo, hi):
        emitter = _emitter(child, gemm)
        emitter.panels_from(child.env[0][PANEL_COUNTER].value)
        _glue_region(child, emitter)
    cg.parallel(gemm.threads, gemm.threads, body)
    cg.pop_scope()


# Emitters of gemms whose packed panels hold another element type, by the Gemm's dtype
# (tilegen/gemm_amx.py registers bf16 gemms when it is imported, so gemm imports none).
PACKED_EMITTERS: dict[str, Callable[..., _GemmEmitter]] = {}  # (cg, gemm) -> emitter


def _emitter(cg, gemm: L.Gemm) -> _GemmEmitter:
    if gemm.dtype in L.FLOAT_TYPES:
        return _GemmEmitter(cg, gemm)
    emitter = PACKED_EMITTERS.get(gemm.dtype)
    if emitter is None:
        raise ValueError(f"no gemm emitter for {gemm.dtype} operands")
    return emitter(cg, gemm)


def _glue_region(child, emitter: _GemmEmitter) -> None:
    """Compile a gemm's parallel region `optnone` when its work is in the shared driver's
    calls (tilegen/gemm_driver.py): what is left is the thread's share, its scratch block
    and the packing contexts (and a loop over batch entries), nanoseconds next to the
    driver's work, and O3 and instruction selection spent 10-25 ms on each of MiniLM's six
    regions."""
    if emitter.shared_driver:
        child.function.attributes.add("noinline")
        child.function.attributes.add("optnone")


def _val(value):
    return Val(value, False)


def _row_end(cg, hi_units, mr, m):
    rows = cg.b.mul(hi_units, ir.Constant(I64, mr))
    return smin(cg.b, rows, ir.Constant(I64, m))


def _transpose(b, rows: list) -> list:
    """The transpose of a square block held as `len(rows)` vectors of as many lanes: at each
    scale h (half, quarter, ... of the width) the off-diagonal h x h blocks of every 2h x 2h
    block swap places; one two-source shuffle per output vector per scale."""
    size = len(rows)
    i32 = ir.IntType(32)
    h = size // 2
    while h:
        low = [size + lane - h if lane & h else lane for lane in range(size)]
        high = [size + lane if lane & h else lane + h for lane in range(size)]
        swapped = list(rows)
        for i in range(size):
            if i & h:
                continue
            pair = (rows[i], rows[i + h])
            swapped[i] = b.shuffle_vector(*pair, ir.Constant(ir.VectorType(i32, size), low))
            swapped[i + h] = b.shuffle_vector(*pair, ir.Constant(ir.VectorType(i32, size), high))
        rows = swapped
        h //= 2
    return rows


def _smax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


class _GemmEmitter:
    def __init__(self, cg, gemm: L.Gemm):
        self.cg = cg
        self.g = gemm
        self.b = cg.b
        self.lanes = cg.target.lanes(gemm.dtype)
        if gemm.tiles.nr % self.lanes:
            raise ValueError(f"gemm tiles nr={gemm.tiles.nr} are not whole vectors of "
                             f"{self.lanes} lanes ({cg.target.name})")
        self.element = SCALAR_LLVM[gemm.dtype]
        self.vector = ir.VectorType(self.element, self.lanes)
        # What the packed panels hold (the bf16 emitter packs 16-bit elements).
        self.packed_element = self.element
        self.packed_bytes = L.ELEMENT_BYTES[gemm.dtype]
        self.tiles = gemm.tiles
        self.vectors_per_row = gemm.tiles.nr // self.lanes
        # Ap's row stride: kc rounded up to whole vectors, so packing stores full vectors
        # without running into the next row (or past the block).
        self.a_stride = -(-gemm.tiles.kc // self.lanes) * self.lanes
        # A column split gives each thread a multiple of this many columns (or up to n).
        self.column_unit = gemm.tiles.nr
        # The depth block `rows` is packing, when it is a whole number of vectors.
        self.whole_depth_block = None

    # The block loops run in the module's shared driver for this micro-kernel, the packing
    # in functions of the product (tilegen/gemm_driver.py); 16-bit emitters keep them inline.
    shared_driver = True

    def const(self, value: int) -> ir.Constant:
        return ir.Constant(I64, value)

    def gep(self, base, offset):
        """An element of a packed panel."""
        pointer = self.b.gep(base, [offset], source_etype=self.packed_element)
        pointer.type = PTR
        return pointer

    def store_packed(self, value, pointer) -> None:
        """Store a vector of packed elements computed as `self.vector`."""
        self.b.store(value, pointer, align=self.packed_bytes)

    def b_panel_elements(self) -> int:
        return self.tiles.kc * self.tiles.nc

    def hands_out_panels(self) -> bool:
        """Whether threads that split the columns take B micro-panels one at a time from a
        counter (panels_from) rather than a fixed share each (rows)."""
        return False

    def lane_mask(self, first, limit):
        """Lanes first + 0..lanes-1 that are < limit (runtime values)."""
        steps = ir.Constant(ir.VectorType(I64, self.lanes), list(range(self.lanes)))
        index = self.b.add(self.cg.splat(first, self.lanes), steps)
        return self.b.icmp_signed("<", index, self.cg.splat(limit, self.lanes))

    def depth_mask(self, k, kc):
        """lane_mask(k, kc) for depths k.. of a depth block of kc (k a multiple of the
        vector width from 0), or None where every lane is inside: kc a whole number of
        vectors (the masks cost as many instructions as the loads they guard)."""
        whole = kc is self.whole_depth_block or (int_constant(kc) or 1) % self.lanes == 0
        return None if whole else self.lane_mask(k, kc)

    def whole_panels(self) -> bool:
        """Whether every B micro-panel lies inside N (no column of a panel needs masking):
        N a multiple of nr, and a column split hands out whole panels."""
        return self.g.n % self.tiles.nr == 0 and self.column_unit % self.tiles.nr == 0

    def column_mask(self, first):
        """lane_mask(first, n) for B's columns first.. of a micro-panel (None: all inside)."""
        return None if self.whole_panels() else self.lane_mask(first, self.const(self.g.n))

    def scratch(self, count: int):
        """This thread's block for the packed panels, cached between calls in one slot per
        thread (`KernelCodegen.acquire_block`); returned to it when `rows` ends, freed by any
        error exit taken while it is live (`cg.cleanups`). Returns (block, slot)."""
        nbytes = count * self.packed_bytes + 128
        threads = max(1, self.g.threads)
        first = self.cg.new_block_slots(threads)
        thread = self.const(0)
        if threads > 1:
            # Two threads landing on one slot would still be safe (the exchange hands the
            # block to one of them); the clamp only keeps the index in range.
            number = self.b.call(self.cg.declare("omp_get_thread_num", ir.FunctionType(
                ir.IntType(32), [])), [])
            thread = smin(self.b, self.b.sext(number, I64), self.const(threads - 1))
        slot = self.cg.block_slot(first, thread)
        pointer = self.cg.acquire_block(slot, nbytes)
        failed = self.b.icmp_unsigned("==", pointer, ir.Constant(PTR, None))
        with self.b.if_then(failed, likely=False):
            self.cg.exit_with(self.const(-1))
        self.cg.cleanups.append(pointer)
        return pointer, slot

    # ---- structure ----------------------------------------------------------------------------

    def rows(self, row_lo, row_hi, col_lo=0, col_hi=None) -> None:
        """C[row_lo:row_hi, col_lo:col_hi] (column bounds: multiples of column_unit, or
        n)."""
        t, g = self.tiles, self.g
        col_hi = g.n if col_hi is None else col_hi
        col_end = self.const(col_hi) if isinstance(col_hi, int) else col_hi
        if t.nc % t.nr or t.mc % t.mr:
            raise ValueError(f"gemm tiles {t}: nc must be a multiple of nr and mc of mr")
        if self.shared_driver:
            gemm_driver.run_rows(self, row_lo, row_hi, col_lo, col_end)
            return
        def column_block(jc, carried):
            nc = smin(self.b, self.const(t.nc), self.b.sub(col_end, jc))

            def depth_block(pc, carried):
                kc = smin(self.b, self.const(t.kc), self.b.sub(self.const(g.k_extent), pc))
                whole = g.k_extent % self.lanes == 0 and t.kc % self.lanes == 0
                self.whole_depth_block = kc if whole else None
                self.pack_b(packed_b, jc, nc, pc, kc)
                first = self.b.icmp_signed("==", pc, self.const(0))

                def row_block(ic, carried):
                    mc = smin(self.b, self.const(t.mc), self.b.sub(row_hi, ic))
                    self.pack_a(packed_a, ic, mc, pc, kc)
                    if g.dtype in L.FLOAT_TYPES:
                        self.zero_a_rows(packed_a, mc, kc)
                    self.micro_tiles(packed_a, packed_b, ic, mc, row_hi, jc, nc, kc, first,
                                     col_end)
                    return carried
                self.cg.loop(row_lo, row_hi, t.mc, [], row_block)
                return carried
            self.cg.loop(0, g.k_extent, t.kc, [], depth_block)
            return carried
        with self.packed_panels() as (packed_a, packed_b):
            self.cg.loop(col_lo, col_hi, t.nc, [], column_block)

    @contextmanager
    def packed_panels(self):
        """(packed A, packed B) in this thread's scratch block (`scratch`, `panels`) for the
        code emitted inside the `with`; the block goes back to its slot after it."""
        a_size = self.tiles.mc * self.a_stride
        block, slot = self.scratch(a_size + self.b_panel_elements())
        yield self.panels(block, a_size)
        self.cg.cleanups.remove(block)
        self.cg.release_block(block, slot)

    def panels(self, block, a_size: int):
        """(packed A, packed B) in this thread's scratch block, A's panel `a_size` elements.
        Both start on a cache line (the block has 128 bytes to spare): malloc's 16-byte
        alignment split every 64-byte row of an AMX tile, and every zmm load, across two
        lines, and made the speed depend on where the block landed."""
        packed_a = cache_line_aligned(self.b, block)
        packed_b = self.gep(packed_a, self.const(-(-a_size * self.packed_bytes // 64) * 64
                                                 // self.packed_bytes))
        return packed_a, packed_b

    # ---- packing ------------------------------------------------------------------------------

    def _tile_value(self, expr: L.Expr, lane_var: L.Var, base, mask, bindings) -> ir.Value:
        """`expr` evaluated for lanes lane_var = base + 0..lanes-1 (inactive lanes: 0)."""
        cg = self.cg
        saved = cg.lane
        cg.lane = Lane(lane_var.name, self.lanes, base, mask)
        cg.push_scope()
        for var, value in bindings:
            cg.env[-1][var.name] = Val(value, False)
        value = cg.as_vector(cg.expr(expr))
        cg.pop_scope()
        cg.lane = saved
        if mask is None:  # every lane inside
            return value
        return self.b.select(mask, value, zeros(self.vector))

    def _read_across(self, expr: L.Expr, packed_along: L.Var, across: L.Var) -> bool:
        """Whether `expr` is contiguous along `across` but not along `packed_along` (a
        transposed operand): packed then by loading vectors along `across` and transposing
        them in registers, instead of one gather per packed vector."""
        strides = {name: buffer.strides for name, buffer in self.cg.buffers.items()}
        return strided_load(expr, packed_along.name, strides) and \
            not strided_load(expr, across.name, strides)

    def pack_b(self, packed, jc, nc, pc, kc) -> None:
        """Bp[(jr / nr) * kc * nr + k * nr + r] = B[pc + k, jc + jr + r] (0 past N)."""
        if self._read_across(self.g.b_elem, self.g.j, self.g.k):
            self.pack_b_transposed(packed, jc, nc, pc, kc)
            return
        g, nr = self.g, self.tiles.nr

        def panel(jr, carried):
            def depth(k, carried):
                for part in range(self.vectors_per_row):
                    first = self.b.add(self.b.add(jc, jr), self.const(part * self.lanes))
                    mask = self.column_mask(first)
                    value = self._tile_value(g.b_elem, g.j, first, mask,
                                             [(g.k, self.b.add(pc, k))])
                    offset = self.b.add(self.b.add(self.b.mul(jr, kc),
                                                   self.b.mul(k, self.const(nr))),
                                        self.const(part * self.lanes))
                    self.store_packed(value, self.gep(packed, offset))
                return carried
            self.cg.loop(self.const(0), kc, 1, [], depth)
            return carried
        self.cg.loop(self.const(0), nc, nr, [], panel)

    def _transposed_block(self, expr, lane_var, lane_base, lane_mask, fixed_var, fixed_at):
        """`lanes` x `lanes` elements of `expr`: vector v loaded along `lane_var` (from
        `lane_base`, under `lane_mask`) at `fixed_var` = fixed_at(v), a (value, inside)
        pair (outside: zeros); then transposed, so row t holds lane t of every vector."""
        b, vectors = self.b, []
        for v in range(self.lanes):
            value, inside = fixed_at(v)  # inside None: always
            mask = lane_mask if inside is None else self.cg.splat(inside, self.lanes) \
                if lane_mask is None else b.and_(lane_mask, self.cg.splat(inside, self.lanes))
            vectors.append(self._tile_value(expr, lane_var, lane_base, mask,
                                            [(fixed_var, value)]))
        return _transpose(b, vectors)

    def _store_rows(self, packed, rows, offset_of, first, limit, partial: bool) -> None:
        """Store row t at offset_of(t); in a partial chunk only the rows first + t < limit."""
        b = self.b
        for t, row in enumerate(rows):
            pointer = self.gep(packed, offset_of(t))
            if partial:
                with b.if_then(b.icmp_signed("<", b.add(first, self.const(t)), limit)):
                    self.store_packed(row, pointer)
            else:
                self.store_packed(row, pointer)

    def pack_b_transposed(self, packed, jc, nc, pc, kc) -> None:
        """pack_b for a B read along k: `lanes` columns x `lanes` depths at a time, each
        column loaded as one vector along k, then transposed in registers."""
        g, nr, lanes, b = self.g, self.tiles.nr, self.lanes, self.b
        whole = b.and_(kc, self.const(-lanes))  # depths in full chunks of `lanes`

        def chunk(jr, k, partial: bool):
            depth_mask = self.depth_mask(k, kc)

            # The vectors of a micro-panel row in a loop, not unrolled: each is a 16 x 16
            # transpose (64 shuffles), and two copies were half of scores' packing code.
            def part(start, carried):
                def column(r):
                    index = b.add(b.add(jc, jr), b.add(start, self.const(r)))
                    if self.whole_panels():
                        return index, None
                    return index, b.icmp_signed("<", index, self.const(g.n))
                rows = self._transposed_block(g.b_elem, g.k, b.add(pc, k), depth_mask, g.j,
                                              column)
                self._store_rows(packed, rows, lambda depth: b.add(
                    b.add(b.mul(jr, kc), b.mul(b.add(k, self.const(depth)), self.const(nr))),
                    start), k, kc, partial)
                return carried
            self.cg.loop(self.const(0), self.const(nr), lanes, [], part)

        def panel(jr, carried):
            self.cg.loop(self.const(0), whole, lanes, [],
                          lambda k, carried: chunk(jr, k, False) or carried)
            if self.depth_mask(whole, kc) is not None:  # else no partial chunk
                with b.if_then(b.icmp_signed("<", whole, kc)):
                    chunk(jr, whole, True)
            return carried
        self.cg.loop(self.const(0), nc, nr, [], panel)

    def a_offset(self, row, k):
        """Where A's element (row, k) of a block goes in its packed panel (k a multiple of
        the vector width: a vector of depths k.. is stored from there)."""
        return self.b.add(self.b.mul(row, self.const(self.a_stride)), k)

    def pack_a(self, packed, ic, mc, pc, kc) -> None:
        """Ap[a_offset(r, k)] = A[ic + r, pc + k] for r < mc, k < kc (rows copied)."""
        if self._read_across(self.g.a_elem, self.g.k, self.g.i):
            self.pack_a_transposed(packed, ic, mc, pc, kc)
            return
        g = self.g

        def row(r, carried):
            def depth(k, carried):
                mask = self.depth_mask(k, kc)
                value = self._tile_value(g.a_elem, g.k, self.b.add(pc, k), mask,
                                         [(g.i, self.b.add(ic, r))])
                self.store_packed(value, self.gep(packed, self.a_offset(r, k)))
                return carried
            self.cg.loop(self.const(0), kc, self.lanes, [], depth)
            return carried
        self.cg.loop(self.const(0), mc, 1, [], row)

    def zero_a_rows(self, packed, mc, kc) -> None:
        """Zeros in the rows from mc to the end of the last register block: the micro-kernel
        multiplies all mr rows and stores only those below mc, but a stale denormal left in
        the heap block would make each of its FMAs a microcode assist (one-sentence MiniLM
        calls 3-7x slower, by how the process' heap happened to be filled; the bf16 dot
        products flush denormals themselves)."""
        b, mr = self.b, self.tiles.mr
        if self.g.m % mr == 0:
            return  # row blocks start at multiples of mr and end at one or at M: all whole
        end = smin(b, b.mul(b.sdiv(b.add(mc, self.const(mr - 1)), self.const(mr)),
                             self.const(mr)), self.const(self.tiles.mc))
        zero = ir.Constant(self.vector, None)

        def row(r, carried):
            def depth(k, carried):
                self.store_packed(zero, self.gep(packed, self.a_offset(r, k)))
                return carried
            self.cg.loop(self.const(0), kc, self.lanes, [], depth)
            return carried
        self.cg.loop(mc, end, 1, [], row)

    def pack_a_transposed(self, packed, ic, mc, pc, kc) -> None:
        """pack_a for an A read along i: `lanes` depths x `lanes` rows at a time, each depth
        loaded as one vector along i, then transposed in registers. Depths past kc come out
        as zeros (as pack_a writes them); rows past mc are not written."""
        g, lanes, b = self.g, self.lanes, self.b
        whole = b.and_(mc, self.const(-lanes))  # rows in full chunks of `lanes`

        def chunk(r, partial: bool):
            row_mask = self.lane_mask(r, mc)

            def depth(k, carried):
                def at_depth(d):
                    if self.depth_mask(k, kc) is None:
                        return b.add(pc, b.add(k, self.const(d))), None
                    return (b.add(pc, b.add(k, self.const(d))),
                            b.icmp_signed("<", b.add(k, self.const(d)), kc))
                rows = self._transposed_block(g.a_elem, g.i, b.add(ic, r), row_mask, g.k,
                                              at_depth)
                self._store_rows(packed, rows, lambda row: self.a_offset(
                    b.add(r, self.const(row)), k), r, mc, partial)
                return carried
            self.cg.loop(self.const(0), kc, lanes, [], depth)

        self.cg.loop(self.const(0), whole, lanes, [],
                      lambda r, carried: chunk(r, False) or carried)
        with b.if_then(b.icmp_signed("<", whole, mc)):
            chunk(whole, True)

    # ---- the micro-kernel ---------------------------------------------------------------------

    def micro_kernel(self) -> ir.Function:
        return micro_kernel_function(self.cg.module, self.g.dtype, self.tiles.mr,
                                     self.tiles.nr, self.a_stride, self.lanes, True)

    def micro_steps(self, kc):
        """The micro-kernel's k-loop trip count for a depth block of kc."""
        return kc

    def b_panel_offset(self, jr, kc):
        """Where the micro-panel of columns jr.. starts in the packed B block."""
        return self.b.mul(jr, kc)

    def micro_tiles(self, packed_a, packed_b, ic, mc, row_hi, jc, nc, kc, first,
                    col_end) -> None:
        t, g, b = self.tiles, self.g, self.b
        kernel = self.micro_kernel()
        steps = self.micro_steps(kc)

        def panel(jr, carried):
            col0 = b.add(jc, jr)
            columns = b.sub(col_end, col0)

            def block(ir_, carried):
                row0 = b.add(ic, ir_)
                c = self.c_pointer(row0, col0)
                self.call_kernel(kernel, [
                    self.gep(packed_a, b.mul(ir_, self.const(self.a_stride))),
                    self.gep(packed_b, self.b_panel_offset(jr, kc)), steps, c,
                    self.const(g.n), b.sub(row_hi, row0), columns, first])
                return carried
            self.cg.loop(self.const(0), mc, t.mr, [], block)
            return carried
        self.cg.loop(self.const(0), nc, t.nr, [], panel)


    def call_kernel(self, kernel, args) -> None:
        self.b.call(kernel, args)  # (Bf16DotEmitter: a narrower kernel for a last panel)

    def c_pointer(self, row, column):
        """&C[batch..., row, column] (the batch entry from the gemm's batch variables)."""
        g, b = self.g, self.b
        flat_batch = self.cg.expr(_flat_batch(g)).value if g.batch else self.const(0)
        offset = b.add(b.mul(flat_batch, self.const(g.m * g.n)),
                       b.add(b.mul(row, self.const(g.n)), column))
        return element_pointer(b, self.cg.pointers[g.out], offset, self.element)


def _flat_batch(g: L.Gemm) -> L.Expr:
    flat: L.Expr = L.const(0)
    for var, extent in zip(g.batch, g.batch_extents, strict=True):
        flat = L.add(L.mul(flat, L.const(extent)), var)
    return flat
