"""The register-blocked micro-kernels every packed product runs, and the LLVM helpers they
are built from.

`micro_kernel_shell` is the function, its k loop with the accumulators carried as phis, and
the masked store of the block into C; each kernel supplies one step of that loop:
`micro_kernel_function` (tilegen's packed fp32/fp64 gemm and the Triton backend's dots:
packed B rows as vectors, A elements broadcast), gemm_small's B read in place, gemm_bf16's
`vdpbf16ps` pairs.
"""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L
from .codegen_values import I1, I64, PTR, SCALAR_LLVM, broadcast_mask, zeros


def micro_kernel_function(module: ir.Module, dtype: str, mr: int, nr: int,
                          a_stride: int | None, lanes: int,
                          prefetch_c: bool = False) -> ir.Function:
    """`void mk(ptr a, ptr b, i64 kc, ptr c, i64 ldc, i64 rows, i64 cols, i1 first)`:
    C[r, j] (+)= sum over k < kc of Ap[r * a_stride + k] * Bp[k * nr + j], for r < rows
    (at most mr) and j < cols (at most nr); `first` overwrites instead of accumulating.
    B rows are `nr // lanes` vectors of `lanes` elements (the target's vector).
    One definition per register block in a module, shared by every gemm (small IR, fast
    compiles); its k loop keeps the mr x nr/lanes accumulators in registers. With
    `a_stride` None the stride is a last argument, `i64 a_stride` (the shared gemm driver's
    kernel, one for every depth block: tilegen/gemm_driver.py). With `prefetch_c` (the packed
    gemm's kernels, not the Triton backend's dots) each call first prefetches its block of
    C (prefetch_block)."""
    stride = "" if a_stride is None else f".s{a_stride}"
    name = f"tilegen.gemm.{dtype}.{mr}x{nr}{stride}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    element, vector, _, fma = vector_fma(module, dtype, lanes)
    parts = nr // lanes

    def step(b, a, bp, k, accumulators):
        b_row = element_pointer(b, bp, b.mul(k, ir.Constant(I64, nr)), element)
        columns = [b.load(element_pointer(b, b_row, ir.Constant(I64, part * lanes), element),
                          typ=vector, align=L.ELEMENT_BYTES[dtype]) for part in range(parts)]
        updated = []
        for r in range(mr):
            if a_stride is None:  # `a`: the rows' pointers
                pointer = element_pointer(b, a[r], k, element)
            else:
                pointer = element_pointer(b, a, b.add(k, ir.Constant(I64, r * a_stride)),
                                          element)
            scalar = b.load(pointer, typ=element)
            broadcast = splat(b, scalar, lanes)
            for part in range(parts):
                updated.append(b.call(fma, [broadcast, columns[part],
                                            accumulators[r * parts + part]]))
        return updated
    return micro_kernel_shell(module, name, dtype, mr, parts, lanes, step,
                              a_rows=a_stride is None, prefetch_c=prefetch_c)


def cache_line_aligned(b: ir.IRBuilder, pointer):
    """`pointer` moved up to the next multiple of 64 bytes (0 to 63 bytes on)."""
    address = b.ptrtoint(pointer, I64)
    skip = b.and_(b.sub(ir.Constant(I64, 0), address), ir.Constant(I64, 63))
    return element_pointer(b, pointer, skip, ir.IntType(8))


def vector_fma(module: ir.Module, dtype: str, lanes: int):
    """(element type, vector type, intrinsic suffix, llvm.fma) for `lanes` x `dtype`."""
    element = SCALAR_LLVM[dtype]
    vector = ir.VectorType(element, lanes)
    suffix = f"v{lanes}{'f32' if dtype == L.F32 else 'f64'}"
    return element, vector, suffix, declare_intrinsic(module, f"llvm.fma.{suffix}", vector,
                                                      [vector] * 3)


def element_pointer(b: ir.IRBuilder, base, offset, element: ir.Type):
    pointer = b.gep(base, [offset], source_etype=element)
    pointer.type = PTR
    return pointer


def declare_intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, ir.FunctionType(ret, args), name)


def smin(b: ir.IRBuilder, x, y):
    """The signed minimum of two integers."""
    return b.select(b.icmp_signed("<", x, y), x, y)


