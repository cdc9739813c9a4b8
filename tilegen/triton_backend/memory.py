"""tt.load, tt.store and the atomics.

A pointer tile whose last-axis stride is the element size (analysis.py) is read and
written in contiguous masked vector chunks (`llvm.masked.load/store`, `other=` as the
pass-through); any other pointer tile lane by lane with `llvm.masked.gather/scatter`.
Atomics are LLVM `atomicrmw` / `cmpxchg` (sequentially consistent), one lane at a time
under its mask, so they stay correct while the grid's programs run on several threads.
"""

from __future__ import annotations

from llvmlite import ir

from . import fused_loads, prefetch
from .elementwise import (
    I1,
    I32,
    I64,
    PTR,
    is_all_true,
    of_width,
    scalar_type,
    splat_constant,
    storage_type,
    type_suffix,
)
from .tileir import element_bytes


def chunk_width(type_) -> int:
    return min(16, type_.shape[-1]) if type_.shape else 1

_RMW = {"add": "add", "fadd": "fadd", "max": "max", "min": "min", "umax": "umax",
        "umin": "umin", "exch": "xchg", "and": "and", "or": "or", "xor": "xor"}


def _memory_type(elem: str) -> ir.Type:
    return storage_type(elem)


def _to_value(e, raw: ir.Value, elem: str) -> ir.Value:
    if elem == "i1":
        zero = splat_constant(ir.IntType(8), 0, _lanes(raw))
        return e.b.icmp_unsigned("!=", raw, zero)
    return raw


def _to_memory(e, value: ir.Value, elem: str) -> ir.Value:
    if elem == "i1":
        return e.b.zext(value, of_width(ir.IntType(8), _lanes(value)))
    return value


