"""A deferred dot's packed `b` kept for the next program on the same thread that reads it.

Tutorial 03's GROUP_SIZE_M order gives consecutive program ids the same `pid_n`, so the
programs a thread runs one after the other read the same column panel of B (1024 x 128
floats at 1024³) through the same pointer tiles. Each program packing it again reads B
rows of 512 bytes at a 4 KB stride: those rows use an eighth of the L2 sets, so the panel
does not stay in L2 between programs and every program reads it from L3 (about a third of
the matmul's time went to these loads). Here the whole K loop's packed B panels (all its
flush groups, contiguous, so they do stay in L2) are kept in the thread's frame with the
key that produced them, and a program whose loop would read the same addresses in the same
trips skips the load of `b` and its packing.

When the cached panels hold what the program would load:
- the same addresses in every trip: the key is the loop's initial `b` pointer tile (every
  lane compared at run time), its bounds and step, and the pointer tile advances by a step
  that depends on nothing program-specific (no program id, no load), as do the load's mask
  and `other` (checked on the TTIR: `static_conditions`), so trip t reads the same lanes
  under the same mask in both programs;
- the same memory: Triton gives programs no order, so a program that reads what another
  program writes without synchronising through atomics races, and a kernel with atomics
  is left alone. What the program itself writes before it loads is seen in program order:
  the loop must be at the kernel's top level with no store or atomic before it or in it.
  The cache is valid within one launch only: the launcher clears its flag in every
  thread's frame before the thread's first program (`reset_offsets`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .tileir import Op, TileType, walk

I1 = ir.IntType(1)
I64 = ir.IntType(64)
CACHE_BYTES = 1 << 20  # at most this much of a thread's frame for one dot's cached panels
ATOMICS = ("tt.atomic_rmw", "tt.atomic_cas")
WRITES = ("tt.store", *ATOMICS)
PURE_PREFIXES = ("arith.", "math.")
PURE_OPS = ("tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape", "tt.make_range",
            "tt.addptr", "tt.trans")


def _const(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def static_conditions(e, loop: Op, dot: Op, advancing: dict) -> tuple | None:
    """(the `b` load op, the carried position of its pointer tile) when the packed `b` of
    `dot` may be reused across programs as the module docstring says; else None."""
    program = e.program
    top = [number for number, op in enumerate(program.body.ops) if op is loop]
    if not top:
        return None
    if any(op.name in ATOMICS for op in walk(program.body)) or \
            any(op.name in WRITES for op in walk(loop.regions[0])):
        return None
    before = program.body.ops[:top[0]]
    if any(inner.name in WRITES for op in before for inner in _self_and_below(op)):
        return None
    body = loop.regions[0]
    defined = {result.id: op for op in body.ops for result in op.results}
    load = defined.get(dot.operands[1].id)
    if load is None or load.name != "tt.load" or e.uses.get(dot.operands[1].id) != 1:
        return None
    arguments = [arg.id for arg in body.args[1:]]
    pointer = load.operands[0]
    if pointer.id not in arguments:
        return None
    position = arguments.index(pointer.id)
    if position not in advancing:
        return None
    invariant = _ProgramInvariant(program, body.args[0].id)
    if not all(invariant(value) for value in (advancing[position], *load.operands[1:])):
        return None
    return load, position


def _self_and_below(op: Op):
    yield op
    for region in op.regions:
        yield from walk(region)


class _ProgramInvariant:
    """Whether a value is the same in every program of a launch: built from constants,
    scalar kernel arguments, ranges and the loop's induction variable by pure ops."""

    def __init__(self, program, induction: int):
        self.defined = {result.id: op for op in walk(program.body) for result in op.results}
        self.known = {param.value.id for param in program.params
                      if not param.value.type.shape} | {induction}

    def __call__(self, value) -> bool:
        if value.id in self.known:
            return True
        op = self.defined.get(value.id)
        if op is None or op.regions or not (op.name.startswith(PURE_PREFIXES) or
                                            op.name in PURE_OPS):
            return False
        if all(self(operand) for operand in op.operands):
            self.known.add(value.id)
            return True
        return False


