"""concat(a, b, ..., axis=k) and slice(x, axis=k, start=S, size=N).

concat's result is written part by part into its slices (a `BufferWriter`: each operand's
loop nest stores at its offset, no per-element select between operands); slice is a view
that shifts the index along the axis. Each is the other's gradient.
"""

from __future__ import annotations

import numpy as np
import sympy

from tilegen import loopir as L

from ..types import format_dim
from .reductions import normalize_axis
from .registry import OpDef, Param, register


def _concat_rule(ctx, operands, attrs):
    first = operands[0]
    axis = normalize_axis(ctx, first, attrs, "concat")
    total = sympy.Integer(0)
    for position, part in enumerate(operands):
        if part.dtype != first.dtype or part.rank != first.rank:
            ctx.fail("type" if part.dtype != first.dtype else "shape",
                     f"'concat' operand {position} is {part}, operand 0 is {first}: element "
                     "types and ranks must agree", at="xs")
        for dim in range(first.rank):
            if dim != axis:
                ctx.prove_equal(part.shape[dim], first.shape[dim], "equal-shape",
                                f"concat: operand {position} dim {dim} "
                                f"{format_dim(part.shape[dim])} == "
                                f"{format_dim(first.shape[dim])}",
                                f"'concat' operand {position} {part} differs from operand 0 "
                                f"{first} at dim {dim} (only the axis {axis} may differ)",
                                at="xs")
        total = total + part.shape[axis]
    shape = first.shape[:axis] + (sympy.expand(total),) + first.shape[axis + 1:]
    return (first.with_shape(shape),)


def _concat_reference(args, attrs):
    return (np.concatenate(args, axis=attrs["axis"]),)


def _concat_lower(ctx, op, operands):
    axis = op.attr("axis")
    shapes = {part.type.concrete_shape for part in operands}

    def at_offset(index, offset):
        return tuple(index[:axis]) + (L.add(index[axis], L.const(offset)),) + \
            tuple(index[axis + 1:])

    def emit(ctx, out):
        if len(shapes) == 1:
            # Parts of one shape are stored by one nest: parts computed from the same
            # operand (a value and its rounding, say) read it once per element, not once
            # per part.
            (shape,) = shapes
            return ctx.loops(shape, lambda index: [
                L.Store(out, at_offset(index, position * shape[axis]), part.at(index))
                for position, part in enumerate(operands)], "c")
        statements = []
        offset = 0
        for part in operands:
            def store(index, part=part, offset=offset):
                return [L.Store(out, at_offset(index, offset), part.at(index))]
            statements += ctx.loops(part.type.concrete_shape, store, "c")
            offset += part.type.concrete_shape[axis]
        return statements
    # Each element is stored once, finished: a BF16 concat needs no f32 staging buffer.
    return L.BufferWriter(op.result.type, emit, reads_back=False)


def _concat_vjp(b, op, cotangents):
    (ct,) = cotangents
    axis = op.attr("axis")
    grads, start = [], 0
    for part in op.operands:
        size = part.type.shape[axis]
        grads.append(b.emit("slice", ct, axis=axis, start=start, size=size))
        start = start + size
    return tuple(grads)


def _slice_text(offsets, sizes) -> str:
    strides = [1] * len(sizes)
    return "[" + "][".join(", ".join(str(v) for v in values)
                           for values in (offsets, sizes, strides)) + "]"


def _concat_mlir(ctx, op, operands):
    # Destination-passing: per operand, the result's slice is extracted, written by a copying
    # generic and inserted back, which bufferizes in place (a bare insert_slice of a strided
    # slice would become a memref.copy that needs the MLIR runtime library).
    result = op.result.type
    axis = op.attr("axis")
    current = ctx.empty(result, ctx.out() + "_init")
    offset = 0
    for position, part in enumerate(operands):
        shape = part.type.concrete_shape
        window = _slice_text([offset if d == axis else 0 for d in range(len(shape))], shape)
        hint = f"{ctx.out()}_part{position}"
        into = ctx.let(hint + "_dest", f"tensor.extract_slice {current}{window} : "
                                       f"{ctx.tensor_type(result)} to "
                                       f"{ctx.tensor_type(part.type)}")
        (copied,) = ctx.generic(hint + "_copy", [part], [(into, part.type,
                                                          tuple(range(len(shape))))],
                                ["parallel"] * len(shape), lambda b, v, _: v)
        last = position == len(operands) - 1
        current = ctx.let(ctx.out() if last else hint,
                          f"tensor.insert_slice {copied} into {current}{window} : "
                          f"{ctx.tensor_type(part.type)} into {ctx.tensor_type(result)}")
        offset += shape[axis]
    return current


