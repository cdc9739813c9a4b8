"""Normalisations along one axis with a learned scale: layer_norm and rms_norm.

layer_norm(x, gamma, beta, axis=k, eps=E) = (x - mean) / sqrt(var + E) * gamma + beta, with
the biased variance; rms_norm(x, gamma, axis=k, eps=E) = x / sqrt(mean(x^2) + E) * gamma.
`gamma` and `beta` have the shape of the normalised axis ([x.shape[k]]) and x's type.

The lowering is a row kernel: per row, the statistics (layer_norm: the mean, then the mean
of squared deviations -- two reductions over the row while it is in cache, stabler than
one pass of sum and sum of squares; rms_norm: the mean square), one reciprocal square root,
and one pass writing the output. The gradients are written in registry ops.
"""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import format_dim
from .elementwise import widened
from .reductions import normalize_axis
from .registry import OpDef, Param, register


def _norm_rule(opname: str, has_beta: bool):
    def rule(ctx, operands, attrs):
        x, *params = operands
        axis = normalize_axis(ctx, x, attrs, opname)
        if not x.dtype.is_float:
            ctx.fail("type", f"'{opname}' needs a floating-point operand, got "
                     f"{x.dtype.kina_name}", at="x")
        for name, param in zip(("gamma", "beta") if has_beta else ("gamma",), params,
                               strict=True):
            if param.dtype != x.dtype or param.rank != 1:
                ctx.fail("type" if param.dtype != x.dtype else "shape",
                         f"'{opname}' {name} must be a rank-1 {x.dtype.kina_name} tensor of "
                         f"the normalised axis' size [{format_dim(x.shape[axis])}], got "
                         f"{param}", at=name)
            ctx.prove_equal(param.shape[0], x.shape[axis], "equal-shape",
                            f"{opname}: {name} size {format_dim(param.shape[0])} == axis "
                            f"{axis} size {format_dim(x.shape[axis])}",
                            f"'{opname}' {name} has {format_dim(param.shape[0])} elements, "
                            f"the normalised axis {axis} of {x} has "
                            f"{format_dim(x.shape[axis])}", at=name)
        if attrs["eps"] < 0:
            ctx.fail("type", f"'{opname}' eps must be >= 0, got {attrs['eps']}", at="eps")
        return (x,)
    return rule


def _along(param: np.ndarray, axis: int, rank: int) -> np.ndarray:
    return param.reshape((1,) * axis + (-1,) + (1,) * (rank - axis - 1))


def _layer_norm_reference(args, attrs):
    x, gamma, beta = (widened(a).astype(np.float64) for a in args)
    axis, eps = attrs["axis"], attrs["eps"]
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    with np.errstate(all="ignore"):
        y = (x - mean) / np.sqrt(var + eps) * _along(gamma, axis, x.ndim) + \
            _along(beta, axis, x.ndim)
    return (y.astype(args[0].dtype),)


def _rms_norm_reference(args, attrs):
    x, gamma = (widened(a).astype(np.float64) for a in args)
    axis, eps = attrs["axis"], attrs["eps"]
    with np.errstate(all="ignore"):
        y = x / np.sqrt((x * x).mean(axis=axis, keepdims=True) + eps) * \
            _along(gamma, axis, x.ndim)
    return (y.astype(args[0].dtype),)


# ---- lowering -----------------------------------------------------------------------------

def _with_axis(index, axis, var):
    return tuple(index[:axis]) + (var,) + tuple(index[axis:])


def _norm_lower(centred: bool):
    def lower(ctx, op, operands):
        x, gamma, *beta = operands
        axis, eps = op.attr("axis"), float(op.attr("eps"))
        shape = x.type.concrete_shape
        extent = shape[axis]
        dtype = L.value_type(x.type.dtype.value)
        x = ctx.reusable(x, 3)
        outer = shape[:axis] + shape[axis + 1:]

        def const(value):
            return L.Const(value, dtype)

        def emit(ctx, out):
            def row(index):
                def element(name):
                    var = ctx.var(extent, name)
                    return var, x.at(_with_axis(index, axis, var))

                statements = []
                shift: L.Expr = const(0.0)
                if centred:
                    mean = L.Var(ctx.fresh_name("row_mean"), dtype)
                    r, value = element("r")
                    statements.append(L.Let(mean, L.binary("div", L.Reduce(
                        "sum", r, extent, value, dtype), const(float(extent)))))
                    shift = mean
                r, value = element("r")
                deviation = L.binary("sub", value, shift) if centred else value
                square_mean = L.Var(ctx.fresh_name("row_var" if centred else "row_ms"), dtype)
                scale = L.Var(ctx.fresh_name("row_rstd"), dtype)
                statements += [
                    L.Let(square_mean, L.binary("div", L.Reduce(
                        "sum", r, extent, L.binary("mul", deviation, deviation), dtype),
                        const(float(extent)))),
                    L.Let(scale, L.binary("div", const(1.0), L.Unary(
                        "sqrt", L.binary("add", square_mean, const(eps)), dtype))),
                ]
                j, value = element("j")
                normalised = L.binary("sub", value, shift) if centred else value
                result = L.binary("mul", L.binary("mul", normalised, scale), gamma.at((j,)))
                if beta:
                    result = L.binary("add", result, beta[0].at((j,)))
                statements.append(L.For(j, extent, (L.Store(out, _with_axis(index, axis, j),
                                                            result),)))
                return statements
            return ctx.loops(outer, row, "row")
        return L.BufferWriter(op.result.type, emit)
    return lower


# ---- MLIR -----------------------------------------------------------------------------------

