"""Tile ops that move elements between positions (broadcast, trans), fold them (reduce,
scan, dot), and structured control flow (scf.for / if / while)."""

from __future__ import annotations

from llvmlite import ir

from . import (
    amx_dot,
    branch_stores,
    dot_operands,
    interior,
    kloop,
    partials,
    sibling_reductions,
)
from .elementwise import I32, I64, PTR, bf16_to_f32, of_width, scalar_type
from .tileir import TileType, element_bytes, reaches_any


def _const(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def row_index(e, flat_row: ir.Value, out_rows: tuple[int, ...], in_rows: tuple[int, ...]):
    """The row of the input that output row `flat_row` reads (dims of size 1 broadcast)."""
    index = _const(0)
    remaining = flat_row
    stride_in = 1
    for out_dim, in_dim in zip(reversed(out_rows), reversed(in_rows), strict=True):
        coordinate = e.b.urem(remaining, _const(out_dim)) if out_dim > 1 else _const(0)
        remaining = e.b.udiv(remaining, _const(out_dim)) if out_dim > 1 else remaining
        if in_dim > 1:
            index = e.b.add(index, e.b.mul(coordinate, _const(stride_in)))
        stride_in *= in_dim
    return index


def trans(e, op) -> None:
    source = e.env[op.operands[0].id]
    order = op.attr("order")
    in_shape, out_shape = op.operands[0].type.shape, op.result.type.shape
    in_strides = _strides(in_shape)
    out = e.alloc(op.result.type)

    def element(flat):
        remaining, index = flat, _const(0)
        for axis in reversed(range(len(out_shape))):
            coordinate = e.b.urem(remaining, _const(out_shape[axis]))
            remaining = e.b.udiv(remaining, _const(out_shape[axis]))
            index = e.b.add(index, e.b.mul(coordinate, _const(in_strides[order[axis]])))
        e.store_chunk(out, flat, e.load_element(source, index))

    e.loop(op.result.type.numel, element)
    e.env[op.result.id] = out


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return strides[::-1]


def _split(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    outer = 1
    for dim in shape[:axis]:
        outer *= dim
    inner = 1
    for dim in shape[axis + 1:]:
        inner *= dim
    return outer, shape[axis], inner


def reduce(e, op) -> None:
    axis = op.attr("axis")
    sources = [e.env[v.id] for v in op.operands]
    shape = sources[0].type.shape  # a carried tile kept folded is shorter (partials.py)
    outer, extent, inner = _split(shape, axis)
    region = op.regions[0]
    scalar_result = not op.results[0].type.shape
    outs = [None if scalar_result else e.alloc(r.type) for r in op.results]
    finals: list = []
    results = list(op.results)

    def combine(accs, values):
        return e.region(region, accs + values)

    if inner > 1:
        width = min(16, inner)

        def group(o, c):
            base = e.b.add(e.b.mul(o, _const(extent * inner)), e.b.mul(c, _const(width)))
            firsts = [e.load_chunk(s, base, width) for s in sources]

            def step(j, accs):
                at = e.b.add(base, e.b.mul(j, _const(inner)))
                return combine(accs, [e.load_chunk(s, at, width) for s in sources])
            accs = e.counted_loop(_const(1), _const(extent), _const(1), firsts, step)
            out_at = e.b.add(e.b.mul(o, _const(inner)), e.b.mul(c, _const(width)))
            for out, acc in zip(outs, accs, strict=True):
                e.store_chunk(out, out_at, acc)

        e.loop(outer, lambda o: e.loop(inner // width, lambda c: group(o, c)))
    else:
        width = min(16, extent)
        # later reductions of the same rows run in this sweep (sibling_reductions.py)
        joined, hoisted = e.siblings.joined(e, op, shape)
        for early in hoisted:  # pure ops computing their operands
            e.op(early)
            e.emitted_early.add(id(early))
        e.current_op = op
        if joined:
            sources += [e.env[v.id] for later in joined for v in later.operands]
            outs += [None if scalar_result else e.alloc(r.type)
                     for later in joined for r in later.results]
            combine = sibling_reductions.combine_all(e, [op, *joined])
            for later in joined:
                e.fills.begin(e, later)

        def row(o):
            total = fold_lanes(e, fold_row(e, sources, e.b.mul(o, _const(extent)), extent,
                                           width, combine), combine)
            if scalar_result:
                finals.extend(total)
                return
            for out, value in zip(outs, total, strict=True):
                e.store_chunk(out, o, value)

        if scalar_result:
            row(_const(0))
        else:
            e.loop(outer, row)
        for later in joined:
            e.fills.end(e, later)
            e.emitted_early.add(id(later))
        results = [r for reduction in (op, *joined) for r in reduction.results]
    for number, result in enumerate(results):
        e.env[result.id] = finals[number] if scalar_result else outs[number]


# Independent accumulators a row's reduction keeps: one chain of combines waits on the
# latency of each (4 cycles for an fadd) while a core can issue two a cycle.
REDUCTION_CHAINS = 4


def fold_row(e, sources, base, extent: int, width: int, combine) -> list:
    """The `width`-lane vectors (one per source) that combine the `extent` elements from
    flat `base`: chunk c into accumulator c % chains, then the accumulators pairwise.
    Triton leaves a reduction's order open; the combine function must be associative and
    commutative (lanes already meet out of order below)."""
    count = extent // width
    chains = min(REDUCTION_CHAINS, count)
    while count % chains:
        chains //= 2
    group, arity = chains * width, len(sources)

    def chunks(at):
        # one index per chunk for every source: a load the sources share prefetches once
        indices = [e.b.add(at, _const(c * width)) for c in range(chains)]
        return [e.load_chunk(s, indices[c], width) for c in range(chains) for s in sources]

    def step(j, accs):
        values = chunks(e.b.add(base, e.b.mul(j, _const(group))))
        return [value for c in range(chains) for value in combine(
            accs[c * arity:(c + 1) * arity], values[c * arity:(c + 1) * arity])]
    firsts = chunks(base)
    if len(sources[0].type.shape) == 1:  # base is 0: interior trips unmasked (interior.py)
        accs = interior.counted(e, sources, sources[0].type, 1, count // chains, group,
                                group, firsts, step)
    else:
        accs = e.counted_loop(_const(1), _const(count // chains), _const(1), firsts, step)
    parts = [accs[c * arity:(c + 1) * arity] for c in range(chains)]
    while len(parts) > 1:
        parts = [combine(parts[k], parts[k + 1]) for k in range(0, len(parts), 2)]
    return parts[0]


def fold_lanes(e, vectors: list, combine) -> list:
    """The lanes of `vectors` (one per source) combined into scalars: halves of the vector
    pairwise while more than two lanes remain (log2 steps, not one per lane), then the
    last two as scalars."""
    lanes = vectors[0].type.count if isinstance(vectors[0].type, ir.VectorType) else 0
    if not lanes:
        return vectors
    while lanes > 2:
        half = lanes // 2

        def part(vector, start, half=half):
            mask = ir.Constant(ir.VectorType(I32, half),
                               [ir.Constant(I32, start + k) for k in range(half)])
            return e.b.shuffle_vector(vector, vector, mask)
        vectors = combine([part(v, 0) for v in vectors], [part(v, half) for v in vectors])
        lanes = half
    scalars = [[e.b.extract_element(v, ir.Constant(I32, k)) for v in vectors]
               for k in range(lanes)]
    return scalars[0] if lanes == 1 else combine(scalars[0], scalars[1])


def scan(e, op) -> None:
    axis, reverse = op.attr("axis"), op.attr("reverse")
    shape = op.operands[0].type.shape
    sources = [e.env[v.id] for v in op.operands]
    outs = [e.alloc(r.type) for r in op.results]
    outer, extent, inner = _split(shape, axis)
    width = min(16, inner) if inner > 1 else 0
    region = op.regions[0]

    def position(j):
        return e.b.sub(_const(extent - 1), j) if reverse else j

    def lane_group(o, c):
        base = e.b.add(e.b.mul(o, _const(extent * inner)), e.b.mul(c, _const(max(width, 1))))
        first = e.b.add(base, e.b.mul(position(_const(0)), _const(inner)))
        accs = [e.load_chunk(s, first, width) for s in sources]
        for out, acc in zip(outs, accs, strict=True):
            e.store_chunk(out, first, acc)

        def step(j, carried):
            at = e.b.add(base, e.b.mul(position(j), _const(inner)))
            carried = e.region(region, carried + [e.load_chunk(s, at, width) for s in sources])
            for out, acc in zip(outs, carried, strict=True):
                e.store_chunk(out, at, acc)
            return carried
        e.counted_loop(_const(1), _const(extent), _const(1), accs, step)

    groups = inner // width if width else 1
    e.loop(outer, lambda o: e.loop(groups, lambda c: lane_group(o, c)))
    for result, out in zip(op.results, outs, strict=True):
        e.env[result.id] = out


def dot(e, op) -> None:
    """d = c + a @ b. Float products accumulated in f32 or f64 run on tilegen's packed-gemm
    micro-kernel (micro_kernel.micro_kernel_function): a is already row-major with a static row
    stride, b is packed into nr-wide panels (converted to the accumulator type on the way,
    f16/bf16 included; a b of exactly four vectors' width is its own panel), and each
    mr x nr block of d is one call. Other products use the register-blocked loop below."""
    deferred = e.deferred_dots.get(op.result.id)
    if deferred is not None:  # a K loop's accumulation (kloop.py)
        kloop.add(e, deferred, op)
        return
    terms = amx_dot.terms_of(op, e.amx_mode) if e.amx else None
    if terms is not None:
        _dot_amx(e, op, terms)
        return
    if kloop.micro_kernel_dot(op):
        _dot_micro_kernel(e, op)
        return
    _dot_blocked(e, op)


def _converted(e, value, elem: str):
    """`value` stored as a tile of `elem` (a lazy conversion, then materialized)."""
    if value.type.elem == elem:
        return e.materialize(value)
    target = TileType(elem, value.type.shape)
    out = e.alloc(target)
    name = "arith.extf" if elem in ("f32", "f64") and value.type.elem != "f64" else \
        "arith.truncf"

    def body(index, width):
        chunk = e.load_chunk(value, index, width)
        e.store_chunk(out, index, e.ew.emit(e.b, name, (), [chunk], [value.type.elem], elem))
    e.chunks(value.type, body)
    return out


def _dot_micro_kernel(e, op) -> None:
    from .. import loopir as L
    from ..micro_kernel import micro_kernel_function
    from ..target import host_target

    a_value, b_value, c_value = op.operands[:3]
    m, k_extent = a_value.type.shape
    n = b_value.type.shape[-1]
    elem = op.result.type.elem
    dtype = L.F32 if elem == "f32" else L.F64
    lanes = host_target().lanes(dtype)
    nr = 2 * lanes if n > lanes else lanes
    # tile rows are powers of two: a register block that divides them wastes no FMAs
    mr = min(m, 8 if nr == 2 * lanes else 16)
    if n == 4 * lanes:
        # b's rows are whole 4-vector panels already (attention's 64-wide K^T and V
        # blocks): no packing, and 6 x 4 accumulators (3/4 of the registers, as tilegen's
        # gemm) read b's rows once per 6 rows, not per 8 x 2 vectors twice
        nr = n
        mr = min(m, host_target().vector_registers * 3 // 4 // 4)
    a = _converted(e, e.env[a_value.id], elem)
    b = e.env[b_value.id]
    b_in_memory = n == nr and dot_operands.in_memory(b)
    if not b_in_memory:
        b = _converted(e, b, elem)
    out, zero_start = _dot_output(e, op)
    panels = -(-n // nr)
    if n == nr:
        packed = b
    else:
        packed = e.alloc(TileType(elem, (panels, k_extent, nr)))
        width = min(lanes, n)

        def pack(p, kk):
            source = e.b.add(e.b.mul(kk, _const(n)), e.b.mul(p, _const(nr)))
            target = e.b.mul(e.b.add(e.b.mul(p, _const(k_extent)), kk), _const(nr))
            for part in range(0, min(nr, n), width):
                chunk = e.load_chunk(b, e.b.add(source, _const(part)), width)
                e.store_chunk(packed, e.b.add(target, _const(part)), chunk)
        e.loop(panels, lambda p: e.loop(k_extent, lambda kk: pack(p, kk), unroll=False),
               unroll=False)

    def blocks(packed_b):
        kloop.micro_kernel_blocks(e, lambda rows: micro_kernel_function(
            e.module, dtype, rows, nr, k_extent, lanes), (a, packed_b, out), (m, n, mr, nr),
            k_extent, _const(k_extent), 1 if zero_start else 0)
    if b_in_memory:
        first, together = dot_operands.rows_in_place(e, b, k_extent, nr)
        with e.b.if_else(together) as (in_place, copied):
            with in_place:
                blocks(e.b.inttoptr(first, PTR))
            with copied:
                blocks(e.materialize(b))
    else:
        blocks(packed)
    e.env[op.result.id] = out


def _dot_output(e, op):
    """(the tile d is computed in, whether it starts from zero): a new tile for a zero
    accumulator, a carried accumulator read only by the dot itself, `acc * alpha` computed
    into acc's own slot (kloop.rescaled_accumulators), else a copy of c."""
    c_value = op.operands[2]
    c = e.env[c_value.id]
    zero_start = getattr(c, "kind", None) == "const" and c.payload == 0
    in_place = c_value.id in e.carried_args and e.uses.get(c_value.id) == 1 and \
        hasattr(c, "offset") and c_value.type.elem == op.result.type.elem
    into_slot = e.accumulator_slots.get(op.result.id)
    if zero_start:
        return e.alloc(op.result.type), True
    if in_place:
        return c, False
    if into_slot is not None and _same_index_only(c, into_slot[0].offset, into_slot[1]):
        _copy(e, c, into_slot[0])  # `acc * alpha`, computed into acc's own slot
        return into_slot[0], False
    return _copy_of(e, c, op.result.type), False


def _dot_amx(e, op, terms) -> None:
    """d = c + a @ b on AMX tiles (amx_dot.py): the whole depth packed as one trip, one
    flush."""
    a_value, b_value = op.operands[:2]
    m, depth = a_value.type.shape
    n = b_value.type.shape[-1]
    lay = amx_dot.Layout(terms, m, n, depth, group=1)
    pack_a, pack_b = e.alloc(lay.pack_a_type()), e.alloc(lay.pack_b_type())
    a, b = e.env[a_value.id], e.env[b_value.id]
    out, zero_start = _dot_output(e, op)
    amx_dot.pack_a(e, lay, pack_a, _const(0), a, a_value.type.elem)
    amx_dot.pack_b(e, lay, pack_b, _const(0), _const(0), b, b_value.type.elem)
    amx_dot.flush(e, lay, (pack_a, pack_b, e.alloc(lay.kept_type()), out), _const(1),
                  _const(0), zero_start)
    e.env[op.result.id] = out


def _copy_of(e, value, type_: TileType):
    out = e.alloc(type_)
    e.chunks(type_, lambda index, width: e.store_chunk(out, index,
                                                      e.load_chunk(value, index, width)))
    return out


def _dot_blocked(e, op) -> None:
    """d = c + a @ b, accumulated in d's type (f32 for float inputs, widened on load; i32
    for int8). Register-blocked: a block of rows x up to four 16-lane column chunks of d
    (16 accumulators) stays in registers while k runs, so each loaded chunk of b feeds one
    FMA per row of the block and each element of a one FMA per chunk."""
    a_value, b_value, c_value = op.operands[:3]
    if len(a_value.type.shape) != 2:
        raise e.fail(op, "batched (3-D) tl.dot is not supported")
    m, k_extent = a_value.type.shape
    n = b_value.type.shape[-1]
    # each element of a and b is read many times: compute lazy operands once
    a, b = e.materialize(e.env[a_value.id]), e.materialize(e.env[b_value.id])
    c = e.env[c_value.id]
    out = e.alloc(op.result.type)
    acc_ty = scalar_type(op.result.type.elem)
    is_float = not isinstance(acc_ty, ir.IntType)
    width = min(16, n)
    group = min(n // width, 4)
    rows = min(m, max(1, 16 // group))

    def widen(value, elem, lanes):
        target = of_width(acc_ty, lanes)
        if value.type == target:
            return value
        if elem == "bf16":
            value = bf16_to_f32(e.b, value, lanes)
            return value if value.type == target else e.b.fpext(value, target)
        return e.b.fpext(value, target) if is_float else e.b.sext(value, target)

    def block(row_block, column_group):
        first_row = e.b.mul(row_block, _const(rows))
        columns = [e.b.mul(e.b.add(e.b.mul(column_group, _const(group)), _const(q)),
                           _const(width)) for q in range(group)]
        row_starts = [e.b.mul(e.b.add(first_row, _const(r)), _const(n)) for r in range(rows)]
        a_rows = [e.b.mul(e.b.add(first_row, _const(r)), _const(k_extent))
                  for r in range(rows)]
        accs = [widen(e.load_chunk(c, e.b.add(start, column), width), c_value.type.elem,
                      width) for start in row_starts for column in columns]

        def step(kk, carried):
            b_base = e.b.mul(kk, _const(n))
            b_chunks = [widen(e.load_chunk(b, e.b.add(b_base, column), width),
                              b_value.type.elem, width) for column in columns]
            updated = []
            for r in range(rows):
                scalar = e.load_element(a, e.b.add(a_rows[r], kk))
                a_lanes = e.splat(widen(scalar, a_value.type.elem, 0), width)
                for q in range(group):
                    acc = carried[r * group + q]
                    if is_float:
                        updated.append(e.ew.intrinsic(e.b, "llvm.fma",
                                                      [a_lanes, b_chunks[q], acc]))
                    else:
                        updated.append(e.b.add(acc, e.b.mul(a_lanes, b_chunks[q])))
            return updated

        accs = e.counted_loop(_const(0), _const(k_extent), _const(1), accs, step)
        for r in range(rows):
            for q in range(group):
                e.store_chunk(out, e.b.add(row_starts[r], columns[q]), accs[r * group + q])

    e.loop(m // rows, lambda rb: e.loop(n // (width * group), lambda g: block(rb, g),
                                        unroll=False), unroll=False)
    e.env[op.result.id] = out


# ---- control flow ---------------------------------------------------------------------------

class _Carried:
    """Loop-carried or branch-result values: tiles in frame slots, scalars in allocas."""

    def __init__(self, e, types: list[TileType], folded=()):
        self.e = e
        self.types = types
        # (positions kept folded in registers instead, partials.py, have no slot)
        self.slots = [None if position in folded else e.alloc(t) if t.shape else
                      e.entry_alloca(scalar_type(t.elem)) for position, t in enumerate(types)]

    def assign(self, values: list) -> None:
        e = self.e
        pending, in_place = [], []
        tile_offsets = {slot.offset for slot in self.slots if hasattr(slot, "offset")}
        for slot, value, type_ in zip(self.slots, values, self.types, strict=True):
            if slot is None:
                continue
            if not type_.shape:
                pending.append((slot, value))
                continue
            if not hasattr(value, "offset") and \
                    _same_index_only(value, slot.offset, tile_offsets):
                in_place.append((slot, value))  # `acc += x`: computed into its own slot
                continue
            if not hasattr(value, "offset"):  # lazy: read it before any slot changes
                value = e.materialize(value)
            if value.offset == slot.offset:
                continue
            if value.offset in tile_offsets:  # another slot's old value: copy it first
                temporary = e.alloc(type_)
                _copy(e, value, temporary)
                value = temporary
            pending.append((slot, value))
        for slot, value in in_place:
            e.chunks(slot.type, lambda index, width, slot=slot, value=value: e.store_chunk(
                slot, index, e.load_chunk(value, index, width)))
        for slot, value in pending:
            if hasattr(slot, "offset"):
                _copy(e, value, slot)
            else:
                e.b.store(value, slot)

    def read(self) -> list:
        return [slot if slot is None or hasattr(slot, "offset") else self.e.b.load(slot)
                for slot in self.slots]


def _same_index_only(lazy, own: int, slots: set[int]) -> bool:
    """Whether chunk i of `lazy` reads its own slot only at chunk i (elementwise chains,
    views) and no other carried slot, so it may be written into its slot chunk by chunk."""
    def other_position(v) -> bool:
        if hasattr(v, "offset"):
            return v.offset != own and v.offset in slots
        # a broadcast reads other positions of its source
        return v.kind == "broadcast" and not _reads_no_slot(v, slots)

    def below(v):
        return () if hasattr(v, "offset") or v.kind == "broadcast" else v.operands
    return not reaches_any([lazy], other_position, below)


def _reads_no_slot(lazy, slots: set[int]) -> bool:
    return not reaches_any([lazy], lambda v: hasattr(v, "offset") and v.offset in slots,
                           lambda v: () if hasattr(v, "offset") else v.operands)


def _copy(e, source, target) -> None:
    e.chunks(target.type, lambda index, width: e.store_chunk(
        target, index, e.load_chunk(source, index, width)))


def scf_for(e, op) -> None:
    lower, upper, step = (e.env[v.id] for v in op.operands[:3])
    body = op.regions[0]
    folds = partials.plan(e, op)
    carried = _Carried(e, [v.type for v in op.operands[3:]], folds)
    carried.assign([e.env[v.id] for v in op.operands[3:]])
    accumulators = partials.Accumulators(e, folds)
    accumulators.start([e.env[v.id] for v in op.operands[3:]])
    index_ty = lower.type
    deferred = []
    tile_offsets = frozenset(slot.offset for slot in carried.slots if hasattr(slot, "offset"))
    for result_id, position in kloop.rescaled_accumulators(e, op).items():
        e.accumulator_slots[result_id] = (carried.slots[position], tile_offsets)
    # advancing pointer tiles: the slot keeps the initial tile, an alloca the offset
    advancing = kloop.advancing_pointers(e, op)
    for dot_op in kloop.deferrable_dots(e, op):
        position = [arg.id for arg in body.args[1:]].index(dot_op.operands[2].id)
        plan = kloop.start(e, op, dot_op, carried.slots[position],
                           (carried.slots, (lower, upper, step), advancing))
        e.deferred_dots[dot_op.result.id] = plan
        deferred.append(plan)
    offsets = {}
    for position in advancing:
        offsets[position] = e.entry_alloca(I64)
        e.b.store(_const(0), offsets[position])

    def current(position, slot):
        if position not in offsets:
            return slot
        splat = e.splat_lazy(e.b.load(offsets[position]), slot.type.shape)
        size = element_bytes(slot.type.pointee)
        return e.lazy_addptr(slot, splat, size)

    def trip(index, _):
        e.env[body.args[0].id] = index
        for position, (arg, value) in enumerate(zip(body.args[1:], carried.read(),
                                                    strict=True)):
            e.env[arg.id] = current(position, value)
        yielded = e.block(body)
        advanced = {}
        for position, step_value in advancing.items():
            step_scalar = kloop.uniform_step(e, step_value)
            if step_scalar is None:  # not uniform after all: rewrite the tile
                yielded[position] = e.materialize(yielded[position])
                continue
            advanced[position] = e.b.add(e.b.load(offsets[position]), step_scalar)
            yielded[position] = carried.slots[position]
        carried.assign(yielded)
        for position, value in advanced.items():
            e.b.store(value, offsets[position])
        return []
    e.counted_loop(lower, upper, step if step.type == index_ty else step, [], trip)
    for plan in deferred:
        kloop.finish(e, plan)
    for position, (result, value) in enumerate(zip(op.results, carried.read(),
                                                   strict=True)):
        e.env[result.id] = accumulators.finish(position) if position in folds else \
            current(position, value)


def scf_if(e, op) -> None:
    condition = e.env[op.operands[0].id]
    # result tiles whose only reader is a store right after: stored by each branch
    sunk = branch_stores.plan(e, op)
    results = _Carried(e, [r.type for r in op.results], {position for position, _ in sunk})
    then_block, else_block = op.regions[0], op.regions[1] if len(op.regions) > 1 else None
    has_else = else_block is not None and else_block.ops

    def finish(values):
        results.assign(values)
        branch_stores.emit(e, sunk, values)
    if has_else:
        with e.b.if_else(condition) as (then, otherwise):
            with then:
                finish(e.block(then_block))
            with otherwise:
                finish(e.block(else_block))
    else:
        with e.b.if_then(condition):
            finish(e.block(then_block))
    for _, store in sunk:
        e.emitted_early.add(id(store))
    for result, value in zip(op.results, results.read(), strict=True):
        e.env[result.id] = value


def scf_while(e, op) -> None:
    before, after = op.regions
    state = _Carried(e, [v.type for v in op.operands])
    state.assign([e.env[v.id] for v in op.operands])
    forwarded = _Carried(e, [r.type for r in op.results])
    header = e.function.append_basic_block("while")
    body = e.function.append_basic_block("while.body")
    done = e.function.append_basic_block("while.end")
    e.b.branch(header)
    e.b.position_at_end(header)
    for arg, value in zip(before.args, state.read(), strict=True):
        e.env[arg.id] = value
    condition, *values = e.block(before)
    forwarded.assign(values)
    e.b.cbranch(condition, body, done)
    e.b.position_at_end(body)
    for arg, value in zip(after.args, forwarded.read(), strict=True):
        e.env[arg.id] = value
    state.assign(e.block(after))
    e.b.branch(header)
    e.b.position_at_end(done)
    for result, value in zip(op.results, forwarded.read(), strict=True):
        e.env[result.id] = value


HANDLERS = {"tt.trans": trans, "tt.reduce": reduce,
            "tt.scan": scan, "tt.dot": dot, "scf.for": scf_for, "scf.if": scf_if,
            "scf.while": scf_while}