concat = register(OpDef(
    "concat", "layout", (Param("xs", "tensors"), Param("axis", "axis", keyword_only=True)),
    _concat_rule, _concat_reference,
    "the operands joined along axis (all other dims equal)",
    vjp=_concat_vjp,
    mlir=_concat_mlir,
    lower=_concat_lower))


def _slice_rule(ctx, operands, attrs):
    (x,) = operands
    axis = normalize_axis(ctx, x, attrs, "slice")
    start, size = attrs["start"], attrs["size"]
    end = sympy.expand(sympy.sympify(start) + size)
    ctx.prove_at_most(end, x.shape[axis], "slice-range",
                      f"slice: start + size {format_dim(end)} <= {format_dim(x.shape[axis])}",
                      f"'slice' takes [{format_dim(start)}, {format_dim(end)}) along axis "
                      f"{axis} of {x}, past its {format_dim(x.shape[axis])} elements",
                      at="size")
    return (x.with_shape(x.shape[:axis] + (size,) + x.shape[axis + 1:]),)


def _slice_reference(args, attrs):
    (x,) = args
    axis, start, size = attrs["axis"], int(attrs["start"]), int(attrs["size"])
    index = (slice(None),) * axis + (slice(start, start + size),)
    return (np.ascontiguousarray(x[index]),)


def _slice_lower(ctx, op, operands):
    (x,) = operands
    axis, start = op.attr("axis"), int(op.attr("start"))

    def at(index):
        return x.at(tuple(index[:axis]) + (L.add(index[axis], L.const(start)),) +
                    tuple(index[axis + 1:]))
    return ctx.view(op.result.type, at)


def _slice_vjp(b, op, cotangents):
    # Zeros before and after the slice, the cotangent in it.
    (ct,) = cotangents
    (x,) = op.operands
    axis, start, size = op.attr("axis"), op.attr("start"), op.attr("size")
    extent = x.type.shape[axis]
    parts = []
    for width in (start, sympy.expand(extent - start - size)):
        if width != 0:
            shape = ct.type.shape[:axis] + (width,) + ct.type.shape[axis + 1:]
            parts.append(b.fill(0.0, ct.type.with_shape(shape)))
    if not parts:
        return (ct,)
    if start == 0:
        parts.insert(0, ct)
    else:
        parts.insert(1, ct)
    return (b.emit("concat", *parts, axis=axis),)


def _slice_mlir(ctx, op, operands):
    (x,) = operands
    axis, start = op.attr("axis"), int(op.attr("start"))
    shape = op.result.type.concrete_shape
    offsets = [start if d == axis else 0 for d in range(len(shape))]
    window = ctx.let(ctx.out() + "_window", f"tensor.extract_slice {x}"
                     f"{_slice_text(offsets, shape)} : {ctx.tensor_type(x.type)} to "
                     f"{ctx.tensor_type(op.result.type)}")
    # Copied into a fresh tensor by a generic: a strided window returned as it is would
    # need memref.copy (the MLIR runtime library) wherever it is stored.
    return ctx.parallel(op.result.type, (ctx.value(window, op.result.type),), lambda b, v: v)


slice_ = register(OpDef(
    "slice", "layout",
    (Param("x", "tensor"), Param("axis", "axis", keyword_only=True),
     Param("start", "offset", keyword_only=True), Param("size", "dim", keyword_only=True)),
    _slice_rule, _slice_reference,
    "the size elements of x from start along axis (start + size within the axis)",
    vjp=_slice_vjp,
    mlir=_slice_mlir,
    lower=_slice_lower))
