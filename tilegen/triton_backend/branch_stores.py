"""Stores of an `scf.if`'s result tiles emitted at the end of each branch.

Layer norm backward's lock section is `if count == 0: ... else: dw += load(DW); db +=
load(DB)` followed by `store(DW, dw); store(DB, db)`: each branch copied its two yielded
tiles into the result slots (a sweep each), and the stores read the slots back (two more).
When a result tile's only reader is a store right after the `if`, each branch stores the
value it yields itself, with no slot: the stores run where they ran before, after
everything the branch does, in the same order.

When (checked on the IR): the ops right after the `if` in its block are stores; each store
of the run whose value is a result tile of the `if` that nothing else reads, and whose
pointer and mask are not results of it, is sunk; the run ends at the first store that is
not (a later store may not move before it).

Several sunk stores of tiles of one shape run in one sweep, chunk by chunk, when their
bytes and the bytes of the loads their values still read lazily (fused_loads.py) are apart,
compared at run time: then no chunk can see another store's write that the program order
would not show it. Every such load comes before all the stores in the program, so a load
of a later store's value must not touch an earlier store's bytes at all; the same
addresses in the same layout are allowed for two stores (each address is written in the
same order) and for a load of the store's own or an earlier store's value (chunk i is read
before the store writes chunk i). Otherwise, and when a range is not
known at compile time, they run one after the other, each value that still reads a load
stored to the frame before a store that could overwrite it (as fused_loads.settle does).
"""

from __future__ import annotations

from llvmlite import ir

from . import fused_loads, memory
from .elementwise import I1
from .tileir import Op


def plan(e, op: Op) -> list[tuple[int, Op]]:
    """(result position, store) of each store sunk into the branches, in program order."""
    if len(op.regions) < 2 or not op.results:
        return []
    block, number = e.siblings.place[id(op)]
    positions = {result.id: n for n, result in enumerate(op.results)}
    sunk: list[tuple[int, Op]] = []
    for later in block.ops[number + 1:]:
        if later.name != "tt.store":
            break
        value = later.operands[1]
        position = positions.get(value.id)
        readers = e.fusion.readers.get(value.id, [])
        if position is None or not value.type.shape or len(readers) != 1 or \
                readers[0] is not later or any(
                    operand.id in positions
                    for operand in (later.operands[0], *later.operands[2:])):
            break
        sunk.append((position, later))
    return sunk


def emit(e, sunk: list[tuple[int, Op]], values: list) -> None:
    """The sunk stores of the values one branch yields, in order."""
    stores = [store for _, store in sunk]
    for position, store in sunk:
        e.env[store.operands[1].id] = values[position]
    shapes = {store.operands[1].type.shape for store in stores}
    hazard = _hazard(e, stores) if len(stores) > 1 and len(shapes) == 1 else None
    if hazard is None:
        _in_order(e, stores)
        return
    saved = {store.operands[1].id: e.env[store.operands[1].id] for store in stores}
    with e.b.if_else(hazard) as (overlapping, apart):
        with overlapping:
            _in_order(e, stores)
            e.env.update(saved)  # the other path reads the values as they were
        with apart:
            _one_sweep(e, stores)
    e.fusion.after_store()


def _in_order(e, stores: list[Op]) -> None:
    for number, store in enumerate(stores):
        for later in stores[number + 1:]:
            value_id = later.operands[1].id
            if e.fusion.holds_pending(e.env[value_id]):
                e.env[value_id] = e.materialize(e.env[value_id])
        memory.store(e, store)


def _one_sweep(e, stores: list[Op]) -> None:
    bodies = [(memory.store_chunk_body(e, store), e.env[store.operands[1].id])
              for store in stores]

    def chunk(index, width):
        for body, values in bodies:
            body(values, index, width)
    reads = [value for store in stores for value in (e.env[store.operands[1].id],
                                                     *memory.store_reads(e, store))]
    e.chunks(stores[0].operands[1].type, chunk, reads=reads)


def _hazard(e, stores: list[Op]):
    """An i1: whether any two of the stores, or a store and a load another store's value
    (or its own, through other addresses) reads lazily, may touch the same bytes other
    than at the same position; None when a range is not known."""
    targets = []
    for store in stores:
        pointer = store.operands[0]
        target = fused_loads.byte_range(e, pointer, e.env[pointer.id], store.operands[1].type)
        if target is None:
            return None
        targets.append((target, store))
    hazard = ir.Constant(I1, 0)
    for k, (target, store) in enumerate(targets):
        for other, other_store in targets[k + 1:]:
            hazard = e.b.or_(hazard, _overlap(e, target, other, store.operands[1].type ==
                                              other_store.operands[1].type))
        for m, (_, reader) in enumerate(targets):
            values = e.env[reader.operands[1].id]
            for load in e.fusion.pending_loads(values):
                broadcast = fused_loads.through_broadcast(values, load)
                if m == k and load.operands[0] is e.env[store.operands[0].id] \
                        and not broadcast:
                    continue  # the same pointer tile at the same positions
                source = fused_loads.byte_range(e, load.op.operands[0], load.operands[0],
                                                load.op.result.type)
                if source is None:
                    return None
                # a load of a later store's value reads memory as it was before this
                # store, but in the sweep it would read chunk i after this store wrote it
                same_layout = m <= k and not broadcast and \
                    load.op.result.type == store.operands[1].type
                hazard = e.b.or_(hazard, _overlap(e, target, source, same_layout))
    return hazard


def _overlap(e, first, second, same_layout: bool):
    """Whether two byte ranges (fused_loads.byte_range) overlap (with `same_layout`: other
    than as the same layout from the same address)."""
    low, high, start, strides = first
    other_low, other_high, other_start, other_strides = second
    overlap = e.b.and_(e.b.icmp_unsigned("<", other_low, high),
                       e.b.icmp_unsigned("<", low, other_high))
    if same_layout and strides == other_strides:
        overlap = e.b.and_(overlap, e.b.icmp_unsigned("!=", other_start, start))
    return overlap
