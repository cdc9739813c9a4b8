"""Reductions along one axis: sum, max, argmax (axis removed) and the row-wise
normalisations softmax, log_softmax (shape kept)."""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import DType
from .registry import OpDef, Param, register

_AXIS_PARAMS = (Param("x", "tensor"), Param("axis", "axis", keyword_only=False))


def normalize_axis(ctx, x, attrs, opname: str) -> int:
    axis = attrs["axis"]
    if x.rank == 0:
        ctx.fail("shape", f"'{opname}' needs a tensor of rank >= 1, got {x}", at="x")
    if not -x.rank <= axis < x.rank:
        ctx.fail("shape", f"axis {axis} is out of range for {x} (rank {x.rank})", at="axis",
                 notes=(f"valid axes are {-x.rank}..{x.rank - 1}",))
    axis %= x.rank
    attrs["axis"] = axis
    ctx.record("axis-range", f"{opname}: axis {axis} < rank {x.rank}")
    return axis


def _reduce_rule(opname: str, result_dtype: DType | None, float_only: bool):
    def rule(ctx, operands, attrs):
        (x,) = operands
        axis = normalize_axis(ctx, x, attrs, opname)
        if float_only and not x.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs a floating-point operand, got "
                     f"{x.dtype.kina_name}", at="x")
        shape = x.shape[:axis] + x.shape[axis + 1:]
        return (x.with_shape(shape).with_dtype(result_dtype or x.dtype),)
    return rule


def _keep_rule(opname: str):
    def rule(ctx, operands, attrs):
        (x,) = operands
        normalize_axis(ctx, x, attrs, opname)
        if not x.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs a floating-point operand, got "
                     f"{x.dtype.kina_name}", at="x")
        return (x,)
    return rule


def _sum_reference(args, attrs):
    (x,) = args
    return (np.sum(x, axis=attrs["axis"], dtype=x.dtype),)


def _max_reference(args, attrs):
    (x,) = args
    return (np.max(x, axis=attrs["axis"]),)


def _argmax_reference(args, attrs):
    (x,) = args
    # numpy's argmax returns the first index among equal maxima, as Kina specifies; a NaN
    # counts as the maximum (first NaN wins), matching the compiled kernels.
    return (np.argmax(x, axis=attrs["axis"]).astype(np.int64),)


def _softmax_reference(args, attrs):
    (x,) = args
    axis = attrs["axis"]
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        e = np.exp(shifted)
        return ((e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype),)


def _log_softmax_reference(args, attrs):
    (x,) = args
    axis = attrs["axis"]
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        return ((shifted - lse).astype(x.dtype),)


def _with_axis(index, axis, var):
    return tuple(index[:axis]) + (var,) + tuple(index[axis:])


def _reduce_lower(reduce_op: str):
    def lower(ctx, op, operands):
        (x,) = operands
        axis = op.attr("axis")
        extent = x.type.concrete_shape[axis]
        dtype = op.result.type.dtype.value

        def at(index):
            r = ctx.var(extent, "r")
            return L.Reduce(reduce_op, r, extent, x.at(_with_axis(index, axis, r)), dtype)
        return ctx.view(op.result.type, at)
    return lower


def _row_lower(log: bool):
    """softmax / log_softmax as one row pass: max, sum of exp(x - max), then the row."""
    def lower(ctx, op, operands):
        (x,) = operands
        axis = op.attr("axis")
        shape = x.type.concrete_shape
        extent = shape[axis]
        dtype = x.type.dtype.value
        x = ctx.reusable(x, 3)
        outer = shape[:axis] + shape[axis + 1:]

        def emit(ctx, out):
            def row(index):
                r1, r2 = ctx.var(extent, "r"), ctx.var(extent, "r")
                row_max = L.Var(ctx.fresh_name("row_max"), dtype)
                row_sum = L.Var(ctx.fresh_name("row_sum"), dtype)
                shifted = L.binary("sub", x.at(_with_axis(index, axis, r2)), row_max)
                statements = [
                    L.Let(row_max, L.Reduce("max", r1, extent,
                                            x.at(_with_axis(index, axis, r1)), dtype)),
                    L.Let(row_sum, L.Reduce("sum", r2, extent,
                                            L.Unary("exp", shifted, dtype), dtype)),
                ]
                if log:
                    log_sum = L.Var(ctx.fresh_name("log_sum"), dtype)
                    statements.append(L.Let(log_sum, L.Unary("log", row_sum, dtype)))
                j = ctx.var(extent, "j")
                full = _with_axis(index, axis, j)
                centred = L.binary("sub", x.at(full), row_max)
                value = (L.binary("sub", centred, log_sum) if log else
                         L.binary("div", L.Unary("exp", centred, dtype), row_sum))
                statements.append(L.For(j, extent, (L.Store(out, full, value),)))
                return statements
            return ctx.loops(outer, row, "row")
        return L.RowKernel(op.result.type, emit)
    return lower


sum_ = register(OpDef(
    "sum", "reduction", _AXIS_PARAMS, _reduce_rule("sum", None, False), _sum_reference,
    "sum along axis (axis removed)",
    lower=_reduce_lower("sum")))
max_ = register(OpDef(
    "max", "reduction", _AXIS_PARAMS, _reduce_rule("max", None, False), _max_reference,
    "maximum along axis (axis removed)",
    lower=_reduce_lower("max")))
argmax = register(OpDef(
    "argmax", "reduction", _AXIS_PARAMS, _reduce_rule("argmax", DType.I64, False),
    _argmax_reference, "index of the maximum along axis, first on ties (I64, axis removed)",
    differentiable=False,
    lower=_reduce_lower("argmax")))
softmax = register(OpDef(
    "softmax", "reduction", _AXIS_PARAMS, _keep_rule("softmax"), _softmax_reference,
    "exp(x - max) / sum(exp(x - max)) along axis",
    lower=_row_lower(False)))
log_softmax = register(OpDef(
    "log_softmax", "reduction", _AXIS_PARAMS, _keep_rule("log_softmax"), _log_softmax_reference,
    "x - max - log(sum(exp(x - max))) along axis",
    lower=_row_lower(True)))