def splat(b: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
    i32 = ir.IntType(32)
    ty = ir.VectorType(value.type, lanes)
    inserted = b.insert_element(zeros(ty), value, ir.Constant(i32, 0))
    return b.shuffle_vector(inserted, zeros(ty), broadcast_mask(lanes))


def carried_loop(b: ir.IRBuilder, function: ir.Function, count, initial: list, body,
                 block_name: str, counter_name: str) -> list:
    """A loop of `count` trips (none when count <= 0) carrying the values `initial` as
    phis: `body(counter, carried) -> updated` builds one trip. Returns the values after the
    loop (`initial` when it ran no trip), the builder left in its exit block, "store"."""
    entry = b.block
    loop = function.append_basic_block(block_name)
    done = function.append_basic_block("store")
    b.cbranch(b.icmp_signed(">", count, ir.Constant(I64, 0)), loop, done)
    b.position_at_end(loop)
    counter = b.phi(I64, name=counter_name)
    counter.add_incoming(ir.Constant(I64, 0), entry)
    carried = []
    for value in initial:
        phi = b.phi(value.type)
        phi.add_incoming(value, entry)
        carried.append(phi)
    updated = body(counter, carried)
    following = b.add(counter, ir.Constant(I64, 1), flags=("nsw",))
    latch = b.block
    counter.add_incoming(following, latch)
    for phi, value in zip(carried, updated, strict=True):
        phi.add_incoming(value, latch)
    b.cbranch(b.icmp_signed("<", following, count), loop, done)
    b.position_at_end(done)
    finals = []
    for start, value in zip(initial, updated, strict=True):
        final = b.phi(value.type)
        final.add_incoming(start, entry)
        final.add_incoming(value, latch)
        finals.append(final)
    return finals


def micro_kernel_shell(module: ir.Module, name: str, dtype: str, mr: int, parts: int,
                       lanes: int, step, masked_b: bool = False,
                       a_rows: bool = False, prefetch_c: bool = False) -> ir.Function:
    """The micro-kernel around `step(builder, a, b, k, accumulators) -> updated`, one step
    of its k loop over the mr x parts accumulator vectors of `dtype`: the function
    (signature as in micro_kernel_function, kc counting steps), the loop with the
    accumulators carried as phis, and the masked store of the block into C. With
    `masked_b`, step also gets the column masks (one per vector of `cols`), computed once
    before the loop, for loads of a B that is not zero-padded (gemm_small.py). With
    `a_rows` the function takes A's row stride as a last argument, `i64 a_stride`, and
    step gets the mr rows' pointers instead of `a`. With `prefetch_c` the call first
    prefetches its block of C (prefetch_block) for the store after the loop."""
    element = SCALAR_LLVM[dtype]
    vector = ir.VectorType(element, lanes)
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, PTR, I64, I64, I64, I1] +
                           [I64] * a_rows)
    function = ir.Function(module, fnty, name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    function.attributes.add("noinline")
    a, bp, kc, c, ldc, rows, cols, first = function.args[:8]
    for arg in (a, bp, c):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(function.append_basic_block("entry"))

    def const(value):
        return ir.Constant(I64, value)

    if a_rows:
        a_stride = function.args[8]
        a = [element_pointer(b, a, b.mul(const(r), a_stride), element) for r in range(mr)]

    suffix = f"v{lanes}{'f32' if dtype == L.F32 else 'f64'}"
    mask_type = ir.VectorType(I1, lanes)
    masked_load = declare_intrinsic(module, f"llvm.masked.load.{suffix}.p0", vector,
                                    [PTR, i32, mask_type, vector])
    masked_store = declare_intrinsic(module, f"llvm.masked.store.{suffix}.p0", ir.VoidType(),
                                     [vector, PTR, i32, mask_type])

    steps = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    masks = [b.icmp_signed("<", b.add(splat(b, const(part * lanes), lanes), steps),
                           splat(b, cols, lanes)) for part in range(parts)]

    if prefetch_c:
        prefetch_block(module, b, c, ldc, mr, parts * lanes * L.ELEMENT_BYTES[dtype], element)

    # The k loop, accumulators carried as phis.
    zero = zeros(vector)

    def body(k, accumulators):
        return step(b, a, bp, k, accumulators, masks) if masked_b else \
            step(b, a, bp, k, accumulators)
    finals = carried_loop(b, function, kc, [zero] * (mr * parts), body, "k", "k")

    # Store: rows below `rows`, lanes below `cols`; accumulate unless `first`.
    align = ir.Constant(i32, L.ELEMENT_BYTES[dtype])
    for r in range(mr):
        with b.if_then(b.icmp_signed("<", const(r), rows)):
            row = element_pointer(b, c, b.mul(const(r), ldc), element)
            for part in range(parts):
                pointer = element_pointer(b, row, const(part * lanes), element)
                value = finals[r * parts + part]
                previous = b.call(masked_load, [pointer, align, masks[part], zero])
                total = b.select(first, value, b.fadd(previous, value))
                b.call(masked_store, [total, pointer, align, masks[part]])
    b.ret_void()
    return function


def prefetch_block(module: ir.Module, b: ir.IRBuilder, c, ldc, rows: int, row_bytes: int,
                   element: ir.Type) -> None:
    """Prefetch for writing, into L2, `rows` rows of `row_bytes` bytes at `c`, `ldc`
    elements apart: every line of each row, the row's last byte included (a row need not
    start on a line). A micro-kernel's C misses at its end otherwise: C of 2048 x 2048 f32
    (16 MB) is past L2 and shares L3 with the operands, and 24 misses at each call's end
    cost the `vdpbf16ps` kernel about 9 % of 2048^3 with 256-deep blocks on Zen 4. Into
    L2, not L1: a call streams more of A and B through L1 than it holds. Rows past the
    block's last (a ragged block) are prefetched too; a prefetch never faults."""
    i32 = ir.IntType(32)
    prefetch = declare_intrinsic(module, "llvm.prefetch.p0", ir.VoidType(),
                                 [PTR, i32, i32, i32])
    write, l2, data = (ir.Constant(i32, value) for value in (1, 2, 1))
    i8 = ir.IntType(8)
    for r in range(rows):
        row = element_pointer(b, c, b.mul(ir.Constant(I64, r), ldc), element)
        for offset in [*range(0, row_bytes, 64), row_bytes - 1]:
            b.call(prefetch, [element_pointer(b, row, ir.Constant(I64, offset), i8), write,
                              l2, data])
