"""Layout ops: broadcast (numpy's right-aligned rule), reshape, transpose, and iota (the
positions along one axis)."""

from __future__ import annotations

import numpy as np
import sympy

from tilegen import loopir as L

from ..types import DType, TensorType, format_dim
from .registry import OpDef, Param, register


def _dims(shape) -> str:
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"


def _is_one(dim) -> bool:
    return sympy.expand(dim) == 1  # expanded polynomials are canonical


def _broadcast_rule(ctx, operands, attrs):
    (x,) = operands
    target = tuple(attrs["shape"])
    if len(target) < x.rank:
        ctx.fail("shape", f"broadcast cannot lower the rank: {x} to {_dims(target)}",
                 at="shape", notes=("broadcast aligns dims from the right and may only add "
                                    "leading dims or expand dims of size 1",))
    offset = len(target) - x.rank
    for axis, src in enumerate(x.shape):
        dst = target[offset + axis]
        if _is_one(src):
            ctx.record("broadcast", f"broadcast: source dim {axis} is 1 -> {format_dim(dst)}")
            continue
        ctx.prove_equal(src, dst, "broadcast",
                        f"broadcast: source dim {axis} {format_dim(src)} == "
                        f"target dim {offset + axis} {format_dim(dst)}",
                        f"cannot broadcast {x} to {_dims(target)}: source dim {axis} is "
                        f"{format_dim(src)}, target dim {offset + axis} is {format_dim(dst)}",
                        at="shape",
                        notes=("right-aligned numpy rule: each source dim must be 1 or equal "
                               "the target dim",))
    return (x.with_shape(target),)


def _broadcast_reference(args, attrs):
    (x,) = args
    return (np.broadcast_to(x, tuple(int(d) for d in attrs["shape"])).copy(),)


def _broadcast_vjp(b, op, cotangents):
    # The adjoint of broadcasting sums over every axis that was broadcast -- the new leading
    # axes and the size-1 source axes that grew -- then reshapes to the source shape.
    (ct,) = cotangents
    (x,) = op.operands
    source, target = x.type.shape, op.result.type.shape
    offset = len(target) - len(source)
    axes = [axis for axis in range(offset) if not _is_one(target[axis])]
    axes += [offset + axis for axis, dim in enumerate(source)
             if _is_one(dim) and not _is_one(target[offset + axis])]
    for axis in sorted(axes, reverse=True):  # highest first, so lower axis numbers hold
        ct = b.sum(ct, axis)
    return (b.reshape(ct, source),)


