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
from .codegen_expr import ExpressionCodegen
from .codegen_memory import MemoryCodegen
from .codegen_reduce import ReductionCodegen
from .codegen_values import (
    BLOCK_COUNT_SUFFIX,
    BLOCKS_SUFFIX,
    I1,
    I32,
    I64,
    PROFILE_COUNTERS,
    PTR,
    SCALAR_LLVM,
    Lane,
    Val,
    int_constant,
    linear_offset,
    type_suffix,
)
from .emitplan import UNROLL_TRIPS, tail_width
from .frame import ALIGN, plan_frame
from .irbuilder import Builder
from .micro_kernel import cache_line_aligned
from .target import Target
from .vecmath import MathLibrary

CLOCK_PROCESS_CPUTIME_ID = 2  # <time.h> on Linux (x86-64 and aarch64)


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
    # a fused attention statement, forward or backward (tilegen/attention_codegen.py,
    # tilegen/attention_backward_codegen.py)
    attention: Callable[[KernelCodegen, L.Stmt], None]


def _as_int(bound):
    """A loop bound as a Python int where it is a constant (from folded arithmetic)."""
    number = int_constant(bound) if isinstance(bound, ir.Value) else None
    return bound if number is None else number


class KernelCodegen(ExpressionCodegen, ReductionCodegen, MemoryCodegen):
    def __init__(self, module: ir.Module, kernel: L.Kernel, symbol: str, math: MathLibrary,
                 target: Target, emitters: Emitters, profile: str = "",
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
        self.b = Builder(self.function.append_basic_block("entry"))
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
        self.profile = ""
        self.kernel = parent.kernel
        self.math = parent.math
        self.target = parent.target
        self.emitters = parent.emitters
        self.buffers = parent.buffers
        self.root = parent.root
        self.function = function
        function.linkage = "internal"
        function.attributes.add("nounwind")
        self.b = Builder(function.append_basic_block("entry"))
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
            started = self._clock() if counters is not None else None
            if not shared.emit(position):
                self.stmt(stmt)
            if counters is not None:
                slot = self.b.gep(counters, [ir.Constant(I64, 0), ir.Constant(I64, position)],
                                  source_etype=counters.value_type)
                slot.type = PTR  # opaque, as LLVM 22 has it
                spent = self.b.sub(self._clock(), started)
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
        # ALIGN bytes to spare: malloc returns blocks this large 16 bytes past a page, which
        # put every temporary 16 bytes past a cache line, so each 64-byte vector access
        # and each row of an AMX tile read or written there touched two lines.
        block = self.acquire_block(slot, total + ALIGN)
        self.workspace = (block, slot)
        # Running out of memory ends the call with status -1 instead of a crash; the block
        # dominates the exit block, which puts it back (null included) in its slot.
        failed = self.b.icmp_unsigned("==", block, ir.Constant(PTR, None))
        with self.b.if_then(failed, likely=False):
            self.exit_with(ir.Constant(I64, -1))
        base = cache_line_aligned(self.b, block)
        for name, offset in offsets.items():
            pointer = self.b.gep(base, [ir.Constant(I64, offset)], source_etype=ir.IntType(8),
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
        """Per top-level loop nest counters (TILEGEN_PROFILE), named by PROFILE_COUNTERS."""
        array = ir.ArrayType(I64, max(1, len(self.kernel.body)))
        suffix = PROFILE_COUNTERS[self.profile][0]
        counters = ir.GlobalVariable(self.module, array, self.function.name + suffix)
        counters.initializer = ir.Constant(array, None)
        if self.profile == "cpu":
            self._timespec = self.b.alloca(ir.ArrayType(I64, 2), name="profile.timespec")
            self._timespec.type = PTR
        return counters

    def _clock(self) -> ir.Value:
        if self.profile != "cpu":
            return self.b.call(self.declare("llvm.readcyclecounter",
                                            ir.FunctionType(I64, [])), [])
        # All threads' CPU time, so a parallel nest counts its workers too; time the
        # process spends preempted on a loaded machine is not counted, as cycles would be.
        clock_gettime = self.declare("clock_gettime", ir.FunctionType(I32, [I32, PTR]))
        self.b.call(clock_gettime, [ir.Constant(I32, CLOCK_PROCESS_CPUTIME_ID),
                                    self._timespec])
        seconds = self.b.load(self._timespec, typ=I64)
        fraction = self.b.gep(self._timespec, [ir.Constant(I64, 1)], source_etype=I64)
        fraction.type = PTR
        nanoseconds = self.b.load(fraction, typ=I64)
        return self.b.add(self.b.mul(seconds, ir.Constant(I64, 1_000_000_000)), nanoseconds)

    def exit_with(self, status: ir.Value) -> None:
        for pointer in self.cleanups:
            self.b.call(self._free(), [pointer])
        self.status_incoming.append((status, self.b.block))
        self.b.branch(self.exit_block)

    def exit_if_failed(self, status: ir.Value) -> None:
        """End the function with `status` (a call's) when it is not 0: one branch to the
        exit block where no cleanup or record must be written first (a kernel calls its
        shared statements one after another, and an extra block per call cost LLVM ~0.05 s
        of MiniLM's compile), else through `exit_with`."""
        failed = self.b.icmp_signed("!=", status, ir.Constant(I64, 0))
        if self.cleanups or type(self).exit_with is not KernelCodegen.exit_with:
            with self.b.if_then(failed, likely=False):
                self.exit_with(status)
            return
        following = self.function.append_basic_block("ok")
        self.b.cbranch(failed, self.exit_block, following).set_weights([1, 99])
        self.status_incoming.append((status, self.b.block))
        self.b.position_at_end(following)

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
        elif isinstance(stmt, (L.Attention, L.FusedStmt)):
            self.emitters.attention(self, stmt)
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
                self._in_tile(loop.var.name, width, ir.Constant(I64, base), None, loop.body,
                              aligned=width)
        elif main:
            def body(index, carried):
                self._in_tile(loop.var.name, width, index, None, loop.body, aligned=width)
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
        self._in_tile(loop.var.name, narrow, ir.Constant(I64, main), mask, loop.body,
                      aligned=loop.width)

    def _vector_range(self, loop: L.For, first_tile, end_tile) -> None:
        """The tiles [first_tile, end_tile) of a vector loop (one thread's share): whole
        tiles in a loop, and the loop's tail tile if the share ends with it."""
        width = loop.width
        whole = loop.extent // width
        stop = self.b.select(self.b.icmp_signed("<", end_tile, ir.Constant(I64, whole)),
                             end_tile, ir.Constant(I64, whole))
        tiles = ir.Constant(I64, width)

        def body(index, carried):
            self._in_tile(loop.var.name, width, index, None, loop.body, aligned=width)
            return carried
        self.loop(self.b.mul(first_tile, tiles), self.b.mul(stop, tiles), width, [], body)
        if loop.extent - whole * width:
            with self.b.if_then(self.b.icmp_signed(">", end_tile, ir.Constant(I64, whole))):
                self._tail_tile(loop)

    def _in_tile(self, var, width, base, mask, body, aligned: int = 1) -> None:
        saved = self.lane
        self.lane = Lane(var, width, base, mask, aligned)
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
        start = _as_int(start)
        stop = _as_int(stop)
        static = isinstance(start, int) and isinstance(stop, int)
        if static and stop <= start:  # folded runtime bounds may leave an empty loop
            return list(inits)
        if static and stop - start <= step:
            # One trip (a gemm's only column block): the body once, its index a constant
            # that the builder folds into the arithmetic depending on it.
            return body(ir.Constant(I64, start), list(inits))
        if inits and static and -(-(stop - start) // step) <= UNROLL_TRIPS:
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
            position = self.expr(linear_offset(check.position, shape))
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
            suffix += "." + type_suffix(ty)
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


