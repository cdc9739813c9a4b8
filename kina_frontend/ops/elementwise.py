"""Elementwise ops: add sub mul div (equal shapes, or one side a number literal),
neg exp log sqrt tanh, and the internal `fill` that a number literal becomes."""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import DType, TensorType, format_dim
from .registry import OpDef, Param, register


def same_shape(ctx, lhs: TensorType, rhs: TensorType, opname: str, at: str = "rhs") -> None:
    if lhs.dtype != rhs.dtype:
        ctx.fail("type", f"'{opname}' operands have different element types: "
                 f"{lhs.dtype.kina_name} and {rhs.dtype.kina_name}", at=at)
    if lhs.rank != rhs.rank:
        ctx.fail("shape", f"'{opname}' operands have different ranks: {lhs} and {rhs}",
                 at=at, notes=("elementwise ops need equal shapes; use broadcast(x, [dims]) "
                                  "to expand one side",))
    for axis, (a, b) in enumerate(zip(lhs.shape, rhs.shape, strict=True)):
        ctx.prove_equal(a, b, "equal-shape",
                        f"{opname}: dim {axis} {format_dim(a)} == {format_dim(b)}",
                        f"'{opname}' operand shapes differ at dim {axis}: {lhs} vs {rhs}",
                        at=at,
                        notes=("elementwise ops need equal shapes; use broadcast(x, [dims]) "
                               "to expand one side",))


def _no_bool_arithmetic(ctx, opname: str, operand: TensorType, at: str) -> None:
    # BOOL is a truth value (i1): i1 arithmetic wraps (true + true is false) where NumPy's
    # is logical, so no meaning is given to it rather than a surprising one.
    if operand.dtype == DType.BOOL:
        ctx.fail("type", f"'{opname}' has no BOOL form", at=at,
                 notes=("cast(x, I64) or cast(x, F32) first, or choose with where(cond, a, b)",))


def _binary_rule(opname: str, float_only: bool):
    def rule(ctx, operands, attrs):
        lhs, rhs = operands
        same_shape(ctx, lhs, rhs, opname)
        _no_bool_arithmetic(ctx, opname, lhs, "lhs")
        if float_only and not lhs.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs floating-point operands, got "
                     f"{lhs.dtype.kina_name}", at="lhs")
        return (lhs,)
    return rule


def _unary_rule(opname: str, float_only: bool):
    def rule(ctx, operands, attrs):
        (x,) = operands
        _no_bool_arithmetic(ctx, opname, x, "x")
        if float_only and not x.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs a floating-point operand, got "
                     f"{x.dtype.kina_name}", at="x")
        return (x,)
    return rule


def widened(array: np.ndarray) -> np.ndarray:
    """A BF16 array as the f32 its arithmetic runs in; other arrays as they are."""
    return array.astype(np.float32) if array.dtype == DType.BF16.numpy else array


def _binary_reference(ufunc):
    def reference(args, attrs):
        lhs, rhs = args
        with np.errstate(all="ignore"):
            return (ufunc(widened(lhs), widened(rhs)).astype(lhs.dtype, copy=False),)
    return reference


def _unary_reference(ufunc):
    def reference(args, attrs):
        (x,) = args
        with np.errstate(all="ignore"):
            return (ufunc(widened(x)).astype(x.dtype, copy=False),)
    return reference


def binary_lower(opname: str):
    """The rule for an elementwise op that is one loop-IR binary `opname`."""
    def lower(ctx, op, operands):
        lhs, rhs = operands
        return ctx.view(op.result.type, lambda index: L.binary(opname, lhs.at(index),
                                                               rhs.at(index)))
    return lower


def _unary_lower(opname: str):
    def lower(ctx, op, operands):
        (x,) = operands
        def at(index):
            operand = x.at(index)  # once: chains of unary ops stay linear in size
            return L.Unary(opname, operand, operand.dtype)
        return ctx.view(op.result.type, at)
    return lower


