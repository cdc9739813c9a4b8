"""tt.join / tt.split (a new or removed last axis of 2), tt.cat (along axis 0) and
tt.histogram."""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I32, I64, scalar_type


def _const(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def _width(type_) -> int:
    return min(16, type_.shape[-1]) if type_.shape else 0


def join(e, op) -> None:
    a, b = (e.env[v.id] for v in op.operands)
    source = op.operands[0].type
    out = e.alloc(op.result.type)
    width = _width(source)
    interleave = ir.Constant(ir.VectorType(I32, 2 * max(width, 1)),
                             [ir.Constant(I32, k // 2 + (k % 2) * max(width, 1))
                              for k in range(2 * max(width, 1))])

    def chunk(index, _):
        left, right = e.load_chunk(a, index, width), e.load_chunk(b, index, width)
        if not width:
            left, right = (e.b.insert_element(ir.Constant(ir.VectorType(v.type, 1), None), v,
                                              ir.Constant(I32, 0)) for v in (left, right))
        e.store_chunk(out, e.b.mul(index, _const(2)),
                      e.b.shuffle_vector(left, right, interleave))
    if width:
        e.chunks(source, chunk)
    else:
        chunk(_const(0), 0)
    e.env[op.result.id] = out


def split(e, op) -> None:
    source = e.materialize(e.env[op.operands[0].id])  # chunks below span its rows
    half = op.results[0].type
    width = _width(half)
    lanes = max(width, 1)
    outs = [e.alloc(r.type) for r in op.results] if half.shape else None

    def chunk(index, _):
        both = e.load_chunk(source, e.b.mul(index, _const(2)), 2 * lanes)
        for parity in range(2):
            mask = ir.Constant(ir.VectorType(I32, lanes),
                               [ir.Constant(I32, 2 * k + parity) for k in range(lanes)])
            picked = e.b.shuffle_vector(both, both, mask)
            if outs is None:
                e.env[op.results[parity].id] = e.b.extract_element(picked,
                                                                   ir.Constant(I32, 0))
            else:
                e.store_chunk(outs[parity], index, picked)
    if outs is None:
        chunk(_const(0), 0)
        return
    e.chunks(half, chunk)
    for result, out in zip(op.results, outs, strict=True):
        e.env[result.id] = out


def cat(e, op) -> None:
    out = e.alloc(op.result.type)
    offset = 0
    for value in op.operands:
        source = e.env[value.id]
        shift = _const(offset)
        e.chunks(value.type, lambda index, width, source=source, shift=shift: e.store_chunk(
            out, e.b.add(index, shift), e.load_chunk(source, index, width)))
        offset += value.type.numel
    e.env[op.result.id] = out


def histogram(e, op) -> None:
    """Counts of each value in [0, bins); other values (and masked-off lanes) count for
    nothing, as in the interpreter."""
    values = e.env[op.operands[0].id]
    mask = e.env[op.operands[1].id] if len(op.operands) > 1 else None
    result = op.result.type
    bins = result.shape[0]
    count_ty = scalar_type(result.elem)
    out = e.alloc(result)
    e.chunks(result, lambda index, width: e.store_chunk(
        out, index, ir.Constant(ir.VectorType(count_ty, width), None)))

    def element(index):
        value = e.b.sext(e.load_element(values, index), I64) \
            if op.operands[0].type.elem != "i64" else e.load_element(values, index)
        inside = e.b.and_(e.b.icmp_signed(">=", value, _const(0)),
                          e.b.icmp_signed("<", value, _const(bins)))
        if mask is not None:
            inside = e.b.and_(inside, e.load_element(mask, index))
        with e.b.if_then(inside):
            slot = e.address(out, value)
            e.b.store(e.b.add(e.b.load(slot, typ=count_ty), ir.Constant(count_ty, 1)), slot)

    e.loop(op.operands[0].type.numel, element, unroll=False)
    e.env[op.result.id] = out


def gather(e, op) -> None:
    """out[..., i, ...] = src[..., index[..., i, ...], ...] along `axis` (tl.gather); an
    index outside the source's extent reads nothing and gives 0 (the GPU's result there
    is undefined)."""
    source = e.materialize(e.env[op.operands[0].id])
    indices = e.env[op.operands[1].id]
    axis = op.attr("axis")
    source_shape, shape = op.operands[0].type.shape, op.result.type.shape
    source_strides = [1] * len(source_shape)
    for d in range(len(source_shape) - 2, -1, -1):
        source_strides[d] = source_strides[d + 1] * source_shape[d + 1]
    out = e.alloc(op.result.type)

    def element(flat):
        remaining, at = flat, _const(0)
        index = e.b.sext(e.load_element(indices, flat), I64)
        inside = e.b.and_(e.b.icmp_signed(">=", index, _const(0)),
                          e.b.icmp_signed("<", index, _const(source_shape[axis])))
        for d in reversed(range(len(shape))):
            coordinate = e.b.urem(remaining, _const(shape[d]))
            remaining = e.b.udiv(remaining, _const(shape[d]))
            if d == axis:
                coordinate = e.b.select(inside, index, _const(0))
            at = e.b.add(at, e.b.mul(coordinate, _const(source_strides[d])))
        value = e.load_element(source, at)
        zero = ir.Constant(value.type, None)
        e.store_chunk(out, flat, e.b.select(inside, value, zero))

    e.loop(op.result.type.numel, element, unroll=False)
    e.env[op.result.id] = out


HANDLERS = {"tt.join": join, "tt.split": split, "tt.cat": cat, "tt.histogram": histogram,
            "tt.gather": gather}
