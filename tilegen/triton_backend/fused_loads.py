"""Loads fused into their readers: a contiguous `tt.load` read by a few elementwise ops,
views, reductions or stores is a lazy value (kind "load", made by
`ProgramEmitter.lazy_load`, read by `memory.fused_load_chunk`) whose chunks are read from
memory where each reader evaluates them, instead of being stored to the frame and read
back (layer norm's loads of X, W and B: one pass over registers instead of three over the
frame; softmax's row, read by its max and by its exponentials, twice from memory).

Reading later than the program says is safe only while nothing writes memory in between:
- before an op that writes memory or runs a region (`tt.store`, atomics, `scf.for`,
  `scf.while`, `scf.if`), every value that still holds an unread lazy load and is read at
  or after that op is stored to the frame first (`settle`); a store's own value may keep
  its loads lazy (the store reads chunk i of them before it writes chunk i);
- a store whose value reads lazy loads through other addresses than its own could
  overwrite, at chunk i, what a lazy load reads at a later chunk j (an in-place shift);
  `guarded_store` compares the byte ranges of the store and of each load at run time and
  takes the stored path when they overlap (unless they are the same addresses in the same
  layout), or always when a range is not known at compile time.
Masked-off lanes never touch memory either way.
"""

from __future__ import annotations

from llvmlite import ir

from . import dot_operands
from .elementwise import ELEMENTWISE_OPS, I1, I64
from .tileir import Op, element_bytes, reaches_any, walk

# Readers whose evaluation of a lazy load happens at their own place in the program.
_READERS = ("tt.store", "tt.reduce", "tt.expand_dims", "tt.reshape", "tt.broadcast")
# Ops before which unread lazy loads that are still needed are stored.
BARRIERS = ("tt.store", "tt.atomic_rmw", "tt.atomic_cas", "scf.for", "scf.while", "scf.if")
LOAD_COST = 2
MAX_READERS = 3


def _evaluates_in_place(reader: Op, value) -> bool:
    if reader.name == "tt.store":  # its value, not its pointer or mask
        return reader.operands[1] is value and all(
            operand is not value for operand in (reader.operands[0], *reader.operands[2:]))
    return reader.name in _READERS or reader.name in ELEMENTWISE_OPS


class LoadFusion:
    """The positions and readers of one program's values, and the loads not read yet."""

    def __init__(self, body):
        self.position: dict[int, int] = {}
        self.last_use: dict[int, int] = {}
        self.readers: dict[int, list[Op]] = {}
        for index, op in enumerate(walk(body)):
            self.position[id(op)] = index
            for value in op.operands:
                self.last_use[value.id] = index
                readers = self.readers.setdefault(value.id, [])
                if op not in readers:
                    readers.append(op)
        self.pending: set[int] = set()  # id() of lazy loads created since the last barrier

    def fusible(self, e, op: Op) -> bool:
        """Up to MAX_READERS readers, each of which evaluates the load where it stands (not
        a dot, a yield, ...). With several (softmax's row: its max and its exponentials)
        each reads memory again, which costs what reading a frame copy does, without the
        copy."""
        readers = self.readers.get(op.result.id, [])
        if len(readers) == 1 and len(op.operands) == 1 and \
                dot_operands.reads_in_place(e, readers[0], op.result):
            return True  # a dot's unpacked b, read by the micro-kernel in memory
        return 0 < len(readers) <= MAX_READERS and all(
            _evaluates_in_place(reader, op.result) for reader in readers)

    def holds_pending(self, value) -> bool:
        return bool(self.pending) and reaches_any(
            [value], lambda v: getattr(v, "kind", None) == "load" and id(v) in self.pending,
            _lazy_operands)

    def pending_loads(self, value) -> list:
        if not hasattr(value, "kind"):
            return []
        found = [value] if value.kind == "load" and id(value) in self.pending else []
        for operand in value.operands:
            found += [load for load in self.pending_loads(operand) if load not in found]
        return found

    def settle(self, e, op: Op) -> None:
        """Before `op` (a barrier): store every value still needed after it that reads an
        unread lazy load. A store's own operands are left to `guarded_store`."""
        if not self.pending or op.name not in BARRIERS:
            return
        here = self.position[id(op)]
        own = {value.id for value in op.operands} if op.name == "tt.store" else set()
        for value_id, value in list(e.env.items()):
            needed = self.last_use.get(value_id, -1)
            if (needed > here or (needed == here and value_id not in own)) \
                    and self.holds_pending(value):
                e.env[value_id] = e.materialize(value)
        if op.name != "tt.store":
            self.pending.clear()

    def after_store(self) -> None:
        self.pending.clear()


