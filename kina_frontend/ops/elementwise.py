"""Elementwise ops: add sub mul div (equal shapes, or one side a number literal),
neg exp log sqrt tanh, and the internal `fill` that a number literal becomes."""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import DType, TensorType, format_dim
from .registry import OpDef, Param, register


def _same_shape(ctx, lhs: TensorType, rhs: TensorType, opname: str) -> None:
    if lhs.dtype != rhs.dtype:
        ctx.fail("type", f"'{opname}' operands have different element types: "
                 f"{lhs.dtype.kina_name} and {rhs.dtype.kina_name}", at="rhs")
    if lhs.rank != rhs.rank:
        ctx.fail("shape", f"'{opname}' operands have different ranks: {lhs} and {rhs}",
                 at="rhs", notes=("elementwise ops need equal shapes; use broadcast(x, [dims]) "
                                  "to expand one side",))
    for axis, (a, b) in enumerate(zip(lhs.shape, rhs.shape, strict=True)):
        ctx.prove_equal(a, b, "equal-shape",
                        f"{opname}: dim {axis} {format_dim(a)} == {format_dim(b)}",
                        f"'{opname}' operand shapes differ at dim {axis}: {lhs} vs {rhs}",
                        at="rhs",
                        notes=("elementwise ops need equal shapes; use broadcast(x, [dims]) "
                               "to expand one side",))


def _binary_rule(opname: str, float_only: bool):
    def rule(ctx, operands, attrs):
        lhs, rhs = operands
        _same_shape(ctx, lhs, rhs, opname)
        if float_only and not lhs.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs floating-point operands, got "
                     f"{lhs.dtype.kina_name}", at="lhs")
        return (lhs,)
    return rule


def _unary_rule(opname: str, float_only: bool):
    def rule(ctx, operands, attrs):
        (x,) = operands
        if float_only and not x.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs a floating-point operand, got "
                     f"{x.dtype.kina_name}", at="x")
        return (x,)
    return rule


def _binary_reference(ufunc):
    def reference(args, attrs):
        lhs, rhs = args
        with np.errstate(all="ignore"):
            return (ufunc(lhs, rhs).astype(lhs.dtype, copy=False),)
    return reference


def _unary_reference(ufunc):
    def reference(args, attrs):
        (x,) = args
        with np.errstate(all="ignore"):
            return (ufunc(x).astype(x.dtype, copy=False),)
    return reference


def _binary_lower(opname: str):
    def lower(ctx, op, operands):
        lhs, rhs = operands
        return ctx.view(op.result.type, lambda index: L.binary(opname, lhs.at(index),
                                                               rhs.at(index)))
    return lower


def _unary_lower(opname: str):
    def lower(ctx, op, operands):
        (x,) = operands
        return ctx.view(op.result.type,
                        lambda index: L.Unary(opname, x.at(index), x.at(index).dtype))
    return lower


_BINARY_PARAMS = (Param("lhs", "tensor_or_literal"), Param("rhs", "tensor_or_literal"))

add = register(OpDef(
    "add", "elementwise", _BINARY_PARAMS, _binary_rule("add", False), _binary_reference(np.add),
    "lhs + rhs elementwise",
    lower=_binary_lower("add")))
sub = register(OpDef(
    "sub", "elementwise", _BINARY_PARAMS, _binary_rule("sub", False),
    _binary_reference(np.subtract), "lhs - rhs elementwise",
    lower=_binary_lower("sub")))
mul = register(OpDef(
    "mul", "elementwise", _BINARY_PARAMS, _binary_rule("mul", False),
    _binary_reference(np.multiply), "lhs * rhs elementwise",
    lower=_binary_lower("mul")))
div = register(OpDef(
    "div", "elementwise", _BINARY_PARAMS, _binary_rule("div", True),
    _binary_reference(np.divide), "lhs / rhs elementwise (floating point only)",
    lower=_binary_lower("div")))

neg = register(OpDef(
    "neg", "elementwise", (Param("x", "tensor"),), _unary_rule("neg", False),
    _unary_reference(np.negative), "-x elementwise",
    lower=_unary_lower("neg")))
exp = register(OpDef(
    "exp", "elementwise", (Param("x", "tensor"),), _unary_rule("exp", True),
    _unary_reference(np.exp), "e^x elementwise",
    lower=_unary_lower("exp")))
log = register(OpDef(
    "log", "elementwise", (Param("x", "tensor"),), _unary_rule("log", True),
    _unary_reference(np.log), "natural logarithm elementwise (-inf at 0, nan below)",
    lower=_unary_lower("log")))
sqrt = register(OpDef(
    "sqrt", "elementwise", (Param("x", "tensor"),), _unary_rule("sqrt", True),
    _unary_reference(np.sqrt), "square root elementwise (nan below 0)",
    lower=_unary_lower("sqrt")))
tanh = register(OpDef(
    "tanh", "elementwise", (Param("x", "tensor"),), _unary_rule("tanh", True),
    _unary_reference(np.tanh), "hyperbolic tangent elementwise",
    lower=_unary_lower("tanh")))


def _fill_rule(ctx, operands, attrs):
    return (TensorType(DType(attrs["dtype"]), tuple(attrs["shape"])),)


def _fill_reference(args, attrs):
    dtype = DType(attrs["dtype"]).numpy
    return (np.full(tuple(int(d) for d in attrs["shape"]), attrs["value"], dtype=dtype),)


def _fill_lower(ctx, op, operands):
    # DType values ("f32", "f64", "i64") are the loop IR's scalar type names.
    constant = L.Const(op.attr("value"), op.attr("dtype"))
    return ctx.view(op.result.type, lambda index: constant)


fill = register(OpDef(
    "fill", "elementwise", (Param("value", "dim"), Param("shape", "dims"), Param("dtype", "dim")),
    _fill_rule, _fill_reference,
    "a tensor of the given shape holding one number (what a number literal operand becomes)",
    internal=True, differentiable=False,
    lower=_fill_lower))

BINARY_OPS = ("add", "sub", "mul", "div")
UNARY_OPS = ("neg", "exp", "log", "sqrt", "tanh")
