"""Interior chunks of a sweep: edge masks proved all-true and dropped.

Kernels that read a row in BLOCK_SIZE pieces (`cols = off + tl.arange(0, BLOCK)`,
`mask = cols < N`) or a whole row under `mask = cols < n_cols` evaluate the mask at every
chunk, and every access under it is a masked one, though only the row's last chunks can
have a lane off. A sweep (the chunks of a store, a stored load, a reduction's row, a
folded accumulator's update) over a 1-D tile looks at the lazy values it reads for
integer comparisons `lhs < rhs` / `lhs <= rhs` (or `>` / `>=` with the sides swapped)
whose one side is affine in the lane with slope 1 and the other with slope 0:
`off + arange(0, BLOCK)` is `A + f` at flat position f, with A and the bound B scalars
known before the sweep. Such a comparison holds at positions [0, B - A) (one more for
`<=`), with integer wrap-around as Triton's: below B - A, A + f < B <= INT_MAX has not
wrapped (past that prefix the lanes are evaluated as before, wrapped or not). The
sweep's trips whose positions all lie below the least of these limits run first with
those comparisons as constant true vectors: plain loads and stores (memory.vector_load),
`tl.where(mask, x, 0)` folded by LLVM; the remaining trips (the edge, and
the all-false tail) run as before. Nothing is matched by name; an i32 or i64 comparison of
any such affine pair qualifies. A comparison reached through a view or a broadcast is read
at other positions than the sweep's and is never folded (ProgramEmitter._compute clears the
set while it evaluates one).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .tileir import TileType

I64 = ir.IntType(64)
# ProgramEmitter.chunks unrolls sweeps of fewer chunks than this; they are left whole (a
# split would need a test per chunk, tried before and not measurable).
MIN_TRIPS = 5
_SIGNED = {"slt": (False, 0), "sle": (False, 1), "sgt": (True, 0), "sge": (True, 1)}


@dataclass(frozen=True)
class Interior:
    """`compares` (id() of lazy comparisons) hold at every flat position below `lanes`."""

    compares: frozenset[int]
    lanes: ir.Value  # i64


def find(e, reads, type_: TileType) -> Interior | None:
    """The comparisons among the lazy values `reads` (their trees, not through views or
    broadcasts) that hold on a prefix of a 1-D tile of `type_`, and that prefix."""
    if len(type_.shape) != 1:
        return None
    found: dict[int, ir.Value] = {}
    seen: set[int] = set()
    for value in reads:
        _collect(e, value, type_, found, seen)
    if not found:
        return None
    lanes = None
    for limit in found.values():
        lanes = limit if lanes is None else e.b.select(
            e.b.icmp_signed("<", limit, lanes), limit, lanes)
    return Interior(frozenset(found), lanes)


def _collect(e, value, type_, found, seen) -> None:
    if not hasattr(value, "kind") or id(value) in seen or value.type.shape != type_.shape:
        return
    seen.add(id(value))
    if value.kind in ("view", "broadcast"):
        return
    if value.kind == "map" and value.op.name == "arith.cmpi":
        limit = _limit(e, value)
        if limit is not None:
            found[id(value)] = limit
            return
    for operand in value.operands:
        _collect(e, operand, type_, found, seen)


def _limit(e, compare) -> ir.Value | None:
    """The i64 number of leading positions where `compare` holds, or None."""
    predicate = dict(compare.op.attrs).get("predicate")
    if predicate not in _SIGNED:
        return None
    swapped, inclusive = _SIGNED[predicate]
    lhs, rhs = compare.operands
    if swapped:
        lhs, rhs = rhs, lhs
    rising, bound = _affine(e, lhs), _affine(e, rhs)
    if rising is None or bound is None or rising[1] != 1 or bound[1] != 0:
        return None
    start, limit = rising[0], bound[0]
    if start.type.width == 64:  # B - A may overflow i64
        span = _clamped_difference(e, limit, start, compare.type.shape[0])
    else:
        span = e.b.sub(e.b.sext(limit, I64), e.b.sext(start, I64))
    return e.b.add(span, ir.Constant(I64, 1)) if inclusive else span


def _clamped_difference(e, limit, start, extent: int) -> ir.Value:
    """B - A for i64 values, clamped to [-1, E] (enough to count the tile's positions)."""
    below = e.b.icmp_signed("<=", limit, start)
    difference = e.b.sub(limit, start)  # wraps only when the answer is outside [0, E]
    huge = e.b.icmp_unsigned(">", difference, ir.Constant(I64, extent))
    return e.b.select(below, ir.Constant(I64, -1),
                      e.b.select(huge, ir.Constant(I64, extent), difference))


def _affine(e, value) -> tuple[ir.Value, int] | None:
    """(A, s) with `value` = A + s * f at flat position f (modulo 2^bits), A a scalar
    emitted now, for integer lazies built from ranges, splats, constants, add and sub."""
    if not hasattr(value, "kind") or value.type.elem not in ("i32", "i64"):
        return None
    ty = ir.IntType(int(value.type.elem[1:]))
    if value.kind == "range":
        return ir.Constant(ty, value.payload), 1
    if value.kind == "const" and isinstance(value.payload, int):
        return ir.Constant(ty, value.payload), 0
    if value.kind == "splat" and value.payload.type == ty:
        return value.payload, 0
    if value.kind == "map" and value.op.name == "arith.extsi":
        # exact for a range's small lanes and for a scalar; not for a sum that may wrap
        (source,) = value.operands
        inner = _affine(e, source)
        if inner is None or (inner[1] and source.kind != "range"):
            return None
        return e.b.sext(inner[0], ty), inner[1]
    if value.kind == "map" and value.op.name in ("arith.addi", "arith.subi"):
        parts = [_affine(e, operand) for operand in value.operands]
        if None in parts:
            return None
        (a, s), (b, t) = parts
        if value.op.name == "arith.addi":
            return e.b.add(a, b), s + t
        return e.b.sub(a, b), s - t
    return None


def trips(e, interior: Interior, start: ir.Value, stop: ir.Value, unit: int, span: int):
    """The first trip in [start, stop] that is not interior, for trips t covering flat
    positions [t * unit, t * unit + span)."""
    room = e.b.sub(interior.lanes, ir.Constant(I64, span))
    inside = e.b.add(e.b.sdiv(room, ir.Constant(I64, unit)), ir.Constant(I64, 1))
    inside = e.b.select(e.b.icmp_signed("<", room, ir.Constant(I64, 0)),
                        ir.Constant(I64, 0), inside)
    inside = e.b.select(e.b.icmp_signed("<", inside, start), start, inside)
    return e.b.select(e.b.icmp_signed("<", stop, inside), stop, inside)


def counted(e, reads, type_: TileType, start: int, stop: int, unit: int, span: int,
            inits: list, body) -> list:
    """e.counted_loop(start, stop, 1, inits, body) over trips t that read `reads` at flat
    positions [t * unit, t * unit + span) of a tile of `type_`, the interior trips first
    with their edge comparisons folded to true."""
    first, last = ir.Constant(I64, start), ir.Constant(I64, stop)
    one = ir.Constant(I64, 1)
    interior = find(e, reads, type_) if stop > start else None
    if interior is None:
        return e.counted_loop(first, last, one, inits, body)
    split = trips(e, interior, first, last, unit, span)
    saved = e.all_true
    e.all_true = saved | interior.compares
    try:
        carried = e.counted_loop(first, split, one, inits, body)
    finally:
        e.all_true = saved
    return e.counted_loop(split, last, one, carried, body)
