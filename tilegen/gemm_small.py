"""Products of few rows (M <= SMALL_M: one sentence's 16 tokens through a Linear layer), with
B streamed once from where it lies.

    for (batch entry, strips of nr columns) in this thread's run:   threads split the columns
      pack A[entry] -> Ap  once per entry                           [m][K], rows copied
      for pc in 0..K by kc:                                         depth blocks (kc = 16)
        for each strip of this thread:
          for each block of mr rows:                                (row_blocks: 8 of 16)
            C[rows, strip] (+)= Ap[rows, pc..] B[pc.., strip]       prefetching B[pc + kc..]

The packed gemm (gemm.py) copies a kc x nc block of B into a panel and reads it back once per
row block: for a 16-row product that copy is as much memory traffic as the product itself,
and B (a weight matrix, megabytes) comes from memory on every call. Here the micro-kernel
loads B's rows in place (masked at the right edge, so nothing past the matrix is read), with
all mr x nr accumulators in registers; each element of B is read once per call.

Why short depth blocks: a thread sweeps its strips over kc = 16 rows of B at a time, so it
reads those rows left to right (a 24 KB stretch of a 384-wide B, not one line per row of a
1.5 KB stride), and each step prefetches the same strip's row in the next depth block,
which the thread reaches one sweep of its strips later (about a microsecond), into L2 only
(`PREFETCH_LOCALITY`): a thread's next depth block of a 1536-wide B is 48 KB, all of L1,
and prefetched into L1 it evicts the A rows, C block and B rows in use. Ad hoc, one
sentence of MiniLM on one thread (CPU time, docs/models.md), prefetching into L1: kc = 16
with that prefetch 5.2 ms, the whole depth in one pass without prefetch 14.5, kc = 64
prefetching 32 rows on 6.0; the accumulators go through C once per depth block (16
masked loads and stores per 16 x 16 FMA steps of 16 rows). Into L2 instead, the encoder
compiled both ways in one process and the calls interleaved (`scripts/minilm_ab.py`, one
thread's CPU time, four processes on a loaded machine): minimum 3.4-4.1 ms against
4.0-4.3 with prefetcht0, lower in every process; kc = 32 into L2 was 3.7-3.8, within
that noise of kc = 16, kc = 64 4.05.

Chosen in lowering (`applies`) for float products whose B element is a plain load, contiguous
along the columns and affine in the depth (a stored or broadcast matrix: every Linear layer's
weight); other B operands keep the packed path. The tiles say so with `b_in_place`.
"""

from __future__ import annotations

import math

from llvmlite import ir

from . import gemm as G
from . import loopir as L
from . import micro_kernel as MK
from .codegen_values import Val, bind_flat_index
from .schedule import flat_coefficient
from .target import Target

# Up to this many rows the product streams B in place.
SMALL_M = 32
# Rows of B per depth block; the k loop prefetches the row this many rows on.
DEPTH_BLOCK = 16
# llvm.prefetch's locality for those rows: 2 is prefetcht1, into L2 (3, prefetcht0, would
# also fill L1, which a thread's depth block ahead of a wide B fills on its own).
PREFETCH_LOCALITY = 2
# At most this many vectors of columns per row block.
MAX_PARTS = 4


def applies(dtype: str, m: int, b_elem: L.Expr, j: L.Var, k: L.Var,
            buffers: dict[str, L.Buffer]) -> bool:
    """Whether the product with B element `b_elem` (at column j, depth k) takes this path."""
    return dtype in L.FLOAT_TYPES and m <= SMALL_M and in_place_row_stride(
        b_elem, j, k, buffers, dtype) is not None


def in_place_row_stride(b_elem: L.Expr, j: L.Var, k: L.Var, buffers: dict[str, L.Buffer],
                        dtype: str) -> int | None:
    """B's row stride (elements per step of k) when `b_elem` is a load of a buffer holding
    `dtype` elements (not BF16 storage, whose loads widen), contiguous along j and affine
    in k; else None."""
    if not (isinstance(b_elem, L.Load) and buffers[b_elem.buffer].dtype == dtype):
        return None
    strides = buffers[b_elem.buffer].strides
    if flat_coefficient(b_elem.index, strides, j.name) != 1:
        return None
    return flat_coefficient(b_elem.index, strides, k.name)


