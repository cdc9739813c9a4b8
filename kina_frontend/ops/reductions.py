"""Reductions along one axis: sum, mean, max, min, argmax (axis removed) and the row-wise
normalisations softmax, log_softmax (shape kept)."""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import DType
from .elementwise import widened
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
    wide = widened(x)
    return (np.asarray(np.sum(wide, axis=attrs["axis"], dtype=wide.dtype)).astype(x.dtype),)


def _mean_reference(args, attrs):
    (x,) = args
    wide = widened(x)
    return (np.asarray(np.mean(wide, axis=attrs["axis"], dtype=wide.dtype)).astype(x.dtype),)


def _max_reference(args, attrs):
    (x,) = args
    return (np.asarray(np.max(x, axis=attrs["axis"])),)


def _min_reference(args, attrs):
    (x,) = args
    return (np.asarray(np.min(x, axis=attrs["axis"])),)


def _argmax_reference(args, attrs):
    (x,) = args
    # numpy's argmax returns the first index among equal maxima, as Kina specifies; a NaN
    # counts as the maximum (first NaN wins), matching the compiled kernels.
    return (np.argmax(x, axis=attrs["axis"]).astype(np.int64),)


def _softmax_reference(args, attrs):
    (x,) = args
    dtype, x = x.dtype, widened(x)
    axis = attrs["axis"]
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        e = np.exp(shifted)
        return ((e / np.sum(e, axis=axis, keepdims=True)).astype(dtype),)


def _log_softmax_reference(args, attrs):
    (x,) = args
    dtype, x = x.dtype, widened(x)
    axis = attrs["axis"]
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        return ((shifted - lse).astype(dtype),)


# Vector-Jacobian rules. `b.restore_axis(r, axis, like)` broadcasts an axis-reduced tensor
# back along that axis (reshape with a 1 there, then broadcast).

def _sum_vjp(b, op, cotangents):
    (ct,) = cotangents
    (x,) = op.operands
    return (b.restore_axis(ct, op.attr("axis"), x.type),)


def _max_vjp(b, op, cotangents):
    # The whole cotangent goes to the first maximum along the axis -- the element argmax
    # picks, so ties never split or duplicate it (PyTorch's max(dim) does the same). The
    # mask is one_hot(argmax(x)) moved back to the reduced axis (one_hot puts it last).
    (ct,) = cotangents
    (x,) = op.operands
    axis, rank = op.attr("axis"), x.type.rank
    winners = b.emit("argmax", x, axis=axis)
    mask = b.cast(b.emit("one_hot", winners, n=x.type.shape[axis]), x.type.dtype)
    if axis != rank - 1:
        mask = b.transpose(mask, tuple(range(axis)) + (rank - 1,) + tuple(range(axis, rank - 1)))
    return (b.mul(mask, b.restore_axis(ct, axis, x.type)),)


def _mean_vjp(b, op, cotangents):
    (ct,) = cotangents
    (x,) = op.operands
    share = b.div(ct, b.fill(float(x.type.shape[op.attr("axis")]), ct.type))
    return (b.restore_axis(share, op.attr("axis"), x.type),)


def _min_vjp(b, op, cotangents):
    # As max: the whole cotangent to the first minimum, the first maximum of -x.
    (ct,) = cotangents
    (x,) = op.operands
    axis, rank = op.attr("axis"), x.type.rank
    winners = b.emit("argmax", b.neg(x), axis=axis)
    mask = b.cast(b.emit("one_hot", winners, n=x.type.shape[axis]), x.type.dtype)
    if axis != rank - 1:
        mask = b.transpose(mask, tuple(range(axis)) + (rank - 1,) + tuple(range(axis, rank - 1)))
    return (b.mul(mask, b.restore_axis(ct, axis, x.type)),)


def _softmax_vjp(b, op, cotangents):
    # y = softmax(x): dx = y * (ct - sum(ct * y)) along the axis.
    (ct,) = cotangents
    y, axis = op.result, op.attr("axis")
    weighted = b.sum(b.mul(ct, y), axis)
    return (b.mul(y, b.sub(ct, b.restore_axis(weighted, axis, y.type))),)


def _log_softmax_vjp(b, op, cotangents):
    # y = log_softmax(x): dx = ct - exp(y) * sum(ct) along the axis (exp(y) is softmax(x)).
    (ct,) = cotangents
    y, axis = op.result, op.attr("axis")
    total = b.restore_axis(b.sum(ct, axis), axis, y.type)
    return (b.sub(ct, b.mul(b.exp(y), total)),)