# MLIR: one all-parallel linalg.generic whose body is the arith / math op (float, int).
_BINARY_MLIR = {"add": ("arith.addf", "arith.addi"), "sub": ("arith.subf", "arith.subi"),
                "mul": ("arith.mulf", "arith.muli"), "div": ("arith.divf", None)}
_UNARY_MLIR = {"neg": "arith.negf", "exp": "math.exp", "log": "math.log", "sqrt": "math.sqrt",
               "tanh": "math.tanh"}


def _binary_mlir(opname: str):
    float_op, int_op = _BINARY_MLIR[opname]

    def mlir(ctx, op, operands):
        lhs, rhs = operands
        scalar = ctx.element_type(lhs.type.dtype)
        arith = float_op if lhs.type.dtype.is_float else int_op
        if arith is None:
            raise ctx.fail(f"'{opname}' on {lhs.type.dtype.kina_name} operands")
        return ctx.parallel(op.result.type, (lhs, rhs),
                            lambda b, x, y: b.let(f"{arith} {x}, {y} : {scalar}"))
    return mlir


def _unary_mlir(opname: str):
    def mlir(ctx, op, operands):
        (x,) = operands
        scalar = ctx.element_type(x.type.dtype)
        if not x.type.dtype.is_float:  # only neg takes integers: 0 - x
            zero = ctx.constant(0, x.type.dtype)
            return ctx.parallel(op.result.type, (x,),
                                lambda b, v: b.let(f"arith.subi {zero}, {v} : {scalar}"))
        return ctx.parallel(op.result.type, (x,),
                            lambda b, v: b.let(f"{_UNARY_MLIR[opname]} {v} : {scalar}"))
    return mlir


# Vector-Jacobian rules: (builder, op, (result cotangent,)) -> one cotangent per operand.
# `op.result` is the forward value y, reused where the derivative is a function of it.

def _add_vjp(b, op, cotangents):
    (ct,) = cotangents
    return (ct, ct)


def _sub_vjp(b, op, cotangents):
    (ct,) = cotangents
    return (ct, b.neg(ct))


def _mul_vjp(b, op, cotangents):
    (ct,) = cotangents
    lhs, rhs = op.operands
    return (b.mul(ct, rhs), b.mul(ct, lhs))


def _div_vjp(b, op, cotangents):
    # y = l / r: dl = ct / r, dr = -ct * l / r^2 = -(ct * y) / r.
    (ct,) = cotangents
    _, rhs = op.operands
    return (b.div(ct, rhs), b.neg(b.div(b.mul(ct, op.result), rhs)))


def _neg_vjp(b, op, cotangents):
    (ct,) = cotangents
    return (b.neg(ct),)


def _exp_vjp(b, op, cotangents):
    (ct,) = cotangents
    return (b.mul(ct, op.result),)


def _log_vjp(b, op, cotangents):
    (ct,) = cotangents
    return (b.div(ct, op.operands[0]),)


def _sqrt_vjp(b, op, cotangents):
    # d sqrt(x) = 1 / (2 sqrt(x)) = 1 / (y + y).
    (ct,) = cotangents
    return (b.div(ct, b.add(op.result, op.result)),)


def _tanh_vjp(b, op, cotangents):
    # d tanh(x) = 1 - y^2.
    (ct,) = cotangents
    y = op.result
    return (b.mul(ct, b.sub(b.fill(1.0, y.type), b.mul(y, y))),)


_BINARY_PARAMS = (Param("lhs", "tensor_or_literal"), Param("rhs", "tensor_or_literal"))

add = register(OpDef(
    "add", "elementwise", _BINARY_PARAMS, _binary_rule("add", False), _binary_reference(np.add),
    "lhs + rhs elementwise",
    vjp=_add_vjp,
    mlir=_binary_mlir("add"),
    lower=binary_lower("add")))
