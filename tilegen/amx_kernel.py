"""The AMX micro-kernel of tilegen/gemm_amx.py: `tdpbf16ps` on 2 x 2 (or fewer) accumulator
tiles kept in tile registers across a depth loop, for a run of register blocks on one B
micro-panel (amx_micro_kernel), and the software prefetches that feed it.

Written with LLVM's shape-carrying intrinsics (`llvm.x86.tileloadd64.internal`,
`tdpbf16ps.internal`, `tilestored64.internal`) on `x86_amx` values, whose row and
byte-column operands are constants, so LLVM writes the tile configuration and the
`ldtilecfg` itself (and `tilerelease` on return).
"""

from __future__ import annotations

from llvmlite import ir

from .gemm_bf16 import AMX_DEPTH, AMX_TILE_ROWS, LANES, NamedLLVMType
from .micro_kernel import I64, PTR, carried_loop, declare_intrinsic, element_pointer, smin, splat

I1, I8, I16, I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
F32 = ir.FloatType()
TILE_BYTES = 64  # bytes per tile row: 16 f32 or 32 bf16
TILE_COLUMNS = 16  # f32 columns of an accumulator tile
# Whether the depth loop also prefetches the next register block's C, into L2 (C of 16 MB
# comes from L3): 2048^3 on one thread ran 3-5% faster with it. Into L1 for writing
# (`prefetchw`), as before the compact slots, its lines (a block's rows 8 KB apart at N =
# 2048 fall on two L1 sets) evicted each other: one thread's share of 2048^3 ran in 9.1
# ms of CPU time with that, 8.5-8.6 without any or into L2 (ad hoc); 1024^3's share 1.10
# against 1.06 ms, 333 x 1000 x 384 within noise.
PREFETCH_C = True
# Two flavours of the kernel, by where A's tiles come from (measured from C on the
# generated kernels, their packing copied in, on a loaded machine: direction only):
# - A packed in slabs (each tile 1 KB of contiguous memory): the depth steps go in runs of
#   at most RUN_STEPS, as even as they go, each run over all of the call's register
#   blocks, so B's part of a run (16 steps: 32 KB) stays in L1 (48 KB) while the blocks'
#   A streams past it, loaded with `tileloaddt1` (STREAM_A); no software prefetch of A or
#   B. One run over a depth block of 1024 read both operands from L2 (a C model on one
#   L2-resident A block x B block of 2048^3: 15 ns a tdpbf16ps, 12 with runs of 16 and the
#   streaming loads, 6.2 with every tile in L1), and the prefetcht0 of A and B made 1024^3
#   10-25% slower (it pulls A into L1 like B). The runs' extra loads and stores of C hit L1
#   or L2.
# - A read in place (`gemm_amx.a_read_in_place`; NumPy's arrays start 16 or 32 bytes past a
#   line, so each 64-byte row of a tile straddles two lines): one run, plain loads, and
#   prefetches into L1 of A's rows and B's lines PREFETCH_STEPS ahead, as before the runs:
#   that ran 333 x 1000 x 777 about 15% faster than the packed flavour's choices on the
#   same rows, and the misaligned rows ran far slower without the prefetches.
RUN_STEPS = 16
STREAM_A = True
PREFETCH_STEPS = 2  # depth steps (of 32) ahead of the in-place flavour's A and B prefetches
# C rows of the next register block prefetched per depth step: 2 for runs of 16 steps
# (each covers all 32), 1 for the in-place flavour's single run.
C_ROWS_PER_STEP = 2
# Rows of the next B panel's source a kernel call prefetches per depth step (kc = 1000 rows
# within 10 register blocks x 32 steps: 333 x 1000 x 777 prefetches all of them).
AHEAD_ROWS = 4


TILE = NamedLLVMType("x86_amx")  # a tile register's value


