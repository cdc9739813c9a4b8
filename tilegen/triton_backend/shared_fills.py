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
or an elementwise op whose only reader F is a `tt.reduce`; F is in the block that defines
the value, every other reader comes after F in that block or in a region nested in it (a
loop or a branch after F: F has run when it runs), and F comes before every reader but
the first. The sweep reads the value through elementwise ops only, at the same positions
and widths, so every position is stored. If the value no longer reaches F that way when F
is emitted (a barrier stored it first, fused_loads.settle), F fills nothing and the value
stays as it is then.

A contiguous load that cannot be fused into its readers (more than fused_loads.MAX_READERS
of them, or one that does not evaluate it in place: a branch's `yield`) is filled the same
way by F, the first `tt.reduce` after it in its block that reads it through elementwise
ops, when every reader before F is such an op in the block and some reader comes after F
(those may be nested in it): it stays a lazy load until F, whose sweep reads it from memory
with the other rows it reads and stores each chunk, instead of a sweep of its own copying
it to the frame first (layer norm backward's `dy`, read by `w * dy` in the reductions'
sweep, by `dy * xhat` and by both branches of the lock section: one sweep fewer, and dy's
row read from memory in the same sweep as x's). A reduction writes no memory and nothing
between the load and F does (a barrier would have stored the load, fused_loads.settle), so
what F reads is what the load would have read. Should F not fill it, the load is stored
to the frame right after F (the same copy as before, one sweep later).
"""

from __future__ import annotations

from .elementwise import ELEMENTWISE_OPS
from .tileir import Block, Op, reaches_any

_SWEEPS = ("tt.reduce", "tt.store")


class SharedFills:
    def __init__(self, body: Block, fusion):
        self.fusion = fusion
        self.block_of: dict[int, int] = {}
        self.enclosing: dict[int, int | None] = {id(body): None}  # id(block) -> its parent's
        self.ops_of: dict[int, list[Op]] = {}  # id(block) -> its ops
        self.definer: dict[int, Op] = {}  # value id -> the op that defines it
        self._index(body)
        self.planned: dict[int, list] = {}  # id(F) -> [(result id, lazy, tile)]
        # id(lazy) -> (lazy, tile): the lazy is kept so that its id is not reused
        self.active: dict[int, tuple] = {}  # while F is emitted
        self.filled: dict[int, tuple] = {}  # complete

    def _index(self, block: Block) -> None:
        self.ops_of[id(block)] = block.ops
        for op in block.ops:
            self.block_of[id(op)] = id(block)
            for result in op.results:
                self.definer[result.id] = op
            for region in op.regions:
                self.enclosing[id(region)] = id(block)
                self._index(region)

    def _within(self, op: Op, block: int | None) -> bool:
        """Whether `op` is in `block` or in a region nested in it."""
        inner = self.block_of.get(id(op))
        while inner is not None and inner != block:
            inner = self.enclosing.get(inner)
        return inner is not None

    def sweep_for(self, definer: Op, result) -> Op | None:
        """The op F whose sweep may store `result` (see the module docstring), or None."""
        readers = self.fusion.readers.get(result.id, [])
        block = self.block_of.get(id(definer))
        if len(readers) < 2 or any(not self._within(r, block) for r in readers):
            return None
        first = readers[0]
        sweep = first if _sweeps(first, result) and self.block_of.get(id(first)) == block \
            else None
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

    def defer_load(self, e, op: Op, lazy) -> bool:
        """Leave the contiguous load `op` (as `lazy`, a lazy load) unread until the reduction
        whose sweep reads it fills a tile for it, if there is one (the module docstring)."""
        sweep = self.load_sweep(op)
        if sweep is None:
            return False
        self.planned.setdefault(id(sweep), []).append((op.result.id, lazy, e.alloc(lazy.type)))
        return True

    def load_sweep(self, op: Op) -> Op | None:
        """The first `tt.reduce` F after the load `op` in its block that reads it through
        elementwise ops, when every reader before F is such an elementwise op in the block,
        and some reader comes after F; every reader is in the block or nested in it."""
        result = op.result
        readers = self.fusion.readers.get(result.id, [])
        block = self.block_of.get(id(op))
        if len(readers) < 2 or any(not self._within(r, block) for r in readers):
            return None
        position = self.fusion.position
        here = position[id(op)]
        sweep = next((later for later in self.ops_of[block] if later.name == "tt.reduce"
                      and position[id(later)] > here
                      and any(self._reaches(v, result.id) for v in later.operands)), None)
        if sweep is None:
            return None
        at = position[id(sweep)]
        before = [r for r in readers if position[id(r)] < at]
        if len(before) == len(readers) or any(
                r.name not in ELEMENTWISE_OPS or self.block_of.get(id(r)) != block
                for r in before):
            return None
        return sweep

    def _reaches(self, value, target: int) -> bool:
        """Whether `value` is computed from the value `target` through elementwise ops."""
        def below(v):
            definer = self.definer.get(v.id)
            return definer.operands if definer is not None and \
                definer.name in ELEMENTWISE_OPS else ()
        return reaches_any([value], lambda v: v.id == target, below)

    def begin(self, e, op: Op) -> None:
        for _, lazy, tile in self.planned.get(id(op), ()):
            sources = op.operands if op.name == "tt.reduce" else op.operands[1:2]
            if any(_through_maps(e.env.get(v.id), lazy) for v in sources):
                self.active[id(lazy)] = (lazy, tile)

    def end(self, e, op: Op) -> None:
        for result_id, lazy, tile in self.planned.pop(id(op), ()):
            if self.active.pop(id(lazy), None) is None:
                if lazy.kind == "load" and e.env.get(result_id) is lazy:
                    e.env[result_id] = e.materialize(lazy)  # not filled: copied as before
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
    return reaches_any([value], lambda v: v is target,
                       lambda v: v.operands if getattr(v, "kind", None) == "map" else ())