sub = register(OpDef(
    "sub", "elementwise", _BINARY_PARAMS, _binary_rule("sub", False),
    _binary_reference(np.subtract), "lhs - rhs elementwise",
    vjp=_sub_vjp,
    mlir=_binary_mlir("sub"),
    lower=binary_lower("sub")))
mul = register(OpDef(
    "mul", "elementwise", _BINARY_PARAMS, _binary_rule("mul", False),
    _binary_reference(np.multiply), "lhs * rhs elementwise",
    vjp=_mul_vjp,
    mlir=_binary_mlir("mul"),
    lower=binary_lower("mul")))
div = register(OpDef(
    "div", "elementwise", _BINARY_PARAMS, _binary_rule("div", True),
    _binary_reference(np.divide), "lhs / rhs elementwise (floating point only)",
    vjp=_div_vjp,
    mlir=_binary_mlir("div"),
    lower=binary_lower("div")))

neg = register(OpDef(
    "neg", "elementwise", (Param("x", "tensor"),), _unary_rule("neg", False),
    _unary_reference(np.negative), "-x elementwise",
    vjp=_neg_vjp,
    mlir=_unary_mlir("neg"),
    lower=_unary_lower("neg")))
exp = register(OpDef(
    "exp", "elementwise", (Param("x", "tensor"),), _unary_rule("exp", True),
    _unary_reference(np.exp), "e^x elementwise",
    vjp=_exp_vjp,
    mlir=_unary_mlir("exp"),
    lower=_unary_lower("exp")))
log = register(OpDef(
    "log", "elementwise", (Param("x", "tensor"),), _unary_rule("log", True),
    _unary_reference(np.log), "natural logarithm elementwise (-inf at 0, nan below)",
    vjp=_log_vjp,
    mlir=_unary_mlir("log"),
    lower=_unary_lower("log")))
sqrt = register(OpDef(
    "sqrt", "elementwise", (Param("x", "tensor"),), _unary_rule("sqrt", True),
    _unary_reference(np.sqrt), "square root elementwise (nan below 0)",
    vjp=_sqrt_vjp,
    mlir=_unary_mlir("sqrt"),
    lower=_unary_lower("sqrt")))
tanh = register(OpDef(
    "tanh", "elementwise", (Param("x", "tensor"),), _unary_rule("tanh", True),
    _unary_reference(np.tanh), "hyperbolic tangent elementwise",
    vjp=_tanh_vjp,
    mlir=_unary_mlir("tanh"),
    lower=_unary_lower("tanh")))


def _fill_rule(ctx, operands, attrs):
    return (TensorType(DType(attrs["dtype"]), tuple(attrs["shape"])),)


def _fill_reference(args, attrs):
    dtype = DType(attrs["dtype"]).numpy
    return (np.full(tuple(int(d) for d in attrs["shape"]), attrs["value"], dtype=dtype),)


def _fill_lower(ctx, op, operands):
    constant = L.Const(op.attr("value"), L.value_type(op.attr("dtype")))
    return ctx.view(op.result.type, lambda index: constant)


def _fill_mlir(ctx, op, operands):
    return ctx.filled(op.result.type, op.attr("value"), ctx.out())


fill = register(OpDef(
    "fill", "elementwise",
    (Param("value", "number"), Param("shape", "dims"), Param("dtype", "dtype")),
    _fill_rule, _fill_reference,
    "a tensor of the given shape holding one number (what a number literal operand becomes)",
    internal=True, differentiable=False,
    mlir=_fill_mlir,
    lower=_fill_lower))


def _cast_rule(ctx, operands, attrs):
    (x,) = operands
    target = DType(attrs["dtype"])
    if not (target.is_float or x.dtype.is_float or DType.BOOL in (x.dtype, target)):
        ctx.fail("type", f"'cast' from {x.dtype.kina_name} to {target.kina_name} is the "
                 "identity", at="dtype")
    return (x.with_dtype(target),)


