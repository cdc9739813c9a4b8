"""Ops that read by integer ids: gather (embedding lookup) and one_hot."""

from __future__ import annotations

import math

import numpy as np

from tilegen import loopir as L

from ..types import DType, TensorType, format_dim
from .registry import OpDef, Param, register


class IdOutOfRange(IndexError):
    """An id outside [0, n) reached gather or one_hot."""

    def __init__(self, opname: str, position: tuple[int, ...], value: int, limit: int):
        self.opname, self.position, self.value, self.limit = opname, position, value, limit
        super().__init__(f"{opname}: id {value} at position {list(position)} is out of range "
                         f"[0, {limit})")


def check_ids(opname: str, ids: np.ndarray, limit: int) -> None:
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        # The first bad id in row-major order. (Not np.argwhere: it finds nothing in a
        # rank-0 array.)
        position = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), ids.shape))
        raise IdOutOfRange(opname, position, int(ids[position]), limit)


def _gather_rule(ctx, operands, attrs):
    table, ids = operands
    if table.rank != 2:
        ctx.fail("shape", f"'gather' table must have rank 2 [rows, width], got {table}",
                 at="table")
    if ids.dtype != DType.I64:
        ctx.fail("type", f"'gather' ids must be I64, got {ids.dtype.kina_name}", at="ids")
    return (TensorType(table.dtype, ids.shape + (table.shape[1],)),)


def _gather_reference(args, attrs):
    table, ids = args
    check_ids("gather", ids, table.shape[0])
    return (table[ids],)


def _gather_vjp(b, op, cotangents):
    # The adjoint of reading rows is adding into them: repeated ids accumulate.
    (ct,) = cotangents
    table, ids = op.operands
    return (b.emit("scatter_add", ct, ids, rows=table.type.shape[0]), None)


