"""Loop-carried tiles that are only reduced after their loop, folded in registers.

Layer norm's `_mean += a` on a [BLOCK_SIZE] tile carried through `for`, read after the loop
only by `tl.sum(_mean, axis=0)`, would otherwise live in a frame slot: set to zeros before
the loop (a memset per row), loaded, added and stored back each chunk of each trip, then
read once more by the reduction. Nothing can observe the tile between those points but the
reduction, so the tile is kept folded instead: the reduced axis cut from E to R positions
(position j of the axis goes to j % R), a few vectors in registers, and the update
`acc = acc ⊕ g` folds each chunk of g into its vector where the program computes it. After
the loop the folded tile (R positions instead of E) is what the reduction reads; with zero
trips it is the loop's initial tile, folded the same way.

When: a carried tile (position p) whose body argument is read by one op only, `⊕` (an
associative, commutative elementwise op: add, mul, max, min, and, or, xor), directly in
the loop's body, whose result is read only by the yield at p; and whose loop result is read
only by `tt.reduce` ops along one axis whose combine region is that same `⊕` on its two
arguments; and whose folded form fits in MAX_VECTORS vector registers.

Order: the elements and the values added to them meet in another order than element-wise
first, reduction second. Triton leaves a reduction's order open, and the reductions here
already combine a row in several chains (tiles.fold_row); for floats the result may differ
in its rounding as with any other order, for integers, max and min it is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from . import interior
from .elementwise import I64, of_width, scalar_type
from .tileir import Op, TileType

# Elementwise ops that may be regrouped freely (associative and commutative).
_REGROUPABLE = frozenset(
    ["arith.addf", "arith.mulf", "arith.addi", "arith.muli", "arith.maxnumf",
     "arith.minnumf", "arith.maximumf", "arith.minimumf", "arith.maxsi", "arith.minsi",
     "arith.maxui", "arith.minui", "arith.andi", "arith.ori", "arith.xori"])
MAX_VECTORS = 16  # of the 32 AVX-512 registers: room for what the update computes
CHAINS = 4  # independent accumulators per reduced row (as tiles.fold_row)


@dataclass(frozen=True)
class Fold:
    """How one carried tile is kept folded: its loop position, the body's update op, the
    folded tile's type (the reduced axis cut to `kept`) and the flat offsets in the full
    tile of each folded chunk's first lane, for trip offset 0 of the axis."""

    position: int
    arg: int  # the body argument's value id
    update: Op
    folded: TileType
    width: int
    starts: tuple[int, ...]
    step: int  # flat distance between successive groups of `kept` positions of the axis
    groups: int  # extent // kept


def plan(e, loop: Op) -> dict[int, Fold]:
    """The carried tiles of `loop` that can be kept folded, by position."""
    body = loop.regions[0]
    terminator = body.ops[-1]
    if terminator.name != "scf.yield":
        return {}
    folds = {}
    for position, (arg, result) in enumerate(zip(body.args[1:], loop.results, strict=True)):
        if not arg.type.shape:
            continue
        update = _update(e, body, arg)
        if update is None or terminator.operands[position].id != update.result.id:
            continue
        axis = _reduced_axis(e, result, update.name)
        if axis is None:
            continue
        fold = _geometry(position, arg.id, update, axis)
        if fold is not None:
            folds[position] = fold
    return folds


def _update(e, body, arg):
    readers = e.fusion.readers.get(arg.id, [])
    if len(readers) != 1 or e.uses.get(arg.id) != 1:
        return None
    update = readers[0]
    if update.name not in _REGROUPABLE or len(update.operands) != 2 or \
            update not in body.ops or update.result.type != arg.type or \
            e.uses.get(update.result.id) != 1:
        return None
    return update


def _reduced_axis(e, result, name: str):
    readers = e.fusion.readers.get(result.id, [])
    if not readers or e.uses.get(result.id) != len(readers):
        return None
    axes = set()
    for reader in readers:
        if reader.name != "tt.reduce" or len(reader.operands) != 1 or \
                not _combines_with(reader.regions[0], name):
            return None
        axes.add(reader.attr("axis"))
    return axes.pop() if len(axes) == 1 else None


