"""A deferred dot's packed `b` kept for the next execution of its K loop on the same
thread that reads it: the next program's, or the same program's next tile.

Tutorial 03's GROUP_SIZE_M order gives consecutive program ids the same `pid_n`, so the
programs a thread runs one after the other read the same column panel of B (1024 x 128
floats at 1024³) through the same pointer tiles; tutorial 09's persistent programs run the
K loop once per tile, and consecutive tiles of a program share `pid_n` the same way. Each
execution packing it again reads B rows of 512 bytes at a 4 KB stride: those rows use an
eighth of the L2 sets, so the panel does not stay in L2 between programs and every
program reads it from L3 (about a third of the matmul's time went to these loads). Here
the whole K loop's packed B panels (all its flush groups, contiguous, so they do stay in
L2) are kept in the thread's frame with the key that produced them, and a loop execution
that would read the same addresses in the same trips skips the load of `b` and its
packing.

When the cached panels hold what the loop would load:
- the same addresses under the same masks in every trip: what the load's pointer, mask and
  `other` read inside the loop are pure ops (no loads, no regions) of the trip's induction
  variable, of values the same in every program (constants, scalar arguments, ranges), of
  at most one carried pointer tile advanced by such a step (`a_ptrs += BLOCK_K *
  stride_ak`), and of values defined before the loop (tutorial 09's `offs_bn`); the key
  is the loop's bounds and step, the advancing tile's initial value and those values
  (every lane compared at run time, bit for bit: `static_conditions`, `_Key`);
- the same memory: Triton gives programs no order, so a program that reads what another
  program writes without synchronising through atomics races, and a kernel with atomics
  is left alone. What the program itself wrote before the loop must be seen: the loop
  itself may not write; a loop at the kernel's top level with no write before it needs
  nothing more; otherwise (a persistent kernel stores each tile before its next K loop)
  every write's tensor and b's must be kernel parameters, b's not written, and the
  launcher checks at each launch that the storages of b and of each written parameter
  are apart (`disjoint_params`, passed in the word after the argument slots): when they
  overlap, the loop loads and packs b every time.
  The cache is valid within one launch only: the launcher clears its flag in every
  thread's frame before the thread's first program (`launch_resets`).
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


@dataclass(frozen=True)
class Reuse:
    """What static_conditions found: the load of `b` a valid cache skips, and what the
    cache's key holds besides the loop's bounds."""

    load: Op
    position: int | None  # the carried position of b's advancing pointer tile, if any
    keys: tuple  # values from outside the loop, not the same in every program, b reads
    disjoint: tuple  # (b's parameter, a written parameter) pairs the launch must keep apart


def static_conditions(e, loop: Op, dot: Op, advancing: dict) -> Reuse | None:
    """Whether the packed `b` of `dot` may be reused across executions of `loop` as the
    module docstring says, and with which key; else None."""
    program = e.program
    if any(op.name in ATOMICS for op in walk(program.body)) or \
            any(op.name in WRITES for op in walk(loop.regions[0])):
        return None
    body = loop.regions[0]
    defined = {result.id: op for op in body.ops for result in op.results}
    load = defined.get(dot.operands[1].id)
    if load is None or load.name != "tt.load" or e.uses.get(dot.operands[1].id) != 1:
        return None
    key = _Key(program, body, advancing, defined)
    if not all(key.reads(operand) for operand in load.operands):
        return None
    disjoint = _disjoint_pairs(program, loop, load, body, key.position)
    if disjoint is None:
        return None
    return Reuse(load, key.position, tuple(key.values), disjoint)


class _Key:
    """Walks what `b`'s load reads inside the loop: pure ops of the induction variable,
    values the same in every program, at most one advancing pointer tile (keyed by its
    initial tile) and values from outside the loop (the loop cannot change them: keyed)."""

    def __init__(self, program, body, advancing: dict, defined: dict):
        self.body, self.advancing, self.defined = body, advancing, defined
        self.arguments = [arg.id for arg in body.args[1:]]
        self.nested = {value.id for op in body.ops for region in op.regions
                       for value in _defined_in(region)}
        self.invariant = _ProgramInvariant(program, body.args[0].id)
        self.position: int | None = None
        self.values: list = []
        self.pure: set[int] = set()  # ids of the loop's values found pure of what it may read

    def reads(self, value) -> bool:
        if value.id == self.body.args[0].id or any(value.id == kept.id
                                                   for kept in self.values):
            return True
        if value.id in self.arguments:
            position = self.arguments.index(value.id)
            if position not in self.advancing or self.position not in (None, position) or \
                    not self.invariant(self.advancing[position]):
                return False
            self.position = position
            return True
        op = self.defined.get(value.id)
        if op is not None:
            if value.id in self.pure:
                return True  # read along another path already (see reaches_any on DAGs)
            if op.regions or not (op.name.startswith(PURE_PREFIXES) or op.name in PURE_OPS):
                return False
            if not all(self.reads(operand) for operand in op.operands):
                return False
            self.pure.add(value.id)
            return True
        if value.id in self.nested:
            return False
        if not self.invariant(value):
            self.values.append(value)  # defined before the loop: fixed while it runs
        return True


def _defined_in(block):
    yield from block.args
    for op in block.ops:
        yield from op.results
        for region in op.regions:
            yield from _defined_in(region)


def _disjoint_pairs(program, loop: Op, load: Op, body, position) -> tuple | None:
    """() when no write can come before the loop in program order (a loop at the top
    level with none before it); else the (b's parameter, written parameter) pairs whose
    tensors the launcher must find apart for the cache to be used, or None when some
    write's or b's tensor is not a parameter (a pointer loaded from memory) or is b's."""
    top = [number for number, op in enumerate(program.body.ops) if op is loop]
    before = program.body.ops[:top[0]] if top else None
    if before is not None and not any(inner.name in WRITES for op in before
                                      for inner in _self_and_below(op)):
        return ()
    roots = _Roots(program)
    pointer = load.operands[0]
    if position is not None:  # an advancing tile: where its initial tile points
        pointer = loop.operands[3 + position]
    source = roots(pointer)
    if source is None:
        return None
    pairs = set()
    for op in walk(program.body):
        if op.name in WRITES:
            written = roots(op.operands[0])
            if written is None or written == source:
                return None
            pairs.add((source, written))
    return tuple(sorted(pairs))


class _Roots:
    """The kernel parameter a pointer (tile) is an offset of, through addptr and views;
    None when it comes from anywhere else (a load, a loop-carried value, a select)."""

    def __init__(self, program):
        self.defined = {result.id: op for op in walk(program.body) for result in op.results}
        self.params = {param.value.id: number for number, param in enumerate(program.params)}

    def __call__(self, value) -> int | None:
        while value.id not in self.params:
            op = self.defined.get(value.id)
            if op is None or op.name not in ("tt.addptr", "tt.splat", "tt.broadcast",
                                              "tt.expand_dims", "tt.reshape", "tt.trans"):
                return None
            value = op.operands[0]
        return self.params[value.id]


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
    flag: object  # i64 frame tile: 1 when the panels and keys below are complete
    keys: tuple  # (value, frame tile holding the value that filled the panels)
    key_bounds: object  # i64 x 3: the loop's lower bound, upper bound and step
    capacity: int  # trips the panels hold
    valid: ir.Value  # i1 alloca: this loop execution reads the cached panels
    fits: ir.Value  # i1 alloca: this loop execution's trips fit in the panels


def groups_held(group_bytes: int) -> int:
    return max(1, CACHE_BYTES // group_bytes)


def begin(e, reuse: Reuse, slots, bounds, group: int, groups: int) -> PanelCache:
    """Before the loop: whether the cached panels are this loop's (then `b` is not loaded)
    and, when they are not, that they are being replaced. `slots` are the loop's carried
    slots (an advancing pointer's holds its initial tile)."""
    flag = e.alloc(TileType("i64", (1,)))
    e.launch_resets.append(flag.offset)
    sources = ([slots[reuse.position]] if reuse.position is not None else []) + \
        [e.env[value.id] for value in reuse.keys]
    types = ([slots[reuse.position].type] if reuse.position is not None else []) + \
        [value.type for value in reuse.keys]
    keys = tuple((source, e.alloc(_key_type(type_)))
                 for source, type_ in zip(sources, types, strict=True))
    key_bounds = e.alloc(TileType("i64", (3,)))
    lower, upper, step = (value if value.type == I64 else e.b.sext(value, I64)
                          for value in bounds)
    span = e.b.sub(upper, lower)
    trips = e.b.sdiv(e.b.add(span, e.b.sub(step, _const(1))), step)
    trips = e.b.select(e.b.icmp_signed(">", span, _const(0)), trips, _const(0))
    capacity = group * groups
    fits = e.entry_alloca(I1)
    e.b.store(e.b.icmp_signed("<=", trips, _const(capacity)), fits)
    if reuse.disjoint:  # the launcher's word after the arguments: 1 when they are apart
        e.disjoint_params.update(reuse.disjoint)
        apart = e.b.icmp_signed("!=", e.trailing_slot(0), _const(0))
        e.b.store(e.b.and_(e.b.load(fits), apart), fits)
    same = e.b.icmp_signed("==", e.load_element(flag, _const(0)), _const(1))
    for number, value in enumerate((lower, upper, step)):
        kept = e.load_element(key_bounds, _const(number))
        same = e.b.and_(same, e.b.icmp_signed("==", kept, value))
    valid = e.entry_alloca(I1)
    e.b.store(e.b.and_(same, e.b.load(fits)), valid)
    for source, kept in keys:  # the tiles, only when the rest agrees
        with e.b.if_then(e.b.load(valid)):
            e.b.store(_same(e, source, kept), valid)
    with e.b.if_then(e.b.not_(e.b.load(valid))):  # refilled: its key is the values now
        e.store_chunk(flag, _const(0), _const(0))
        for source, kept in keys:
            _copy_key(e, source, kept)
        for number, value in enumerate((lower, upper, step)):
            e.store_chunk(key_bounds, _const(number), value)
    return PanelCache(reuse.load, flag, keys, key_bounds, capacity, valid, fits)


def _key_type(type_: TileType) -> TileType:
    """Where a key is kept: a tile as itself, a scalar as one element (a pointer as i64)."""
    if type_.shape:
        return type_
    return TileType("i64" if type_.is_pointer else type_.elem, (1,))


def _chunks(e, source, kept, visit) -> None:
    """visit(index, width, source chunk) over a key (a scalar: one element)."""
    if isinstance(source, ir.Value):
        scalar = source
        if isinstance(scalar.type, ir.PointerType):
            scalar = e.b.ptrtoint(scalar, I64)
        visit(_const(0), 0, scalar)
        return
    e.chunks(kept.type, lambda index, width: visit(index, width,
                                                   e.load_chunk(source, index, width)))


def _copy_key(e, source, kept) -> None:
    _chunks(e, source, kept, lambda index, width, chunk: e.store_chunk(kept, index, chunk))


def _same(e, source, kept) -> ir.Value:
    """i1: every lane of the key equal to the value that filled the panels (bit for bit)."""
    differs = e.entry_alloca(I64)
    e.b.store(_const(0), differs)

    def compare(index, width, chunk):
        bits = e.b.xor(_as_integer(e, chunk), _as_integer(e, e.load_chunk(kept, index, width)))
        if width:
            element = bits.type.element
            reduce = e.ew.declare(f"llvm.vector.reduce.or.v{width}i{element.width}", element,
                                  [bits.type])
            bits = e.b.call(reduce, [bits])
        if bits.type.width < 64:
            bits = e.b.zext(bits, I64)
        e.b.store(e.b.or_(e.b.load(differs), bits), differs)
    _chunks(e, source, kept, compare)
    return e.b.icmp_signed("==", e.b.load(differs), _const(0))


def _as_integer(e, value: ir.Value) -> ir.Value:
    """`value` with its bits as integers of the same width (floats bitcast)."""
    element = value.type.element if isinstance(value.type, ir.VectorType) else value.type
    if isinstance(element, ir.IntType):
        return value
    integer = ir.IntType(64 if isinstance(element, ir.DoubleType) else
                         32 if isinstance(element, ir.FloatType) else 16)
    if isinstance(value.type, ir.VectorType):
        integer = ir.VectorType(integer, value.type.count)
    return e.b.bitcast(value, integer)


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