def byte_range(e, pointer_value, pointer, type_):
    """[low, high) of the bytes a contiguous access through `pointer` (a tile) may touch,
    or None when a stride is not known."""
    strides = e.axis_strides.get(pointer_value.id)
    if not strides or any(stride is None for stride in strides):
        return None
    first = e.load_chunk(pointer, ir.Constant(I64, 0), 0)
    below = sum(min(0, (n - 1) * s) for n, s in zip(type_.shape, strides, strict=True))
    above = sum(max(0, (n - 1) * s) for n, s in zip(type_.shape, strides, strict=True))
    size = element_bytes(type_.elem)
    return (e.b.add(first, ir.Constant(I64, below)),
            e.b.add(first, ir.Constant(I64, above + size)), first, strides)


def through_broadcast(value, load) -> bool:
    """Whether `value` reads `load` through a broadcast (at other flat positions)."""
    return reaches_any(
        [value], lambda v: hasattr(v, "kind") and v is not load and v.kind == "broadcast"
        and _reaches(v, load), lambda v: () if v is load else _lazy_operands(v))


def _reaches(value, load) -> bool:
    return reaches_any([value], lambda v: v is load, _lazy_operands)


def _lazy_operands(value) -> tuple:
    """What a lazy tile reads (nothing for a tile already in registers or memory)."""
    return value.operands if hasattr(value, "kind") else ()


def guarded_store(e, op: Op, emit_store) -> None:
    """`emit_store(values)` with the store's value as it is when no lazy load in it can
    see the store's own writes, else with the value stored to the frame first."""
    pointer_value, value = op.operands[0], op.operands[1]
    values = e.env[value.id]
    loads = e.fusion.pending_loads(values)
    pointer = e.env[pointer_value.id]
    # the same pointer tile read at the same flat positions: chunk i is read, then written
    loads = [load for load in loads
             if load.operands[0] is not pointer or through_broadcast(values, load)]
    if not loads:
        emit_store(values)
        e.fusion.after_store()
        return
    target = byte_range(e, pointer_value, pointer, value.type)
    sources = [byte_range(e, load.op.operands[0], load.operands[0], load.op.result.type)
               for load in loads]
    if target is None or any(source is None for source in sources):
        emit_store(e.materialize(values))
        e.fusion.after_store()
        return
    low, high, first, strides = target
    hazard = ir.Constant(I1, 0)
    for (source_low, source_high, source_first, source_strides), load in zip(
            sources, loads, strict=True):
        overlap = e.b.and_(e.b.icmp_unsigned("<", source_low, high),
                           e.b.icmp_unsigned("<", low, source_high))
        if source_strides == strides and load.op.result.type == value.type and \
                not through_broadcast(values, load):
            # the same layout from the same address: chunk i is read, then written
            overlap = e.b.and_(overlap, e.b.icmp_unsigned("!=", source_first, first))
        hazard = e.b.or_(hazard, overlap)
    with e.b.if_else(hazard) as (overlapping, apart):
        with overlapping:
            emit_store(e.materialize(values))
        with apart:
            emit_store(values)
    e.fusion.after_store()