def row_blocks(m: int, target: Target) -> tuple[int, int]:
    """(mr, vectors per row) with the fewest loads per multiply-add. A step of the k loop
    loads mr broadcasts of A and `parts` vectors of B for mr x parts FMAs, and a strip runs
    ceil(m / mr) row blocks, so a strip's step costs ceil(m / mr) * (mr + parts) loads for
    its `parts` vectors of columns. The accumulators take at most 3/4 of the vector
    registers (the rest hold B's row and the broadcasts), `parts` at most MAX_PARTS. One
    sentence (m = 16, 32 registers): 8 x 3, 7.3 loads a column vector, where one block of
    16 x 1 took 17 and ran the call about 15 % slower (ad hoc, docs/models.md)."""
    budget = target.vector_registers * 3 // 4
    choices = ((-(-m // mr) * (mr + parts) / parts, -parts, -mr, mr, parts)
               for parts in range(1, MAX_PARTS + 1)
               for mr in range(1, min(m, budget // parts) + 1))
    *_, mr, parts = min(choices)
    return mr, parts


def small_m_tiles(dtype: str, m: int, n: int, k: int, target: Target) -> L.GemmTiles:
    """Tiles of the in-place path: mr x nr register blocks, depth blocks of kc =
    DEPTH_BLOCK, all rows in one A block of mc = m, strips of nr columns (nc = nr)."""
    mr, parts = row_blocks(m, target)
    nr = parts * target.lanes(dtype)
    return L.GemmTiles(mr, nr, min(k, DEPTH_BLOCK), m, nr, b_in_place=True)


def operand_evaluations(m: int, n: int, batches: int, tiles: L.GemmTiles,
                        threads: int) -> tuple[int, int]:
    """How many times the in-place path evaluates each element of A and of B: A once per
    thread working on its entry (the threads split the columns, each packs all of A), B once
    (it is read, not packed). gemm_tiles.operand_evaluations' signature."""
    del m
    units = batches * -(-n // tiles.nr)
    if threads <= 1 or units < 2:
        return 1, 1
    return (threads if batches < 2 * threads else 2), 1


def emit_any_gemm(cg, gemm: L.Gemm) -> None:
    """The pipeline's gemm emitter: this path for tiles with `b_in_place`, else gemm.py's."""
    if gemm.tiles.b_in_place:
        emit_small_m(cg, gemm)
    else:
        G.emit_gemm(cg, gemm)


def emit_small_m(cg, gemm: L.Gemm) -> None:
    """One parallel region over the (batch entry, column strip) pairs, split in contiguous
    runs: each thread packs A for the entries it works on and streams its columns of B."""
    strips = -(-gemm.n // gemm.tiles.nr)
    units = math.prod(gemm.batch_extents) * strips

    def body(child, lo, hi):
        _SmallMEmitter(child, gemm).run(lo, hi, strips)
    if gemm.threads > 1 and units >= 2:
        cg.parallel(units, gemm.threads, body)
    else:
        body(cg, ir.Constant(MK.I64, 0), ir.Constant(MK.I64, units))


class _SmallMEmitter(G._GemmEmitter):
    def __init__(self, cg, gemm: L.Gemm):
        super().__init__(cg, gemm)
        # A is packed whole (every depth block reads it).
        self.a_stride = -(-gemm.k_extent // self.lanes) * self.lanes

    def b_panel_elements(self) -> int:
        return 0

    def run(self, lo, hi, strips: int) -> None:
        g, b, t = self.g, self.b, self.tiles
        units = self.const(strips)
        block, slot = self.scratch(g.m * self.a_stride)
        first_entry = b.sdiv(lo, units)
        last_entry = b.sdiv(b.add(hi, self.const(strips - 1)), units)

        def entry(flat, carried):
            base = b.mul(flat, units)
            start = G._smax(b, b.sub(lo, base), self.const(0))
            stop = MK.smin(b, b.sub(hi, base), units)
            self.cg.push_scope()
            bind_flat_index(b, self.cg.env[-1], g.batch, g.batch_extents, flat)
            self.pack_a(block, self.const(0), self.const(g.m), self.const(0),
                        self.const(g.k_extent))
            row_stride = self.b_row_stride()

            def depth_block(pc, carried):
                depth = MK.smin(b, self.const(t.kc), b.sub(self.const(g.k_extent), pc))
                first = b.icmp_signed("==", pc, self.const(0))

                def strip(index, carried):
                    column = b.mul(index, self.const(t.nr))
                    columns = MK.smin(b, self.const(t.nr), b.sub(self.const(g.n), column))
                    b_row = MK.element_pointer(b, self.b_pointer(column),
                                              b.mul(pc, self.const(row_stride)), self.element)
                    for row in range(0, g.m, t.mr):
                        rows = min(t.mr, g.m - row)
                        kernel = small_m_kernel_function(
                            self.cg.module, g.dtype, rows, self.vectors_per_row, self.lanes,
                            self.a_stride, row_stride, t.kc)
                        a_block = self.gep(block, b.add(self.const(row * self.a_stride), pc))
                        b.call(kernel, [a_block, b_row, depth,
                                        self.c_pointer(self.const(row), column),
                                        self.const(g.n), self.const(rows), columns, first])
                    return carried
                self.cg.loop(start, stop, 1, [], strip)
                return carried
            self.cg.loop(0, g.k_extent, t.kc, [], depth_block)
            self.cg.pop_scope()
            return carried
        self.cg.loop(first_entry, last_entry, 1, [], entry)
        self.cg.cleanups.remove(block)
        self.cg.release_block(block, slot)

    def b_row_stride(self) -> int:
        stride = in_place_row_stride(self.g.b_elem, self.g.j, self.g.k, self.cg.buffers,
                                     self.g.dtype)
        if stride is None:
            raise ValueError(f"gemm into {self.g.out!r}: tiles say b_in_place but B "
                             f"({self.g.b_elem}) is not a load contiguous along "
                             f"{self.g.j} and affine in {self.g.k}")
        return stride

    def b_pointer(self, column):
        """&B[batch..., k = 0, column] in B's own buffer (batch variables from the scope)."""
        load, b, cg = self.g.b_elem, self.b, self.cg
        strides = cg.buffers[load.buffer].strides
        cg.push_scope()
        cg.env[-1][self.g.k.name] = Val(self.const(0), False)
        cg.env[-1][self.g.j.name] = Val(column, False)
        offset = self.const(0)
        for component, stride in zip(load.index, strides, strict=True):
            if stride:
                offset = b.add(offset, b.mul(cg.expr(component).value, self.const(stride)))
        cg.pop_scope()
        return MK.element_pointer(b, cg.pointers[load.buffer], offset, self.element)


def small_m_kernel_function(module: ir.Module, dtype: str, mr: int, parts: int, lanes: int,
                            a_stride: int, b_stride: int, prefetch: int) -> ir.Function:
    """micro_kernel.micro_kernel_function's signature and store, with B read in place: C[r, j] (+)=
    sum over k < kc of Ap[r * a_stride + k] * B[k * b_stride + j] for r < rows, j < cols; B's
    row loads are masked to `cols` (no reads past the matrix' edge), and each step prefetches
    the row `prefetch` steps on (a prefetch never faults)."""
    name = f"tilegen.gemm_small.{dtype}.{mr}x{parts * lanes}.a{a_stride}.b{b_stride}.p{prefetch}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    element, vector, suffix, fma = MK.vector_fma(module, dtype, lanes)
    i32 = ir.IntType(32)
    masked_load = MK.declare_intrinsic(module, f"llvm.masked.load.{suffix}.p0", vector,
                                      [MK.PTR, i32, ir.VectorType(MK.I1, lanes), vector])
    prefetch_intrinsic = MK.declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(),
                                             [MK.PTR, i32, i32, i32])
    align = ir.Constant(i32, L.ELEMENT_BYTES[dtype])
    zero = ir.Constant(vector, None)

    def step(b, a, bp, k, accumulators, masks):
        row = MK.element_pointer(b, bp, b.mul(k, ir.Constant(MK.I64, b_stride)), element)
        ahead = MK.element_pointer(b, row, ir.Constant(MK.I64, prefetch * b_stride), element)
        columns = []
        for part in range(parts):
            offset = ir.Constant(MK.I64, part * lanes)
            if prefetch:
                # read, into L2 (PREFETCH_LOCALITY), data
                b.call(prefetch_intrinsic, [MK.element_pointer(b, ahead, offset, element),
                                            ir.Constant(i32, 0),
                                            ir.Constant(i32, PREFETCH_LOCALITY),
                                            ir.Constant(i32, 1)])
            columns.append(b.call(masked_load, [MK.element_pointer(b, row, offset, element),
                                                align, masks[part], zero]))
        updated = []
        for r in range(mr):
            scalar = b.load(MK.element_pointer(b, a, b.add(k, ir.Constant(MK.I64, r * a_stride)),
                                              element), typ=element)
            broadcast = MK.splat(b, scalar, lanes)
            for part in range(parts):
                updated.append(b.call(fma, [broadcast, columns[part],
                                            accumulators[r * parts + part]]))
        return updated
    return MK.micro_kernel_shell(module, name, dtype, mr, parts, lanes, step, masked_b=True)