def _with_axis(index, axis, var):
    return tuple(index[:axis]) + (var,) + tuple(index[axis:])


def _axis_fold(ctx, op, x, reduce_op: str, before=None, after=None):
    """A view folding `x` along the op's axis with `reduce_op`, each element mapped by
    `before` and the result by `after` (both: (expr, dtype) -> expr)."""
    axis = op.attr("axis")
    extent = x.type.concrete_shape[axis]
    dtype = L.value_type(op.result.type.dtype.value)

    def at(index):
        r = ctx.var(extent, "r")
        element = x.at(_with_axis(index, axis, r))
        folded = L.Reduce(reduce_op, r, extent, before(element, dtype) if before else element,
                          dtype)
        return after(folded, dtype) if after else folded
    return ctx.view(op.result.type, at)


def _reduce_lower(reduce_op: str):
    def lower(ctx, op, operands):
        (x,) = operands
        return _axis_fold(ctx, op, x, reduce_op)
    return lower


def _mean_lower(ctx, op, operands):
    (x,) = operands
    extent = x.type.concrete_shape[op.attr("axis")]
    return _axis_fold(ctx, op, x, "sum", after=lambda total, dtype: L.binary(
        "div", total, L.Const(float(extent), dtype)))


def _order_reversed(value: L.Expr, dtype: str) -> L.Expr:
    # -x for floats (exact; NaN stays NaN), -1 - x for integers (no overflow at INT64_MIN).
    if dtype in L.FLOAT_TYPES:
        return L.Unary("neg", value, dtype)
    return L.binary("sub", L.Const(-1, dtype), value)


def _min_lower(ctx, op, operands):
    # The max of the order-reversed values, reversed back, so the vectorised max reductions
    # serve min as well.
    (x,) = operands
    return _axis_fold(ctx, op, x, "max", before=_order_reversed, after=_order_reversed)


def _row_lower(log: bool):
    """softmax / log_softmax as one pass per row. softmax: the row max, then exp(x - max)
    written to the result, its sum, then the result scaled by 1/sum (one exp per element).
    log_softmax: the max, the sum of exp(x - max), then x - max - log(sum)."""
    def lower(ctx, op, operands):
        (x,) = operands
        axis = op.attr("axis")
        shape = x.type.concrete_shape
        extent = shape[axis]
        dtype = L.value_type(x.type.dtype.value)
        x = ctx.reusable(x, 3)
        outer = shape[:axis] + shape[axis + 1:]

        def emit(ctx, out):
            def row(index):
                def at(name):
                    var = ctx.var(extent, name)
                    return var, _with_axis(index, axis, var)

                r1, max_index = at("r")
                row_max = L.Var(ctx.fresh_name("row_max"), dtype)
                row_sum = L.Var(ctx.fresh_name("row_sum"), dtype)
                # maxnum: a NaN in the row makes every result NaN through exp and the sum
                # anyway, so the row max need not track it.
                statements = [L.Let(row_max, L.Reduce("maxnum", r1, extent, x.at(max_index),
                                                      dtype))]
                j, full = at("j")
                centred = L.binary("sub", x.at(full), row_max)
                if log:
                    r2, sum_index = at("r")
                    shifted = L.binary("sub", x.at(sum_index), row_max)
                    log_sum = L.Var(ctx.fresh_name("log_sum"), dtype)
                    statements += [
                        L.Let(row_sum, L.Reduce("sum", r2, extent, L.Unary("exp", shifted,
                                                                            dtype), dtype)),
                        L.Let(log_sum, L.Unary("log", row_sum, dtype)),
                        L.For(j, extent, (L.Store(out, full, L.binary("sub", centred,
                                                                      log_sum)),)),
                    ]
                    return statements
                r2, sum_index = at("r")
                j2, scaled = at("j")
                # One division per row, then multiplies (within an ulp of dividing each
                # element; a vector division costs as much as a dozen multiplies).
                inverse = L.Var(ctx.fresh_name("row_inverse"), dtype)
                statements += [
                    L.For(j, extent, (L.Store(out, full, L.Unary("exp", centred, dtype)),)),
                    L.Let(row_sum, L.Reduce("sum", r2, extent, L.Load(out, sum_index, dtype),
                                            dtype)),
                    L.Let(inverse, L.binary("div", L.Const(1.0, dtype), row_sum)),
                    L.For(j2, extent, (L.Store(out, scaled, L.binary(
                        "mul", L.Load(out, scaled, dtype), inverse)),)),
                ]
                return statements
            return ctx.loops(outer, row, "row")
        return L.BufferWriter(op.result.type, emit)
    return lower


