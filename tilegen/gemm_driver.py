"""The packed fp32/fp64 gemm's loops as one function per micro-kernel, shared by every
product of a module; each product keeps only its packing.

    i64 driver(ptr pack_a, ptr context_a, ptr pack_b, ptr context_b, ptr packed_a,
               ptr packed_b, ptr c, i64 ldc, i64 row_lo, i64 row_hi, i64 col_lo, i64 col_hi, i64 k,
               i64 mc, i64 nc, i64 kc)

runs gemm.py's block structure (column blocks of nc, depth blocks of kc, row blocks of mc,
micro-panels of nr, register blocks of mr; the loops in the module docstring of gemm.py)
on C[row_lo:row_hi, col_lo:col_hi] with every size, bound and leading dimension a run-time
argument, so its code depends only on the micro-kernel it calls (dtype, mr x nr and A's
packed row stride: `tilegen.gemm.driver.f32.12x32.s256`). What is particular to a product
is how its operands are read (transposed, broadcast, a fused producer such as a bias add
or a GELU computed while packing): that is two small functions of the product,

    i64 pack(ptr context, ptr packed, i64 first, i64 count, i64 pc, i64 kc)

packing rows (A) or columns (B) first..first+count-1 at depths pc..pc+kc-1 exactly as the
inline packing did (pack_a then zero_a_rows; pack_b), called by the driver through the
pointers it is given, each with its context: the caller's error slots, the scalars in scope
(batch indices, top-level lets) and the buffer pointers that function reads; a non-zero status
(a failed id check in a gathered operand) ends the driver and is the caller's to report.

Fully specialised, each of MiniLM's six products was its own copy of these loops (with
its own depth, column and row bounds folded in), and LLVM optimised and compiled each:
the loops are the larger part of a product's code when its operands are plain loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from . import loopir as L
from .codegen import KernelCodegen
from .codegen_values import I64, PTR, SCALAR_LLVM, Val, linear_offset, zeros
from .micro_kernel import (
    declare_intrinsic,
    element_pointer,
    micro_kernel_function,
    smin,
    splat,
)
from .parallel import CapturedPointers
from .schedule import flat_coefficient
from .shared import return_status

# The packing functions' signature (gemm_driver's module docstring).
PACK_TYPE = ir.FunctionType(I64, [PTR, PTR, I64, I64, I64, I64])


def run_rows(emitter, row_lo, row_hi, col_lo, col_hi) -> None:
    """C[row_lo:row_hi, col_lo:col_hi] of `emitter`'s gemm (a gemm._GemmEmitter whose
    scratch block is not yet taken) through the shared driver: the packing functions, the
    context they read, one driver call."""
    cg, g, t, b = emitter.cg, emitter.g, emitter.tiles, emitter.b
    row_lo, row_hi, col_lo, col_hi = (emitter.const(bound) if isinstance(bound, int) else bound
                                      for bound in (row_lo, row_hi, col_lo, col_hi))
    a_size = t.mc * emitter.a_stride
    block, slot = emitter.scratch(a_size + emitter.b_panel_elements())
    packed_a, packed_b = emitter.panels(block, a_size)
    captured = [(name, value) for scope in cg.env for name, value in scope.items()]
    contexts = []
    for role, body in (("packa", _pack_a_body), ("packb", _pack_b_body)):
        plain = plain_operand(emitter, role)
        if plain is not None:
            contexts += _plain_packing(emitter, role, *plain)
            continue
        pack = _pack_function(emitter, role, captured, body)
        contexts += [pack.function, _context(cg, captured, pack.pointers.used)]
    c = emitter.c_pointer(emitter.const(0), emitter.const(0))
    driver = driver_function(cg.module, emitter)
    status = b.call(driver, contexts + [packed_a, packed_b, c,
                             emitter.const(g.n), row_lo, row_hi, col_lo, col_hi,
                             emitter.const(g.k_extent), emitter.const(t.mc),
                             emitter.const(t.nc), emitter.const(t.kc),
                             emitter.const(emitter.a_stride)])
    with b.if_then(b.icmp_signed("!=", status, emitter.const(0)), likely=False):
        cg.exit_with(status)
    cg.cleanups.remove(block)
    cg.release_block(block, slot)


def plain_operand(emitter, role: str) -> tuple[L.Load, int] | None:
    """(the load, its row stride) when the gemm's A (role "packa") or B ("packb") is a
    load of a buffer of the gemm's element type, contiguous along the packed vectors (A
    along k, B along j) and affine in the other index: packed by the module's copy loop
    (`plain_pack_a` / `plain_pack_b`) from a base pointer and a row stride, no function of
    its own."""
    g = emitter.g
    load, along, rows = (g.a_elem, g.k, g.i) if role == "packa" else (g.b_elem, g.j, g.k)
    if not isinstance(load, L.Load) or emitter.cg.buffers[load.buffer].dtype != g.dtype:
        return None
    strides = emitter.cg.buffers[load.buffer].strides
    if flat_coefficient(load.index, strides, along.name) != 1:
        return None
    row_stride = flat_coefficient(load.index, strides, rows.name)
    return None if row_stride is None else (load, row_stride)


def _plain_packing(emitter, role: str, load: L.Load, row_stride: int) -> list:
    """[the module's copy loop, its context] for a plain operand: the element at index 0
    of the packed axes (the batch entry's corner), the row stride, and what the loop needs
    of the tiles (A: its packed row stride, mr and mc, to zero the rows of the last
    register block past M; B: N, past which its columns are zeros)."""
    cg, g, t, b = emitter.cg, emitter.g, emitter.tiles, emitter.b
    at_origin = {g.i.name: L.const(0), g.j.name: L.const(0), g.k.name: L.const(0)}
    shape = cg.buffers[load.buffer].shape
    offset = cg.expr(linear_offset(tuple(L.substitute(e, at_origin) for e in load.index),
                                   shape)).value
    corner = element_pointer(b, cg.pointers[load.buffer], offset, emitter.element)
    if role == "packa":
        function = plain_pack_a(cg.module, g.dtype, emitter.lanes)
        values = [row_stride, emitter.a_stride, t.mr, t.mc]
    else:
        function = plain_pack_b(cg.module, g.dtype, emitter.lanes, t.nr)
        values = [row_stride, g.n]
    context = _entry_alloca(cg, 1 + len(values))
    b.store(corner, _slot(b, context, 0))
    for index, value in enumerate(values):
        b.store(ir.Constant(I64, value), _slot(b, context, 1 + index))
    return [function, context]


@dataclass(frozen=True)
class _PackShell:
    """A new module-wide packing function (PACK_TYPE) being built."""

    function: ir.Function
    b: ir.IRBuilder
    args: tuple  # context, packed, first, count, pc, kc
    element: ir.Type
    vector: ir.VectorType
    align: int
    corner: ir.Value  # context[0]: the operand's element at index 0 of the packed axes


def _pack_shell(module: ir.Module, name: str, dtype: str, lanes: int, build) -> ir.Function:
    """The module's packing function `name`, built by `build(shell)` (a _PackShell) the
    first time it is asked for."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    function = ir.Function(module, PACK_TYPE, name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    function.attributes.add("noinline")
    for arg, label in zip(function.args, ("context", "packed", "first", "count", "pc", "kc"),
                          strict=True):
        arg.name = label
    b = ir.IRBuilder(function.append_basic_block("entry"))
    element = SCALAR_LLVM[dtype]
    build(_PackShell(function, b, tuple(function.args), element,
                     ir.VectorType(element, lanes), L.ELEMENT_BYTES[dtype],
                     _context_value(b, function.args[0], 0, PTR)))
    return function


def _context_value(b: ir.IRBuilder, context, index: int, typ=I64):
    return b.load(_slot(b, context, index), typ=typ)


def _lanes_below(b: ir.IRBuilder, first, limit, lanes: int):
    """The mask of lanes first + 0..lanes-1 below `limit`."""
    steps = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    index = b.add(splat(b, first, lanes), steps)
    return b.icmp_signed("<", index, splat(b, limit, lanes))


def _masked_load(b: ir.IRBuilder, module: ir.Module, dtype: str, lanes: int, pointer, mask):
    element = SCALAR_LLVM[dtype]
    vector = ir.VectorType(element, lanes)
    suffix = f"v{lanes}{'f32' if dtype == L.F32 else 'f64'}"
    load = declare_intrinsic(module, f"llvm.masked.load.{suffix}.p0", vector,
                             [PTR, ir.IntType(32), ir.VectorType(ir.IntType(1), lanes),
                              vector])
    return b.call(load, [pointer, ir.Constant(ir.IntType(32), L.ELEMENT_BYTES[dtype]), mask,
                         zeros(vector)])


def plain_pack_a(module: ir.Module, dtype: str, lanes: int) -> ir.Function:
    """Ap[r * a_stride + k] = A[first + r, pc + k] for r < count, k < kc (zeros from kc to
    the next whole vector), A's rows `lda` apart from the context's corner; then zeros in
    rows count.. up to the end of the last register block (as gemm's zero_a_rows). Context:
    [corner, lda, a_stride, mr, mc]. Whole vectors are copied unmasked, a partial last one
    under its mask (masks cost as many instructions as the loads)."""
    return _pack_shell(module, f"tilegen.gemm.pack_a.{dtype}.v{lanes}", dtype, lanes,
                       lambda shell: _build_pack_a(shell, module, dtype, lanes))


def _build_pack_a(shell: _PackShell, module: ir.Module, dtype: str, lanes: int) -> None:
    function, b, element, vector, align, corner = (shell.function, shell.b, shell.element,
                                                   shell.vector, shell.align, shell.corner)
    context, packed, first, count, pc, kc = shell.args
    lda, a_stride, mr, mc = (_context_value(b, context, i) for i in range(1, 5))
    zero = ir.Constant(I64, 0)
    whole = b.and_(kc, ir.Constant(I64, -lanes))  # depths in whole vectors

    def row(r):
        source = element_pointer(b, corner, b.add(b.mul(b.add(first, r), lda), pc), element)
        target = element_pointer(b, packed, b.mul(r, a_stride), element)
        _counted_loop(b, function, zero, whole, lanes, lambda k: b.store(
            b.load(element_pointer(b, source, k, element), typ=vector, align=align),
            element_pointer(b, target, k, element), align=align))
        with b.if_then(b.icmp_signed("<", whole, kc)):
            value = _masked_load(b, module, dtype, lanes, element_pointer(b, source, whole,
                                                                          element),
                                 _lanes_below(b, whole, kc, lanes))
            b.store(value, element_pointer(b, target, whole, element), align=align)
    _counted_loop(b, function, zero, count, 1, row)
    whole_blocks = b.mul(b.sdiv(b.add(count, b.sub(mr, ir.Constant(I64, 1))), mr), mr)
    end = smin(b, whole_blocks, mc)

    def zero_row(r):
        target = element_pointer(b, packed, b.mul(r, a_stride), element)
        _counted_loop(b, function, zero, kc, lanes, lambda k: b.store(
            zeros(vector), element_pointer(b, target, k, element), align=align))
    _counted_loop(b, function, count, end, 1, zero_row)
    b.ret(zero)


def plain_pack_b(module: ir.Module, dtype: str, lanes: int, nr: int) -> ir.Function:
    """Bp[jr * kc + k * nr + r] = B[pc + k, first + jr + r] for jr < count by nr, k < kc,
    zeros past column N; B's rows `ldb` apart from the context's corner. Context:
    [corner, ldb, n]. A micro-panel inside N is copied unmasked, one reaching past it under
    its column masks."""
    return _pack_shell(module, f"tilegen.gemm.pack_b.{dtype}.{nr}x{lanes}", dtype, lanes,
                       lambda shell: _build_pack_b(shell, module, dtype, lanes, nr))


def _build_pack_b(shell: _PackShell, module: ir.Module, dtype: str, lanes: int,
                  nr: int) -> None:
    function, b, vector, align, corner = (shell.function, shell.b, shell.vector, shell.align,
                                          shell.corner)
    element = shell.element
    context, packed, first, count, pc, kc = shell.args
    ldb, n = _context_value(b, context, 1), _context_value(b, context, 2)
    zero = ir.Constant(I64, 0)

    def panel(jr):
        column = b.add(first, jr)
        target = element_pointer(b, packed, b.mul(jr, kc), element)

        def copy(masks):
            def depth(k):
                source = element_pointer(b, corner, b.add(b.mul(b.add(pc, k), ldb), column),
                                         element)
                row = element_pointer(b, target, b.mul(k, ir.Constant(I64, nr)), element)
                for part, mask in enumerate(masks):
                    offset = ir.Constant(I64, part * lanes)
                    pointer = element_pointer(b, source, offset, element)
                    value = b.load(pointer, typ=vector, align=align) if mask is None else \
                        _masked_load(b, module, dtype, lanes, pointer, mask)
                    b.store(value, element_pointer(b, row, offset, element), align=align)
            _counted_loop(b, function, zero, kc, 1, depth)
        inside = b.icmp_signed("<=", b.add(column, ir.Constant(I64, nr)), n)
        with b.if_else(inside) as (whole, ragged):
            with whole:
                copy([None] * (nr // lanes))
            with ragged:
                copy([_lanes_below(b, b.add(column, ir.Constant(I64, part * lanes)), n, lanes)
                      for part in range(nr // lanes)])
    _counted_loop(b, function, zero, count, nr, panel)
    b.ret(zero)


def _context(cg: KernelCodegen, captured, used: list[str]) -> ir.Value:
    """A packing function's context, filled where the gemm runs: the error slots, the
    scalars in scope, the buffers it reads."""
    b = cg.b
    context = _entry_alloca(cg, 1 + len(captured) + len(used))
    b.store(cg.err, _slot(b, context, 0))
    for index, (_, value) in enumerate(captured):
        b.store(value.value, _slot(b, context, 1 + index))
    for index, name in enumerate(used):
        b.store(cg.pointers[name], _slot(b, context, 1 + len(captured) + index))
    return context


def _pack_a_body(emitter, packed, first, count, pc, kc) -> None:
    emitter.pack_a(packed, first, count, pc, kc)
    emitter.zero_a_rows(packed, count, kc)


def _pack_b_body(emitter, packed, first, count, pc, kc) -> None:
    emitter.pack_b(packed, first, count, pc, kc)


def _pack_function(emitter, role: str, captured, body) -> PackCodegen:
    """One of the product's packing functions: `body(emitter, packed, first, count, pc,
    kc)` emitted by an emitter of the same gemm generating into it."""
    cg = emitter.cg
    name = cg.module.get_unique_name(f"{cg.function.name}.{role}")
    pack = PackCodegen(cg, name, captured)
    inner = type(emitter)(pack, emitter.g)
    packed, first, count, pc, kc = pack.function.args[1:]
    g, t = emitter.g, emitter.tiles
    # Every depth block a whole number of vectors: pack_a/pack_b drop the depth masks.
    whole = g.k_extent % inner.lanes == 0 and t.kc % inner.lanes == 0
    inner.whole_depth_block = kc if whole else None
    body(inner, packed, first, count, pc, kc)
    pack.finish()
    return pack


class PackCodegen(KernelCodegen):
    """A product's packing step as `i64 fn(ptr context, ptr packed, i64 first, i64 count,
    i64 pc, i64 kc)`: the caller's scalars and buffers come from `context` (slot 0 its
    error slots), the status is the kernel's (0, or a failed id check's)."""

    def __init__(self, parent: KernelCodegen, name: str, captured):
        self._start_helper(parent, ir.Function(parent.module, PACK_TYPE, name))
        self.function.attributes.add("noinline")
        context, packed, first, count, pc, kc = self.function.args
        for arg, label in zip(self.function.args, ("context", "packed", "first", "count",
                                                   "pc", "kc"), strict=True):
            arg.name = label
        packed.add_attribute("noalias")
        b = self.b
        self.context = context
        self.err = b.load(_slot(b, context, 0), typ=PTR)
        self.env = [{name: Val(b.load(_slot(b, context, 1 + i), typ=value.value.type), False)
                     for i, (name, value) in enumerate(captured)}]
        self.pointers = CapturedPointers(self, self.function.entry_basic_block, context,
                                         1 + len(captured), parent.pointers)

    def finish(self) -> None:
        return_status(self)


def driver_function(module: ir.Module, emitter) -> ir.Function:
    """The driver for `emitter`'s micro-kernel (one per kernel name in a module)."""
    mr, nr = emitter.tiles.mr, emitter.tiles.nr
    kernel = micro_kernel_function(module, emitter.g.dtype, mr, nr, None, emitter.lanes,
                                   prefetch_c=True)
    name = kernel.name.replace("tilegen.gemm.", "tilegen.gemm.driver.", 1)
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    element, packed_element = emitter.element, emitter.packed_element
    function = ir.Function(module, ir.FunctionType(I64, [PTR] * 7 + [I64] * 10), name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    function.attributes.add("noinline")
    args = function.args
    for arg, label in zip(args, ("pack_a", "context_a", "pack_b", "context_b", "packed_a",
                                 "packed_b", "c", "ldc", "row_lo", "row_hi", "col_lo",
                                 "col_hi", "k", "mc", "nc", "kc", "a_stride"), strict=True):
        arg.name = label
    pack_a, context_a, pack_b, context_b, packed_a, packed_b, c = args[:7]
    for pointer in (pack_a, pack_b):
        pointer.__class__ = _PackPointer
    ldc, row_lo, row_hi, col_lo, col_hi, k, mc_max, nc_max, kc_max, a_stride = args[7:]
    b = ir.IRBuilder(function.append_basic_block("entry"))
    failed = function.append_basic_block("failed")

    def const(value: int) -> ir.Constant:
        return ir.Constant(I64, value)

    statuses: list = []  # (status, block) of each branch to `failed`

    def check(status) -> None:
        following = function.append_basic_block("packed")
        b.cbranch(b.icmp_signed("!=", status, const(0)), failed, following)
        statuses.append((status, b.block))
        b.position_at_end(following)

    def column_block(jc):
        nc = smin(b, nc_max, b.sub(col_hi, jc))

        def depth_block(pc):
            kc = smin(b, kc_max, b.sub(k, pc))
            check(b.call(pack_b, [context_b, packed_b, jc, nc, pc, kc]))
            first = b.icmp_signed("==", pc, const(0))

            def row_block(ic):
                mc = smin(b, mc_max, b.sub(row_hi, ic))
                check(b.call(pack_a, [context_a, packed_a, ic, mc, pc, kc]))

                def panel(jr):
                    col0 = b.add(jc, jr)
                    b_panel = element_pointer(b, packed_b, b.mul(jr, kc), packed_element)

                    def register_block(ir_):
                        row0 = b.add(ic, ir_)
                        corner = element_pointer(b, c, b.add(b.mul(row0, ldc), col0), element)
                        a_block = element_pointer(b, packed_a, b.mul(ir_, a_stride),
                                                  packed_element)
                        b.call(kernel, [a_block, b_panel, kc, corner, ldc, b.sub(row_hi, row0),
                                        b.sub(col_hi, col0), first, a_stride])
                    _counted_loop(b, function, const(0), mc, mr, register_block)
                _counted_loop(b, function, const(0), nc, nr, panel)
            _counted_loop(b, function, row_lo, row_hi, mc_max, row_block)
        _counted_loop(b, function, const(0), k, kc_max, depth_block)
    _counted_loop(b, function, col_lo, col_hi, nc_max, column_block)
    b.ret(const(0))
    b.position_at_end(failed)
    status = b.phi(I64, name="status")
    for value, block in statuses:
        status.add_incoming(value, block)
    b.ret(status)
    return function


class _PackPointer(ir.Argument):
    """A driver argument pointing to a packing function: llvmlite's call needs the
    callee's function type, which an opaque `ptr` argument does not carry."""

    @property
    def function_type(self) -> ir.FunctionType:
        return PACK_TYPE


def _counted_loop(b: ir.IRBuilder, function: ir.Function, start, stop, step, body) -> None:
    """for (i = start; i < stop; i += step) body(i), with run-time bounds (maybe empty)."""
    step = step if isinstance(step, ir.Value) else ir.Constant(I64, step)
    before = b.block
    loop = function.append_basic_block("loop")
    done = function.append_basic_block("after")
    b.cbranch(b.icmp_signed("<", start, stop), loop, done)
    b.position_at_end(loop)
    index = b.phi(I64, name="i")
    index.add_incoming(start, before)
    body(index)
    following = b.add(index, step, flags=("nsw",))
    index.add_incoming(following, b.block)
    b.cbranch(b.icmp_signed("<", following, stop), loop, done)
    b.position_at_end(done)


def _entry_alloca(cg: KernelCodegen, count: int) -> ir.Value:
    """`count` i64 slots on the stack of `cg`'s function, allocated in its entry block (a
    gemm inside a loop over batch entries fills them once per entry)."""
    entry = cg.function.entry_basic_block
    if cg.b.block is entry:
        b = cg.b
    else:
        b = ir.IRBuilder(entry)
        b.position_at_start(entry)
    pointer = b.alloca(I64, size=ir.Constant(I64, count), name="gemm.ctx")
    pointer.type = PTR
    return pointer


def _slot(b: ir.IRBuilder, base: ir.Value, index: int) -> ir.Value:
    pointer = b.gep(base, [ir.Constant(I64, index)], source_etype=I64)
    pointer.type = PTR
    return pointer
