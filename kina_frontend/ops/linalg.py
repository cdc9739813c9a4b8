"""Linear algebra: batched matmul, rank 2 to 4, equal batch dims (no implicit broadcast)."""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import format_dim
from .elementwise import widened
from .registry import OpDef, Param, register


def _matmul_rule(ctx, operands, attrs):
    a, b = operands
    if a.dtype != b.dtype:
        ctx.fail("type", f"'matmul' operands have different element types: "
                 f"{a.dtype.kina_name} and {b.dtype.kina_name}", at="b")
    if not a.dtype.is_float:
        ctx.fail("type", f"'matmul' needs floating-point operands, got {a.dtype.kina_name}",
                 at="a")
    for name, t in (("a", a), ("b", b)):
        if not 2 <= t.rank <= 4:
            ctx.fail("shape", f"'matmul' operand {name} has rank {t.rank}; ranks 2 to 4 are "
                     f"supported: {t}", at=name)
    if a.rank != b.rank:
        ctx.fail("shape", f"'matmul' operands have different ranks: {a} and {b}", at="b",
                 notes=("batch dims are not broadcast implicitly; broadcast the weight "
                        "explicitly, e.g. broadcast(w, [1, D, D])",))
    for axis in range(a.rank - 2):
        ctx.prove_equal(a.shape[axis], b.shape[axis], "matmul-batch",
                        f"matmul: batch dim {axis} {format_dim(a.shape[axis])} == "
                        f"{format_dim(b.shape[axis])}",
                        f"'matmul' batch dims differ at dim {axis}: {a} vs {b}", at="b",
                        notes=("batch dims must be equal; broadcast explicitly",))
    ctx.prove_equal(a.shape[-1], b.shape[-2], "matmul-inner",
                    f"matmul: inner dim {format_dim(a.shape[-1])} == {format_dim(b.shape[-2])}",
                    f"'matmul' inner dims differ: {a} has {format_dim(a.shape[-1])} columns, "
                    f"{b} has {format_dim(b.shape[-2])} rows", at="b")
    # BF16 operands accumulate in f32 and give F32 (the products are exact in f32).
    return (a.with_shape(a.shape[:-1] + (b.shape[-1],)).with_dtype(a.dtype.compute),)


def _matmul_reference(args, attrs):
    a, b = (widened(x) for x in args)
    return (np.matmul(a, b),)


def _matmul_vjp(b, op, cotangents):
    # c = a @ b per batch: da = dc @ b^T, db = a^T @ dc (^T swaps the last two dims).
    (ct,) = cotangents
    a, w = op.operands
    rank = a.type.rank
    swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    dtype = a.type.dtype
    ct = b.cast(ct, dtype)  # BF16 operands: the F32 cotangent is rounded to BF16 first
    return (b.cast(b.matmul(ct, b.transpose(w, swap)), dtype),
            b.cast(b.matmul(b.transpose(a, swap), ct), dtype))


def _matmul_lower(ctx, op, operands):
    a, b = operands
    rows, inner = a.type.concrete_shape[-2:]
    cols = b.type.concrete_shape[-1]
    if ctx.gemm_pays(a, b):
        # Large products: packed panels and a register-blocked micro-kernel.
        return L.BufferWriter(op.result.type, lambda ctx, out: [ctx.gemm(out, a, b)])
    a = ctx.reusable(a, cols)
    if cols < 8 <= inner and rows >= 4:
        # Too few columns for vector stores: the reduction over k runs in vector tiles, so
        # B is stored k-contiguous (transposed) once instead of gathered by every row.
        b = ctx.materialize_transposed(b, "tmp")
    else:
        b = ctx.reusable(b, rows)
    dtype = L.value_type(a.type.dtype.value)

    def at(index):
        batch, i, j = index[:-2], index[-2], index[-1]
        k = ctx.var(inner, "k")
        product = L.binary("mul", a.at(batch + (i, k)), b.at(batch + (k, j)))
        return L.Reduce("sum", k, inner, product, dtype)
    return ctx.view(op.result.type, at)


def _matmul_mlir(ctx, op, operands):
    # linalg.matmul (rank 2) or linalg.batch_matmul (rank 3) accumulating into a zero-filled
    # destination; rank 4 collapses its two batch dims into one around a batch_matmul.
    a, b = operands
    result = op.result.type
    hint = ctx.out()
    if result.rank == 2:
        return _matmul_into(ctx, "linalg.matmul", a, b, result, hint)
    if result.rank == 3:
        return _matmul_into(ctx, "linalg.batch_matmul", a, b, result, hint)
    groups = [[0, 1], [2], [3]]
    a = ctx.collapse_shape(a, groups, hint + "_lhs")
    b = ctx.collapse_shape(b, groups, hint + "_rhs")
    batch, rows, cols = result.concrete_shape[0] * result.concrete_shape[1], *result.shape[2:]
    flat = result.with_shape((batch, rows, cols))
    product = _matmul_into(ctx, "linalg.batch_matmul", a, b, flat, hint + "_batched")
    return ctx.expand_shape(ctx.value(product, flat), groups, result, hint).name


def _matmul_into(ctx, opname: str, a, b, result, hint: str) -> str:
    acc = ctx.filled(result, 0.0, hint + "_acc")
    ty = ctx.tensor_type(result)
    return ctx.let(hint, f"{opname} ins({a}, {b} : {ctx.tensor_type(a.type)}, "
                         f"{ctx.tensor_type(b.type)}) outs({acc} : {ty}) -> {ty}")


matmul = register(OpDef(
    "matmul", "linalg", (Param("a", "tensor"), Param("b", "tensor")),
    _matmul_rule, _matmul_reference,
    "batched matrix product [..., M, K] x [..., K, N] -> [..., M, N]",
    vjp=_matmul_vjp,
    mlir=_matmul_mlir,
    lower=_matmul_lower))