def _lanes(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 0


def _is_run(e, chunk: ir.Value, first: ir.Value, width: int, size: int) -> ir.Value:
    """Whether the lanes' addresses are first, first + size, first + 2 size, ..."""
    steps = ir.Constant(ir.VectorType(I64, width), [ir.Constant(I64, k * size)
                                                    for k in range(width)])
    expected = e.b.add(e.splat(first, width), steps)
    same = e.b.icmp_unsigned("==", chunk, expected)
    bits = e.b.bitcast(same, ir.IntType(width))
    return e.b.icmp_unsigned("==", bits, ir.Constant(ir.IntType(width), (1 << width) - 1))


def _pointers(e, addresses: ir.Value, width: int) -> ir.Value:
    return e.b.inttoptr(addresses, of_width(PTR, width))


def load(e, op) -> None:
    pointer, mask, other = (list(op.operands) + [None, None])[:3]
    result = op.result
    elem = result.type.elem
    memory_ty = _memory_type(elem)
    align = element_bytes(elem)
    if not result.type.shape:
        e.env[result.id] = _scalar_load(e, op, pointer, mask, other, memory_ty, align)
        return
    stride = e.strides.get(pointer.id)
    contiguous = stride == align
    # an unknown stride (runtime strides, `% M` wrap-around offsets) is tested per chunk:
    # a run of consecutive addresses is read as one vector
    dynamic = stride is None and chunk_width(result.type) >= 4
    # a K loop's operand goes straight into its packed buffer (kloop.py)
    sink = e.load_sinks.get(result.id)
    if contiguous and sink is None:
        lazy = e.lazy_load(op, e.env[pointer.id], e.env[mask.id] if mask is not None else None,
                           e.env[other.id] if other is not None else None)
        # fused into its readers, or read by the first reduction's sweep (shared_fills.py)
        if e.fusion.fusible(e, op) or e.fills.defer_load(e, op, lazy):
            e.env[result.id] = lazy
            return
        e.fusion.pending.discard(id(lazy))
    out = sink if sink is not None else e.alloc(result.type)
    addresses = e.env[pointer.id]
    masks = e.env[mask.id] if mask is not None else None
    others = e.env[other.id] if other is not None else None

    def contiguous_read(address, lane_mask, passthru, vector_ty):
        return vector_load(e, address, lane_mask, passthru, vector_ty, align)

    def gather(chunk, lane_mask, passthru, vector_ty, width):
        if lane_mask is None:
            lane_mask = splat_constant(I1, 1, width)
        pointers = _pointers(e, chunk, width)
        function = e.ew.declare(
            f"llvm.masked.gather.{type_suffix(vector_ty)}.{type_suffix(pointers.type)}",
            vector_ty, [pointers.type, I32, lane_mask.type, vector_ty])
        return e.b.call(function, [pointers, ir.Constant(I32, align), lane_mask, passthru])

    def body(index, width):
        vector_ty = ir.VectorType(memory_ty, width)
        lane_mask = e.load_chunk(masks, index, width) if masks is not None else None
        passthru = _to_memory(e, e.load_chunk(others, index, width), elem) \
            if others is not None else ir.Constant(vector_ty, None)
        if contiguous:  # only the first lane's address is needed
            address = e.load_chunk(addresses, index, 0)
            e.check_bounds(op, address, lane_mask, width, align, contiguous=True)
            if e.streams.streams(op, pointer, result.type):
                prefetch.ahead(e, address)
            else:
                _next_trip(e, op, pointer, result.type, address)
            raw = contiguous_read(address, lane_mask, passthru, vector_ty)
        else:
            chunk = e.load_chunk(addresses, index, width)
            e.check_bounds(op, chunk, lane_mask, width, align)
            if dynamic:
                first = e.b.extract_element(chunk, ir.Constant(I32, 0))
                with e.b.if_else(_is_run(e, chunk, first, width, align)) as (run, scattered):
                    with run:
                        contiguous_raw = contiguous_read(first, lane_mask, passthru, vector_ty)
                        run_block = e.b.block
                    with scattered:
                        gathered_raw = gather(chunk, lane_mask, passthru, vector_ty, width)
                        gather_block = e.b.block
                raw = e.b.phi(vector_ty)
                raw.add_incoming(contiguous_raw, run_block)
                raw.add_incoming(gathered_raw, gather_block)
            else:
                raw = gather(chunk, lane_mask, passthru, vector_ty, width)
        _put(e, out, index, _to_value(e, raw, elem))

    if _column_contiguous(e, pointer, result.type, align):
        _transposing_load(e, result.type, out, addresses, masks, others, memory_ty, align,
                          contiguous_read, elem)
    else:
        e.chunks(result.type, body, reads=tuple(
            value for value in (addresses, masks, others) if value is not None))
    e.env[result.id] = out


def vector_load(e, address, lane_mask, passthru, vector_ty, align: int) -> ir.Value:
    """A contiguous vector read from `address`, under `lane_mask` if there is one."""
    first = e.b.inttoptr(address, PTR)
    if lane_mask is None or is_all_true(lane_mask):
        return e.b.load(first, typ=vector_ty, align=align)
    function = e.ew.declare(f"llvm.masked.load.{type_suffix(vector_ty)}.p0",
                            vector_ty, [PTR, I32, lane_mask.type, vector_ty])
    return e.b.call(function, [first, ir.Constant(I32, align), lane_mask, passthru])


def fused_load_chunk(e, lazy, index: ir.Value, width: int) -> ir.Value:
    """Lanes [index, index + width) of a fused load (fused_loads.py), read from memory
    now (width 0: one element, read as a one-lane masked load when there is a mask)."""
    op = lazy.op
    elem = op.result.type.elem
    align = element_bytes(elem)
    has_mask, has_other = lazy.payload
    addresses, *rest = lazy.operands
    masks = rest.pop(0) if has_mask else None
    others = rest.pop(0) if has_other else None
    lanes = max(width, 1)
    vector_ty = ir.VectorType(_memory_type(elem), lanes)

    def chunk(value):
        read = e.load_chunk(value, index, width)
        if width:
            return read
        return e.b.insert_element(ir.Constant(of_width(read.type, 1), None), read,
                                  ir.Constant(I32, 0))
    lane_mask = chunk(masks) if masks is not None else None
    passthru = _to_memory(e, chunk(others), elem) if others is not None \
        else ir.Constant(vector_ty, None)
    address = e.load_chunk(addresses, index, 0)
    e.check_bounds(op, address, lane_mask, lanes, align, contiguous=True)
    if lane_mask is None and not width:
        return _to_value(e, e.b.load(e.b.inttoptr(address, PTR), align=align,
                                     typ=_memory_type(elem)), elem)
    # once per chunk: a sweep that evaluates the load for several readers (fills, sibling
    # reductions) reads it again, which LLVM merges, but a prefetch is a call it keeps
    once = (id(op), index, width, id(e.b.block))
    if width and once not in e.prefetched:
        e.prefetched.add(once)
        if e.streams.streams(op, op.operands[0], op.result.type):
            prefetch.ahead(e, address)
        else:
            _next_trip(e, op, op.operands[0], op.result.type, address)
    raw = vector_load(e, address, lane_mask, passthru, vector_ty, align)
    if not width:
        raw = e.b.extract_element(raw, ir.Constant(I32, 0))
    return _to_value(e, raw, elem)


def _next_trip(e, op, pointer, type_, address) -> None:
    """Prefetch the chunk the loop's next trip reads here (prefetch.Streams.next_trip)."""
    distance = e.streams.next_trip(e, op, pointer, type_)
    if distance is not None:
        prefetch.ahead(e, address, distance=distance)


def _put(e, out, index, value) -> None:
    """Store a loaded chunk into the load's tile, or through its sink (a callable)."""
    if callable(out):
        out(index, value)
    else:
        e.store_chunk(out, index, value)


def _column_contiguous(e, pointer, type_, size: int) -> bool:
    """Contiguous along the axis before the last, strided along the last (a transposed
    read such as attention's K^T), with square blocks of at least 4 x 4."""
    strides = e.axis_strides.get(pointer.id, ())
    return len(strides) >= 2 and strides[-2] == size and strides[-1] != size and \
        min(16, type_.shape[-1], type_.shape[-2]) >= 4


def _transposing_load(e, type_, out, addresses, masks, others, memory_ty, align,
                      vector_load, elem) -> None:
    """Read W x W blocks as W contiguous columns and transpose them in registers (the
    packed gemm's shuffle transpose) into W rows of the tile."""
    from ..gemm import _transpose

    rows, columns = type_.shape[-2:]
    width = min(16, rows, columns)
    vector_ty = ir.VectorType(memory_ty, width)
    outer = type_.numel // (rows * columns)

    def lanes_of(value, first, step):
        """A vector of `value`'s elements at first, first + step, ... (read one by one)."""
        vector = ir.Constant(ir.VectorType(e.load_element(value, first).type, width), None)
        for k in range(width):
            at = e.b.add(first, ir.Constant(I64, k * step))
            vector = e.b.insert_element(vector, e.load_element(value, at),
                                        ir.Constant(I32, k))
        return vector

    def block(o, row_block, column_block):
        base = e.b.add(e.b.mul(o, ir.Constant(I64, rows * columns)),
                       e.b.add(e.b.mul(row_block, ir.Constant(I64, width * columns)),
                               e.b.mul(column_block, ir.Constant(I64, width))))
        column_vectors = []
        for j in range(width):
            first = e.b.add(base, ir.Constant(I64, j))
            lane_mask = lanes_of(masks, first, columns) if masks is not None else None
            passthru = _to_memory(e, lanes_of(others, first, columns), elem) \
                if others is not None else ir.Constant(vector_ty, None)
            address = e.load_element(addresses, first)
            e.check_bounds(e.current_op, address, lane_mask, width, align, contiguous=True)
            column_vectors.append(vector_load(address, lane_mask, passthru, vector_ty))
        for k, row in enumerate(_transpose(e.b, column_vectors)):
            _put(e, out, e.b.add(base, ir.Constant(I64, k * columns)),
                          _to_value(e, row, elem))

    e.loop(outer, lambda o: e.loop(rows // width, lambda rb: e.loop(
        columns // width, lambda cb: block(o, rb, cb), unroll=False), unroll=False),
        unroll=False)


def _scalar_load(e, op, pointer, mask, other, memory_ty, align) -> ir.Value:
    address = e.env[pointer.id]
    elem = op.result.type.elem
    if mask is None:
        e.check_bounds(op, address, None, 0, align)
        return _to_value(e, e.b.load(e.b.inttoptr(address, PTR), typ=memory_ty, align=align),
                         elem)
    fallback = e.env[other.id] if other is not None else ir.Constant(scalar_type(elem), None)
    slot = e.entry_alloca(fallback.type)
    e.b.store(fallback, slot)
    with e.b.if_then(e.env[mask.id]):
        e.check_bounds(op, address, None, 0, align)
        raw = e.b.load(e.b.inttoptr(address, PTR), typ=memory_ty, align=align)
        e.b.store(_to_value(e, raw, elem), slot)
    return e.b.load(slot)


def store(e, op) -> None:
    value = op.operands[1]
    if not value.type.shape:
        _scalar_store(e, op)
        return
    body = store_chunk_body(e, op)
    fused_loads.guarded_store(e, op, lambda values: e.chunks(
        value.type, lambda index, width: body(values, index, width),
        reads=(values, *store_reads(e, op))))


def _scalar_store(e, op) -> None:
    pointer, value, mask = (list(op.operands) + [None])[:3]
    elem = value.type.elem
    align = element_bytes(elem)
    address = e.env[pointer.id]
    data = _to_memory(e, e.env[value.id], elem)
    if mask is None:
        e.check_bounds(op, address, None, 0, align)
        e.b.store(data, e.b.inttoptr(address, PTR), align=align)
    else:
        with e.b.if_then(e.env[mask.id]):
            e.check_bounds(op, address, None, 0, align)
            e.b.store(data, e.b.inttoptr(address, PTR), align=align)


def store_reads(e, op) -> tuple:
    """What a store's chunks read besides its value: its pointer and mask tiles."""
    return tuple(e.env[operand.id] for operand in (op.operands[0], *op.operands[2:3]))


def store_chunk_body(e, op):
    """body(values, index, width): the store of a tile's chunk at flat `index`, its data
    read from `values` (the stored value's lazy or tile)."""
    pointer, value, mask = (list(op.operands) + [None])[:3]
    elem = value.type.elem
    memory_ty = _memory_type(elem)
    align = element_bytes(elem)
    stride = e.strides.get(pointer.id)
    contiguous = stride == align
    dynamic = stride is None and chunk_width(value.type) >= 4
    addresses = e.env[pointer.id]
    masks = e.env[mask.id] if mask is not None else None

    def vector_store(address, lane_mask, data, vector_ty):
        first = e.b.inttoptr(address, PTR)
        if lane_mask is None or is_all_true(lane_mask):
            e.b.store(data, first, align=align)
            return
        function = e.ew.declare(f"llvm.masked.store.{type_suffix(vector_ty)}.p0",
                                ir.VoidType(), [vector_ty, PTR, I32, lane_mask.type])
        e.b.call(function, [data, first, ir.Constant(I32, align), lane_mask])

    def scatter(chunk, lane_mask, data, vector_ty, width):
        if lane_mask is None:
            lane_mask = splat_constant(I1, 1, width)
        pointers = _pointers(e, chunk, width)
        function = e.ew.declare(
            f"llvm.masked.scatter.{type_suffix(vector_ty)}.{type_suffix(pointers.type)}",
            ir.VoidType(), [vector_ty, pointers.type, I32, lane_mask.type])
        e.b.call(function, [data, pointers, ir.Constant(I32, align), lane_mask])

    def body(values, index, width):
        vector_ty = ir.VectorType(memory_ty, width)
        lane_mask = e.load_chunk(masks, index, width) if masks is not None else None
        data = _to_memory(e, e.load_chunk(values, index, width), elem)
        if contiguous:
            address = e.load_chunk(addresses, index, 0)
            e.check_bounds(op, address, lane_mask, width, align, contiguous=True)
            if prefetch.STORES and e.streams.streams(op, pointer, value.type):
                prefetch.ahead(e, address, write=True)
            vector_store(address, lane_mask, data, vector_ty)
            return
        chunk = e.load_chunk(addresses, index, width)
        e.check_bounds(op, chunk, lane_mask, width, align)
        if dynamic:
            first = e.b.extract_element(chunk, ir.Constant(I32, 0))
            with e.b.if_else(_is_run(e, chunk, first, width, align)) as (run, scattered):
                with run:
                    vector_store(first, lane_mask, data, vector_ty)
                with scattered:
                    scatter(chunk, lane_mask, data, vector_ty, width)
        else:
            scatter(chunk, lane_mask, data, vector_ty, width)
    return body


def atomic_rmw(e, op) -> None:
    kind = op.attr("kind")
    if kind not in _RMW:
        raise e.fail(op, f"atomic kind `{kind}` is not supported")
    pointer, value = op.operands[0], op.operands[1]
    mask = op.operands[2] if len(op.operands) > 2 else None
    elem = value.type.elem
    rmw = _RMW[kind]
    if elem.startswith("f") and rmw in ("max", "min"):
        rmw = "f" + rmw

    def one(address, data, active):
        def run():
            e.check_bounds(op, address, None, 0, element_bytes(elem))
            return e.b.atomic_rmw(rmw, e.b.inttoptr(address, PTR), data, "seq_cst")
        return _guarded(e, active, run, data.type)

    _per_lane(e, op, [pointer, value], mask, one)


def atomic_cas(e, op) -> None:
    pointer, compare, value = op.operands

    def one(address, expected, data, active):
        def run():
            e.check_bounds(op, address, None, 0, element_bytes(value.type.elem))
            pair = e.b.cmpxchg(e.b.inttoptr(address, PTR), expected, data, "seq_cst",
                               "seq_cst")
            return e.b.extract_value(pair, 0)
        return _guarded(e, active, run, data.type)

    _per_lane(e, op, [pointer, compare, value], None, one)


def _guarded(e, active, run, ty):
    if active is None:
        return run()
    slot = e.entry_alloca(ty)
    e.b.store(ir.Constant(ty, None), slot)
    with e.b.if_then(active):
        e.b.store(run(), slot)
    return e.b.load(slot)


def _per_lane(e, op, operands, mask, one) -> None:
    """`one(scalars..., active)` for each element (the atomics' lane-by-lane form)."""
    result = op.result if op.results else None
    if not operands[0].type.shape:
        active = e.env[mask.id] if mask is not None else None
        value = one(*[e.env[v.id] for v in operands], active)
        if result is not None:
            e.env[result.id] = value
        return
    tiles = [e.env[v.id] for v in operands]
    masks = e.env[mask.id] if mask is not None else None
    out = e.alloc(result.type) if result is not None else None

    def body(index):
        scalars = [e.load_element(t, index) for t in tiles]
        active = e.load_element(masks, index) if masks is not None else None
        value = one(*scalars, active)
        if out is not None:
            e.store_chunk(out, index, value)

    e.loop(operands[0].type.numel, body)
    if result is not None:
        e.env[result.id] = out


HANDLERS = {"tt.load": load, "tt.store": store, "tt.atomic_rmw": atomic_rmw,
            "tt.atomic_cas": atomic_cas}