_INT64_BOUND = 2.0 ** 63


def _cast_reference(args, attrs):
    (x,) = args
    target = DType(attrs["dtype"])
    if target == DType.BOOL:
        return (x != 0,)  # NaN is nonzero
    source = widened(x)
    if target == DType.I64 and x.dtype.kind == "f":
        # Truncation toward zero, saturating at the I64 bounds, NaN -> 0.
        finite = np.where(np.isnan(source), 0, source)
        inside = (finite > -_INT64_BOUND) & (finite < _INT64_BOUND)
        result = np.where(inside, finite, 0).astype(np.int64)
        result[finite >= _INT64_BOUND] = np.iinfo(np.int64).max
        result[finite <= -_INT64_BOUND] = np.iinfo(np.int64).min
        return (result,)
    if target == DType.BF16 and source.dtype != np.float32:
        source = source.astype(np.float32)  # BF16 rounds from f32: through f32 first
    return (source.astype(target.numpy),)


def _cast_lower(ctx, op, operands):
    (x,) = operands
    target = op.result.type.dtype
    into = L.value_type(target.value)

    def at(index):
        value = x.at(index)
        return value if value.dtype == into else L.Cast(value, into)
    return ctx.view(op.result.type, at)


def _cast_vjp(b, op, cotangents):
    # Float to float: the cotangent converts back. Other sources have no gradient.
    (ct,) = cotangents
    (x,) = op.operands
    float_to_float = x.type.dtype.is_float and op.result.type.dtype.is_float
    return (b.cast(ct, x.type.dtype) if float_to_float else None,)


_FLOAT_WIDTHS = {DType.BF16: 16, DType.F32: 32, DType.F64: 64}


def _cast_mlir(ctx, op, operands):
    # Between float widths arith.extf / arith.truncf (to nearest; F64 -> BF16 through F32,
    # as the compiled code rounds); arith.sitofp / fptosi between I64 and floats; BOOL is i1.
    (x,) = operands
    source, target = x.type.dtype, op.result.type.dtype
    if source == target:
        return x.name
    element = ctx.element_type

    def convert(b, v):
        if target == DType.BOOL:
            zero = b.let(f"arith.constant {'0.0' if source.is_float else '0'} : "
                         f"{element(source)}")
            predicate = "arith.cmpf une" if source.is_float else "arith.cmpi ne"
            return b.let(f"{predicate}, {v}, {zero} : {element(source)}")
        if source == DType.BOOL:
            kind = "arith.uitofp" if target.is_float else "arith.extui"
            return b.let(f"{kind} {v} : i1 to {element(target)}")
        if not source.is_float:
            if target == DType.BF16:
                v = b.let(f"arith.sitofp {v} : i64 to f32")
                return b.let(f"arith.truncf {v} : f32 to bf16")
            return b.let(f"arith.sitofp {v} : i64 to {element(target)}")
        if not target.is_float:
            return b.let(f"arith.fptosi {v} : {element(source)} to i64")
        if source == DType.F64 and target == DType.BF16:
            v = b.let(f"arith.truncf {v} : f64 to f32")
            return b.let(f"arith.truncf {v} : f32 to bf16")
        kind = "arith.extf" if _FLOAT_WIDTHS[target] > _FLOAT_WIDTHS[source] else "arith.truncf"
        return b.let(f"{kind} {v} : {element(source)} to {element(target)}")
    return ctx.parallel(op.result.type, (x,), convert)


cast = register(OpDef(
    "cast", "elementwise", (Param("x", "tensor"), Param("dtype", "dtype")),
    _cast_rule, _cast_reference,
    "x converted elementwise to dtype: floats round to nearest (BF16 from F32), floats to "
    "I64 truncate toward zero (saturating, NaN -> 0), BOOL is x != 0 and converts to 0 / 1",
    vjp=_cast_vjp,
    mlir=_cast_mlir,
    lower=_cast_lower))
