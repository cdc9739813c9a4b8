"""Comparisons (-> BOOL), `where`, and the elementwise `maximum` / `minimum`.

Operands follow `add`'s rule: equal shapes and element types, or one side a number (which
takes the other side's type). Float comparisons follow NumPy (and IEEE): every ordered
comparison with a NaN is false, `not_equal` with a NaN is true.
"""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import DType
from .elementwise import binary_lower, same_shape, widened
from .registry import OpDef, Param, register

_BINARY_PARAMS = (Param("lhs", "tensor_or_literal"), Param("rhs", "tensor_or_literal"))

# Kina name -> (loop IR comparison, NumPy ufunc, MLIR float predicate, MLIR int predicate).
_COMPARISONS = {
    "less": ("lt", np.less, "olt", "slt"),
    "less_equal": ("le", np.less_equal, "ole", "sle"),
    "greater": ("gt", np.greater, "ogt", "sgt"),
    "greater_equal": ("ge", np.greater_equal, "oge", "sge"),
    "equal": ("eq", np.equal, "oeq", "eq"),
    "not_equal": ("ne", np.not_equal, "une", "ne"),
}


def _compare_rule(opname: str):
    def rule(ctx, operands, attrs):
        lhs, rhs = operands
        same_shape(ctx, lhs, rhs, opname)
        if lhs.dtype == DType.BOOL and opname not in ("equal", "not_equal"):
            ctx.fail("type", f"'{opname}' orders numbers; BOOL operands only take equal and "
                     "not_equal", at="lhs")
        return (lhs.with_dtype(DType.BOOL),)
    return rule


def _compare_reference(ufunc):
    def reference(args, attrs):
        lhs, rhs = (widened(a) for a in args)
        with np.errstate(all="ignore"):
            return (np.asarray(ufunc(lhs, rhs), dtype=np.bool_),)
    return reference


def _compare_mlir(opname: str):
    _, _, float_predicate, int_predicate = _COMPARISONS[opname]

    def mlir(ctx, op, operands):
        lhs, rhs = operands
        scalar = ctx.element_type(lhs.type.dtype)
        if lhs.type.dtype.is_float:
            text = f"arith.cmpf {float_predicate}"
        else:
            text = f"arith.cmpi {int_predicate}"
        return ctx.parallel(op.result.type, (lhs, rhs),
                            lambda b, x, y: b.let(f"{text}, {x}, {y} : {scalar}"))
    return mlir


for _name, (_loop_op, _ufunc, _, _) in _COMPARISONS.items():
    register(OpDef(
        _name, "comparison", _BINARY_PARAMS, _compare_rule(_name), _compare_reference(_ufunc),
        f"lhs {_loop_op} rhs elementwise -> BOOL (NumPy's {_ufunc.__name__}; NaN as in IEEE)",
        differentiable=False,
        mlir=_compare_mlir(_name),
        lower=binary_lower(_loop_op)))


# ---- where ------------------------------------------------------------------------------------

def _where_rule(ctx, operands, attrs):
    cond, if_true, if_false = operands
    if cond.dtype != DType.BOOL:
        ctx.fail("type", f"'where' condition must be BOOL, got {cond.dtype.kina_name}",
                 at="cond", notes=("comparisons (less, equal, ...) produce BOOL; "
                                   "cast(x, BOOL) converts numbers",))
    same_shape(ctx, if_true, if_false, "where", at="if_false")
    same_shape(ctx, cond, if_true.with_dtype(DType.BOOL), "where", at="cond")
    return (if_true,)


def _where_reference(args, attrs):
    cond, if_true, if_false = args
    return (np.where(cond, if_true, if_false).astype(if_true.dtype, copy=False),)


def _where_vjp(b, op, cotangents):
    (ct,) = cotangents
    cond, if_true, _ = op.operands
    zero = b.fill(0.0, ct.type)
    return (None, b.emit("where", cond, ct, zero), b.emit("where", cond, zero, ct))


def _where_lower(ctx, op, operands):
    cond, if_true, if_false = operands

    def at(index):
        yes = if_true.at(index)
        return L.Select(cond.at(index), yes, if_false.at(index), yes.dtype)
    return ctx.view(op.result.type, at)


def _where_mlir(ctx, op, operands):
    _, if_true, _ = operands
    scalar = ctx.element_type(if_true.type.dtype)
    return ctx.parallel(op.result.type, operands,
                        lambda b, c, x, y: b.let(f"arith.select {c}, {x}, {y} : {scalar}"))


where = register(OpDef(
    "where", "comparison",
    (Param("cond", "tensor"), Param("if_true", "tensor_or_literal"),
     Param("if_false", "tensor_or_literal")),
    _where_rule, _where_reference,
    "if_true where cond (BOOL) holds, else if_false; either may be a number",
    vjp=_where_vjp,
    mlir=_where_mlir,
    lower=_where_lower))


# ---- maximum / minimum ------------------------------------------------------------------------

def _extremum_rule(opname: str):
    def rule(ctx, operands, attrs):
        lhs, rhs = operands
        same_shape(ctx, lhs, rhs, opname)
        if lhs.dtype == DType.BOOL:
            ctx.fail("type", f"'{opname}' needs numbers, got BOOL", at="lhs")
        return (lhs,)
    return rule


def _extremum_reference(ufunc):
    def reference(args, attrs):
        lhs, rhs = args
        with np.errstate(all="ignore"):
            return (ufunc(widened(lhs), widened(rhs)).astype(lhs.dtype),)
    return reference


def _extremum_vjp(pick: str):
    # PyTorch's rule: the cotangent goes to the picked operand, split in half on ties.
    def vjp(b, op, cotangents):
        (ct,) = cotangents
        lhs, rhs = op.operands
        zero, half = b.fill(0.0, ct.type), b.mul(ct, b.fill(0.5, ct.type))
        tie = b.emit("where", b.emit("equal", lhs, rhs), half, zero)
        to_lhs = b.emit("where", b.emit(pick, lhs, rhs), ct, tie)
        return (to_lhs, b.sub(ct, to_lhs))
    return vjp


def _extremum_mlir(float_op: str, int_op: str):
    def mlir(ctx, op, operands):
        lhs, rhs = operands
        scalar = ctx.element_type(lhs.type.dtype)
        text = float_op if lhs.type.dtype.is_float else int_op
        return ctx.parallel(op.result.type, (lhs, rhs),
                            lambda b, x, y: b.let(f"{text} {x}, {y} : {scalar}"))
    return mlir


maximum = register(OpDef(
    "maximum", "comparison", _BINARY_PARAMS, _extremum_rule("maximum"),
    _extremum_reference(np.maximum), "the larger of lhs and rhs elementwise (NaN if either is)",
    vjp=_extremum_vjp("greater"),
    mlir=_extremum_mlir("arith.maximumf", "arith.maxsi"),
    lower=binary_lower("max")))
minimum = register(OpDef(
    "minimum", "comparison", _BINARY_PARAMS, _extremum_rule("minimum"),
    _extremum_reference(np.minimum), "the smaller of lhs and rhs elementwise (NaN if either is)",
    vjp=_extremum_vjp("less"),
    mlir=_extremum_mlir("arith.minimumf", "arith.minsi"),
    lower=binary_lower("min")))

COMPARISON_OPS = tuple(_COMPARISONS)
