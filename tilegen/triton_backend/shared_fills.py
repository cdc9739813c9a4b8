"""Shared lazy tiles stored by the reduction that first reads them.

A lazy value with several readers that costs more than recomputing it per reader is stored
(emit._keep). Stored where it is defined, that is a sweep of its own, and the reduction
that reads it next sweeps it again: softmax's `numerator = exp(row - max)` was computed and
stored, then read back by `tl.sum(numerator)`; layer norm backward's `xhat` and `wdy` were
each stored, then read by `tl.sum(xhat * wdy)`. Instead the tile is filled by that
reduction's own sweep: each chunk it evaluates is stored as well, and readers after it read
the tile.

When (checked on the IR, so the fill is unconditional and complete before any other reader
evaluates the value): the value's first reader F is a `tt.reduce` or a `tt.store` of it,
or an elementwise op whose only reader F is a `tt.reduce`; every reader is in the block
that defines the value (none inside a loop or a branch), and F comes before every reader
but the first. The sweep reads the value through elementwise ops only, at the same
positions and widths, so every position is stored. If the value no longer reaches F that
way when F is emitted (a barrier stored it first, fused_loads.settle), F fills nothing and
the value stays as it is then.
"""

from __future__ import annotations

from .elementwise import ELEMENTWISE_OPS
from .tileir import Block, Op

_SWEEPS = ("tt.reduce", "tt.store")


class SharedFills:
    def __init__(self, body: Block, fusion):
        self.fusion = fusion
        self.block_of: dict[int, int] = {}
        self._index(body)
        self.planned: dict[int, list] = {}  # id(F) -> [(result id, lazy, tile)]
        # id(lazy) -> (lazy, tile): the lazy is kept so that its id is not reused
        self.active: dict[int, tuple] = {}  # while F is emitted
        self.filled: dict[int, tuple] = {}  # complete

    def _index(self, block: Block) -> None:
        for op in block.ops:
            self.block_of[id(op)] = id(block)
            for region in op.regions:
                self._index(region)

    def sweep_for(self, definer: Op, result) -> Op | None:
        """The op F whose sweep may store `result` (see the module docstring), or None."""
        readers = self.fusion.readers.get(result.id, [])
        block = self.block_of.get(id(definer))
        if len(readers) < 2 or any(self.block_of.get(id(r)) != block for r in readers):
            return None
        first = readers[0]
        sweep = first if _sweeps(first, result) else None
        if sweep is None and first.name in ELEMENTWISE_OPS and first.results:
            after = self.fusion.readers.get(first.result.id, [])
            if len(after) == 1 and after[0].name == "tt.reduce" and \
                    self.block_of.get(id(after[0])) == block:
                sweep = after[0]
        if sweep is None:
            return None
        position = self.fusion.position
        if any(position[id(sweep)] >= position[id(r)] for r in readers[1:]):
            return None
        return sweep

    def defer(self, e, definer: Op, result, lazy) -> bool:
        """Leave `lazy` unstored until its sweep fills a tile for it, if there is one."""
        sweep = self.sweep_for(definer, result)
        if sweep is None:
            return False
        self.planned.setdefault(id(sweep), []).append((result.id, lazy, e.alloc(lazy.type)))
        return True

    def begin(self, e, op: Op) -> None:
        for _, lazy, tile in self.planned.get(id(op), ()):
            sources = op.operands if op.name == "tt.reduce" else op.operands[1:2]
            if any(_through_maps(e.env.get(v.id), lazy) for v in sources):
                self.active[id(lazy)] = (lazy, tile)

    def end(self, e, op: Op) -> None:
        for result_id, lazy, tile in self.planned.pop(id(op), ()):
            if self.active.pop(id(lazy), None) is None:
                continue
            self.filled[id(lazy)] = (lazy, tile)
            if e.env.get(result_id) is lazy:
                e.env[result_id] = tile


def tile_of(table: dict, lazy):
    """The tile `table` (active or filled) holds for `lazy`, or None."""
    entry = table.get(id(lazy))
    return entry[1] if entry is not None and entry[0] is lazy else None


def _sweeps(op: Op, value) -> bool:
    if op.name == "tt.reduce":
        return True
    return op.name == "tt.store" and op.operands[1].id == value.id and all(
        operand.id != value.id for operand in (op.operands[0], *op.operands[2:]))


def _through_maps(value, target) -> bool:
    """Whether `value` reads `target` through elementwise (same-position) lazies only."""
    if value is target:
        return True
    return getattr(value, "kind", None) == "map" and any(
        _through_maps(operand, target) for operand in value.operands)
