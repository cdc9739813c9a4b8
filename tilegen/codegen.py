"""Loop-nest IR -> LLVM IR with llvmlite's IR builder.

One LLVM function per kernel: `i64 @name(ptr buf0, ..., ptr bufN, ptr err)` taking the
input then output buffers; it returns 0, or 1 + the index of the id check that failed
(with the id and its position written to `err[0..2]`). Loops tagged `vector` run in
`width`-lane tiles; the remainder runs as one tile under a constant lane mask, so no
lane ever touches memory outside its buffer. Inside a tile every expression is either
uniform (a scalar) or varying (a vector); loads pick a contiguous vector load, a scalar
load and splat, or a gather from the index's coefficient of the lane variable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from . import loopir as L
from . import storage
from .affine import to_affine
from .emitplan import UNROLL_TRIPS, joint_reduction, tail_width
from .frame import plan_frame
from .target import Target
from .vecmath import MathLibrary

I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
SCALAR_LLVM = {L.F32: ir.FloatType(), L.F64: ir.DoubleType(), L.I64: I64, L.BOOL: I1,
               **storage.STORAGE_LLVM}

# Temporaries up to 64 KiB live on the stack up to a budget for the frame; the rest share
# one heap workspace (tilegen/frame.py).
# Heap blocks (the workspace, gemm packing panels) are kept between calls, one per slot, so
# a call does not pay for page-faulting fresh memory (a 4 MB temporary costs ~1 ms of faults
# each time glibc hands it out through mmap). A call takes its slot's block with an atomic
# exchange (or mallocs one when another call holds it) and puts it back when it returns.
# The slots are an array the runtime owns: it reads their number from `<symbol>.blockcount`
# and stores the array's address in `<symbol>.blocks` (left null, nothing is cached), and
# frees the blocks when the code is unloaded -- without running code that may be gone.
BLOCKS_SUFFIX = ".blocks"
BLOCK_COUNT_SUFFIX = ".blockcount"
# Float ops may be contracted into FMAs (more accurate, never less).
FLOAT_FLAGS = ("contract",)


@dataclass(frozen=True)
class Val:
    value: ir.Value
    vector: bool


@dataclass
class Lane:
    """The vector tile being generated: lane variable, width, scalar base index, mask."""

    var: str
    width: int
    base: ir.Value
    mask: ir.Value | None


def _joint_horizontal(builder: ir.IRBuilder, vectors: list[ir.Value],
                      combine) -> list[ir.Value]:
    """[combine over the lanes of v] for each of 2 or 4 vectors (same type, power-of-two
    width); `combine(builder, x, y)` is the lane-wise sum or max.

    A vector holds `len(group)` equal segments, segment s accumulating vectors[group[s]].
    Two vectors with the same segments merge into one whose segments are half as long
    (first halves + second halves of each, one combine); a lone vector folds its segments'
    halves onto each other. Merging first shares the shuffles among the vectors, and each
    vector's lanes are still folded in the halving order of LLVM's own reductions."""
    i32 = ir.IntType(32)

    def mask(lanes):
        return ir.Constant(ir.VectorType(i32, len(lanes)), lanes)

    states = [(vector, [number]) for number, vector in enumerate(vectors)]
    while len(states) > 1 or len(states[0][1]) < states[0][0].type.count:
        if len(states) > 1 and len(states[0][1]) == len(states[1][1]) and \
                states[0][0].type.count == states[1][0].type.count:
            (a, group_a), (b, group_b) = states[0], states[1]
            lanes = a.type.count
            segment = lanes // len(group_a)
            half = segment // 2
            firsts, seconds = [], []
            for source in (0, lanes):  # lanes of a, then of b
                for start in range(0, lanes, segment):
                    firsts += [source + start + i for i in range(half)]
                    seconds += [source + start + half + i for i in range(half)]
            low = builder.shuffle_vector(a, b, mask(firsts))
            high = builder.shuffle_vector(a, b, mask(seconds))
            # Segment order: a's segments, then b's.
            states = states[2:] + [(combine(builder, low, high), group_a + group_b)]
            continue
        vector, group = states[0]
        lanes = vector.type.count
        segment = lanes // len(group)
        half = segment // 2
        firsts = [start + i for start in range(0, lanes, segment) for i in range(half)]
        seconds = [start + half + i for start in range(0, lanes, segment) for i in range(half)]
        undefined = ir.Constant(vector.type, None)
        low = builder.shuffle_vector(vector, undefined, mask(firsts))
        high = builder.shuffle_vector(vector, undefined, mask(seconds))
        states = states[1:] + [(combine(builder, low, high), group)]
    vector, group = states[0]
    results: list[ir.Value] = [None] * len(vectors)  # type: ignore[list-item]
    for lane, number in enumerate(group):
        results[number] = builder.extract_element(vector, ir.Constant(i32, lane))
    return results


def _lane_sum(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return builder.fadd(x, y, flags=FLOAT_FLAGS)


def _lane_max(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    # maxnum accumulators hold no NaN (see KernelCodegen._combine): one vmaxps.
    return builder.select(builder.fcmp_ordered(">", x, y), x, y)


_JOINT_COMBINE = {"sum": _lane_sum, "maxnum": _lane_max}


def _int_constant(value: ir.Value) -> int | None:
    if isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) \
            and isinstance(value.constant, int):
        return value.constant
    return None


def _fold_index(op: str, lhs: ir.Value, rhs: ir.Value) -> ir.Value | None:
    """Integer arithmetic on constants (unrolled loop indices) folded here, so the unrolled
    address arithmetic reaches LLVM as constants instead of instructions for it to fold."""
    a, b = _int_constant(lhs), _int_constant(rhs)
    if a is None and b is None:
        return None
    if op == "add" and (a == 0 or b == 0):
        return rhs if a == 0 else lhs
    if op == "mul" and (a == 1 or b == 1):
        return rhs if a == 1 else lhs
    if op == "mul" and (a == 0 or b == 0):
        return ir.Constant(lhs.type, 0)
    if op == "sub" and b == 0:
        return lhs
    if a is None or b is None:
        return None
    if op in ("add", "sub", "mul"):
        value = {"add": a + b, "sub": a - b, "mul": a * b}[op]
    elif op in ("floordiv", "mod") and a >= 0 and b > 0:  # udiv/urem on non-negatives
        value = a // b if op == "floordiv" else a % b
    else:
        return None
    if not -(2 ** 63) <= value < 2 ** 63:
        return None
    return ir.Constant(lhs.type, value)


def _const(dtype: str, value) -> ir.Constant:
    if dtype in (L.F32, L.F64):
        return ir.Constant(SCALAR_LLVM[dtype], float(value))
    return ir.Constant(SCALAR_LLVM[dtype], int(value))


def _neg(cg: KernelCodegen, value: ir.Value, dtype: str) -> ir.Value:
    return cg.b.fneg(value) if dtype in L.FLOAT_TYPES else cg.b.neg(value)


def _float_intrinsic(name: str):
    def emit(cg: KernelCodegen, value: ir.Value, dtype: str) -> ir.Value:
        return cg.b.call(cg._intrinsic(name, value.type, [value.type]), [value])
    return emit


def _abs(cg: KernelCodegen, value: ir.Value, dtype: str) -> ir.Value:
    if dtype in L.FLOAT_TYPES:
        return _float_intrinsic("llvm.fabs")(cg, value, dtype)
    function = cg._intrinsic("llvm.abs", value.type, [value.type, I1])
    return cg.b.call(function, [value, ir.Constant(I1, 0)])


def _math(op: str):
    def emit(cg: KernelCodegen, value: ir.Value, dtype: str) -> ir.Value:
        return cg.math.call(cg.b, op, value)
    return emit


# How each unary op is emitted: (codegen, operand, dtype) -> value. An op missing here is an
# error, never some other function (a name the math library happened to have).
_UNARY_EMIT = {
    L.UnaryOp.NEG: _neg,
    L.UnaryOp.SQRT: _float_intrinsic("llvm.sqrt"),
    L.UnaryOp.ABS: _abs,
    L.UnaryOp.ROUND_BF16: lambda cg, value, dtype: storage.round_bf16(cg.b, value),
    **{op: _math(op) for op in (L.UnaryOp.EXP, L.UnaryOp.LOG, L.UnaryOp.TANH, L.UnaryOp.ERF)},
}
_BINARY_OPS = frozenset(L.BinaryOp)
_REDUCE_OPS = frozenset(L.ReduceOp)


@dataclass(frozen=True)
class Emitters:
    """What this module leaves to the modules above it, handed in by the pipeline so that
    codegen imports none of them: a `Gemm` statement (tilegen/gemm.py), a loop split across
    threads and the kernel's thread-state global (tilegen/parallel.py), shared statements
    (tilegen/shared.py)."""

    gemm: Callable[[KernelCodegen, L.Gemm], None]
    parallel: Callable[[KernelCodegen, int, int, Callable], None]
    thread_state: Callable[[KernelCodegen], ir.GlobalVariable]
    # the kernel's repeated top-level statements, one function each (tilegen/shared.py):
    # `.emit(position)` calls it, or returns False for a statement to generate inline
    shared: Callable[[KernelCodegen], Any]


class KernelCodegen:
    def __init__(self, module: ir.Module, kernel: L.Kernel, symbol: str, math: MathLibrary,
                 target: Target, emitters: Emitters, profile: bool = False,
                 stack_bytes: int = 1 << 20):
        self.module = module
        self.target = target
        self.emitters = emitters
        self.profile = profile
        self.stack_bytes = stack_bytes
        self.kernel = kernel
        self.math = math
        io = list(kernel.inputs) + list(kernel.outputs)
        fnty = ir.FunctionType(I64, [PTR] * (len(io) + 1))
        self.function = ir.Function(module, fnty, name=symbol)
        self.function.attributes.add("nounwind")
        for arg, name in zip(self.function.args, io + ["err"], strict=True):
            arg.name = f"buf.{name}" if name != "err" else "err"
            arg.add_attribute("noundef")
        for arg in self.function.args[len(kernel.inputs):len(io)]:
            arg.add_attribute("noalias")
        self.pointers: dict[str, ir.Value] = dict(zip(io, self.function.args[:-1], strict=True))
        self.err = self.function.args[-1]
        self.buffers = {b.name: b for b in kernel.buffers}
        self.b = ir.IRBuilder(self.function.append_basic_block("entry"))
        self.exit_block = self.function.append_basic_block("exit")
        self.status_incoming: list[tuple[ir.Value, ir.Block]] = []
        self.cleanups: list[ir.Value] = []  # scratch blocks an error exit must free
        self.root = self
        self.block_table = ir.GlobalVariable(module, PTR, symbol + BLOCKS_SUFFIX)
        self.block_table.initializer = ir.Constant(PTR, None)
        self.block_count = 0
        self.workspace: tuple[ir.Value, ir.Value] | None = None  # (block, its slot)
        self.env: list[dict[str, Val]] = [{}]
        self.cache: list[dict[L.Expr, Val]] = [{}]
        self.lane: Lane | None = None
        self.varying_names: set[str] = set()
        self.outlined_count = 0  # parallel regions outlined so far (their names)

    def _start_helper(self, parent: KernelCodegen, function: ir.Function) -> None:
        """State for generating `function`, a helper of `parent`'s kernel (a parallel
        region, a shared statement): the kernel's buffers and block table, fresh scopes."""
        self.module = parent.module
        self.profile = False
        self.kernel = parent.kernel
        self.math = parent.math
        self.target = parent.target
        self.emitters = parent.emitters
        self.buffers = parent.buffers
        self.root = parent.root
        self.function = function
        function.linkage = "internal"
        function.attributes.add("nounwind")
        self.b = ir.IRBuilder(function.append_basic_block("entry"))
        self.exit_block = function.append_basic_block("exit")
        self.status_incoming = []
        self.cleanups = []
        self.workspace = None
        self.env = [{}]
        self.cache = [{}]
        self.lane = None
        self.varying_names = set()
        self.outlined_count = 0

    # ---- function frame -----------------------------------------------------------------------

    def build(self) -> ir.Function:
        self._allocate_temporaries()
        counters = self._profile_counters() if self.profile else None
        shared = self.emitters.shared(self)  # repeated statements: one function, many calls
        for position, stmt in enumerate(self.kernel.body):
            started = self._cycles() if counters is not None else None
            if not shared.emit(position):
                self.stmt(stmt)
            if counters is not None:
                slot = self.b.gep(counters, [ir.Constant(I64, 0), ir.Constant(I64, position)],
                                  source_etype=counters.value_type)
                slot.type = PTR  # opaque, as LLVM 22 has it
                spent = self.b.sub(self._cycles(), started)
                self.b.store(self.b.add(self.b.load(slot, typ=I64), spent), slot)
        self.exit_with(ir.Constant(I64, 0))
        self.b.position_at_end(self.exit_block)
        status = self.b.phi(I64, name="status")
        for value, block in self.status_incoming:
            status.add_incoming(value, block)
        if self.workspace is not None:
            self.release_block(*self.workspace)
        self.b.ret(status)
        self.emitters.thread_state(self)  # always there, for the runtime to bind
        count = ir.GlobalVariable(self.module, I64, self.function.name + BLOCK_COUNT_SUFFIX)
        count.initializer = ir.Constant(I64, self.block_count)
        count.global_constant = True
        return self.function

    def _allocate_temporaries(self) -> None:
        """Small temporaries on the stack up to the frame's budget; the rest carved from
        one cached workspace, sharing bytes where their live ranges allow."""
        frame = plan_frame(self.kernel, self.stack_bytes)
        for name in frame.stack:
            buffer = self.buffers[name]
            slot = self.b.alloca(SCALAR_LLVM[buffer.dtype], size=ir.Constant(I64, buffer.size),
                                 name=f"tmp.{buffer.name}")
            slot.align = 64
            slot.type = PTR  # LLVM 22 pointers are opaque; llvmlite would keep `float*`
            self.pointers[buffer.name] = slot
        offsets, total = frame.offsets, frame.heap_bytes
        if not offsets:
            return
        slot = self.block_slot(self.new_block_slots(1), ir.Constant(I64, 0))
        block = self.acquire_block(slot, total)
        self.workspace = (block, slot)
        # Running out of memory ends the call with status -1 instead of a crash; the block
        # dominates the exit block, which puts it back (null included) in its slot.
        failed = self.b.icmp_unsigned("==", block, ir.Constant(PTR, None))
        with self.b.if_then(failed, likely=False):
            self.exit_with(ir.Constant(I64, -1))
        for name, offset in offsets.items():
            pointer = self.b.gep(block, [ir.Constant(I64, offset)], source_etype=ir.IntType(8),
                                 name=f"heap.{name}")
            pointer.type = PTR
            self.pointers[name] = pointer

    # ---- cached heap blocks -------------------------------------------------------------------

    def new_block_slots(self, count: int) -> int:
        """Reserve `count` slots in the kernel's block table; returns the first."""
        root = self.root
        first = root.block_count
        root.block_count += count
        return first

    def block_slot(self, first: int, index: ir.Value) -> ir.Value:
        """Pointer to slot `first + index`, or null when the runtime gave no table."""
        table = self.b.load(self.root.block_table, typ=PTR)
        pointer = self.b.gep(table, [self.b.add(index, ir.Constant(I64, first))],
                             source_etype=PTR)
        pointer.type = PTR
        missing = self.b.icmp_unsigned("==", table, ir.Constant(PTR, None))
        return self.b.select(missing, ir.Constant(PTR, None), pointer)

    def acquire_block(self, slot: ir.Value, nbytes: int) -> ir.Value:
        """The block cached in `slot` (taking it), or a fresh malloc of `nbytes`; null only
        when malloc fails."""
        null = ir.Constant(PTR, None)
        before = self.b.block
        with self.b.if_then(self.b.icmp_unsigned("!=", slot, null)):
            taken = self.b.atomic_rmw("xchg", slot, null, "acquire")
            taken_end = self.b.block
        cached = self.b.phi(PTR)
        cached.add_incoming(null, before)
        cached.add_incoming(taken, taken_end)
        before = self.b.block
        with self.b.if_then(self.b.icmp_unsigned("==", cached, null), likely=False):
            fresh = self.b.call(self._malloc(), [ir.Constant(I64, nbytes)])
            fresh_end = self.b.block
        block = self.b.phi(PTR)
        block.add_incoming(cached, before)
        block.add_incoming(fresh, fresh_end)
        return block

    def release_block(self, block: ir.Value, slot: ir.Value) -> None:
        """Put `block` back in `slot` (freeing whatever another call left there), or free
        it when there is no slot."""
        before = self.b.block
        with self.b.if_then(self.b.icmp_unsigned("!=", slot, ir.Constant(PTR, None))):
            swapped = self.b.atomic_rmw("xchg", slot, block, "acq_rel")
            swapped_end = self.b.block
        displaced = self.b.phi(PTR)
        displaced.add_incoming(block, before)
        displaced.add_incoming(swapped, swapped_end)
        self.b.call(self._free(), [displaced])

    def _profile_counters(self) -> ir.GlobalVariable:
        """Per top-level loop nest cycle counters (TILEGEN_PROFILE): `<symbol>.cycles`."""
        array = ir.ArrayType(I64, max(1, len(self.kernel.body)))
        counters = ir.GlobalVariable(self.module, array, self.function.name + ".cycles")
        counters.initializer = ir.Constant(array, None)
        return counters

    def _cycles(self) -> ir.Value:
        return self.b.call(self.declare("llvm.readcyclecounter", ir.FunctionType(I64, [])), [])

    def exit_with(self, status: ir.Value) -> None:
        for pointer in self.cleanups:
            self.b.call(self._free(), [pointer])
        self.status_incoming.append((status, self.b.block))
        self.b.branch(self.exit_block)

    def _malloc(self) -> ir.Function:
        return self.declare("malloc", ir.FunctionType(PTR, [I64]))

    def _free(self) -> ir.Function:
        return self.declare("free", ir.FunctionType(ir.VoidType(), [PTR]))

    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        return existing if existing is not None else ir.Function(self.module, fnty, name=name)

    # ---- statements ---------------------------------------------------------------------------

    def stmt(self, stmt: L.Stmt) -> None:
        if isinstance(stmt, L.For):
            if stmt.kind == "vector" and self.lane is None and stmt.threads > 1:
                self.parallel(-(-stmt.extent // stmt.width), stmt.threads,
                              lambda child, lo, hi: child._vector_range(stmt, lo, hi))
            elif stmt.kind == "vector" and self.lane is None:
                self._vector_for(stmt)
            elif stmt.kind == "parallel" and stmt.width > 1:
                self.parallel(stmt.extent, stmt.width, lambda child, lo, hi:
                              child._serial_range(stmt, lo, hi))
            else:
                self._serial_for(stmt)
        elif isinstance(stmt, L.Gemm):
            self.emitters.gemm(self, stmt)
        elif isinstance(stmt, L.Let):
            value = self.expr(stmt.value)
            if value.vector:
                self.varying_names.add(stmt.var.name)
            self.env[-1][stmt.var.name] = value
        elif isinstance(stmt, L.Store):
            self._store(stmt)
        else:
            raise TypeError(stmt)

    def push_scope(self) -> None:
        self.env.append({})
        self.cache.append({})

    def pop_scope(self) -> None:
        self.env.pop()
        self.cache.pop()

    def _loop_body(self, loop: L.For):
        """The body of `loop` as a `_loop` callback: its statements with the index bound."""
        def body(index, carried):
            self.push_scope()
            self.env[-1][loop.var.name] = Val(index, False)
            for inner in loop.body:
                self.stmt(inner)
            self.pop_scope()
            return carried
        return body

    def _serial_for(self, loop: L.For) -> None:
        body = self._loop_body(loop)
        innermost = not any(isinstance(s, L.For) for s in loop.body)
        if innermost and self._joint_reductions(loop):
            return
        if innermost and loop.extent <= UNROLL_TRIPS:
            for index in range(loop.extent):
                body(ir.Constant(I64, index), [])
            return
        self.loop(0, loop.extent, 1, [], body)

    def _joint_reductions(self, loop: L.For) -> bool:
        """A loop whose trips each finish one vectorised float sum or max (a short row of
        dot products, as in p @ v with a narrow v; the row maxima and sums of short softmax
        rows) runs four trips at a time and finishes their reductions together: the
        accumulators are halved pairwise in shared shuffles, about a third of the
        instructions of one horizontal reduction each, with the other trips' work to
        overlap. False when the loop is not that."""
        reduce = joint_reduction(loop, in_tile=self.lane is not None)  # tilegen/emitplan.py
        if reduce is None:
            return False

        def trips(first, count: int) -> None:
            def bind(trip):
                self.push_scope()
                index = self._binary("add", Val(first, False),
                                     Val(ir.Constant(I64, trip), False), L.I64)
                self.env[-1][loop.var.name] = index

            accumulators = []
            for trip in range(count):
                bind(trip)
                accumulators.append(self._vector_accumulate(reduce)[0])
                self.pop_scope()
            totals = _joint_horizontal(self.b, accumulators, _JOINT_COMBINE[reduce.op])
            for trip, total in enumerate(totals):
                bind(trip)
                self.cache[-1][reduce] = Val(total, False)
                for stmt in loop.body:
                    self.stmt(stmt)
                self.pop_scope()

        groups = loop.extent // 4
        if groups > 1:
            self.loop(0, 4 * groups, 4, [], lambda index, carried: trips(index, 4) or carried)
        elif groups == 1:
            trips(ir.Constant(I64, 0), 4)
        done = 4 * groups
        if loop.extent - done >= 2:
            trips(ir.Constant(I64, done), 2)
            done += 2
        if done < loop.extent:
            self._loop_body(loop)(ir.Constant(I64, done), [])
        return True

    def _serial_range(self, loop: L.For, lo, hi) -> None:
        self.loop(lo, hi, 1, [], self._loop_body(loop))

    # ---- threads ------------------------------------------------------------------------------

    def parallel(self, extent: int, threads: int, body) -> None:
        """Run `body(child, lo, hi)` over [0, extent) split across up to `threads` OpenMP
        threads (tilegen/parallel.py)."""
        self.emitters.parallel(self, extent, threads, body)

    def _vector_for(self, loop: L.For) -> None:
        width = loop.width
        main = loop.extent // width * width
        if main and main // width <= UNROLL_TRIPS:
            for base in range(0, main, width):
                self._in_tile(loop.var.name, width, ir.Constant(I64, base), None, loop.body)
        elif main:
            def body(index, carried):
                self._in_tile(loop.var.name, width, index, None, loop.body)
                return carried
            self.loop(0, main, width, [], body)
        if loop.extent - main:
            self._tail_tile(loop)

    def _tail_tile(self, loop: L.For) -> None:
        """A vector loop's last extent % width elements, as one narrow (4/8-lane) tile."""
        main = loop.extent // loop.width * loop.width
        active = loop.extent - main
        narrow = tail_width(loop.width, active)
        mask = self._tail_mask(narrow, active) if active < narrow else None
        self._in_tile(loop.var.name, narrow, ir.Constant(I64, main), mask, loop.body)

    def _vector_range(self, loop: L.For, first_tile, end_tile) -> None:
        """The tiles [first_tile, end_tile) of a vector loop (one thread's share): whole
        tiles in a loop, and the loop's tail tile if the share ends with it."""
        width = loop.width
        whole = loop.extent // width
        stop = self.b.select(self.b.icmp_signed("<", end_tile, ir.Constant(I64, whole)),
                             end_tile, ir.Constant(I64, whole))
        tiles = ir.Constant(I64, width)

        def body(index, carried):
            self._in_tile(loop.var.name, width, index, None, loop.body)
            return carried
        self.loop(self.b.mul(first_tile, tiles), self.b.mul(stop, tiles), width, [], body)
        if loop.extent - whole * width:
            with self.b.if_then(self.b.icmp_signed(">", end_tile, ir.Constant(I64, whole))):
                self._tail_tile(loop)

    def _in_tile(self, var, width, base, mask, body) -> None:
        saved = self.lane
        self.lane = Lane(var, width, base, mask)
        self.push_scope()
        for inner in body:
            self.stmt(inner)
        self.pop_scope()
        self.lane = saved

    def _tail_mask(self, width: int, active: int) -> ir.Value:
        return ir.Constant(ir.VectorType(I1, width), [1 if i < active else 0
                                                      for i in range(width)])

    def loop(self, start, stop, step: int, inits: list[ir.Value], body):
        """A counted loop [start, stop) by `step` carrying values. Static bounds must have
        stop > start; runtime (ir.Value) bounds are checked first and may be empty. Short
        static reductions (at most UNROLL_TRIPS trips) are emitted unrolled: most of what
        LLVM's unroller bought here, at a fraction of its compile time."""
        if inits and isinstance(start, int) and isinstance(stop, int) and \
                -(-(stop - start) // step) <= UNROLL_TRIPS:
            carried = list(inits)
            for index in range(start, stop, step):
                carried = body(ir.Constant(I64, index), carried)
            return carried
        start_value = ir.Constant(I64, start) if isinstance(start, int) else start
        stop_value = ir.Constant(I64, stop) if isinstance(stop, int) else stop
        guarded = not (isinstance(start, int) and isinstance(stop, int))
        pre = self.b.block
        after = self.function.append_basic_block("after")
        if guarded:
            run = self.function.append_basic_block("run")
            self.b.cbranch(self.b.icmp_signed("<", start_value, stop_value), run, after)
            self.b.position_at_end(run)
        entry = self.b.block
        header = self.function.append_basic_block("loop")
        self.b.branch(header)
        self.b.position_at_end(header)
        index = self.b.phi(I64, name="i")
        index.add_incoming(start_value, entry)
        phis = []
        for init in inits:
            phi = self.b.phi(init.type)
            phi.add_incoming(init, entry)
            phis.append(phi)
        updated = body(index, phis)
        following = self.b.add(index, ir.Constant(I64, step), flags=("nsw",))
        latch = self.b.block
        index.add_incoming(following, latch)
        for phi, value in zip(phis, updated, strict=True):
            phi.add_incoming(value, latch)
        self.b.cbranch(self.b.icmp_signed("<", following, stop_value), header, after)
        self.b.position_at_end(after)
        if not guarded:
            return updated
        results = []
        for init, value in zip(inits, updated, strict=True):
            merged = self.b.phi(init.type)
            merged.add_incoming(init, pre)
            merged.add_incoming(value, latch)
            results.append(merged)
        return results

    # ---- memory -------------------------------------------------------------------------------

    def _flat_offset(self, buffer: L.Buffer, index: tuple[L.Expr, ...]) -> L.Expr:
        flat: L.Expr = L.const(0)
        for component, stride in zip(index, buffer.strides, strict=True):
            flat = L.add(flat, L.mul(component, L.const(stride)))
        return flat

    def _address_plan(self, buffer: L.Buffer, index: tuple[L.Expr, ...]):
        """('scalar', offset) | ('contiguous', offset) | ('strided', offset, coeff) |
        ('gather', offsets) for the current tile."""
        flat = self._flat_offset(buffer, index)
        lane = self.lane
        if lane is None or not self._depends_on_lane(flat):
            return ("scalar", self.expr(flat).value)
        affine = to_affine(flat)
        if any(self._depends_on_lane(e) for e, _ in affine.opaque):
            return ("gather", self.as_vector(self.expr(flat)))
        coefficient = affine.coefficient(lane.var)
        base = self._uniform(flat)
        if coefficient == 1:
            return ("contiguous", base)
        return ("strided", base, coefficient)

    def _uniform(self, expr: L.Expr) -> ir.Value:
        """`expr` evaluated with the lane variable at the tile's base (lane 0)."""
        lane, cache = self.lane, self.cache
        # Cached values may be vectors of this tile; evaluate from a clean cache (LLVM's CSE
        # merges what is recomputed).
        self.lane, self.cache = None, [{}]
        self.push_scope()
        self.env[-1][lane.var] = Val(lane.base, False)
        try:
            value = self.expr(expr)
        finally:
            self.pop_scope()
            self.lane, self.cache = lane, cache
        return value.value

    def _depends_on_lane(self, expr: L.Expr) -> bool:
        names = L.free_vars(expr)
        return self.lane is not None and (self.lane.var in names or
                                          bool(names & self.varying_names))

    def _element_pointer(self, buffer: L.Buffer, offset: ir.Value) -> ir.Value:
        return self.b.gep(self.pointers[buffer.name], [offset], inbounds=True,
                          source_etype=SCALAR_LLVM[buffer.dtype])

    def _vector_gep(self, buffer: L.Buffer, offsets: ir.Value) -> ir.Value:
        pointers = self.b.gep(self.pointers[buffer.name], [offsets], inbounds=True,
                              source_etype=SCALAR_LLVM[buffer.dtype])
        # llvmlite types a GEP by its base pointer; with vector offsets it yields a vector of
        # pointers.
        pointers.type = ir.VectorType(PTR, offsets.type.count)
        return pointers

    def _lane_offsets(self, base: ir.Value, coefficient: int) -> ir.Value:
        width = self.lane.width
        steps = ir.Constant(ir.VectorType(I64, width), [i * coefficient for i in range(width)])
        return self.b.add(self.splat(base, width), steps)

    def _load(self, load: L.Load) -> Val:
        loaded = self._load_stored(load)
        kind = self.buffers[load.buffer].dtype
        if kind in storage.STORAGE_LLVM:
            return Val(storage.widen(self.b, loaded.value, kind), loaded.vector)
        return loaded

    def _load_stored(self, load: L.Load) -> Val:
        buffer = self.buffers[load.buffer]
        element = SCALAR_LLVM[buffer.dtype]
        plan = self._address_plan(buffer, load.index)
        if plan[0] == "scalar":
            return Val(self.b.load(self._element_pointer(buffer, plan[1]), typ=element), False)
        width = self.lane.width
        vtype = ir.VectorType(element, width)
        mask = self.lane.mask
        if plan[0] == "contiguous":
            pointer = self._element_pointer(buffer, plan[1])
            if mask is None:
                return Val(self.b.load(pointer, typ=vtype, align=L.ELEMENT_BYTES[buffer.dtype]),
                           True)
            intrinsic = self._intrinsic("llvm.masked.load", vtype, [PTR, I32, mask.type, vtype])
            return Val(self.b.call(intrinsic, [pointer, ir.Constant(I32, L.ELEMENT_BYTES[
                buffer.dtype]), mask, ir.Constant(vtype, None)]), True)
        offsets = self._lane_offsets(plan[1], plan[2]) if plan[0] == "strided" else plan[1]
        return Val(self._gather(buffer, offsets, vtype), True)

    def _gather(self, buffer: L.Buffer, offsets: ir.Value, vtype: ir.VectorType) -> ir.Value:
        width = vtype.count
        pointers = self._vector_gep(buffer, offsets)
        mask = self.lane.mask if self.lane.mask is not None else ir.Constant(
            ir.VectorType(I1, width), [1] * width)
        intrinsic = self._intrinsic("llvm.masked.gather", vtype,
                                    [ir.VectorType(PTR, width), I32, mask.type, vtype])
        return self.b.call(intrinsic, [pointers, ir.Constant(I32, L.ELEMENT_BYTES[buffer.dtype]),
                                       mask, ir.Constant(vtype, None)])

    def _store(self, store: L.Store) -> None:
        buffer = self.buffers[store.buffer]
        element = SCALAR_LLVM[buffer.dtype]
        value = self.expr(store.value)
        if buffer.dtype in storage.STORAGE_LLVM:
            value = Val(storage.narrow(self.b, value.value, buffer.dtype), value.vector)
        plan = self._address_plan(buffer, store.index)
        if plan[0] == "scalar":
            if value.vector:
                raise AssertionError("a varying value stored to one address")
            self.b.store(value.value, self._element_pointer(buffer, plan[1]))
            return
        width = self.lane.width
        vtype = ir.VectorType(element, width)
        vector = self.as_vector(value)
        mask = self.lane.mask
        if plan[0] == "contiguous":
            pointer = self._element_pointer(buffer, plan[1])
            if mask is None:
                self.b.store(vector, pointer, align=L.ELEMENT_BYTES[buffer.dtype])
                return
            intrinsic = self._intrinsic("llvm.masked.store", None,
                                        [vtype, PTR, I32, mask.type], overload=(vtype,))
            self.b.call(intrinsic, [vector, pointer, ir.Constant(I32, L.ELEMENT_BYTES[
                buffer.dtype]), mask])
            return
        offsets = (self._lane_offsets(plan[1], plan[2]) if plan[0] == "strided" else plan[1])
        pointers = self._vector_gep(buffer, offsets)
        mask = mask if mask is not None else ir.Constant(ir.VectorType(I1, width), [1] * width)
        intrinsic = self._intrinsic("llvm.masked.scatter", None,
                                    [vtype, ir.VectorType(PTR, width), I32, mask.type],
                                    overload=(vtype,))
        self.b.call(intrinsic, [vector, pointers, ir.Constant(I32, L.ELEMENT_BYTES[buffer.dtype]),
                                mask])

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, expr: L.Expr) -> Val:
        for cache in reversed(self.cache):
            hit = cache.get(expr)
            if hit is not None:
                return hit
        value = self._expr(expr)
        self.cache[-1][expr] = value
        return value

    def _expr(self, expr: L.Expr) -> Val:
        if isinstance(expr, L.Const):
            return Val(_const(expr.dtype, expr.value), False)
        if isinstance(expr, L.Var):
            return self._var(expr)
        if isinstance(expr, L.Load):
            return self._load(expr)
        if isinstance(expr, L.Binary):
            return self._binary(expr.op, self.expr(expr.lhs), self.expr(expr.rhs),
                                expr.lhs.dtype)
        if isinstance(expr, L.Unary):
            return self._unary(expr.op, self.expr(expr.operand), expr.dtype)
        if isinstance(expr, L.Select):
            cond, yes, no = (self.expr(expr.cond), self.expr(expr.if_true),
                             self.expr(expr.if_false))
            cond, yes, no = self._unify(cond, yes, no)
            return Val(self.b.select(cond.value, yes.value, no.value), cond.vector)
        if isinstance(expr, L.Cast):
            return self._cast(self.expr(expr.operand), expr.operand.dtype, expr.dtype)
        if isinstance(expr, L.Reduce):
            return self._reduce(expr)
        if isinstance(expr, L.CheckedId):
            return self._checked_id(expr)
        raise TypeError(expr)

    def _var(self, var: L.Var) -> Val:
        if self.lane is not None and var.name == self.lane.var:
            return Val(self._lane_offsets(self.lane.base, 1), True)
        for scope in reversed(self.env):
            if var.name in scope:
                return scope[var.name]
        raise KeyError(f"unbound variable {var.name}")

    def splat(self, value: ir.Value, width: int) -> ir.Value:
        vtype = ir.VectorType(value.type, width)
        inserted = self.b.insert_element(ir.Constant(vtype, None), value, ir.Constant(I32, 0))
        return self.b.shuffle_vector(inserted, ir.Constant(vtype, None),
                                     ir.Constant(ir.VectorType(I32, width), [0] * width))

    def as_vector(self, value: Val) -> ir.Value:
        return value.value if value.vector else self.splat(value.value, self.lane.width)

    def _unify(self, *values: Val) -> tuple[Val, ...]:
        if any(v.vector for v in values):
            return tuple(Val(self.as_vector(v), True) for v in values)
        return values

    def _binary(self, op: str, lhs: Val, rhs: Val, dtype: str) -> Val:
        if op not in _BINARY_OPS:  # the branches below cover exactly these
            raise L.unknown_op("binary", op, L.BinaryOp)
        lhs, rhs = self._unify(lhs, rhs)
        a, b, vector = lhs.value, rhs.value, lhs.vector
        is_float = dtype in L.FLOAT_TYPES
        builder = self.b
        if op in L.COMPARISONS:
            symbol = {"lt": "<", "le": "<=", "eq": "==", "ne": "!=", "gt": ">", "ge": ">="}[op]
            if is_float:
                result = (builder.fcmp_unordered(symbol, a, b) if op == "ne"
                          else builder.fcmp_ordered(symbol, a, b))
            else:
                result = builder.icmp_signed(symbol, a, b)
            return Val(result, vector)
        if op in ("and", "or"):
            return Val(builder.and_(a, b) if op == "and" else builder.or_(a, b), vector)
        if is_float:
            if op in ("max", "min"):
                name = "llvm.maximum" if op == "max" else "llvm.minimum"
                return Val(builder.call(self._intrinsic(name, a.type, [a.type, a.type]), [a, b]),
                           vector)
            method = {"add": builder.fadd, "sub": builder.fsub, "mul": builder.fmul,
                      "div": builder.fdiv}[op]
            return Val(method(a, b, flags=FLOAT_FLAGS), vector)
        if op in ("max", "min"):
            name = "llvm.smax" if op == "max" else "llvm.smin"
            return Val(builder.call(self._intrinsic(name, a.type, [a.type, a.type]), [a, b]),
                       vector)
        if not vector:
            folded = _fold_index(op, a, b)
            if folded is not None:
                return Val(folded, False)
        method = {"add": builder.add, "sub": builder.sub, "mul": builder.mul,
                  "div": builder.sdiv, "floordiv": builder.udiv, "mod": builder.urem}[op]
        return Val(method(a, b), vector)

    def _unary(self, op: str, operand: Val, dtype: str) -> Val:
        emit = _UNARY_EMIT.get(op)
        if emit is None:
            raise L.unknown_op("unary", op, L.UnaryOp)
        return Val(emit(self, operand.value, dtype), operand.vector)

    def _cast(self, value: Val, source: str, target: str) -> Val:
        ty = SCALAR_LLVM[target]
        if value.vector:
            ty = ir.VectorType(ty, self.lane.width)
        if source == target:
            return value
        if source == L.I64 and target in L.FLOAT_TYPES:
            return Val(self.b.sitofp(value.value, ty), value.vector)
        if source in L.FLOAT_TYPES and target == L.I64:
            # Saturating: NaN gives 0 and out-of-range values the nearest bound (plain
            # fptosi would be poison there).
            function = self._intrinsic("llvm.fptosi.sat", ty, [value.value.type],
                                       overload=(ty, value.value.type))
            return Val(self.b.call(function, [value.value]), value.vector)
        if source == L.F32 and target == L.F64:
            return Val(self.b.fpext(value.value, ty), value.vector)
        if source == L.F64 and target == L.F32:
            return Val(self.b.fptrunc(value.value, ty), value.vector)
        if source == L.BOOL:
            return Val(self.b.uitofp(value.value, ty) if target in L.FLOAT_TYPES
                       else self.b.zext(value.value, ty), value.vector)
        if target == L.BOOL:  # nonzero is true; NaN is nonzero, as in NumPy
            zero = ir.Constant(value.value.type, None)
            return Val(self.b.fcmp_unordered("!=", value.value, zero) if source in
                       L.FLOAT_TYPES else self.b.icmp_signed("!=", value.value, zero),
                       value.vector)
        raise TypeError(f"cast {source} -> {target}")

    # ---- reductions ---------------------------------------------------------------------------

    def _identity(self, op: str, dtype: str) -> ir.Constant:
        if op == "sum":
            return _const(dtype, 0)
        if dtype in L.FLOAT_TYPES:
            return _const(dtype, float("-inf"))
        return _const(dtype, -(2**63))

    def _reduce(self, reduce: L.Reduce) -> Val:
        if reduce.op not in _REDUCE_OPS:  # _combine's last branch would take it as argmax
            raise L.unknown_op("reduction", reduce.op, L.ReduceOp)
        if reduce.vector_width and self.lane is None:
            return self._vector_reduce(reduce)
        varying = self._depends_on_lane(reduce)
        body_dtype = reduce.body.dtype
        width = self.lane.width if varying else 0

        def typed(constant: ir.Constant) -> ir.Value:
            return ir.Constant(ir.VectorType(constant.type, width),
                               [constant.constant] * width) if width else constant

        if reduce.op == "argmax":
            inits = [typed(self._identity("max", body_dtype)), typed(ir.Constant(I64, 0))]
        elif reduce.op == "max" and body_dtype in L.FLOAT_TYPES:
            inits = [typed(self._identity("max", body_dtype)), typed(ir.Constant(I1, 0))]
        else:
            inits = [typed(self._identity(reduce.op, reduce.dtype))]

        def body(index, carried):
            self.push_scope()
            self.env[-1][reduce.var.name] = Val(index, False)
            value = self.expr(reduce.body)
            self.pop_scope()
            if varying and not value.vector:
                value = Val(self.splat(value.value, width), True)
            return self._combine(reduce.op, carried, value, index, body_dtype, varying)

        final = self.loop(0, reduce.extent, 1, inits, body)
        if reduce.op == "argmax":
            return Val(final[-1], varying)
        if reduce.op == "max" and body_dtype in L.FLOAT_TYPES:
            return Val(self._nan_if(final[1], final[0], body_dtype), varying)
        return Val(final[0], varying)

    def _nan_if(self, flag: ir.Value, value: ir.Value, dtype: str) -> ir.Value:
        nan = _const(dtype, float("nan"))
        if isinstance(value.type, ir.VectorType):
            nan = ir.Constant(value.type, [nan.constant] * value.type.count)
        return self.b.select(flag, nan, value)

    def _combine(self, op: str, carried, value: Val, index, dtype: str, varying: bool):
        if op == "sum":
            return [self._binary("add", Val(carried[0], varying), value, dtype).value]
        if op == "maxnum":
            best = Val(carried[0], varying)
            greater = self._binary("gt", value, best, dtype)
            return [self.b.select(greater.value, value.value, best.value)]
        if op == "max" and dtype in L.FLOAT_TYPES:
            # A plain compare-and-select max (one vmaxps) and a separate NaN flag: cheaper
            # than llvm.maximum's NaN handling at every step; the flag makes the result NaN
            # at the end, as numpy's max does.
            best = Val(carried[0], varying)
            greater = self._binary("gt", value, best, dtype)
            is_nan = self._binary("ne", value, value, dtype)
            return [self.b.select(greater.value, value.value, best.value),
                    self.b.or_(carried[1], is_nan.value)]
        if op == "max":
            return [self._binary("max", Val(carried[0], varying), value, dtype).value]
        best, best_index = carried
        greater = self._binary("gt", value, Val(best, varying), dtype)
        if dtype in L.FLOAT_TYPES:
            # numpy's argmax: a NaN is the maximum and the first NaN wins.
            value_nan = self._binary("ne", value, value, dtype)
            best_nan = self._binary("ne", Val(best, varying), Val(best, varying), dtype)
            not_best_nan = Val(self.b.xor(best_nan.value, ir.Constant(best_nan.value.type,
                                                                      -1)), varying)
            first_nan = self._binary("and", value_nan, not_best_nan, L.BOOL)
            greater = self._binary("or", greater, first_nan, L.BOOL)
        index_val = Val(index, False)
        if varying:
            index_val = Val(self.splat(index, self.lane.width), True)
        new_best = self.b.select(greater.value, value.value, best)
        new_index = self.b.select(greater.value, index_val.value, best_index)
        return [new_best, new_index]

    def _vector_reduce(self, reduce: L.Reduce) -> Val:
        return self._finish_vector_reduce(reduce, self._vector_accumulate(reduce))

    def _vector_accumulate(self, reduce: L.Reduce) -> list[ir.Value]:
        """The lane-wise accumulators of a vectorised reduction (before the horizontal
        combine): [sum] or [max, NaN flags]."""
        width = reduce.vector_width
        dtype = reduce.dtype
        vtype = ir.VectorType(SCALAR_LLVM[dtype], width)
        identity = self._identity(reduce.op, dtype)
        init = ir.Constant(vtype, [identity.constant] * width)
        main = reduce.extent // width * width
        float_max = reduce.op == "max" and dtype in L.FLOAT_TYPES

        def tile(base, mask, carried, tile_width=width):
            """One tile folded into `carried`; None: the tile starts the accumulator."""
            saved = self.lane
            self.lane = Lane(reduce.var.name, tile_width, base, mask)
            self.push_scope()
            value = self.as_vector(self.expr(reduce.body))
            self.pop_scope()
            if tile_width < width or mask is not None:
                # Masked-off lanes, and the lanes a narrow tail lacks, hold the identity.
                fill = ir.Constant(ir.VectorType(vtype.element, tile_width),
                                   [identity.constant] * tile_width)
                if mask is not None:
                    value = self.b.select(mask, value, fill)
                if tile_width < width:
                    value = self.b.shuffle_vector(value, fill, ir.Constant(
                        ir.VectorType(ir.IntType(32), width),
                        [min(lane, tile_width) for lane in range(width)]))
            if carried is None:
                # 0 + x is x (a -0 stays -0, as numpy's sum keeps it): skip the add.
                # maxnum's first combine stays: it is what keeps NaN out of the accumulator.
                combined = [value]
            else:
                combined = self._combine(reduce.op, carried, Val(value, True), None, dtype,
                                         True)
            self.lane = saved
            return combined

        carried = [init, ir.Constant(ir.VectorType(I1, width), [0] * width)] if float_max \
            else [init]
        start = 0
        if reduce.op == "sum" and main:
            carried = tile(ir.Constant(I64, 0), None, None)
            start = width
        if main > start:
            carried = self.loop(start, main, width, carried,
                                 lambda index, acc: tile(index, None, acc))
        if reduce.extent - main:
            active = reduce.extent - main
            narrow = tail_width(width, active)
            carried = tile(ir.Constant(I64, main),
                           self._tail_mask(narrow, active) if active < narrow else None,
                           carried, narrow)
        return carried

    def _finish_vector_reduce(self, reduce: L.Reduce, carried: list[ir.Value]) -> Val:
        width, dtype = reduce.vector_width, reduce.dtype
        vtype = ir.VectorType(SCALAR_LLVM[dtype], width)
        float_max = reduce.op == "max" and dtype in L.FLOAT_TYPES
        accumulator = carried[0]
        if reduce.op == "sum":
            name = "llvm.vector.reduce.fadd" if dtype in L.FLOAT_TYPES else \
                "llvm.vector.reduce.add"
            if dtype in L.FLOAT_TYPES:
                intrinsic = self._intrinsic(name, SCALAR_LLVM[dtype], [SCALAR_LLVM[dtype], vtype],
                                            overload=(vtype,))
                result = self.b.call(intrinsic, [ir.Constant(SCALAR_LLVM[dtype], -0.0),
                                                 accumulator], fastmath=("reassoc",))
            else:
                intrinsic = self._intrinsic(name, SCALAR_LLVM[dtype], [vtype], overload=(vtype,))
                result = self.b.call(intrinsic, [accumulator])
        elif float_max or reduce.op == "maxnum":
            # The accumulator holds no NaN (see _combine): maxnum's plain vmaxps tree.
            intrinsic = self._intrinsic("llvm.vector.reduce.fmax", SCALAR_LLVM[dtype], [vtype],
                                        overload=(vtype,))
            result = self.b.call(intrinsic, [accumulator], fastmath=("nnan",))
            if float_max:
                flags = carried[1]
                any_nan = self.b.icmp_unsigned("!=", self.b.bitcast(flags, ir.IntType(width)),
                                               ir.Constant(ir.IntType(width), 0))
                result = self._nan_if(any_nan, result, dtype)
        else:
            intrinsic = self._intrinsic("llvm.vector.reduce.smax", SCALAR_LLVM[dtype], [vtype],
                                        overload=(vtype,))
            result = self.b.call(intrinsic, [accumulator])
        return Val(result, False)

    # ---- id checks ----------------------------------------------------------------------------

    def _checked_id(self, check: L.CheckedId) -> Val:
        value = self.expr(check.value)
        limit = ir.Constant(I64, check.limit)
        if value.vector:
            limit = self.splat(limit, self.lane.width)
        outside = self.b.icmp_unsigned(">=", value.value, limit)
        if value.vector:
            if self.lane.mask is not None:
                outside = self.b.and_(outside, self.lane.mask)
            bits = self.b.bitcast(outside, ir.IntType(self.lane.width))
            any_outside = self.b.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0))
        else:
            any_outside = outside
        with self.b.if_then(any_outside, likely=False):
            # Values computed on this error path must not be cached for the code after it,
            # which this block does not dominate.
            self.push_scope()
            shape = self.kernel.check_sites[check.site].ids_shape
            position = self.expr(_linear(check.position, shape))
            bad_value, bad_position = value.value, position.value
            if value.vector:
                lane = self.b.call(self._intrinsic("llvm.cttz", bits.type, [bits.type, I1]),
                                   [bits, ir.Constant(I1, 0)])
                lane = self.b.zext(lane, I32) if bits.type.width < 32 else \
                    self.b.trunc(lane, I32) if bits.type.width > 32 else lane
                bad_value = self.b.extract_element(value.value, lane)
                if position.vector:
                    bad_position = self.b.extract_element(position.value, lane)
            for slot, item in enumerate((ir.Constant(I64, check.site), bad_value, bad_position)):
                pointer = self.b.gep(self.err, [ir.Constant(I64, slot)], source_etype=I64)
                self.b.store(item, pointer)
            self.exit_with(ir.Constant(I64, check.site + 1))
            self.pop_scope()
        return value

    # ---- intrinsics ---------------------------------------------------------------------------

    def _intrinsic(self, name: str, ret, args, overload=None) -> ir.Function:
        types = overload if overload is not None else ((ret,) if ret is not None else ())
        suffix = ""
        for ty in types:
            suffix += "." + _type_suffix(ty)
        if name in ("llvm.masked.load", "llvm.masked.store"):
            suffix += ".p0"
        if name in ("llvm.masked.gather", "llvm.masked.scatter"):
            width = (ret or overload[0]).count
            suffix += f".v{width}p0"
        full = name + suffix
        existing = self.module.globals.get(full)
        if existing is not None:
            return existing
        return ir.Function(self.module, ir.FunctionType(ret or ir.VoidType(), args), name=full)


def _type_suffix(ty) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_type_suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    raise TypeError(ty)


def _linear(index: tuple[L.Expr, ...], shape: tuple[int, ...]) -> L.Expr:
    flat: L.Expr = L.const(0)
    stride = 1
    for position in reversed(range(len(shape))):
        flat = L.add(flat, L.mul(index[position], L.const(stride)))
        stride *= shape[position]
    return flat