def _broadcast_lower(ctx, op, operands):
    (x,) = operands
    source = x.type.concrete_shape
    target = op.result.type.concrete_shape
    offset = len(target) - len(source)
    x = ctx.reusable(x, _count(target) // _count(source))

    def at(index):
        return x.at(tuple(L.const(0) if source[a] == 1 else index[offset + a]
                          for a in range(len(source))))
    return ctx.view(op.result.type, at)


def _broadcast_mlir(ctx, op, operands):
    # linalg.broadcast adds dims only: first collapse away the size-1 dims that stretch,
    # then broadcast along the new leading dims and the stretched ones.
    (x,) = operands
    source = x.type.concrete_shape
    target = op.result.type.concrete_shape
    offset = len(target) - len(source)
    stretched = [a for a in range(len(source)) if source[a] == 1 and target[offset + a] != 1]
    added = list(range(offset)) + [offset + a for a in stretched]
    if not added:
        return x.name
    if stretched:
        kept = [a for a in range(len(source)) if a not in stretched]
        x = ctx.collapse_shape(x, _unit_groups(kept, len(source)), ctx.out() + "_squeezed")
    init = ctx.empty(op.result.type, ctx.out() + "_init")
    return ctx.let(ctx.out(), f"linalg.broadcast ins({x} : {ctx.tensor_type(x.type)}) "
                              f"outs({init} : {ctx.tensor_type(op.result.type)}) "
                              f"dimensions = [{', '.join(str(d) for d in added)}]")


def _unit_groups(kept: list[int], rank: int) -> list[list[int]]:
    """collapse_shape groups keeping dims `kept` and folding the (size-1) others into a
    neighbour: each group runs from one kept dim to the next, the first from dim 0."""
    if not kept:
        return []  # every dim folds away: a rank-0 tensor
    starts = [0] + kept[1:]
    ends = kept[1:] + [rank]
    return [list(range(start, end)) for start, end in zip(starts, ends, strict=True)]


def _count(shape) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


broadcast = register(OpDef(
    "broadcast", "layout", (Param("x", "tensor"), Param("shape", "dims")),
    _broadcast_rule, _broadcast_reference,
    "expand x to shape by numpy's right-aligned rule (new leading dims, or size-1 dims)",
    vjp=_broadcast_vjp,
    mlir=_broadcast_mlir,
    lower=_broadcast_lower))


def _reshape_rule(ctx, operands, attrs):
    (x,) = operands
    target = list(attrs["shape"])
    inferred = [i for i, d in enumerate(target) if d == -1]
    if len(inferred) > 1:
        ctx.fail("shape", "reshape may infer at most one dim (-1)", at="shape")
    if inferred:
        known = sympy.Integer(1)
        for i, dim in enumerate(target):
            if i != inferred[0]:
                known *= dim
        if sympy.expand(known) == 0:
            ctx.fail("shape", "reshape cannot infer the -1 dim next to a 0 dim", at="shape")
        # cancel() rather than div(): div() raises on integers that do not divide (2 / 3).
        numerator, denominator = sympy.fraction(sympy.cancel(x.numel() / known))
        if denominator != 1:
            ctx.fail("shape", f"reshape cannot infer the -1 dim: {format_dim(x.numel())} "
                     f"elements are not a multiple of {format_dim(known)}", at="shape",
                     notes=("the quotient must be an integer for every value of the constants",))
        target[inferred[0]] = sympy.expand(numerator)
        ctx.record("reshape-infer", f"reshape: -1 = {format_dim(target[inferred[0]])}")
    src_count = sympy.expand(x.numel())
    dst_count = sympy.expand(TensorType(x.dtype, tuple(target)).numel())
    ctx.prove_equal(src_count, dst_count, "reshape-count",
                    f"reshape: {format_dim(src_count)} elements == {format_dim(dst_count)}",
                    f"reshape changes the element count: {x} has {format_dim(src_count)} "
                    f"elements, {_dims(target)} has {format_dim(dst_count)}",
                    at="shape",
                    notes=("the counts must agree for every value of the constants",))
    attrs["shape"] = tuple(target)  # canonical: the -1 resolved
    return (x.with_shape(target),)


def _reshape_reference(args, attrs):
    (x,) = args
    return (x.reshape(tuple(int(d) for d in attrs["shape"])).copy(),)


def _reshape_vjp(b, op, cotangents):
    (ct,) = cotangents
    return (b.reshape(ct, op.operands[0].type.shape),)


def _reshape_lower(ctx, op, operands):
    (x,) = operands
    source = x.type.concrete_shape
    target = op.result.type.concrete_shape
    simplify = ctx.simplifier

    def at(index):
        return x.at(simplify.delinearize(simplify.linearize(index, target), source))
    return ctx.view(op.result.type, at)


def _reassociation(small, big) -> list[list[int]] | None:
    """Contiguous groups of `big`'s dims whose products are `small`'s dims (trailing 1s join
    the last group), or None when there is none. rank(big) >= rank(small)."""
    if not small:
        return [] if all(d == 1 for d in big) else None
    groups, j = [], 0
    for dim in small:
        if j >= len(big):
            return None
        group, product = [j], big[j]
        j += 1
        while product < dim and j < len(big):
            group.append(j)
            product *= big[j]
            j += 1
        if product != dim:
            return None
        groups.append(group)
    if any(big[k] != 1 for k in range(j, len(big))):
        return None
    groups[-1].extend(range(j, len(big)))
    return groups


def _reshape_mlir(ctx, op, operands):
    # One tensor.expand_shape or tensor.collapse_shape when the dims regroup, otherwise a
    # collapse to the flat vector and an expand to the target.
    (x,) = operands
    result = op.result.type
    source, target = x.type.concrete_shape, result.concrete_shape
    if source == target:
        return x.name
    if len(target) > len(source) and (groups := _reassociation(source, target)) is not None:
        return ctx.expand_shape(x, groups, result, ctx.out()).name
    if len(target) < len(source) and (groups := _reassociation(target, source)) is not None:
        return ctx.collapse_shape(x, groups, ctx.out()).name
    if len(source) > 1:
        x = ctx.collapse_shape(x, [list(range(len(source)))], ctx.out() + "_flat")
    return ctx.expand_shape(x, [list(range(len(target)))], result, ctx.out()).name


reshape = register(OpDef(
    "reshape", "layout", (Param("x", "tensor"), Param("shape", "dims")),
    _reshape_rule, _reshape_reference,
    "same elements in row-major order, new shape (one dim may be -1)",
    vjp=_reshape_vjp,
    mlir=_reshape_mlir,
    lower=_reshape_lower))


def _transpose_rule(ctx, operands, attrs):
    (x,) = operands
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        ctx.fail("shape", f"transpose permutation {list(perm)} is not a permutation of "
                 f"0..{x.rank - 1} for {x}", at="perm")
    ctx.record("permutation", f"transpose: {list(perm)} permutes rank {x.rank}")
    return (x.with_shape(tuple(x.shape[p] for p in perm)),)


def _transpose_reference(args, attrs):
    (x,) = args
    return (np.ascontiguousarray(np.transpose(x, attrs["perm"])),)


def _transpose_vjp(b, op, cotangents):
    # Transpose back by the inverse permutation.
    (ct,) = cotangents
    perm = op.attr("perm")
    inverse = [0] * len(perm)
    for result_axis, source_axis in enumerate(perm):
        inverse[source_axis] = result_axis
    return (b.transpose(ct, inverse),)


def _transpose_lower(ctx, op, operands):
    (x,) = operands
    perm = op.attr("perm")

    def at(index):
        source_index = [None] * len(perm)
        for result_axis, source_axis in enumerate(perm):
            source_index[source_axis] = index[result_axis]
        return x.at(tuple(source_index))
    return ctx.view(op.result.type, at)


def _transpose_mlir(ctx, op, operands):
    # linalg.transpose has Kina's convention: result dim i is input dim permutation[i].
    (x,) = operands
    perm = tuple(op.attr("perm"))
    if perm == tuple(range(len(perm))):
        return x.name
    result = op.result.type
    init = ctx.empty(result, ctx.out() + "_init")
    return ctx.let(ctx.out(), f"linalg.transpose ins({x} : {ctx.tensor_type(x.type)}) "
                              f"outs({init} : {ctx.tensor_type(result)}) "
                              f"permutation = [{', '.join(str(p) for p in perm)}]")


transpose = register(OpDef(
    "transpose", "layout", (Param("x", "tensor"), Param("perm", "ints")),
    _transpose_rule, _transpose_reference,
    "result dim i is x's dim perm[i]",
    vjp=_transpose_vjp,
    mlir=_transpose_mlir,
    lower=_transpose_lower))


def _iota_rule(ctx, operands, attrs):
    shape = tuple(attrs["shape"])
    axis = attrs["axis"]
    if not -len(shape) <= axis < len(shape):
        ctx.fail("shape", f"axis {axis} is out of range for shape {_dims(shape)}", at="axis")
    attrs["axis"] = axis % len(shape)
    ctx.record("axis-range", f"iota: axis {attrs['axis']} < rank {len(shape)}")
    return (TensorType(DType.I64, shape),)


def _iota_reference(args, attrs):
    shape = tuple(int(d) for d in attrs["shape"])
    axis = attrs["axis"]
    positions = np.arange(shape[axis], dtype=np.int64).reshape(
        (1,) * axis + (shape[axis],) + (1,) * (len(shape) - axis - 1))
    return (np.broadcast_to(positions, shape).copy(),)


def _iota_lower(ctx, op, operands):
    axis = op.attr("axis")
    return ctx.view(op.result.type, lambda index: index[axis])


def _iota_mlir(ctx, op, operands):
    axis = op.attr("axis")
    return ctx.parallel(op.result.type, (), lambda b: b.index_i64(axis))


iota = register(OpDef(
    "iota", "layout", (Param("shape", "dims"), Param("axis", "axis")),
    _iota_rule, _iota_reference,
    "I64 tensor of shape whose element at an index is that index's position along axis",
    differentiable=False,
    mlir=_iota_mlir,
    lower=_iota_lower))
