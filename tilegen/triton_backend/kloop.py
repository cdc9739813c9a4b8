"""A matmul's K loop (`scf.for` around `tt.dot`) runs as tilegen's gemm runs.

Pointer tiles the loop advances by a uniform step (`a_ptrs += BLOCK_K * stride_ak`) are
not rewritten each trip: the loop keeps the initial tile and a scalar element offset, and
the tile is read lazily as `initial + offset` (a contiguous load reads one address per
chunk of it).

A dot accumulating into a loop-carried tile keeps the accumulator in registers over a
deep block of K, not over one BLOCK_K.

Triton's matmul adds `dot(a, b, acc)` once per BLOCK_K (16-64) deep step; calling the
micro-kernel once per step would load and store the whole accumulator tile (larger than
L1) every step. When the loop-carried accumulator is read by nothing but that dot and the
dot's result by nothing but the yield, the dot is deferred: each trip copies its `a`
into a packed A (rows x KC, row-major) and its `b` into packed B panels (KC x nr each,
converted to the accumulator type on the way; a load read only by the dot stores its
chunks there itself, converted as it goes), and every `group` trips, and once after
the loop, the micro-kernel runs over the packed depth with its accumulators in registers
(KC = `group` x BLOCK_K: at most 256 as tilegen's gemm's kc, and no more than keeps one
packed B panel, KC x nr, at 32 KB, so it stays in L1 while the flush runs every row block
of `a` against it: 128 for the 6 x 64 register block). Nothing can observe the
accumulator between flushes: the loop's result is read only after the final flush.

A dot that runs on AMX tiles (amx_dot.py: bf16, f16, f32 of tf32 precision, tiles of 32 x
32 and more, where the host allows it) is deferred the same way, with amx_dot's packs (A
in slabs of 32 depths, B in VNNI pairs, each operand split into its bf16 terms) and
flushes of up to 1024 packed depths on the AMX micro-kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llvmlite import ir

from . import amx_dot, panel_cache
from .tileir import FLOAT_ELEMS, Op, TileType, element_bytes

I64 = ir.IntType(64)
DEPTH = 256  # the packed K depth of one flush at most (tilegen's gemm uses kc = 256)
PANEL_BYTES = 32 * 1024  # one packed B panel (kc x nr), kept in L1 over a flush's row blocks


def register_block(m: int, n: int, lanes: int, registers: int) -> tuple[int, int]:
    """(nr, mr) of the micro-kernel's register block for a dot of an m x n tile (`lanes`
    per vector, `registers` vector registers). With 32 registers and n spanning four
    vectors, 6 x 4 vectors (tilegen's gemm's register rule: three quarters of the registers
    hold accumulators; 4 B loads and 6 broadcasts per 24 FMAs, against 2 and 8 per 16 for
    8 x 2 vectors); else 8 x 2 or 16 x 1 vectors."""
    if n >= 4 * lanes and registers >= 32:
        return 4 * lanes, min(m, registers * 3 // 4 // 4)
    if n > lanes:
        return 2 * lanes, min(m, 8)
    return lanes, min(m, 16)


def _const(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def advancing_pointers(e, loop: Op) -> dict[int, object]:
    """Carried pointer tiles whose yielded value is `addptr(arg, step)` with a uniform
    step (a splat of a scalar or an integer constant) read by nothing but the yield:
    {carried position: the step Value}."""
    body = loop.regions[0]
    terminator = body.ops[-1]
    if terminator.name != "scf.yield":
        return {}
    defined = {result.id: op for op in body.ops for result in op.results}
    found = {}
    for position, arg in enumerate(body.args[1:]):
        if not (arg.type.is_pointer and arg.type.shape):
            continue
        advanced = defined.get(terminator.operands[position].id)
        if advanced is None or advanced.name != "tt.addptr" or \
                advanced.operands[0].id != arg.id or e.uses.get(advanced.result.id) != 1:
            continue
        found[position] = advanced.operands[1]
    return found


def uniform_step(e, step) -> ir.Value | None:
    """The scalar (as i64) every lane of the step tile holds, if the emitter knows one."""
    value = e.env[step.id]
    kind = getattr(value, "kind", None)
    if kind == "splat":
        scalar = value.payload
    elif kind == "const" and isinstance(value.payload, int):
        return _const(value.payload)
    else:
        return None
    return scalar if scalar.type == I64 else e.b.sext(scalar, I64)


def micro_kernel_dot(op: Op) -> bool:
    """Whether `op` is a dot that runs on the packed-gemm micro-kernel (tiles.dot)."""
    a_value, b_value = op.operands[:2]
    return len(a_value.type.shape) == 2 and op.result.type.elem in ("f32", "f64") and \
        a_value.type.elem in FLOAT_ELEMS and b_value.type.elem in FLOAT_ELEMS


def deferrable_dots(e, loop: Op) -> list[Op]:
    """The dots of `loop`'s body that accumulate into a carried value read by nothing else
    and whose results only feed the yield back into that value."""
    body = loop.regions[0]
    terminator = body.ops[-1]
    if terminator.name != "scf.yield":
        return []
    found = []
    for op in body.ops:
        if op.name != "tt.dot" or not micro_kernel_dot(op):
            continue
        accumulator = op.operands[2]
        carried = [number for number, arg in enumerate(body.args[1:])
                   if arg.id == accumulator.id]
        if len(carried) != 1 or e.uses.get(accumulator.id) != 1:
            continue
        position = carried[0]
        if e.uses.get(op.result.id) != 1 or terminator.operands[position].id != op.result.id:
            continue
        if accumulator.type.elem != op.result.type.elem:
            continue
        found.append(op)
    return found


@dataclass
class DeferredDot:
    """The packed operands and the trip counter of one deferred dot."""

    op: Op
    accumulator: object  # the carried slot (a frame Tile) the flushes accumulate into
    pack_a: object
    pack_b: object
    counter: ir.Value  # i64 alloca: trips packed since the last flush
    group: int
    nr: int
    mr: int
    loaded_packed: frozenset = frozenset()  # operand ids whose loads fill the packs
    cache: panel_cache.PanelCache | None = None  # b's panels kept for the next program
    groups_done: ir.Value | None = None  # i64 alloca: flushes so far (with a cache)
    amx: amx_dot.Layout | None = None  # the packs of a dot on AMX tiles (amx_dot.py)
    kept: object = None  # the AMX kernel's scratch (a frame Tile)


def start(e, loop: Op, op: Op, accumulator, context=None) -> DeferredDot:
    """Before the loop: the pack buffers and a zero trip counter; with the loop's
    `context` (its carried slots, its (lower, upper, step) and advancing_pointers), b's
    panels kept across programs where panel_cache.py allows it."""
    from ..target import host_target

    a_value, b_value = op.operands[:2]
    m, depth = a_value.type.shape
    n = b_value.type.shape[-1]
    elem = op.result.type.elem
    slots, bounds, advancing = context if context is not None else ((), (), {})
    reuse = panel_cache.static_conditions(e, loop, op, advancing) if context else None
    terms = amx_dot.terms_of(op, e.amx_mode) if e.amx else None
    if terms is not None:
        lay = amx_dot.layout(op, terms)
        group, nr, mr = lay.group, lay.nr, lay.mr
        pack_a = e.alloc(lay.pack_a_type())
        groups = panel_cache.groups_held(lay.panels * lay.panel_elements * 2) if reuse else 1
        pack_b = e.alloc(lay.pack_b_type(groups))
    else:
        target = host_target()
        nr, mr = register_block(m, n, target.lanes("f32" if elem == "f32" else "f64"),
                                target.vector_registers)
        kc = min(DEPTH, PANEL_BYTES // (nr * element_bytes(elem)))
        group = max(1, kc // depth)
        panels = -(-n // nr)
        pack_a = e.alloc(TileType(elem, (m, group * depth)))
        group_bytes = panels * group * depth * nr * element_bytes(elem)
        groups = panel_cache.groups_held(group_bytes) if reuse else 1
        pack_b = e.alloc(TileType(elem, (groups * panels, group * depth, nr)))
    counter = e.entry_alloca(I64)
    e.b.store(_const(0), counter)
    plan = DeferredDot(op, accumulator, pack_a, pack_b, counter, group, nr, mr)
    if terms is not None:
        plan = replace(plan, amx=lay, kept=e.alloc(lay.kept_type()))
    if reuse:
        cache = panel_cache.begin(e, reuse, slots, bounds, group, groups)
        groups_done = e.entry_alloca(I64)
        e.b.store(_const(0), groups_done)
        e.load_guards[reuse.load.result.id] = lambda: panel_cache.must_load(e, cache)
        plan = replace(plan, cache=cache, groups_done=groups_done)
    direct = _packed_loads(e, loop, op)
    for operand in direct:
        e.load_sinks[operand.id] = _sink(e, plan, operand is a_value)
    return replace(plan, loaded_packed=frozenset(v.id for v in direct))


def _packed_loads(e, loop: Op, op: Op) -> list:
    """The dot's operands that are loads in the loop body read by nothing but the dot:
    their chunks are stored straight into the packs (f16/bf16 converted to the
    accumulator's type on the way), with no tile of their own."""
    defined = {result.id: body_op for body_op in loop.regions[0].ops
               for result in body_op.results}
    found = []
    for operand in op.operands[:2]:  # (dot(x, x) reads x twice: not a single reader)
        source = defined.get(operand.id)
        if source is not None and source.name == "tt.load" and \
                e.uses.get(operand.id) == 1:
            found.append(operand)
    return found


def _sink(e, plan: DeferredDot, is_a: bool):
    """store(flat index, chunk) of a loaded `a` (or `b`) tile into this trip's place in
    the packed A (or B panels); a chunk never crosses a row or a panel."""
    a_value, b_value = plan.op.operands[:2]
    depth = a_value.type.shape[1]
    n = b_value.type.shape[-1]
    kc = plan.group * depth
    source = (a_value if is_a else b_value).type.elem
    elem = plan.op.result.type.elem

    def store_amx(index, chunk):
        slot = e.b.load(plan.counter)
        if is_a:
            row, column = e.b.udiv(index, _const(depth)), e.b.urem(index, _const(depth))
            amx_dot.store_a(e, plan.amx, plan.pack_a, slot, row, column, chunk, source)
            return
        kk, j = e.b.udiv(index, _const(n)), e.b.urem(index, _const(n))
        amx_dot.store_b(e, plan.amx, plan.pack_b, _b_base(e, plan), slot, kk, j, chunk, source)

    def store(index, chunk):
        if source != elem:
            chunk = e.ew.emit(e.b, "arith.extf", (), [chunk], [source], elem)
        column0 = e.b.mul(e.b.load(plan.counter), _const(depth))
        if is_a:
            row, column = e.b.udiv(index, _const(depth)), e.b.urem(index, _const(depth))
            at = e.b.add(e.b.add(e.b.mul(row, _const(kc)), column0), column)
            e.store_chunk(plan.pack_a, at, chunk)
            return
        kk, j = e.b.udiv(index, _const(n)), e.b.urem(index, _const(n))
        panel, lane = e.b.udiv(j, _const(plan.nr)), e.b.urem(j, _const(plan.nr))
        row = e.b.add(e.b.add(e.b.mul(panel, _const(kc)), column0), kk)
        at = e.b.add(e.b.mul(row, _const(plan.nr)), lane)
        e.store_chunk(plan.pack_b, e.b.add(_b_base(e, plan), at), chunk)
    return store_amx if plan.amx is not None else store


def _b_base(e, plan: DeferredDot) -> ir.Value:
    """The element offset of the current flush group's panels in pack_b."""
    if plan.cache is None:
        return _const(0)
    n = plan.op.operands[1].type.shape[-1]
    kc = plan.group * plan.op.operands[0].type.shape[1]
    elements = -(-n // plan.nr) * kc * plan.nr if plan.amx is None else \
        plan.amx.panels * plan.amx.panel_elements
    return panel_cache.group_base(e, plan.cache, plan.groups_done, elements)


def add(e, plan: DeferredDot, op: Op) -> None:
    """One trip: pack this trip's a and b; flush when `group` trips are packed."""
    a_value, b_value = op.operands[:2]
    m, depth = a_value.type.shape
    n = b_value.type.shape[-1]
    elem = op.result.type.elem
    kc = plan.group * depth
    slot = e.b.load(plan.counter)
    a, b = e.env[a_value.id], e.env[b_value.id]
    a_width, b_width = min(16, depth), min(16, n, plan.nr)

    def converted(value, source_elem, index, width):
        chunk = e.load_chunk(value, index, width)
        if source_elem == elem:
            return chunk
        return e.ew.emit(e.b, "arith.extf", (), [chunk], [source_elem], elem)

    column0 = e.b.mul(slot, _const(depth))
    b_base = _b_base(e, plan)

    def pack_a_row(row):
        source = e.b.mul(row, _const(depth))
        target = e.b.add(e.b.mul(row, _const(kc)), column0)
        for part in range(0, depth, a_width):
            chunk = converted(a, a_value.type.elem, e.b.add(source, _const(part)), a_width)
            e.store_chunk(plan.pack_a, e.b.add(target, _const(part)), chunk)

    def pack_b_row(kk):
        source = e.b.mul(kk, _const(n))
        depth_at = e.b.add(column0, kk)
        for p in range(-(-n // plan.nr)):
            target = e.b.add(b_base, e.b.mul(e.b.add(_const(p * kc), depth_at),
                                             _const(plan.nr)))
            for part in range(0, min(plan.nr, n), b_width):
                chunk = converted(b, b_value.type.elem,
                                  e.b.add(source, _const(p * plan.nr + part)), b_width)
                e.store_chunk(plan.pack_b, e.b.add(target, _const(part)), chunk)

    def pack_a_all():
        if plan.amx is not None:
            amx_dot.pack_a(e, plan.amx, plan.pack_a, slot, a, a_value.type.elem)
        else:
            e.loop(m, pack_a_row, unroll=False)

    def pack_b_all():
        if plan.amx is not None:
            amx_dot.pack_b(e, plan.amx, plan.pack_b, b_base, slot, b, b_value.type.elem)
        else:
            e.loop(depth, pack_b_row, unroll=False)

    if a_value.id not in plan.loaded_packed:
        pack_a_all()
    if b_value.id not in plan.loaded_packed:
        if plan.cache is None:
            pack_b_all()
        else:
            with e.b.if_then(panel_cache.must_load(e, plan.cache)):
                pack_b_all()
    packed = e.b.add(slot, _const(1))
    full = e.b.icmp_signed("==", packed, _const(plan.group))
    with e.b.if_else(full) as (then, otherwise):
        with then:
            _flush(e, plan, _const(plan.group))
            e.b.store(_const(0), plan.counter)
            if plan.groups_done is not None:
                e.b.store(e.b.add(e.b.load(plan.groups_done), _const(1)), plan.groups_done)
        with otherwise:
            e.b.store(packed, plan.counter)
    e.env[op.result.id] = plan.accumulator


def finish(e, plan: DeferredDot) -> None:
    """After the loop: the trips packed since the last flush."""
    slot = e.b.load(plan.counter)
    with e.b.if_then(e.b.icmp_signed(">", slot, _const(0))):
        _flush(e, plan, slot)
    if plan.cache is not None:
        panel_cache.end(e, plan.cache)


def _flush(e, plan: DeferredDot, trips: ir.Value) -> None:
    """acc += the product of the `trips` trips packed."""
    from .. import loopir as L
    from ..micro_kernel import micro_kernel_function

    if plan.amx is not None:
        amx_dot.flush(e, plan.amx, (plan.pack_a, plan.pack_b, plan.kept, plan.accumulator),
                      trips, _b_base(e, plan))
        return
    op = plan.op
    kc = e.b.mul(trips, _const(op.operands[0].type.shape[1]))
    m, depth = op.operands[0].type.shape
    n = op.operands[1].type.shape[-1]
    elem = op.result.type.elem
    stride = plan.group * depth
    mr, nr = plan.mr, plan.nr
    from ..target import host_target

    dtype = L.F32 if elem == "f32" else L.F64
    lanes = host_target().lanes(dtype)
    micro_kernel_blocks(e, lambda rows: micro_kernel_function(e.module, dtype, rows, nr,
                                                              stride, lanes),
                        (plan.pack_a, plan.pack_b, plan.accumulator),
                        (m, n, mr, nr), stride, kc, 0, _b_base(e, plan))


def micro_kernel_blocks(e, kernel, tiles, sizes, stride: int, kc: ir.Value,
                        first: int, packed_at: ir.Value | None = None) -> None:
    """out (+)= a @ packed over `kc` of depth, one micro-kernel call per mr x nr block:
    `a` is row-major with row stride `stride`, `packed` holds nr-wide panels of that
    depth (from element `packed_at` on), `out` is m x n row-major; `first` overwrites
    instead of accumulating. `kernel(rows)` is the micro-kernel of a rows x nr block: the
    m // mr whole blocks use kernel(mr), the m % mr rows left one of exactly that many
    rows (a micro-kernel reads every row of its block of `a`)."""
    a, packed, out = tiles
    m, n, mr, nr = sizes
    whole, left = divmod(m, mr)
    start = packed_at if packed_at is not None else _const(0)

    def block(p, row0, rows: int):
        column0 = e.b.mul(p, _const(nr))
        columns = e.b.sub(_const(n), column0)
        columns = e.b.select(e.b.icmp_signed("<", columns, _const(nr)), columns,
                             _const(nr))
        e.b.call(kernel(rows), [e.address(a, e.b.mul(row0, _const(stride))),
                                _address(e, packed, e.b.add(start, e.b.mul(p, _const(stride * nr))),
                                         a.storage),
                                kc,
                                e.address(out, e.b.add(e.b.mul(row0, _const(n)), column0)),
                                _const(n), _const(rows), columns,
                                ir.Constant(ir.IntType(1), first)])

    def panel(p):
        e.loop(whole, lambda r: block(p, e.b.mul(r, _const(mr)), mr), unroll=False)
        if left:
            block(p, _const(whole * mr), left)
    e.loop(-(-n // nr), panel, unroll=False)


def _address(e, tile, index: ir.Value, element: ir.Type) -> ir.Value:
    """The address of element `index` of a frame tile, or of memory at a pointer (a dot's
    b read where it lies, dot_operands.py)."""
    if isinstance(tile, ir.Value):
        return e.b.gep(tile, [index], source_etype=element)
    return e.address(tile, index)


VIEW_OPS = ("tt.broadcast", "tt.expand_dims", "tt.splat", "tt.reshape")


def rescaled_accumulators(e, loop: Op) -> dict[int, int]:
    """Dots of `loop`'s body whose accumulator operand is an elementwise expression of one
    carried tile, as attention's `acc = tl.dot(p, v, acc * alpha[:, None])`, whose result
    only goes back into that carried value through the yield, and where nothing but that
    expression reads the carried tile: {dot result id: carried position}. Such a dot
    computes its accumulator into the carried slot and accumulates there (tiles.dot):
    no copy of the accumulator into a tile of its own, and none back at the yield."""
    body = loop.regions[0]
    terminator = body.ops[-1]
    if terminator.name != "scf.yield":
        return {}
    defined = {result.id: op for op in body.ops for result in op.results}
    arguments = body.args[1:]
    found = {}
    for op in body.ops:
        if op.name != "tt.dot" or not micro_kernel_dot(op) or e.uses.get(op.result.id) != 1:
            continue
        positions = [number for number, value in enumerate(terminator.operands)
                     if value.id == op.result.id]
        if len(positions) != 1:
            continue
        carried = arguments[positions[0]]
        if carried.type != op.result.type:
            continue
        reads = _reads_in_expression(op.operands[2], carried, defined, e.uses)
        if reads and reads == e.uses.get(carried.id):
            found[op.result.id] = positions[0]
    return found


def _reads_in_expression(value, carried, defined, uses) -> int:
    """How often the elementwise/view expression tree behind `value` (each of its values
    read once: by its parent, `value` by the dot) reads `carried`; 0 when it does not or
    is not such a tree."""
    if value.id == carried.id:
        return 1
    source = defined.get(value.id)
    if source is None or uses.get(value.id) != 1:
        return 0
    if not (source.name.startswith(("arith.", "math.")) or source.name in VIEW_OPS) or \
            source.regions:
        return 0
    total = 0
    for operand in source.operands:
        if operand.id == carried.id:
            total += 1
        elif operand.id in defined:
            total += _reads_in_expression(operand, carried, defined, uses)
    return total
