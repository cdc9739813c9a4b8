"""Reductions of one row run in one sweep.

Two reductions over tiles of the same shape along the same axis, one after the other in a
block, sweep the row twice: layer norm backward's `c1 = tl.sum(xhat * wdy) / N` and
`c2 = tl.sum(wdy) / N` read `wdy` once to fill its tile (shared_fills.py) and then again from
the frame. Instead the first reduction's sweep carries the accumulators of both: each chunk
of every source is read once, combined into its own reduction's accumulators, and both
results are bound when the sweep ends; the later reduction emits nothing where it stands.

When (so the early sweep computes what the later reduction would have): the later
reduction R is in the same block as the first F, after it, with every operand already
emitted when F is (defined before F); no op between F and R writes memory or runs a region
(stores, atomics, `for`, `while`, `if`, the barriers of fused_loads.py), so its lazy
operands read what they would have read at R; R reduces a row (nothing inside the reduced
axis, the `inner == 1` sweep of tiles.reduce) of a tile of the same shape, along the same
axis. A reduction kept folded (partials.py) or a load that may be skipped is left alone.
"""

from __future__ import annotations

from .elementwise import ELEMENTWISE_OPS
from .fused_loads import BARRIERS
from .tileir import Block, Op, TileType

# ops with regions that only combine values (no memory access)
_PURE_REGIONS = ("tt.reduce", "tt.scan")
# ops that read no memory and may be emitted earlier in their block
_HOISTABLE = ("arith.constant", "tt.splat", "tt.make_range", "tt.expand_dims", "tt.reshape",
              "tt.broadcast", "tt.addptr")


class SiblingReductions:
    """Where each op stands in its block, to look ahead for reductions to join."""

    def __init__(self, body: Block):
        self.place: dict[int, tuple[Block, int]] = {}
        self._index(body)

    def _index(self, block: Block) -> None:
        for number, op in enumerate(block.ops):
            self.place[id(op)] = (block, number)
            for region in op.regions:
                self._index(region)

    def joined(self, e, first: Op, shape: tuple[int, ...]) -> tuple[list[Op], list[Op]]:
        """The later reductions that run in `first`'s sweep (see the module docstring), and
        the pure ops between that compute their operands, to be emitted before the sweep."""
        block, number = self.place[id(first)]
        axis = first.attr("axis")
        producers: dict[int, Op] = {}  # results of the ops between first and here
        found: list[Op] = []
        hoisted: list[Op] = []
        for op in block.ops[number + 1:]:
            if op.name in BARRIERS or (op.regions and op.name not in _PURE_REGIONS):
                break
            if op.name == "tt.reduce" and op.attr("axis") == axis and \
                    id(op) not in e.folded_updates:
                needed = _computable(e, op, producers, shape)
                if needed is not None:
                    found.append(op)
                    hoisted += [p for p in needed if all(p is not h for h in hoisted)]
                    continue
            for result in op.results:
                producers[result.id] = op
        order = {id(op): n for n, op in enumerate(block.ops)}
        return found, sorted(hoisted, key=lambda op: order[id(op)])


def _computable(e, reduction: Op, producers: dict[int, Op], shape) -> list[Op] | None:
    """The ops between the first reduction and `reduction` that compute its operands, if
    each is pure and everything they read is already emitted; None otherwise."""
    needed: list[Op] = []

    def reach(value, top: bool) -> bool:
        if value.id in e.env:
            return not top or _tile_shape(e.env[value.id]) == shape
        producer = producers.get(value.id)
        if producer is None or producer.name not in _HOISTABLE and \
                producer.name not in ELEMENTWISE_OPS:
            return False
        if top and value.type.shape != shape:
            return False
        if all(producer is not other for other in needed):
            if not all(reach(operand, False) for operand in producer.operands):
                return False
            needed.append(producer)
        return True
    return needed if all(reach(v, True) for v in reduction.operands) else None


def combine_all(e, ops: list[Op]):
    """combine(accs, values) over the accumulators of every op in `ops`, in order, each
    through its own combine region."""
    arities = [len(op.operands) for op in ops]

    def combine(accs, values):
        out, start = [], 0
        for op, arity in zip(ops, arities, strict=True):
            out += e.region(op.regions[0], accs[start:start + arity] +
                            values[start:start + arity])
            start += arity
        return out
    return combine


def _tile_shape(value):
    type_ = getattr(value, "type", None)
    return type_.shape if isinstance(type_, TileType) else None
