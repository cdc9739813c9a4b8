"""The tile IR -> LLVM IR: one function per program instance, and the grid launcher.

Scalars are SSA values. Every tile lives in the program's scratch frame (one block per CPU
thread, given by the launcher), at an offset fixed while emitting; an op reads its operand
tiles and writes its result tile in vector chunks of up to 16 lanes that never cross a row
(tile dims are powers of two, so chunks divide rows exactly). `tt.expand_dims`,
`tt.reshape` and same-width bitcasts are views of their operand's bytes. Loads and stores
use the pointer analysis (analysis.py): masked vector loads/stores for pointer tiles that
are contiguous along the last axis, gathers/scatters otherwise; masked-off lanes never
touch memory. Reductions and scans run the op's combine region on whole vectors across
the kept axis, or along a row and then across the lanes.

ABI: `void @<name>.program(ptr args, i32 pid_x, pid_y, pid_z, i32 num_x, num_y, num_z,
ptr frame, ptr status)` reads each kernel argument from its 8-byte slot of `args`
(pointers and integers as i64, floats as f64); `void @<name>.launch(ptr params)` runs the
grid, over `threads` threads through libgomp: params is i64 nx, ny, nz, scratch, frame_bytes,
threads, status, run (grid.LAUNCH_FIELDS), then the argument slots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llvmlite import ir

from . import (
    amx_dot,
    bounds,
    fused_loads,
    interior,
    memory,
    prefetch,
    shapes,
    shared_fills,
    tiles,
)
from .analysis import axis_strides
from .elementwise import (
    ELEMENTWISE_OPS,
    I1,
    I32,
    I64,
    PTR,
    Elementwise,
    VectorText,
    bf16_bits,
    of_width,
    scalar_type,
    scaled_reciprocal,
    splat_constant,
    storage_type,
)
from .fused_loads import LoadFusion
from .sibling_reductions import SiblingReductions
from .tileir import Block, Op, Program, TileError, TileType, Value, element_bytes, walk

CHUNK = 16  # lanes of a vector chunk (one AVX-512 register of f32)
UNROLL_CHUNKS = 4
# The program is called by the grid's worker, not inlined into it: inlined, LLVM's O3
# simplified its body twice (alone, then again inside the worker), ~30 % of the
# optimiser's time in a cold compile; one call per program instance costs nothing that
# could be measured (docs/triton.md, "Compile time").
INLINE_PROGRAM = False
# The frame is the launcher's scratch block: no tensor points into it. Said to LLVM (the
# program's frame parameter is `noalias`), it keeps values across frame stores: a sweep
# that fills several tiles reads each row chunk once, not once per fill it stores.
FRAME_NOALIAS = True
_VIEWS = ("tt.expand_dims", "tt.reshape")
# debug_barrier (ttg.barrier) orders the threads of one GPU program; a CPU program is one
# thread, so it has nothing to wait for.
_IGNORED = ("llvm.intr.assume", "tt.assume", "gpu.barrier", "ttg.barrier")


@dataclass(frozen=True)
class Tile:
    """A tile value: `type` at byte `offset` of the frame."""

    offset: int
    type: TileType

    @property
    def storage(self) -> ir.Type:
        return storage_type(self.type.elem)


@dataclass(frozen=True, eq=False)
class Lazy:
    """A tile computed where it is read, chunk by chunk, instead of stored: splats,
    ranges, constants, views and elementwise chains with one reader (so elementwise ops
    fuse, and pointer and mask tiles of contiguous accesses are never built)."""

    type: TileType
    kind: str  # const | splat | range | map | addptr | view | broadcast | load
    operands: tuple = ()
    op: Op | None = None
    payload: object = None
    cost: int = 0


# Lazy values above this cost are stored once rather than recomputed by each reader.
LAZY_COST_LIMIT = 24
# A lazy value with several readers is stored once above this cost: recomputing a mask
# such as `cols < N` (two vector ops a chunk) is cheaper than storing it as bytes and
# turning each read back into a lane mask.
SHARED_COST_LIMIT = 3
_EXPENSIVE = ("math.exp", "math.log", "math.exp2", "math.log2", "math.sqrt", "math.rsqrt",
              "arith.divf", "tt.extern_elementwise", "math.erf", "arith.divsi", "arith.remsi",
              "arith.divui", "arith.remui", "tt.precise_divf", "tt.precise_sqrt")


def chunk_width(type_: TileType) -> int:
    return min(CHUNK, type_.shape[-1]) if type_.shape else 1


class ProgramEmitter:
    def __init__(self, program: Program, module: ir.Module, debug: bool = False,
                 amx_mode: str = "off"):
        self.program = program
        self.module = module
        self.debug = debug
        # dots on AMX tiles (amx_dot.py): TILEGEN_TRITON_AMX, and whether this host may
        self.amx_mode = amx_mode
        self.amx = amx_dot.available(amx_mode)
        self.uses_amx = False  # set by the first AMX dot emitted: the launcher asks Linux
        self.ew = Elementwise(module)
        self.axis_strides = axis_strides(program)
        # the last axis's stride of each integer and pointer tile (loads and stores)
        self.strides = {key: value[-1] for key, value in self.axis_strides.items() if value}
        self.current_op: Op | None = None
        self.frame_bytes = 0
        self.env: dict[int, object] = {}
        self.region_width = 0  # >0 while a combine region runs on vectors
        self.check_sites: list[str] = []
        self.uses = _use_counts(program.body)
        # ops reading each value: `x * x` evaluates both operands' chunk at one index,
        # and LLVM merges the two identical reads, so it is one reader of x
        self.reader_ops = _use_counts(program.body, distinct=True)
        # loop-carried tiles (their frame slots are the loop's own): a dot whose
        # accumulator is one of them, read by nothing else, accumulates in place
        self.carried_args = {arg.id for op in walk(program.body) if op.name == "scf.for"
                             for arg in op.regions[0].args[1:]}
        self.deferred_dots: dict[int, object] = {}  # dot result id -> kloop.DeferredDot
        # dot result id -> (carried slot, the loop's slot offsets): kloop.rescaled_accumulators
        self.accumulator_slots: dict[int, tuple] = {}
        # loaded tiles stored elsewhere than a tile of their own: id -> store(index, chunk)
        self.load_sinks: dict[int, object] = {}
        # updates of carried tiles kept folded (partials.py): id(op) -> its Accumulators
        self.folded_updates: dict[int, object] = {}
        # loads run only when guard() -> i1 holds: id -> guard (panel_cache.py)
        self.load_guards: dict[int, object] = {}
        self.launch_resets: list[int] = []  # frame offsets of i64s zeroed at each launch
        # (parameter, parameter) pairs of tensors the launcher checks are apart (its
        # trailing word, trailing_slot(0)): panel_cache.py's caches across a program's writes
        self.disjoint_params: set[tuple[int, int]] = set()
        self.fusion = LoadFusion(program.body)
        self.fills = shared_fills.SharedFills(program.body, self.fusion)
        self.siblings = SiblingReductions(program.body)
        self.streams = prefetch.Streams(program.body)  # accesses that prefetch ahead
        self.prefetched: set[tuple] = set()  # (load op, chunk index, width, block) fetched
        # ops already emitted at an earlier place (a reduction run in an earlier one's
        # sweep, sibling_reductions.py): nothing is emitted where they stand
        self.emitted_early: set[int] = set()
        # id() of lazy comparisons known true at every position the current sweep's trip
        # reads (its interior, interior.py)
        self.all_true: frozenset[int] = frozenset()
        args = [PTR, I32, I32, I32, I32, I32, I32, PTR, PTR]
        self.function = ir.Function(module, ir.FunctionType(ir.VoidType(), args),
                                    f"{program.name}.program")
        self.function.linkage = "internal"
        if not INLINE_PROGRAM:
            self.function.attributes.add("noinline")
        (self.args_ptr, *pids), self.frame_ptr, self.status = \
            self.function.args[:7], self.function.args[7], self.function.args[8]
        self.program_ids, self.num_programs = pids[:3], pids[3:6]
        if FRAME_NOALIAS and not INLINE_PROGRAM:
            self.frame_ptr.add_attribute("noalias")
        self.entry = self.function.append_basic_block("entry")
        self.b = ir.IRBuilder(self.function.append_basic_block("body"))

    # ---- driver ---------------------------------------------------------------------------

    def emit(self) -> ir.Function:
        for number, param in enumerate(self.program.params):
            self.env[param.value.id] = self._param(number, param.value.type)
        self.block(self.program.body)
        if not self.b.block.is_terminated:
            self.b.ret_void()
        ir.IRBuilder(self.entry).branch(self.function.blocks[1])
        return self.function

    def _param(self, number: int, type_: TileType) -> ir.Value:
        slot = self.b.gep(self.args_ptr, [ir.Constant(I64, number)], source_etype=I64)
        raw = self.b.load(slot, typ=I64)
        elem = type_.elem
        if type_.is_pointer or elem == "i64":
            return raw
        target = scalar_type(elem)
        if isinstance(target, ir.IntType):
            return self.b.trunc(raw, target)
        as_double = self.b.bitcast(raw, ir.DoubleType())
        return as_double if elem == "f64" else self.b.fptrunc(as_double, target)

    def trailing_slot(self, number: int) -> ir.Value:
        """Word `number` (i64) after the kernel's argument slots: what the launcher adds
        (panel_cache.py: whether the tensors in `disjoint_params` are apart)."""
        return self._param(len(self.program.params) + number, TileType("i64"))

    def check_bounds(self, op: Op, addresses, mask, width: int, size: int,
                     contiguous: bool = False) -> None:
        """With TRITON_DEBUG=1: a lane outside every argument tensor stops the program and
        records the op and the offending address in `status` (see bounds.py)."""
        if self.debug:
            bounds.emit_check(self, op, addresses, mask, width, size, contiguous)

    def fail(self, op: Op, message: str):
        return TileError(f"{op.where(self.program.name)}: {message}")

    def block(self, block: Block) -> list:
        """Emit the ops of `block`; returns the operands of its terminator (yield, ...)."""
        for op in block.ops:
            if op.name in ("scf.yield", "tt.reduce.return", "tt.scan.return",
                           "scf.condition"):
                return [self.env[v.id] for v in op.operands]
            if op.name == "tt.return":
                if block is not self.program.body or op is not block.ops[-1]:
                    raise self.fail(op, "a return before the end of the kernel's body (the "
                                        "importer structurizes early returns)")
                self.b.ret_void()
                return []
            self.op(op)
        return []

    def op(self, op: Op) -> None:
        name = op.name
        if id(op) in self.emitted_early:
            return
        self.current_op = op
        try:
            self.fusion.settle(self, op)
            self.fills.begin(self, op)
            handler = _HANDLERS.get(name)
            folded = self.folded_updates.get(id(op))
            guard = self.load_guards.get(op.results[0].id) if op.results else None
            if folded is not None:
                folded.update(op)
            elif guard is not None:  # a load that may be skipped (panel_cache.py)
                with self.b.if_then(guard()):
                    handler(self, op)
            elif handler is not None:
                handler(self, op)
            elif name in ELEMENTWISE_OPS:
                self._elementwise(op)
            elif name in _VIEWS:
                self._view(op)
            elif name in _IGNORED:
                pass
            elif name.startswith("cf."):
                raise self.fail(op, "a branch left in the tile IR (the importer "
                                    "structurizes the kernel body's branches)")
            else:
                raise self.fail(op, "this op is not supported by the tilegen backend")
            self.fills.end(self, op)
        except TileError as error:
            if op.where(self.program.name) in str(error):
                raise
            raise self.fail(op, str(error)) from None
        except (ValueError, TypeError, KeyError, IndexError, AssertionError,
                NotImplementedError, AttributeError) as error:
            # a case the lowering does not handle: name the op, keep the cause chained
            raise self.fail(op, f"the tilegen backend cannot lower this op "
                                f"({type(error).__name__}: {error})") from error

    # ---- frame and chunks -----------------------------------------------------------------

    def alloc(self, type_: TileType) -> Tile:
        size = type_.numel * element_bytes(type_.elem)
        offset = self.frame_bytes
        self.frame_bytes += -(-size // 64) * 64
        return Tile(offset, type_)

    def address(self, tile: Tile, index: ir.Value) -> ir.Value:
        base = self.b.gep(self.frame_ptr, [ir.Constant(I64, tile.offset)],
                          source_etype=ir.IntType(8))
        return self.b.gep(base, [index], source_etype=tile.storage)

    def load_chunk(self, value, index: ir.Value, width: int) -> ir.Value:
        """Lanes [index, index + width) of a tile (width 0: one element, as a scalar)."""
        if isinstance(value, Lazy):
            last = value.type.shape[-1] if value.type.shape else 1
            if width > last:  # a chunk over several rows (a reduction's inner dims)
                return self._read_across_rows(value, index, width)
            return self._evaluate(value, index, width)
        return self._load_tile(value, index, width)

    def _load_tile(self, tile: Tile, index: ir.Value, width: int) -> ir.Value:
        pointer = self.address(tile, index)
        raw = self.b.load(pointer, typ=of_width(tile.storage, width),
                          align=element_bytes(tile.type.elem))
        if tile.type.elem == "i1":
            return self.b.trunc(raw, of_width(I1, width))
        return raw

    def store_chunk(self, tile: Tile, index: ir.Value, value: ir.Value) -> None:
        if tile.type.elem == "i1":
            value = self.b.zext(value, of_width(tile.storage, _lanes(value)))
        self.b.store(value, self.address(tile, index), align=element_bytes(tile.type.elem))

    def load_element(self, value, index: ir.Value) -> ir.Value:
        return self.load_chunk(value, index, 0)

    def materialize(self, value) -> Tile:
        if isinstance(value, Tile):
            return value
        out = self.alloc(value.type)
        self.chunks(value.type, lambda index, width: self.store_chunk(
            out, index, self._evaluate(value, index, width)), reads=(value,))
        return out

    def _keep(self, result: Value, lazy: Lazy):
        """Bind `result` to `lazy`, or to its stored tile when recomputing it per reader
        would cost more than storing it."""
        readers = self.reader_ops.get(result.id, 0)
        if lazy.cost > LAZY_COST_LIMIT or (readers > 1 and lazy.cost > SHARED_COST_LIMIT):
            # stored by the reduction that reads it first, if one does (shared_fills.py)
            deferred = readers > 1 and self.fills.defer(self, self.current_op, result, lazy)
            self.env[result.id] = lazy if deferred else self.materialize(lazy)
        else:
            self.env[result.id] = lazy

    def _evaluate(self, lazy: Lazy, index: ir.Value, width: int) -> ir.Value:
        filled = shared_fills.tile_of(self.fills.filled, lazy)
        if filled is not None:
            return self._load_tile(filled, index, width)
        value = self._compute(lazy, index, width)
        filling = shared_fills.tile_of(self.fills.active, lazy)
        if filling is not None:
            self.store_chunk(filling, index, value)
        return value

    def _compute(self, lazy: Lazy, index: ir.Value, width: int) -> ir.Value:
        kind = lazy.kind
        elem = lazy.type.elem
        if kind == "const":
            return splat_constant(scalar_type(elem), lazy.payload, width)
        if kind == "splat":
            return self.splat(lazy.payload, width)
        if kind == "range":
            base = self.b.add(self.b.trunc(index, I32), ir.Constant(I32, lazy.payload))
            if not width:
                return base
            lanes = ir.Constant(ir.VectorType(I32, width),
                                [ir.Constant(I32, k) for k in range(width)])
            return self.b.add(self.splat(base, width), lanes)
        if kind == "load":
            return memory.fused_load_chunk(self, lazy, index, width)
        if kind == "map" and id(lazy) in self.all_true:
            return splat_constant(I1, 1, width)
        if kind in ("view", "broadcast") and self.all_true:
            # read at other positions than the sweep's: nothing is known true there
            saved, self.all_true = self.all_true, frozenset()
            try:
                return self._compute(lazy, index, width)
            finally:
                self.all_true = saved
        if kind in ("map", "addptr"):
            args = [self.load_chunk(v, index, width) for v in lazy.operands]
            if kind == "addptr":
                assert isinstance(lazy.payload, int)
                return self._advance(args[0], args[1], lazy.payload, width)
            op = lazy.op
            assert op is not None
            return self.ew.emit(self.b, op.name, op.attrs, args,
                                [v.type.elem for v in op.operands], elem)
        if kind == "view":
            (source,) = lazy.operands
            return self._read_across_rows(source, index, width)
        if kind == "broadcast":
            (source,) = lazy.operands
            in_shape, out_shape = source.type.shape, lazy.type.shape
            last = out_shape[-1]
            last_ir = ir.Constant(I64, last)
            row = self.b.udiv(index, last_ir)
            in_row = tiles.row_index(self, row, out_shape[:-1], in_shape[:-1])
            if in_shape[-1] == last:
                column = self.b.urem(index, last_ir)
                at = self.b.add(self.b.mul(in_row, last_ir), column)
                return self.load_chunk(source, at, width)
            return self.splat(self.load_chunk(source, in_row, 0), width)
        raise AssertionError(kind)

    def _read_across_rows(self, source, index: ir.Value, width: int) -> ir.Value:
        """A view's chunk may span several rows of its source: read them row by row."""
        source_last = source.type.shape[-1] if source.type.shape else 1
        if isinstance(source, Tile) or width <= source_last:
            return self.load_chunk(source, index, width)
        pieces = [self.load_chunk(source, self.b.add(index, ir.Constant(I64, k)), source_last)
                  for k in range(0, width, source_last)]
        while len(pieces) > 1:
            pieces = [self._concat(pieces[i], pieces[i + 1]) for i in range(0, len(pieces), 2)]
        return pieces[0]

    def _concat(self, low: ir.Value, high: ir.Value) -> ir.Value:
        count = low.type.count
        mask = ir.Constant(ir.VectorType(I32, 2 * count),
                           [ir.Constant(I32, k) for k in range(2 * count)])
        return self.b.shuffle_vector(low, high, mask)

    def loop(self, count, body, unroll: bool = True) -> None:
        """body(index) for index in [0, count) (count an int or an i64 value); up to
        UNROLL_CHUNKS trips are emitted unrolled unless `unroll` is off."""
        if isinstance(count, int):
            if count <= 0:
                return
            if count == 1 or (unroll and count <= UNROLL_CHUNKS):
                for index in range(count):
                    body(ir.Constant(I64, index))
                return
            count = ir.Constant(I64, count)
        self.counted_loop(ir.Constant(I64, 0), count, ir.Constant(I64, 1), [],
                          lambda index, carried: (body(index), carried)[1])

    def counted_loop(self, start, stop, step, inits: list[ir.Value], body) -> list[ir.Value]:
        """A loop over [start, stop) by a positive `step` carrying `inits` through
        `body(index, carried) -> carried`; returns the final carried values."""
        pre = self.b.block
        header = self.function.append_basic_block("loop")
        inside = self.function.append_basic_block("loop.body")
        after = self.function.append_basic_block("loop.end")
        self.b.branch(header)
        self.b.position_at_end(header)
        index = self.b.phi(start.type)
        index.add_incoming(start, pre)
        phis = []
        for init in inits:
            phi = self.b.phi(init.type)
            phi.add_incoming(init, pre)
            phis.append(phi)
        self.b.cbranch(self.b.icmp_signed("<", index, stop), inside, after)
        self.b.position_at_end(inside)
        carried = body(index, list(phis))
        following = self.b.add(index, step)
        latch = self.b.block
        self.b.branch(header)
        index.add_incoming(following, latch)
        for phi, value in zip(phis, carried, strict=True):
            phi.add_incoming(value, latch)
        self.b.position_at_end(after)
        return list(phis)

    def chunks(self, type_: TileType, body, reads=()) -> None:
        """body(flat_index, width) over the chunks of a tile of `type_`. `reads`: every
        value the body reads at those positions; edge comparisons among them are folded
        where the chunk lies inside the tile's interior (interior.py)."""
        width = chunk_width(type_)
        count = type_.numel // width
        if reads and count >= interior.MIN_TRIPS:
            def trip(i, carried):
                body(self.b.mul(i, ir.Constant(I64, width)), width)
                return carried
            interior.counted(self, reads, type_, 0, count, width, width, [], trip)
            return
        self.loop(count, lambda i: body(self.b.mul(i, ir.Constant(I64, width)), width))

    def splat(self, value: ir.Value, width: int) -> ir.Value:
        if not width:
            return value
        vector = ir.VectorType(value.type, width)
        undefined = VectorText(vector, "undef")
        one = self.b.insert_element(undefined, value, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, undefined,
                                     ir.Constant(ir.VectorType(I32, width), [0] * width))

    def entry_alloca(self, ty: ir.Type) -> ir.Value:
        builder = ir.IRBuilder(self.entry)
        return builder.alloca(ty)

    # ---- op families ----------------------------------------------------------------------

    def _elementwise(self, op: Op) -> None:
        result = op.result
        elems = [v.type.elem for v in op.operands]
        if not result.type.shape:
            args = [self.env[v.id] for v in op.operands]
            self.env[result.id] = self.ew.emit(self.b, op.name, op.attrs, args, elems,
                                               result.type.elem)
            return
        # a scalar operand among tiles (arith.select's scalar condition) is a splat
        sources = tuple(self.env[v.id] if v.type.shape else
                        Lazy(TileType(v.type.elem, result.type.shape), "splat",
                             payload=self.env[v.id]) for v in op.operands)
        if op.name == "arith.divf" and result.type.elem in ("f32", "f64"):
            divisor = _uniform(sources[1])
            if divisor is not None:  # a reciprocal once, two multiplies per lane
                self._keep(result, self._scaled_product(op, sources[0], divisor))
                return
        own = 8 if op.name in _EXPENSIVE else 1
        self._keep(result, Lazy(result.type, "map", sources, op,
                                cost=own + sum(_cost(s) for s in sources)))

    def _scaled_product(self, op: Op, dividend, divisor: ir.Value) -> Lazy:
        """`dividend / divisor` (a scalar) as (dividend * s) * r, elementwise.scaled_reciprocal.
        tt.precise_divf (tl.div_rn) stays an IEEE division."""
        scale, reciprocal = scaled_reciprocal(self.b, divisor)
        multiply = replace(op, name="arith.mulf")
        type_ = op.result.type
        scaled = Lazy(type_, "map", (dividend, Lazy(type_, "splat", payload=scale)), multiply,
                      cost=1 + _cost(dividend))
        return Lazy(type_, "map", (scaled, Lazy(type_, "splat", payload=reciprocal)),
                    multiply, cost=1 + scaled.cost)

    def _view(self, op: Op) -> None:
        source = self.env[op.operands[0].id]
        if isinstance(source, Tile):
            self.env[op.result.id] = Tile(source.offset, op.result.type)
        else:
            self.env[op.result.id] = Lazy(op.result.type, "view", (source,), cost=_cost(source))

    def broadcast(self, op: Op) -> None:
        source = self.env[op.operands[0].id]
        if _cost(source) > 4:  # each source element is read by many lanes
            source = self.materialize(source)
        self.env[op.result.id] = Lazy(op.result.type, "broadcast", (source,),
                                      cost=_cost(source))

    def constant(self, op: Op) -> None:
        result = op.result
        value = op.attr("value")
        if result.type.elem == "bf16":  # bf16 values are their bits (elementwise.py)
            value = bf16_bits(value)
        if not result.type.shape:
            self.env[result.id] = splat_constant(scalar_type(result.type.elem), value,
                                                 self.region_width)
            return
        self.env[result.id] = Lazy(result.type, "const", payload=value)

    def splat_op(self, op: Op) -> None:
        self.env[op.result.id] = Lazy(op.result.type, "splat",
                                      payload=self.env[op.operands[0].id])

    def make_range(self, op: Op) -> None:
        self.env[op.result.id] = Lazy(op.result.type, "range", payload=op.attr("start"))

    def program_id(self, op: Op) -> None:
        values = self.program_ids if op.name == "tt.get_program_id" else self.num_programs
        self.env[op.result.id] = values[op.attr("axis")]

    def addptr(self, op: Op) -> None:
        result = op.result
        size = element_bytes(result.type.pointee)
        if not result.type.shape:
            self.env[result.id] = self._advance(self.env[op.operands[0].id],
                                                self.env[op.operands[1].id], size, 0)
            return
        sources = (self.env[op.operands[0].id], self.env[op.operands[1].id])
        self._keep(result, Lazy(result.type, "addptr", sources, op, payload=size,
                                cost=1 + sum(_cost(s) for s in sources)))

    def lazy_load(self, op: Op, addresses, masks, others) -> Lazy:
        """A load read where its one reader evaluates it (fused_loads.py)."""
        lazy = Lazy(op.result.type, "load", tuple(v for v in (addresses, masks, others)
                                                   if v is not None), op,
                    payload=(masks is not None, others is not None),
                    cost=fused_loads.LOAD_COST)
        self.fusion.pending.add(id(lazy))
        return lazy

    def splat_lazy(self, scalar: ir.Value, shape: tuple[int, ...]) -> Lazy:
        elem = f"i{scalar.type.width}"
        return Lazy(TileType(elem, shape), "splat", payload=scalar)

    def lazy_addptr(self, pointers, offsets, size: int) -> Lazy:
        """pointers + offsets (elements of `size` bytes), computed where it is read."""
        return Lazy(pointers.type, "addptr", (pointers, offsets), payload=size,
                    cost=1 + _cost(pointers) + _cost(offsets))

    def _advance(self, pointer, offset, size: int, width: int) -> ir.Value:
        if offset.type != of_width(I64, width):
            offset = self.b.sext(offset, of_width(I64, width))
        return self.b.add(pointer, self.b.mul(offset, self.splat(ir.Constant(I64, size),
                                                                  width)))

    def region(self, block: Block, args: list[ir.Value]) -> list[ir.Value]:
        """A combine region on scalars or vectors (the width of `args`)."""
        saved = self.region_width
        self.region_width = _lanes(args[0])
        for arg, value in zip(block.args, args, strict=True):
            self.env[arg.id] = value
        try:
            return self.block(block)
        finally:
            self.region_width = saved


