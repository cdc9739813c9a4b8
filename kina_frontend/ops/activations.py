"""Elementwise activations and powers: relu gelu gelu_tanh erf sigmoid silu rsqrt abs, and
pow(x, p) with a number p.

Each lowers to loop-IR arithmetic on the existing primitives (exp, tanh, sqrt) plus the
vectorised `erf` (tilegen/vecmath.py) and `abs`, so fusion and the schedule treat them like
any other chain of element work. The references are written from the definitions in
float64-safe NumPy (erf through math.erf), independent of the lowering.
"""

from __future__ import annotations

import math

import numpy as np

from tilegen import loopir as L

from .elementwise import widened
from .registry import OpDef, Param, register

_SQRT_HALF = math.sqrt(0.5)
_TANH_SCALE = math.sqrt(2.0 / math.pi)  # gelu_tanh: tanh(sqrt(2/pi) (x + 0.044715 x^3))
_TANH_CUBIC = 0.044715
_ERF_SLOPE = 2.0 / math.sqrt(math.pi)  # d erf(x) / dx = 2/sqrt(pi) e^(-x^2)
_NORMAL_DENSITY = 1.0 / math.sqrt(2.0 * math.pi)

_erf_elementwise = np.vectorize(math.erf, otypes=[np.float64])


def _erf_reference_values(x: np.ndarray) -> np.ndarray:
    return _erf_elementwise(x.astype(np.float64)) if x.size else x.astype(np.float64)


# Reference formulas, on float arrays (BF16 widened to f32), computed in float64 and rounded
# once to the operand's type.
_FORMULAS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf_reference_values(x * _SQRT_HALF)),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(_TANH_SCALE * (x + _TANH_CUBIC * x ** 3))),
    "erf": _erf_reference_values,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "abs": np.abs,
}


def _unary_rule(opname: str, ints: bool):
    def rule(ctx, operands, attrs):
        (x,) = operands
        if not (x.dtype.is_float or ints and x.dtype.kina_name == "I64"):
            ctx.fail("type", f"'{opname}' needs a floating-point operand, got "
                     f"{x.dtype.kina_name}", at="x")
        return (x,)
    return rule


def _reference(opname: str):
    formula = _FORMULAS[opname]

    def reference(args, attrs):
        (x,) = args
        if x.dtype == np.int64:  # abs of I64
            return (np.abs(x),)
        with np.errstate(all="ignore"):
            return (np.asarray(formula(widened(x).astype(np.float64))).astype(x.dtype),)
    return reference


# ---- loop-IR lowering: each formula in the operand's arithmetic type -------------------------

def _c(value: float, like: L.Expr) -> L.Const:
    return L.Const(value, like.dtype)


def _sigmoid_expr(x: L.Expr) -> L.Expr:
    # e / (1 + e) for x < 0 and 1 / (1 + e) otherwise, with e = e^-|x| <= 1: the plain
    # 1 / (1 + e^-x) overflows e^-x to inf below x = -88.7 and returns 0 where sigmoid (and
    # silu = x sigmoid(x)) still has subnormal and normal values down to x = -103.
    e = L.Unary("exp", L.Unary("neg", L.Unary("abs", x, x.dtype), x.dtype), x.dtype)
    numerator = L.Select(L.binary("ge", x, _c(0.0, x)), _c(1.0, x), e, x.dtype)
    return L.binary("div", numerator, L.binary("add", _c(1.0, x), e))


def _lowered(opname: str, x: L.Expr) -> L.Expr:
    if opname == "relu":
        return L.binary("max", x, _c(0.0, x))
    if opname == "erf":
        return L.Unary("erf", x, x.dtype)
    if opname == "abs":
        return L.Unary("abs", x, x.dtype)
    if opname == "gelu":
        erf = L.Unary("erf", L.binary("mul", x, _c(_SQRT_HALF, x)), x.dtype)
        return L.binary("mul", L.binary("mul", x, _c(0.5, x)), L.binary("add", _c(1.0, x), erf))
    if opname == "gelu_tanh":
        cube = L.binary("mul", L.binary("mul", x, x), x)
        inner = L.binary("mul", _c(_TANH_SCALE, x),
                         L.binary("add", x, L.binary("mul", _c(_TANH_CUBIC, x), cube)))
        return L.binary("mul", L.binary("mul", x, _c(0.5, x)),
                        L.binary("add", _c(1.0, x), L.Unary("tanh", inner, x.dtype)))
    if opname == "sigmoid":
        return _sigmoid_expr(x)
    if opname == "silu":
        return L.binary("mul", x, _sigmoid_expr(x))
    if opname == "rsqrt":
        return L.binary("div", _c(1.0, x), L.Unary("sqrt", x, x.dtype))
    raise KeyError(opname)


def _lower(opname: str):
    def lower(ctx, op, operands):
        (x,) = operands
        return ctx.view(op.result.type, lambda index: _lowered(opname, x.at(index)))
    return lower


# ---- MLIR: math / arith in one parallel generic -----------------------------------------------

