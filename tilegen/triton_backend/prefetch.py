"""Software prefetch ahead of row-long contiguous loads and stores.

A program that sweeps a long row (softmax, layer norm: 4 KB and more) starts each row on a
new 4 KB page, and the hardware's streaming prefetcher does not cross pages: every row began
with demand misses while the prefetcher ramped up again (`perf` put the first instruction
after the row loads of layer norm backward and softmax among the hottest). Each chunk of a
contiguous access whose tile rows span at least MIN_ROW_BYTES prefetches the line
DISTANCE bytes further on: in the row's second half that is the start of the next row when
rows follow each other in memory (the next program on the thread, whose ids run in
contiguous order, grid.py, but for the last of each run of a kernel whose atomics are periodic
in the program id), in its first half the rest of its own row. Prefetches never
fault, so lanes past a tensor's end cost at most a line fetched for nothing; rows with gaps
between them fetch up to DISTANCE bytes of each gap. Short rows (the tiles of matmul and
attention, a few hundred bytes per row) are left to the hardware. Stores prefetch for
writing, so the line is owned before the store needs it.

Inside a loop the next access is the next trip's: an access prefetches only when its
address advances, per trip of its innermost loop, by exactly its tile's bytes (the loop's
step a constant, the address affine in the induction variable with constant factors:
layer norm forward's `X + off + arange(BLOCK)` with `off` stepping by BLOCK), so the bytes
ahead are the next trip's. The persistent softmax's rows, `row_idx * stride` with
`row_idx` stepping by the number of programs, jump 32 KB and more between trips: fetching
the row after each one only cost bandwidth (0.78-0.88x single-threaded, ad hoc), so they
do not prefetch; neither does an address that a loop carries or reads from memory.
"""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I32, PTR
from .tileir import Block, Op, TileType, element_bytes, walk

DISTANCE = 2048
MIN_ROW_BYTES = 2048
STORES = True


def row_long(type_: TileType) -> bool:
    return bool(DISTANCE) and bool(type_.shape) and \
        type_.shape[-1] * element_bytes(type_.elem) >= MIN_ROW_BYTES


_SAME = ("tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape", "arith.extsi",
         "arith.extui", "arith.trunci", "arith.index_cast")


_READS = ("tt.load", "tt.atomic_rmw", "tt.atomic_cas")


class Streams:
    """Which row-long accesses prefetch ahead (see the module docstring)."""

    def __init__(self, body: Block):
        self.loop_of: dict[int, Op] = {}  # id(op) -> its innermost enclosing scf.for/while
        self.definer: dict[int, Op] = {}
        self.inside: dict[int, set[int]] = {}  # id(loop) -> ids of the values defined in it
        self._per_unit: dict[tuple[int, int], int | None] = {}
        self._index(body, None)

    def _index(self, block: Block, loop: Op | None) -> None:
        for op in block.ops:
            if loop is not None:
                self.loop_of[id(op)] = loop
            for result in op.results:
                self.definer[result.id] = op
            if op.name in ("scf.for", "scf.while"):
                self.inside[id(op)] = {v.id for inner in walk_regions(op) for v in inner}
            for region in op.regions:
                self._index(region, op if op.name in ("scf.for", "scf.while") else loop)

    def streams(self, op: Op, pointer, type_: TileType) -> bool:
        """Whether access `op` through `pointer` (a tile of `type_`) prefetches ahead."""
        if not row_long(type_):
            return False
        loop = self.loop_of.get(id(op))
        if loop is None:
            return True
        if loop.name != "scf.for":
            return False
        step = self._constant(loop.operands[2])
        per_unit = self._bytes_per_unit(pointer, loop)
        if step is None or per_unit is None:
            return False
        return step * per_unit == type_.numel * element_bytes(type_.elem)

    def _constant(self, value) -> int | None:
        op = self.definer.get(value.id)
        if op is None:
            return None
        if op.name == "arith.constant":
            constant = op.attr("value")
            return constant if isinstance(constant, int) else None
        if op.name in _SAME:
            return self._constant(op.operands[0])
        return None

    def _bytes_per_unit(self, value, loop: Op) -> int | None:
        """How many bytes (pointers) or units (integers) `value` moves per unit of the
        loop's induction variable; None when not affine with constant factors."""
        key = (value.id, id(loop))
        if key not in self._per_unit:  # values are shared: each is looked at once
            self._per_unit[key] = self._compute_per_unit(value, loop)
        return self._per_unit[key]

    def _compute_per_unit(self, value, loop: Op) -> int | None:
        induction = loop.regions[0].args[0]
        if value.id == induction.id:
            return 1
        if value.id not in self.inside[id(loop)]:
            return 0  # defined before the loop
        op = self.definer.get(value.id)
        if op is None:  # a carried value
            return None
        parts = [self._bytes_per_unit(operand, loop) for operand in op.operands]
        if any(part is None for part in parts):
            return None
        if op.name in _SAME:
            return parts[0]
        if op.name == "tt.addptr":
            return parts[0] + parts[1] * element_bytes(op.result.type.pointee)
        if op.name == "arith.addi":
            return parts[0] + parts[1]
        if op.name == "arith.subi":
            return parts[0] - parts[1]
        if op.name == "arith.muli":
            factors = [self._constant(operand) for operand in op.operands]
            if factors[1] is not None:
                return parts[0] * factors[1]
            if factors[0] is not None:
                return parts[1] * factors[0]
        # memory may change between trips; other ops of trip-invariant operands are too
        return 0 if not any(parts) and op.name not in _READS and not op.regions else None


def walk_regions(op: Op):
    """The values defined inside `op`'s regions: block arguments and results."""
    for region in op.regions:
        yield region.args
        for inner in walk(region):
            yield inner.results
            for nested in inner.regions:
                yield nested.args


def ahead(e, address: ir.Value, write: bool = False) -> None:
    """Prefetch the line DISTANCE bytes after `address` (an i64) into L1."""
    function = e.ew.declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    target = e.b.inttoptr(e.b.add(address, ir.Constant(address.type, DISTANCE)), PTR)
    e.b.call(function, [target, ir.Constant(I32, int(write)), ir.Constant(I32, 3),
                        ir.Constant(I32, 1)])