def _norm_mlir(centred: bool):
    def mlir(ctx, op, operands):
        x, gamma, *beta = operands
        axis, eps = op.attr("axis"), float(op.attr("eps"))
        result = op.result.type
        scalar = ctx.element_type(result.dtype)
        kept = tuple(d for d in range(result.rank) if d != axis)
        rows = result.with_shape(tuple(result.shape[d] for d in kept))
        extent = ctx.constant(float(result.concrete_shape[axis]), result.dtype)
        epsilon = ctx.constant(eps, result.dtype)
        one = ctx.constant(1.0, result.dtype)
        hint = ctx.out()

        def add(b, v, acc):
            return b.let(f"arith.addf {v}, {acc} : {scalar}")

        def row_mean(source, name):
            (total,) = ctx.reduce(source, axis, [(result.dtype, 0.0)], add, name + "_sum")
            return ctx.value(ctx.parallel(rows, (ctx.value(total, rows),), lambda b, v: b.let(
                f"arith.divf {v}, {extent} : {scalar}"), name), rows)
        deviations = x
        if centred:
            mean = row_mean(x, hint + "_mean")
            deviations = ctx.value(ctx.parallel(result, [x, (mean, kept)], lambda b, v, m: b.let(
                f"arith.subf {v}, {m} : {scalar}"), hint + "_centred"), result)
        squares = ctx.value(ctx.parallel(result, (deviations,), lambda b, v: b.let(
            f"arith.mulf {v}, {v} : {scalar}"), hint + "_squares"), result)
        spread = row_mean(squares, hint + "_spread")
        def reciprocal_root(b, v):
            shifted = b.let(f"arith.addf {v}, {epsilon} : {scalar}")
            return b.let(f"arith.divf {one}, {b.let(f'math.sqrt {shifted} : {scalar}')} : "
                         f"{scalar}")
        rstd = ctx.value(ctx.parallel(rows, (spread,), reciprocal_root, hint + "_rstd"), rows)

        def body(b, v, r, g, *shift):
            scaled = b.let(f"arith.mulf {b.let(f'arith.mulf {v}, {r} : {scalar}')}, {g} : "
                           f"{scalar}")
            return b.let(f"arith.addf {scaled}, {shift[0]} : {scalar}") if shift else scaled
        inputs = [deviations, (rstd, kept), (gamma, (axis,))] + [(p, (axis,)) for p in beta]
        return ctx.parallel(result, inputs, body)
    return mlir


# ---- vector-Jacobian rules ------------------------------------------------------------------

def _along_axis(b, param, like, axis: int):
    """A [D] parameter broadcast along `axis` of the `like`-typed tensor."""
    shape = tuple(like.shape[d] if d == axis else 1 for d in range(like.rank))
    return b.broadcast(b.reshape(param, shape), like.shape)


def _sum_except(b, t, axis: int):
    for other in reversed(range(t.type.rank)):
        if other != axis:
            t = b.sum(t, other)
    return t


def _row_mean(b, t, axis: int):
    return b.restore_axis(b.emit("mean", t, axis=axis), axis, t.type)


def _norm_vjp(centred: bool):
    # xhat = (x - mean) * rstd (layer_norm) or x * rstd (rms_norm), y = xhat * gamma (+ beta):
    # dx = rstd * (dxhat - [mean(dxhat)] - xhat * mean(dxhat * xhat)) along the axis,
    # dxhat = ct * gamma; dgamma = sum of ct * xhat and dbeta = sum of ct over the other axes.
    def vjp(b, op, cotangents):
        (ct,) = cotangents
        x, gamma, *beta = op.operands
        axis, eps = op.attr("axis"), float(op.attr("eps"))
        deviation = b.sub(x, _row_mean(b, x, axis)) if centred else x
        square_mean = b.emit("mean", b.mul(deviation, deviation), axis=axis)
        rstd = b.emit("rsqrt", b.add(square_mean, b.fill(eps, square_mean.type)))
        rstd = b.restore_axis(rstd, axis, x.type)
        xhat = b.mul(deviation, rstd)
        dxhat = b.mul(ct, _along_axis(b, gamma, x.type, axis))
        inner = b.sub(dxhat, b.mul(xhat, _row_mean(b, b.mul(dxhat, xhat), axis)))
        if centred:
            inner = b.sub(inner, _row_mean(b, dxhat, axis))
        grads = [b.mul(rstd, inner), _sum_except(b, b.mul(ct, xhat), axis)]
        if beta:
            grads.append(_sum_except(b, ct, axis))
        return tuple(grads)
    return vjp


_EPS = Param("eps", "number", keyword_only=True, default=1e-5)
_AXIS = Param("axis", "axis", keyword_only=True, default=-1)

layer_norm = register(OpDef(
    "layer_norm", "normalisation",
    (Param("x", "tensor"), Param("gamma", "tensor"), Param("beta", "tensor"), _AXIS, _EPS),
    _norm_rule("layer_norm", True), _layer_norm_reference,
    "(x - mean) / sqrt(var + eps) * gamma + beta along axis (biased variance)",
    vjp=_norm_vjp(True),
    mlir=_norm_mlir(True),
    lower=_norm_lower(True)))
rms_norm = register(OpDef(
    "rms_norm", "normalisation",
    (Param("x", "tensor"), Param("gamma", "tensor"), _AXIS, _EPS),
    _norm_rule("rms_norm", False), _rms_norm_reference,
    "x / sqrt(mean(x^2) + eps) * gamma along axis",
    vjp=_norm_vjp(False),
    mlir=_norm_mlir(False),
    lower=_norm_lower(False)))