def _mlir_body(opname: str, b, v: str, scalar: str, const) -> str:
    def let(text):
        return b.let(f"{text} : {scalar}")

    def sigmoid(value):  # the form _sigmoid_expr explains
        magnitude = let(f"math.absf {value}")
        e = let(f"math.exp {let(f'arith.negf {magnitude}')}")
        positive = b.let(f"arith.cmpf oge, {value}, {const(0.0)} : {scalar}")
        numerator = let(f"arith.select {positive}, {const(1.0)}, {e}")
        return let(f"arith.divf {numerator}, {let(f'arith.addf {const(1.0)}, {e}')}")
    if opname == "relu":
        return let(f"arith.maximumf {v}, {const(0.0)}")
    if opname == "erf":
        return let(f"math.erf {v}")
    if opname == "abs":
        return let(f"math.absf {v}")
    if opname == "gelu":
        erf = let(f"math.erf {let(f'arith.mulf {v}, {const(_SQRT_HALF)}')}")
        return let(f"arith.mulf {let(f'arith.mulf {v}, {const(0.5)}')}, "
                   f"{let(f'arith.addf {const(1.0)}, {erf}')}")
    if opname == "gelu_tanh":
        cube = let(f"arith.mulf {let(f'arith.mulf {v}, {v}')}, {v}")
        inner = let(f"arith.addf {v}, {let(f'arith.mulf {const(_TANH_CUBIC)}, {cube}')}")
        tanh = let(f"math.tanh {let(f'arith.mulf {const(_TANH_SCALE)}, {inner}')}")
        return let(f"arith.mulf {let(f'arith.mulf {v}, {const(0.5)}')}, "
                   f"{let(f'arith.addf {const(1.0)}, {tanh}')}")
    if opname == "sigmoid":
        return sigmoid(v)
    if opname == "silu":
        return let(f"arith.mulf {v}, {sigmoid(v)}")
    if opname == "rsqrt":
        return let(f"math.rsqrt {v}")
    raise KeyError(opname)


def _mlir(opname: str):
    def mlir(ctx, op, operands):
        (x,) = operands
        dtype = x.type.dtype
        scalar = ctx.element_type(dtype)
        if not dtype.is_float:  # abs of I64
            return ctx.parallel(op.result.type, (x,),
                                lambda b, v: b.let(f"math.absi {v} : {scalar}"))
        constants = {value: ctx.constant(value, dtype)
                     for value in (0.0, 0.5, 1.0, _SQRT_HALF, _TANH_SCALE, _TANH_CUBIC)}
        return ctx.parallel(op.result.type, (x,), lambda b, v: _mlir_body(
            opname, b, v, scalar, constants.__getitem__))
    return mlir


# ---- vector-Jacobian rules (in terms of registry ops) ----------------------------------------

def _scaled(b, x, value: float):
    return b.mul(x, b.fill(value, x.type))


def _relu_vjp(b, op, cotangents):
    # PyTorch's rule: the cotangent passes where the result is positive.
    (ct,) = cotangents
    positive = b.emit("greater", op.result, b.fill(0.0, ct.type))
    return (b.emit("where", positive, ct, b.fill(0.0, ct.type)),)


def _abs_vjp(b, op, cotangents):
    # d|x| = sign(x) (0 at 0, as PyTorch's sgn).
    (ct,) = cotangents
    (x,) = op.operands
    zero = b.fill(0.0, ct.type)
    negative = b.emit("where", b.emit("less", x, zero), b.neg(ct), zero)
    return (b.emit("where", b.emit("greater", x, zero), ct, negative),)


def _erf_vjp(b, op, cotangents):
    (ct,) = cotangents
    (x,) = op.operands
    return (b.mul(ct, _scaled(b, b.exp(b.neg(b.mul(x, x))), _ERF_SLOPE)),)


def _gelu_vjp(b, op, cotangents):
    # d/dx x Phi(x) = Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
    (ct,) = cotangents
    (x,) = op.operands
    cdf = _scaled(b, b.add(b.fill(1.0, x.type), b.emit("erf", _scaled(b, x, _SQRT_HALF))), 0.5)
    density = _scaled(b, b.exp(_scaled(b, b.mul(x, x), -0.5)), _NORMAL_DENSITY)
    return (b.mul(ct, b.add(cdf, b.mul(x, density))),)


def _gelu_tanh_vjp(b, op, cotangents):
    # y = x (1 + t) / 2, t = tanh(u), u = k (x + c x^3):
    # dy/dx = (1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2.
    (ct,) = cotangents
    (x,) = op.operands
    one = b.fill(1.0, x.type)
    square = b.mul(x, x)
    u = _scaled(b, b.add(x, _scaled(b, b.mul(square, x), _TANH_CUBIC)), _TANH_SCALE)
    t = b.emit("tanh", u)
    du = _scaled(b, b.add(one, _scaled(b, square, 3 * _TANH_CUBIC)), _TANH_SCALE)
    slope = b.mul(b.mul(x, b.sub(one, b.mul(t, t))), du)
    return (b.mul(ct, _scaled(b, b.add(b.add(one, t), slope), 0.5)),)