def _gather_lower(ctx, op, operands):
    table, ids = operands
    rows, width = table.type.concrete_shape
    row_id = ctx.id_checker(ctx.reusable(ids, width), rows)
    # Each table row is read len(ids) / rows times on average: a computed table (a
    # projection moved before the gather) is stored once rather than recomputed per id.
    gathered = math.prod(ids.type.concrete_shape)
    table = ctx.reusable(table, -(-gathered // rows))

    def at(index):
        return table.at((row_id(index[:-1]), index[-1]))
    return ctx.view(op.result.type, at)


def _gather_mlir(ctx, op, operands):
    # A parallel generic over the result reading the id at the leading dims; the body
    # casts it to an index and extracts table[id, j] (j is the last loop dim).
    table, ids = operands
    result = op.result.type
    last = result.rank - 1

    def body(b, row_id):
        row = b.let(f"arith.index_cast {row_id} : i64 to index", "row")
        return b.let(f"tensor.extract {table}[{row}, {b.index(last)}] : "
                     f"{ctx.tensor_type(table.type)}", "elem")
    return ctx.parallel(result, [(ids, tuple(range(last)))], body)


gather = register(OpDef(
    "gather", "indexing", (Param("table", "tensor"), Param("ids", "tensor")),
    _gather_rule, _gather_reference,
    "rows of table[V, D] picked by ids[...] -> [..., D]; ids must lie in [0, V)",
    vjp=_gather_vjp,
    mlir=_gather_mlir,
    lower=_gather_lower,
    ids_bound=lambda op: (1, int(op.operands[0].type.shape[0]))))


def _scatter_add_rule(ctx, operands, attrs):
    updates, ids = operands
    if ids.dtype != DType.I64:
        ctx.fail("type", f"'scatter_add' ids must be I64, got {ids.dtype.kina_name}", at="ids")
    if updates.rank != ids.rank + 1:
        ctx.fail("shape", f"'scatter_add' updates must have the ids' shape plus a trailing "
                 f"row width: updates {updates}, ids {ids}", at="updates")
    for axis, (u, i) in enumerate(zip(updates.shape, ids.shape, strict=False)):
        ctx.prove_equal(u, i, "equal-shape",
                        f"scatter_add: updates dim {axis} {format_dim(u)} == ids dim {axis} "
                        f"{format_dim(i)}",
                        f"'scatter_add' updates {updates} and ids {ids} differ at dim {axis}",
                        at="updates")
    return (TensorType(updates.dtype, (attrs["rows"], updates.shape[-1])),)


def _scatter_add_reference(args, attrs):
    updates, ids = args
    rows = int(attrs["rows"])
    check_ids("scatter_add", ids, rows)
    out = np.zeros((rows, updates.shape[-1]), dtype=updates.dtype)
    # np.add.at adds position by position in order, so repeated ids accumulate.
    np.add.at(out, ids.reshape(-1), updates.reshape(-1, updates.shape[-1]))
    return (out,)


def _scatter_add_vjp(b, op, cotangents):
    (ct,) = cotangents
    _, ids = op.operands
    return (b.emit("gather", ct, ids), None)


def _scatter_add_lower(ctx, op, operands):
    # Its own statements: zero the [rows, D] result, then for each position p in order add
    # updates[p, :] into row ids[p] (checked to lie in [0, rows)). O(rows*D + positions*D),
    # the inner row loop contiguous (vectorised); no [positions, rows] one-hot matrix.
    updates, ids = operands
    rows, width = op.result.type.concrete_shape
    row_id = ctx.id_checker(ids, rows)
    dtype = updates.type.dtype.value
    zero = L.Const(0, dtype)

    def emit(ctx, out):
        def add_row(index):
            row = L.Var(ctx.fresh_name("row"), L.I64)
            j = ctx.var(width, "j")
            target = (row, j)
            total = L.binary("add", L.Load(out, target, dtype), updates.at(tuple(index) + (j,)))
            return [L.Let(row, row_id(index)), L.For(j, width, (L.Store(out, target, total),))]
        return (ctx.loops((rows, width), lambda index: [L.Store(out, index, zero)], "z") +
                ctx.loops(ids.type.concrete_shape, add_row, "p"))
    return L.BufferWriter(op.result.type, emit)


def _scatter_add_mlir(ctx, op, operands):
    # out[r, j] = sum over positions p, in order, of updates[p, j] where ids[p] == r: one
    # generic over (r, j, p...) with the positions as reduction dims, into zeros.
    updates, ids = operands
    result = op.result.type
    scalar = ctx.element_type(result.dtype)
    positions = ids.type.rank
    loops = 2 + positions
    position_dims = tuple(range(2, loops))
    acc = ctx.filled(result, 0, ctx.out() + "_acc")

    def body(b, update, row_id, total):
        row = b.let(f"arith.index_cast {b.index(0)} : index to i64", "r")
        hit = b.let(f"arith.cmpi eq, {row_id}, {row} : i64", "hit")
        added = b.let(f"arith.addf {total}, {update} : {scalar}", "added")
        return b.let(f"arith.select {hit}, {added}, {total} : {scalar}", "total")
    (name,) = ctx.generic(ctx.out(), [(updates, position_dims + (1,)), (ids, position_dims)],
                          [(acc, result, (0, 1))],
                          ["parallel", "parallel"] + ["reduction"] * positions, body)
    return name


scatter_add = register(OpDef(
    "scatter_add", "indexing",
    (Param("updates", "tensor"), Param("ids", "tensor"), Param("rows", "dim")),
    _scatter_add_rule, _scatter_add_reference,
    "[rows, D] zeros plus updates[..., D] added into row ids[...] (the adjoint of gather); "
    "ids must lie in [0, rows)",
    vjp=_scatter_add_vjp,
    mlir=_scatter_add_mlir,
    lower=_scatter_add_lower,
    ids_bound=lambda op: (1, int(op.attr("rows")))))


def _one_hot_rule(ctx, operands, attrs):
    (ids,) = operands
    if ids.dtype != DType.I64:
        ctx.fail("type", f"'one_hot' ids must be I64, got {ids.dtype.kina_name}", at="ids")
    return (TensorType(DType.F32, ids.shape + (attrs["n"],)),)


def _one_hot_reference(args, attrs):
    (ids,) = args
    n = int(attrs["n"])
    check_ids("one_hot", ids, n)
    return ((ids[..., None] == np.arange(n)).astype(np.float32),)


def _one_hot_lower(ctx, op, operands):
    (ids,) = operands
    n = int(op.attr("n"))
    class_id = ctx.id_checker(ctx.reusable(ids, n), n)

    def at(index):
        hit = L.binary("eq", class_id(index[:-1]), index[-1])
        return L.Select(hit, L.Const(1.0, L.F32), L.Const(0.0, L.F32), L.F32)
    return ctx.view(op.result.type, at)


def _one_hot_mlir(ctx, op, operands):
    # 1.0 where the class index (the last loop dim) equals the id: arith.cmpi + select.
    (ids,) = operands
    result = op.result.type
    last = result.rank - 1
    one, zero = ctx.constant(1.0, DType.F32), ctx.constant(0.0, DType.F32)

    def body(b, class_id):
        hit = b.let(f"arith.cmpi eq, {class_id}, {b.index_i64(last)} : i64", "hit")
        return b.let(f"arith.select {hit}, {one}, {zero} : f32", "elem")
    return ctx.parallel(result, [(ids, tuple(range(last)))], body)


one_hot = register(OpDef(
    "one_hot", "indexing", (Param("ids", "tensor"), Param("n", "dim")),
    _one_hot_rule, _one_hot_reference,
    "F32 [..., n] with 1 at each id's index; ids must lie in [0, n)", differentiable=False,
    mlir=_one_hot_mlir,
    lower=_one_hot_lower,
    ids_bound=lambda op: (0, int(op.attr("n")))))