def amx_micro_kernel(module: ir.Module, mr: int, nr: int, panel_columns: int | None = None,
                     a_in_place: bool = False) -> ir.Function:
    """`void mk(ptr a, ptr b, i64 steps, ptr c, i64 ldc, i64 rows, i64 cols, i1 first,
    i64 blocks, i64 row_bytes, i64 step_bytes, i64 main_steps, ptr tail, ptr ahead,
    i64 ahead_stride, i64 ahead_rows, ptr kept)`:
    micro_kernel.micro_kernel_function's signature (steps counting 32 depths) with `blocks`
    register blocks of mr rows one after the other: for q < blocks,
    C[q mr + r, j] (+)= sum over d < 32 steps of A[q mr + r, d] * B[d, j] for q mr + r < rows
    and j < cols (at most nr), B read from the first nr columns of its pair-interleaved
    panel of panel_columns (default nr; 32 for the 16-column kernel) and A's 32 depths of
    row r at step s from a + r row_bytes + s step_bytes for s < main_steps (slabs of packed
    rows: 64 and mc x 64 bytes; A in place: its row stride and 64), from the slab at `tail`
    (rows 64 bytes apart) for the steps after. The steps go in runs of at most RUN_STEPS,
    each run over every block (B's part of the run stays in L1 while A's streams past);
    with `a_in_place` (the flavour for A read where it is) in one run, A's rows and B's
    lines prefetched into L1 PREFETCH_STEPS ahead.
    The n-th (run, block, step) of the call also prefetches into L2 rows AHEAD_ROWS n..
    (below ahead_rows) of a strip of 64 bytes at `ahead`, ahead_stride bytes a row
    (_prefetch_ahead). `kept` is scratch of blocks x mr x nr f32 (64-byte aligned), a
    compact slot per block where its accumulators wait between runs and a ragged block's
    C is staged.
    One call per B micro-panel and A block: `ldtilecfg` and `tilerelease` are paid once
    per call."""
    panel_columns = panel_columns or nr
    name = f"tilegen.gemm.amx.{mr}x{nr}" + ("" if panel_columns == nr else
                                            f".of{panel_columns}") + \
        (".in_place" if a_in_place else "")
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    row_tiles, column_tiles = mr // AMX_TILE_ROWS, nr // TILE_COLUMNS
    load = declare_intrinsic(module, "llvm.x86.tileloadd64.internal", TILE,
                             [I16, I16, PTR, I64])
    load_a = load if a_in_place or not STREAM_A else declare_intrinsic(
        module, "llvm.x86.tileloaddt164.internal", TILE, [I16, I16, PTR, I64])
    dot = declare_intrinsic(module, "llvm.x86.tdpbf16ps.internal", TILE,
                            [I16, I16, I16, TILE, TILE, TILE])
    store = declare_intrinsic(module, "llvm.x86.tilestored64.internal", ir.VoidType(),
                              [I16, I16, PTR, I64, TILE])
    zeros = _zero_rows(module)

    fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, PTR, I64, I64, I64, I1, I64,
                                           I64, I64, I64, PTR, PTR, I64, I64, PTR])
    function = ir.Function(module, fnty, name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    function.attributes.add("noinline")
    (a_first, bp, steps, c_first, ldc, rows_first, cols, first, blocks,
     row_bytes, step_bytes, main_steps, tail_first, ahead, ahead_stride,
     ahead_rows, kept_first) = function.args
    for arg in (bp, c_first, kept_first):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(function.append_basic_block("entry"))

    def const(value, typ=I64):
        return ir.Constant(typ, value)

    tile_rows, tile_bytes = const(AMX_TILE_ROWS, I16), const(TILE_BYTES, I16)
    tile_bytes_wide = const(TILE_BYTES)  # the row stride of a compact tile
    byte = I8
    c_stride = b.mul(ldc, const(4))
    stage_stride = const(4 * nr)
    vector = ir.VectorType(F32, LANES)
    masks = _column_masks(module, b, cols, nr)

    # Runs of at most RUN_STEPS depth steps, as even as they go (36 steps: 3 x 12), each
    # over every register block; every run but the first adds to C.
    run_steps = steps
    if not a_in_place:
        runs = b.sdiv(b.add(steps, const(RUN_STEPS - 1)), const(RUN_STEPS))
        runs = b.select(b.icmp_signed("<", runs, const(1)), const(1), runs)
        run_steps = b.sdiv(b.add(steps, b.sub(runs, const(1))), runs)
    rows_per_step = 1 if a_in_place else C_ROWS_PER_STEP
    before = b.block
    run_block = function.append_basic_block("run")
    finished = function.append_basic_block("finished")
    b.cbranch(b.icmp_signed(">", blocks, const(0)), run_block, finished)
    b.position_at_end(run_block)
    run_start = b.phi(I64, name="s0")
    run_start.add_incoming(const(0), before)
    run_length = smin(b, run_steps, b.sub(steps, run_start))
    first_run = b.icmp_signed("==", run_start, const(0))
    run_first = b.and_(first, first_run)
    last_run = b.icmp_signed(">=", b.add(run_start, run_steps), steps)
    run_a = element_pointer(b, a_first, b.mul(run_start, step_bytes), byte)
    run_main = b.sub(main_steps, run_start)
    run_b = element_pointer(b, bp, b.mul(run_start, const(AMX_DEPTH * 2 * panel_columns)),
                            byte)

    # The loop over register blocks.
    before = b.block
    outer = function.append_basic_block("block")
    next_run = function.append_basic_block("next_run")
    b.branch(outer)
    b.position_at_end(outer)
    block = b.phi(I64, name="q")
    block.add_incoming(const(0), before)
    a = element_pointer(b, run_a, b.mul(block, b.mul(row_bytes, const(mr))), byte)
    tail = element_pointer(b, tail_first, b.mul(block, const(mr * TILE_BYTES)), byte)
    c = element_pointer(b, c_first, b.mul(b.mul(block, const(mr)), c_stride), byte)
    stage = element_pointer(b, kept_first, b.mul(block, const(mr * nr)), F32)
    rows = b.sub(rows_first, b.mul(block, const(mr)))
    whole = b.and_(b.icmp_signed(">=", rows, const(mr)), b.icmp_signed(">=", cols, const(nr)))

    def ragged_rows(move):
        """move(staged, in_c, mask, masked_load, masked_store) for each vector of the
        block's rows of C that exist (below `rows`), and its place in the block's slot.
        A loop over the rows: only the blocks at C's edges take this path, and its mr
        rows unrolled were three quarters of each kernel's instructions (and of the
        time LLVM spent compiling them)."""
        def row(r, carried):
            for part, (mask, masked_load, masked_store) in enumerate(masks):
                offset = const(part * LANES)
                staged = element_pointer(b, stage, b.add(b.mul(r, const(nr)), offset), F32)
                in_c = element_pointer(b, c, b.add(b.mul(r, ldc), offset), F32)
                move(staged, in_c, mask, masked_load, masked_store)
            return carried
        carried_loop(b, function, smin(b, rows, const(mr)), [], row, "ragged", "r")

    def stage_in(staged, in_c, mask, masked_load, _masked_store):
        value = b.call(masked_load, [in_c, const(4, I32), mask, ir.Constant(vector, None)])
        b.store(value, staged, align=4)

    def stage_out(staged, in_c, mask, _masked_load, masked_store):
        b.call(masked_store, [b.load(staged, typ=vector, align=4), in_c, const(4, I32), mask])

    # Between runs the accumulators wait in the block's compact slot (`stage`), not in C:
    # C's rows 8 KB apart (2048 columns) fall on one L1 set pair and 16 L2 sets, and
    # reloading them there every run cost about 10% of the kernel's time (C model). A
    # ragged block (not first) starts from C's values copied into the slot.
    with b.if_then(b.and_(b.and_(b.not_(whole), b.not_(first)), first_run)):
        ragged_rows(stage_in)
    from_c = b.and_(whole, first_run)
    start = b.select(from_c, c, stage)
    start_stride = b.select(from_c, c_stride, stage_stride)
    start = b.select(run_first, zeros, start)
    start_stride = b.select(run_first, const(0), start_stride)

    def c_tile(base, stride, tr, tc):
        offset = b.add(b.mul(const(tr * AMX_TILE_ROWS), stride), const(tc * TILE_BYTES))
        return element_pointer(b, base, offset, byte)

    initial = [b.call(load, [tile_rows, tile_bytes, c_tile(start, start_stride, tr, tc),
                             start_stride])
               for tr in range(row_tiles) for tc in range(column_tiles)]

    # The depth loop: per 32 depths, row_tiles A tiles and column_tiles B tiles.
    b_row_bytes = const(2 * 2 * panel_columns)  # one depth pair of the panel's columns

    def depth_step(step, accumulators):
        in_main = b.icmp_signed("<", step, run_main)
        a_step = b.select(in_main, element_pointer(b, a, b.mul(step, step_bytes), byte), tail)
        a_stride = b.select(in_main, row_bytes, tile_bytes_wide)
        a_tiles = [b.call(load_a, [tile_rows, tile_bytes, element_pointer(
            b, a_step, b.mul(a_stride, const(tr * AMX_TILE_ROWS)), byte), a_stride])
            for tr in range(row_tiles)]
        b_step = b.mul(step, const(AMX_DEPTH // 2 * 2 * 2 * panel_columns))  # 16 pairs
        b_tiles = [b.call(load, [tile_rows, tile_bytes, element_pointer(
            b, run_b, b.add(b_step, const(tc * TILE_BYTES)), byte), b_row_bytes])
            for tc in range(column_tiles)]
        if a_in_place:
            _prefetch(module, b, a, run_b, b.add(step, const(PREFETCH_STEPS)), mr, nr,
                      panel_columns, row_bytes, step_bytes)
        if PREFETCH_C:
            _prefetch_next_c(module, b, c, c_stride, step, mr, nr, rows_per_step)
        # Runs of run_steps and a shorter last: (run, block, step) numbers 0 .. blocks x
        # steps.
        _prefetch_ahead(module, b, ahead, ahead_stride, ahead_rows, b.add(
            b.mul(run_start, blocks), b.add(b.mul(block, run_length), step)))
        return [b.call(dot, [tile_rows, tile_bytes, tile_bytes,
                             accumulators[tr * column_tiles + tc], a_tiles[tr], b_tiles[tc]])
                for tr in range(row_tiles) for tc in range(column_tiles)]
    finals = carried_loop(b, function, run_length, initial, depth_step, "depth", "step")

    # After the last run whole blocks go straight to C, ragged ones through their slot,
    # then under masks; after the others into the slot.
    to_c = b.and_(whole, last_run)
    out = b.select(to_c, c, stage)
    out_stride = b.select(to_c, c_stride, stage_stride)
    for index, final in enumerate(finals):
        tr, tc = divmod(index, column_tiles)
        b.call(store, [tile_rows, tile_bytes, c_tile(out, out_stride, tr, tc), out_stride,
                       final])
    with b.if_then(b.and_(b.not_(whole), last_run)):
        ragged_rows(stage_out)
    following_block = b.add(block, const(1))
    block.add_incoming(following_block, b.block)
    b.cbranch(b.icmp_signed("<", following_block, blocks), outer, next_run)
    b.position_at_end(next_run)
    following_run = b.add(run_start, run_steps)
    run_start.add_incoming(following_run, next_run)
    b.cbranch(b.icmp_signed("<", following_run, steps), run_block, finished)
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


def _prefetch_next_c(module, b, c, c_stride, step, mr: int, nr: int,
                     rows_per_step: int) -> None:
    """Prefetch into L2 rows rows_per_step x step.. (mod mr) of the next register block's C
    (nr f32, 2 lines each): over a run of mr / rows_per_step steps or more, its whole C
    arrives before its loads and stores (a line no other core holds comes exclusive, so
    the store needs no further request). Past the last block the lines may lie outside
    C; a prefetch never faults."""
    prefetch = declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(),
                                 [PTR, I32, I32, I32])
    read, l2, data = (ir.Constant(I32, value) for value in (0, 2, 1))
    for extra in range(rows_per_step):
        row = b.add(b.mul(step, ir.Constant(I64, rows_per_step)), ir.Constant(I64, extra))
        row = b.add(b.and_(row, ir.Constant(I64, mr - 1)), ir.Constant(I64, mr))
        start = element_pointer(b, c, b.mul(row, c_stride), I8)
        for line in range(nr * 4 // 64):
            b.call(prefetch, [element_pointer(b, start, ir.Constant(I64, 64 * line), I8),
                              read, l2, data])


def _prefetch(module, b, a, bp, step, mr: int, nr: int, panel_columns: int, row_bytes,
              step_bytes) -> None:
    """Prefetch into L1 the A rows and B panel lines of depth step `step` (mr rows of 64
    bytes, row_bytes apart, and the first nr columns of 16 pairs of a panel of
    panel_columns: 32 contiguous lines for a 32-column kernel), for an A read in place.
    Past the end of a panel or of A's whole steps they touch lines nobody reads, which a
    prefetch never faults on."""
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