def _sigmoid_vjp(b, op, cotangents):
    (ct,) = cotangents
    y = op.result
    return (b.mul(ct, b.mul(y, b.sub(b.fill(1.0, y.type), y))),)


def _silu_vjp(b, op, cotangents):
    # d/dx x s(x) = s (1 + x (1 - s)).
    (ct,) = cotangents
    (x,) = op.operands
    one = b.fill(1.0, x.type)
    s = b.emit("sigmoid", x)
    return (b.mul(ct, b.mul(s, b.add(one, b.mul(x, b.sub(one, s))))),)


def _rsqrt_vjp(b, op, cotangents):
    # d x^(-1/2) = -y / (2 x).
    (ct,) = cotangents
    (x,) = op.operands
    return (b.mul(ct, _scaled(b, b.div(op.result, x), -0.5)),)


_VJPS = {"relu": _relu_vjp, "gelu": _gelu_vjp, "gelu_tanh": _gelu_tanh_vjp, "erf": _erf_vjp,
         "sigmoid": _sigmoid_vjp, "silu": _silu_vjp, "rsqrt": _rsqrt_vjp, "abs": _abs_vjp}
_SUMMARIES = {
    "relu": "max(x, 0) elementwise (NaN stays NaN)",
    "gelu": "x * (1 + erf(x / sqrt(2))) / 2 elementwise (exact GELU)",
    "gelu_tanh": "x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) / 2 (tanh-approximate GELU)",
    "erf": "the error function elementwise",
    "sigmoid": "1 / (1 + e^-x) elementwise",
    "silu": "x * sigmoid(x) elementwise",
    "rsqrt": "1 / sqrt(x) elementwise",
    "abs": "|x| elementwise (F32, F64, BF16 or I64)",
}

for _name in _FORMULAS:
    register(OpDef(
        _name, "elementwise", (Param("x", "tensor"),), _unary_rule(_name, _name == "abs"),
        _reference(_name), _SUMMARIES[_name],
        vjp=_VJPS[_name],
        mlir=_mlir(_name),
        lower=_lower(_name)))


# ---- pow(x, p) --------------------------------------------------------------------------------

def _pow_rule(ctx, operands, attrs):
    (x,) = operands
    if not x.dtype.is_float:
        ctx.fail("type", f"'pow' needs a floating-point operand, got {x.dtype.kina_name}",
                 at="x")
    return (x,)


def _pow_reference(args, attrs):
    (x,) = args
    with np.errstate(all="ignore"):
        return (np.power(widened(x).astype(np.float64), attrs["p"]).astype(x.dtype),)


def _integer_power(x: L.Expr, n: int) -> L.Expr:
    """x^n for n >= 1 by repeated squaring (exact for small n up to the roundings)."""
    result: L.Expr | None = None
    square = x
    while n:
        if n & 1:
            result = square if result is None else L.binary("mul", result, square)
        n >>= 1
        if n:
            square = L.binary("mul", square, square)
    assert result is not None, "n >= 1"
    return result


def _pow_expr(x: L.Expr, p: float) -> L.Expr:
    if p == 0:
        return _c(1.0, x)  # NumPy: x^0 is 1, NaN included
    if p == 0.5:
        return L.Unary("sqrt", x, x.dtype)
    if p == -0.5:
        return L.binary("div", _c(1.0, x), L.Unary("sqrt", x, x.dtype))
    if float(p).is_integer() and abs(p) <= 64:
        power = _integer_power(x, int(abs(p)))
        return power if p > 0 else L.binary("div", _c(1.0, x), power)
    # e^(p log x): NaN for x < 0 (a non-integer power of a negative number), 0 or inf at 0.
    return L.Unary("exp", L.binary("mul", _c(p, x), L.Unary("log", x, x.dtype)), x.dtype)


def _pow_lower(ctx, op, operands):
    (x,) = operands
    p = float(op.attr("p"))
    return ctx.view(op.result.type, lambda index: _pow_expr(x.at(index), p))


def _pow_vjp(b, op, cotangents):
    (ct,) = cotangents
    (x,) = op.operands
    p = float(op.attr("p"))
    if p == 0:
        return (b.fill(0.0, ct.type),)
    return (b.mul(ct, _scaled(b, b.emit("pow", x, p=p - 1.0), p)),)


def _pow_mlir(ctx, op, operands):
    (x,) = operands
    scalar = ctx.element_type(x.type.dtype)
    exponent = ctx.constant(float(op.attr("p")), x.type.dtype)
    return ctx.parallel(op.result.type, (x,),
                        lambda b, v: b.let(f"math.powf {v}, {exponent} : {scalar}"))


pow_ = register(OpDef(
    "pow", "elementwise", (Param("x", "tensor"), Param("p", "number")),
    _pow_rule, _pow_reference,
    "x^p elementwise for a number p (NumPy's power: NaN for negative x and non-integer p)",
    vjp=_pow_vjp,
    mlir=_pow_mlir,
    lower=_pow_lower))

UNARY_ACTIVATIONS = tuple(_FORMULAS)