def _uniform(value) -> ir.Value | None:
    """The scalar a tile holds at every position (a splat or a constant), or None."""
    if not isinstance(value, Lazy) or value.kind not in ("splat", "const"):
        return None
    if value.kind == "splat":
        return value.payload
    return ir.Constant(scalar_type(value.type.elem), value.payload)


def _cost(value) -> int:
    return value.cost if isinstance(value, Lazy) else 0


def _use_counts(block: Block, distinct: bool = False) -> dict[int, int]:
    """How often each value is an operand (distinct: of how many ops)."""
    counts: dict[int, int] = {}
    for op in walk(block):
        operands = {value.id: value for value in op.operands}.values() if distinct \
            else op.operands
        for value in operands:
            counts[value.id] = counts.get(value.id, 0) + 1
    return counts


def _lanes(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 0


_HANDLERS = {
    "arith.constant": ProgramEmitter.constant,
    "tt.splat": ProgramEmitter.splat_op,
    "tt.make_range": ProgramEmitter.make_range,
    "tt.get_program_id": ProgramEmitter.program_id,
    "tt.get_num_programs": ProgramEmitter.program_id,
    "tt.addptr": ProgramEmitter.addptr,
    "tt.broadcast": ProgramEmitter.broadcast,
    **memory.HANDLERS,
    **tiles.HANDLERS,
    **shapes.HANDLERS,
    **bounds.HANDLERS,
}