# MLIR: reductions are linalg.generic with a reduction iterator on the axis, accumulating
# into a linalg.fill-ed destination that lacks that axis.
_INT64_MIN = -(2 ** 63)


def _kept(rank: int, axis: int) -> tuple[int, ...]:
    return tuple(d for d in range(rank) if d != axis)


def _lowest(dtype: DType):
    return float("-inf") if dtype.is_float else _INT64_MIN


def _reduce_mlir(kind: str):
    def mlir(ctx, op, operands):
        (x,) = operands
        dtype = x.type.dtype
        scalar = ctx.element_type(dtype)
        if kind == "sum":
            initial, combine = 0, "arith.addf" if dtype.is_float else "arith.addi"
        else:  # maximumf propagates NaN, as numpy's max does
            initial, combine = _lowest(dtype), "arith.maximumf" if dtype.is_float else \
                "arith.maxsi"
        (name,) = ctx.reduce(x, op.attr("axis"), [(dtype, initial)],
                             lambda b, v, acc: b.let(f"{combine} {v}, {acc} : {scalar}"),
                             ctx.out())
        return name
    return mlir


def _mean_mlir(ctx, op, operands):
    (x,) = operands
    dtype = x.type.dtype
    scalar = ctx.element_type(dtype)
    extent = ctx.constant(float(x.type.concrete_shape[op.attr("axis")]), dtype)
    (total,) = ctx.reduce(x, op.attr("axis"), [(dtype, 0.0)],
                          lambda b, v, acc: b.let(f"arith.addf {v}, {acc} : {scalar}"),
                          ctx.out() + "_sum")
    return ctx.parallel(op.result.type, (ctx.value(total, op.result.type),),
                        lambda b, v: b.let(f"arith.divf {v}, {extent} : {scalar}"))


def _min_mlir(ctx, op, operands):
    (x,) = operands
    dtype = x.type.dtype
    scalar = ctx.element_type(dtype)
    initial, combine = (float("inf"), "arith.minimumf") if dtype.is_float else \
        (2 ** 63 - 1, "arith.minsi")
    (name,) = ctx.reduce(x, op.attr("axis"), [(dtype, initial)],
                         lambda b, v, acc: b.let(f"{combine} {v}, {acc} : {scalar}"), ctx.out())
    return name


def _argmax_mlir(ctx, op, operands):
    # One generic carrying (best value, best index); a later element wins only when it is
    # strictly greater (first index on ties), or the first NaN (NaN counts as the maximum).
    (x,) = operands
    axis = op.attr("axis")
    dtype = x.type.dtype
    scalar = ctx.element_type(dtype)

    def body(b, v, best, best_index):
        if dtype.is_float:
            greater = b.let(f"arith.cmpf ogt, {v}, {best} : {scalar}", "greater")
            is_nan = b.let(f"arith.cmpf uno, {v}, {v} : {scalar}", "is_nan")
            best_is_number = b.let(f"arith.cmpf ord, {best}, {best} : {scalar}", "best_num")
            first_nan = b.let(f"arith.andi {is_nan}, {best_is_number} : i1", "first_nan")
            take = b.let(f"arith.ori {greater}, {first_nan} : i1", "take")
        else:
            take = b.let(f"arith.cmpi sgt, {v}, {best} : {scalar}", "take")
        index = b.index_i64(axis)
        return [b.let(f"arith.select {take}, {v}, {best} : {scalar}", "best"),
                b.let(f"arith.select {take}, {index}, {best_index} : i64", "best_index")]
    _, indices = ctx.reduce(x, axis, [(dtype, _lowest(dtype)), (DType.I64, 0)], body,
                            (ctx.out() + "_value", ctx.out()))
    return indices