def _combines_with(region, name: str) -> bool:
    """Whether a reduce's combine region is `return name(a, b)` on its two arguments."""
    if len(region.ops) != 2 or len(region.args) != 2:
        return False
    combine, returned = region.ops
    arguments = {arg.id for arg in region.args}
    return combine.name == name and len(arguments) == 2 and \
        {v.id for v in combine.operands} == arguments and \
        returned.name == "tt.reduce.return" and len(returned.operands) == 1 and \
        returned.operands[0].id == combine.result.id


def _geometry(position: int, arg: int, update: Op, axis: int) -> Fold | None:
    type_ = update.result.type
    shape = type_.shape
    outer = _product(shape[:axis])
    extent, inner = shape[axis], _product(shape[axis + 1:])
    width = min(16, shape[-1])
    if inner == 1:  # the axis runs along a row: keep CHAINS chunks of it
        kept = width * max(1, min(CHAINS, extent // width))
    else:  # each chunk of a row is its own accumulator; a few positions of the axis too
        kept = max(1, min(extent, CHAINS * width // inner))
    least = width if inner == 1 else 1
    while kept > least and outer * kept * inner // width > MAX_VECTORS:
        kept //= 2
    if outer * kept * inner // width > MAX_VECTORS or extent % kept or \
            (inner == 1 and kept % width):
        return None
    folded = TileType(type_.elem, shape[:axis] + (kept,) + shape[axis + 1:])
    starts = []
    for flat in range(0, folded.numel, width):
        o, rest = divmod(flat, kept * inner)
        r, i = divmod(rest, inner)
        starts.append((o * extent + r) * inner + i)
    return Fold(position, arg, update, folded, width, tuple(starts), kept * inner,
                extent // kept)


def _product(dims) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


class Accumulators:
    """The folded chunks of every folded tile of one loop, in allocas LLVM promotes to
    registers (every index is a constant)."""

    def __init__(self, e, folds: dict[int, Fold]):
        self.e = e
        self.folds = folds
        self.slots = {position: [e.entry_alloca(of_width(scalar_type(fold.folded.elem),
                                                          fold.width))
                                 for _ in fold.starts]
                      for position, fold in folds.items()}
        for fold in folds.values():
            e.folded_updates[id(fold.update)] = self

    def start(self, inits: list) -> None:
        """Fold each tile's initial value (what the reduction sees after zero trips)."""
        for position, fold in self.folds.items():
            self._fold(fold, self.slots[position], inits[position], first=True)

    def update(self, op: Op) -> None:
        """`op` is a fold's update `arg ⊕ g`: fold g into the accumulators now, where the
        program computes it (g may read loads that a later store would change)."""
        e = self.e
        fold = next(f for f in self.folds.values() if f.update is op)
        index = 0 if op.operands[1].id == fold.arg else 1
        self._fold(fold, self.slots[fold.position], e.env[op.operands[index].id],
                   value_first=index == 0)
        e.env[op.result.id] = None  # read only by the yield, which skips it

    def _fold(self, fold: Fold, slots, value, first=False, value_first=False) -> None:
        e = self.e
        op = fold.update
        elems = [fold.folded.elem] * 2

        def combine(acc, chunk):
            args = [chunk, acc] if value_first else [acc, chunk]
            return e.ew.emit(e.b, op.name, op.attrs, args, elems, fold.folded.elem)

        def chunks(group):
            offset = e.b.mul(group, ir.Constant(I64, fold.step))
            return [e.load_chunk(value, e.b.add(offset, ir.Constant(I64, start)),
                                 fold.width) for start in fold.starts]

        if first:
            accs = chunks(ir.Constant(I64, 0))
            begin = 1
        else:
            accs = [e.b.load(slot) for slot in slots]
            begin = 0
        if fold.groups > begin:  # interior groups with their edge masks folded
            accs = interior.counted(
                e, [value], value.type, begin, fold.groups, fold.step,
                max(fold.starts) + fold.width, accs,
                lambda group, carried: [combine(acc, chunk) for acc, chunk in
                                        zip(carried, chunks(group), strict=True)])
        for slot, acc in zip(slots, accs, strict=True):
            e.b.store(acc, slot)

    def finish(self, position: int):
        """The folded tile, stored once, for the reductions that read the loop's result."""
        e = self.e
        fold = self.folds[position]
        out = e.alloc(fold.folded)
        for number, slot in enumerate(self.slots[position]):
            e.store_chunk(out, ir.Constant(I64, number * fold.width), e.b.load(slot))
        return out