@dataclass(frozen=True)
class PanelCache:
    """The frame tiles and allocas of one dot's cached panels."""

    load: Op  # the load of `b` that a valid cache skips
    pointer_slot: object  # the carried slot holding the initial `b` pointer tile
    flag: object  # i64 frame tile: 1 when the panels and keys below are complete
    key_tile: object  # the initial pointer tile that filled the panels
    key_bounds: object  # i64 x 3: the loop's lower bound, upper bound and step
    capacity: int  # trips the panels hold
    valid: ir.Value  # i1 alloca: this loop execution reads the cached panels
    fits: ir.Value  # i1 alloca: this loop execution's trips fit in the panels


def groups_held(group_bytes: int) -> int:
    return max(1, CACHE_BYTES // group_bytes)


def begin(e, load: Op, pointer_slot, bounds, group: int, groups: int) -> PanelCache:
    """Before the loop: whether the cached panels are this loop's (then `b` is not loaded)
    and, when they are not, that they are being replaced."""
    flag = e.alloc(TileType("i64", (1,)))
    e.launch_resets.append(flag.offset)
    key_tile = e.alloc(pointer_slot.type)
    key_bounds = e.alloc(TileType("i64", (3,)))
    lower, upper, step = (value if value.type == I64 else e.b.sext(value, I64)
                          for value in bounds)
    span = e.b.sub(upper, lower)
    trips = e.b.sdiv(e.b.add(span, e.b.sub(step, _const(1))), step)
    trips = e.b.select(e.b.icmp_signed(">", span, _const(0)), trips, _const(0))
    capacity = group * groups
    fits = e.entry_alloca(I1)
    e.b.store(e.b.icmp_signed("<=", trips, _const(capacity)), fits)
    same = e.b.icmp_signed("==", e.load_element(flag, _const(0)), _const(1))
    for number, value in enumerate((lower, upper, step)):
        kept = e.load_element(key_bounds, _const(number))
        same = e.b.and_(same, e.b.icmp_signed("==", kept, value))
    valid = e.entry_alloca(I1)
    e.b.store(e.b.and_(same, e.b.load(fits)), valid)
    with e.b.if_then(e.b.load(valid)):  # the pointer tiles, only when the rest agrees
        e.b.store(_same_tiles(e, pointer_slot, key_tile), valid)
    with e.b.if_then(e.b.not_(e.b.load(valid))):  # refilled: its key is the tile now
        e.store_chunk(flag, _const(0), _const(0))
        e.chunks(pointer_slot.type, lambda index, width: e.store_chunk(
            key_tile, index, e.load_chunk(pointer_slot, index, width)))
        for number, value in enumerate((lower, upper, step)):
            e.store_chunk(key_bounds, _const(number), value)
    return PanelCache(load, pointer_slot, flag, key_tile, key_bounds, capacity, valid, fits)


def _same_tiles(e, tile, other) -> ir.Value:
    """i1: every lane of the two i64 tiles equal."""
    differs = e.entry_alloca(I64)
    e.b.store(_const(0), differs)

    def compare(index, width):
        x, y = e.load_chunk(tile, index, width), e.load_chunk(other, index, width)
        bits = e.b.xor(x, y)
        if width:
            vector = bits.type
            reduce = e.ew.declare(f"llvm.vector.reduce.or.v{vector.count}i64", I64,
                                  [vector])
            bits = e.b.call(reduce, [bits])
        e.b.store(e.b.or_(e.b.load(differs), bits), differs)
    e.chunks(tile.type, compare)
    return e.b.icmp_signed("==", e.b.load(differs), _const(0))


def must_load(e, cache: PanelCache) -> ir.Value:
    return e.b.not_(e.b.load(cache.valid))


def group_base(e, cache: PanelCache, groups_done: ir.Value, group_elements: int):
    """The element offset in the panels of the current flush group: its own place when the
    loop's trips fit (so the panels are kept), else the first."""
    own = e.b.mul(e.b.load(groups_done), _const(group_elements))
    return e.b.select(e.b.load(cache.fits), own, _const(0))


def end(e, cache: PanelCache) -> None:
    """After the loop: panels filled by this execution are complete (their key was stored
    before the loop, while the flag said they were not)."""
    with e.b.if_then(e.b.and_(must_load(e, cache), e.b.load(cache.fits))):
        e.store_chunk(cache.flag, _const(0), _const(1))
