"""Ops that read by integer ids: gather (embedding lookup) and one_hot."""

from __future__ import annotations

import numpy as np

from tilegen import loopir as L

from ..types import DType, TensorType
from .registry import OpDef, Param, register


class IdOutOfRange(IndexError):
    """An id outside [0, n) reached gather or one_hot."""

    def __init__(self, opname: str, position: tuple[int, ...], value: int, limit: int):
        self.opname, self.position, self.value, self.limit = opname, position, value, limit
        super().__init__(f"{opname}: id {value} at position {list(position)} is out of range "
                         f"[0, {limit})")


def check_ids(opname: str, ids: np.ndarray, limit: int) -> None:
    bad = np.argwhere((ids < 0) | (ids >= limit))
    if bad.size:
        position = tuple(int(i) for i in bad[0])
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


def _gather_lower(ctx, op, operands):
    table, ids = operands
    rows, width = table.type.concrete_shape
    row_id = ctx.id_checker(ctx.reusable(ids, width), rows)

    def at(index):
        return table.at((row_id(index[:-1]), index[-1]))
    return ctx.view(op.result.type, at)


gather = register(OpDef(
    "gather", "indexing", (Param("table", "tensor"), Param("ids", "tensor")),
    _gather_rule, _gather_reference,
    "rows of table[V, D] picked by ids[...] -> [..., D]; ids must lie in [0, V)",
    lower=_gather_lower))


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


one_hot = register(OpDef(
    "one_hot", "indexing", (Param("ids", "tensor"), Param("n", "dim")),
    _one_hot_rule, _one_hot_reference,
    "F32 [..., n] with 1 at each id's index; ids must lie in [0, n)", differentiable=False,
    lower=_one_hot_lower))
