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
the row after each one in memory only cost bandwidth (0.78-0.88x single-threaded, ad hoc),
so they do not prefetch DISTANCE ahead. Such a load fetches the next trip's row instead
(`next_trip`): when its address is affine in the loop's induction variable with factors
known before the loop (constants or scalars defined outside it: `row_idx * stride`, the
step `num_programs`), each chunk of the first sweep that reads it in a trip prefetches the
line `step * d(address)/d(index)` bytes on, the same chunk of the row the program reads
next. Neither rule applies to an address that a loop carries or reads from memory.
"""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I32, I64, PTR
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
        self._first_reader: dict[int, int] = {}  # id(load) -> id(op) prefetching its trip
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


    def next_trip(self, e, op: Op, pointer, type_: TileType) -> ir.Value | None:
        """The i64 bytes from `op`'s address in this trip to its address in the next one
        (emitted now), for a row-long load in an `scf.for` that `streams` leaves out and
        whose address is affine in the induction variable; else None. Only the first op
        that evaluates the load (e.current_op: its first sweep in the trip) prefetches."""
        loop = self.loop_of.get(id(op))
        if loop is None or loop.name != "scf.for" or not row_long(type_) or \
                self.streams(op, pointer, type_):
            return None
        first = self._first_reader.setdefault(id(op), id(e.current_op))
        if first != id(e.current_op):
            return None
        per_unit = self._runtime_per_unit(e, pointer, loop)
        if per_unit is None or isinstance(per_unit, int) and per_unit == 0:
            return None
        step = e.env[loop.operands[2].id]
        trip = _times(e, per_unit, _wide(e, step))
        return ir.Constant(I64, trip) if isinstance(trip, int) else trip

    def _runtime_per_unit(self, e, value, loop: Op):
        """d(value)/d(induction variable) in bytes or units: an int, an i64 value emitted
        now, or None when `value` is not affine in it with loop-invariant factors."""
        induction = loop.regions[0].args[0]
        if value.id == induction.id:
            return 1
        if value.id not in self.inside[id(loop)]:
            return 0
        op = self.definer.get(value.id)
        if op is None:  # a carried value
            return None
        if op.name in _SAME:
            return self._runtime_per_unit(e, op.operands[0], loop)
        parts = [self._runtime_per_unit(e, operand, loop) for operand in op.operands]
        if op.name == "arith.muli":
            for moving, other in ((0, 1), (1, 0)):
                if parts[other] == 0 and parts[moving] is not None:
                    factor = _invariant_scalar(e, op.operands[other])
                    if factor is not None:
                        return _times(e, parts[moving], factor)
            return None
        if any(part is None for part in parts):
            return None
        if op.name == "tt.addptr":
            return _plus(e, parts[0], _times(e, parts[1],
                                             element_bytes(op.result.type.pointee)))
        if op.name == "arith.addi":
            return _plus(e, parts[0], parts[1])
        if op.name == "arith.subi":
            return _plus(e, parts[0], _times(e, parts[1], -1))
        pure = op.name not in _READS and not op.regions
        return 0 if pure and all(isinstance(p, int) and p == 0 for p in parts) else None

def _wide(e, value: ir.Value) -> ir.Value:
    return value if value.type.width == 64 else e.b.sext(value, I64)


def _invariant_scalar(e, value) -> ir.Value | None:
    """A loop-invariant integer operand as an i64: a scalar or a splat of one."""
    held = e.env.get(value.id)
    if not value.type.shape and isinstance(held, ir.Value):
        return _wide(e, held)
    if getattr(held, "kind", None) == "splat":
        return _wide(e, held.payload)
    if getattr(held, "kind", None) == "const" and isinstance(held.payload, int):
        return ir.Constant(I64, held.payload)
    return None


def _plus(e, a, b):
    """a + b for ints or i64 values (ints folded)."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int):
        a, b = b, a
    return a if b == 0 else e.b.add(a, ir.Constant(I64, b) if isinstance(b, int) else b)


def _times(e, a, b):
    """a * b for ints or i64 values (ints folded)."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        a, b = b, a
    if b == 0 or b == 1:
        return 0 if b == 0 else a
    return e.b.mul(a, ir.Constant(I64, b) if isinstance(b, int) else b)


def walk_regions(op: Op):
    """The values defined inside `op`'s regions: block arguments and results."""
    for region in op.regions:
        yield region.args
        for inner in walk(region):
            yield inner.results
            for nested in inner.regions:
                yield nested.args


def ahead(e, address: ir.Value, write: bool = False, distance=DISTANCE) -> None:
    """Prefetch the line `distance` bytes (an int or an i64) after `address` into L1."""
    function = e.ew.declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    if isinstance(distance, int):
        distance = ir.Constant(address.type, distance)
    target = e.b.inttoptr(e.b.add(address, distance), PTR)
    e.b.call(function, [target, ir.Constant(I32, int(write)), ir.Constant(I32, 3),
                        ir.Constant(I32, 1)])
