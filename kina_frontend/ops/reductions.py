"""Reductions along one axis: sum, max, argmax (axis removed) and the row-wise
normalisations softmax, log_softmax (shape kept)."""

from __future__ import annotations

import numpy as np

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


sum_ = register(OpDef(
    "sum", "reduction", _AXIS_PARAMS, _reduce_rule("sum", None, False), _sum_reference,
    "sum along axis (axis removed)"))
max_ = register(OpDef(
    "max", "reduction", _AXIS_PARAMS, _reduce_rule("max", None, False), _max_reference,
    "maximum along axis (axis removed)"))
argmax = register(OpDef(
    "argmax", "reduction", _AXIS_PARAMS, _reduce_rule("argmax", DType.I64, False),
    _argmax_reference, "index of the maximum along axis, first on ties (I64, axis removed)",
    differentiable=False))
softmax = register(OpDef(
    "softmax", "reduction", _AXIS_PARAMS, _keep_rule("softmax"), _softmax_reference,
    "exp(x - max) / sum(exp(x - max)) along axis"))
log_softmax = register(OpDef(
    "log_softmax", "reduction", _AXIS_PARAMS, _keep_rule("log_softmax"), _log_softmax_reference,
    "x - max - log(sum(exp(x - max))) along axis"))