def _row_mlir(log: bool):
    """softmax: max-reduce, sub + exp, sum-reduce, div. log_softmax: max-reduce, sub,
    sum-reduce of exp, then shifted - log(sum)."""
    def mlir(ctx, op, operands):
        (x,) = operands
        axis = op.attr("axis")
        result = op.result.type
        scalar = ctx.element_type(result.dtype)
        kept = _kept(result.rank, axis)
        rows = result.with_shape(tuple(result.shape[d] for d in kept))
        hint = ctx.out()
        (row_max,) = ctx.reduce(
            x, axis, [(result.dtype, float("-inf"))],
            lambda b, v, acc: b.let(f"arith.maximumf {v}, {acc} : {scalar}"), hint + "_max")
        row_max = ctx.value(row_max, rows)
        if log:
            shifted = ctx.value(ctx.parallel(
                result, [x, (row_max, kept)],
                lambda b, v, m: b.let(f"arith.subf {v}, {m} : {scalar}"), hint + "_shifted"),
                result)

            def exp_sum(b, v, acc):
                return b.let(f"arith.addf {b.let(f'math.exp {v} : {scalar}')}, {acc} : "
                             f"{scalar}")
            (row_sum,) = ctx.reduce(shifted, axis, [(result.dtype, 0.0)], exp_sum,
                                    hint + "_sum")

            def centre(b, v, total):
                return b.let(f"arith.subf {v}, {b.let(f'math.log {total} : {scalar}')} : "
                             f"{scalar}")
            return ctx.parallel(result, [shifted, (ctx.value(row_sum, rows), kept)], centre)

        def shifted_exp(b, v, m):
            return b.let(f"math.exp {b.let(f'arith.subf {v}, {m} : {scalar}')} : {scalar}")
        exps = ctx.value(ctx.parallel(result, [x, (row_max, kept)], shifted_exp, hint + "_exp"),
                         result)
        (row_sum,) = ctx.reduce(exps, axis, [(result.dtype, 0.0)],
                                lambda b, v, acc: b.let(f"arith.addf {v}, {acc} : {scalar}"),
                                hint + "_sum")
        return ctx.parallel(result, [exps, (ctx.value(row_sum, rows), kept)],
                            lambda b, e, total: b.let(f"arith.divf {e}, {total} : {scalar}"))
    return mlir


sum_ = register(OpDef(
    "sum", "reduction", _AXIS_PARAMS, _reduce_rule("sum", None, False), _sum_reference,
    "sum along axis (axis removed)",
    vjp=_sum_vjp,
    mlir=_reduce_mlir("sum"),
    lower=_reduce_lower("sum")))
max_ = register(OpDef(
    "max", "reduction", _AXIS_PARAMS, _reduce_rule("max", None, False), _max_reference,
    "maximum along axis (axis removed)",
    vjp=_max_vjp,
    mlir=_reduce_mlir("max"),
    lower=_reduce_lower("max")))
mean = register(OpDef(
    "mean", "reduction", _AXIS_PARAMS, _reduce_rule("mean", None, True), _mean_reference,
    "arithmetic mean along axis (axis removed; floating point only)",
    vjp=_mean_vjp,
    mlir=_mean_mlir,
    lower=_mean_lower))
min_ = register(OpDef(
    "min", "reduction", _AXIS_PARAMS, _reduce_rule("min", None, False), _min_reference,
    "minimum along axis (axis removed; NaN if any element is)",
    vjp=_min_vjp,
    mlir=_min_mlir,
    lower=_min_lower))
argmax = register(OpDef(
    "argmax", "reduction", _AXIS_PARAMS, _reduce_rule("argmax", DType.I64, False),
    _argmax_reference, "index of the maximum along axis, first on ties (I64, axis removed)",
    differentiable=False,
    mlir=_argmax_mlir,
    lower=_reduce_lower("argmax")))
softmax = register(OpDef(
    "softmax", "reduction", _AXIS_PARAMS, _keep_rule("softmax"), _softmax_reference,
    "exp(x - max) / sum(exp(x - max)) along axis",
    vjp=_softmax_vjp,
    mlir=_row_mlir(False),
    lower=_row_lower(False)))
log_softmax = register(OpDef(
    "log_softmax", "reduction", _AXIS_PARAMS, _keep_rule("log_softmax"), _log_softmax_reference,
    "x - max - log(sum(exp(x - max))) along axis",
    vjp=_log_softmax_vjp,
    mlir=_row_mlir(True),
    lower=_row_lower(True)))
