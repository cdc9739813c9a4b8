"""Parallel regions: a loop's body outlined into `void fn(ptr context)` and run by libgomp.

`emit_parallel` outlines the body, stores every visible scalar and the buffer pointers the
body uses in a context block, and calls `GOMP_parallel`. Two things are decided at run
time, not compile time:

- **How many threads.** Each kernel has a pointer `<symbol>.threads` that the runtime sets
  to its parallel state (`tilegen/forksafe.py`): `state[0]` caps the thread count and
  `state[1]` records that a parallel region ran. libgomp's worker pool does not survive
  `fork`: a child that asks for two threads waits forever for workers that only exist in
  the parent, while a region of one thread runs on the caller alone. The runtime therefore
  sets the cap to 1 in a child forked after a parallel region. A null pointer (a `.so`
  used without the tilegen runtime) means no cap.
- **Which id error is reported.** Each thread runs one contiguous chunk in order and stops
  at its first failing id check, recording it in its own slot of a per-thread record; the
  lowest-numbered thread that failed holds the failure that a serial run meets first (the
  chunks are in iteration order), and that is the one reported.
"""

from __future__ import annotations

from llvmlite import ir

from . import codegen as C
from .codegen_values import I32, I64, PTR, Val

# `<symbol>.threads`: pointer to the runtime's [thread cap, ran a parallel region] pair.
THREADS_SUFFIX = ".threads"
# A thread's record: status, then the three error slots (site, id, position).
_RECORD = 4



def thread_state_global(cg: C.KernelCodegen) -> ir.GlobalVariable:
    """The kernel's `<symbol>.threads` pointer (null until the runtime binds it)."""
    name = cg.root.function.name + THREADS_SUFFIX
    existing = cg.module.globals.get(name)
    if existing is not None:
        return existing
    state = ir.GlobalVariable(cg.module, PTR, name)
    state.initializer = ir.Constant(PTR, None)
    return state


def emit_parallel(cg: C.KernelCodegen, extent: int, threads: int, body) -> None:
    """Run `body(child, lo, hi)` over [0, extent) split evenly across up to `threads`
    OpenMP threads (fewer when the runtime caps them)."""
    b = cg.b
    captured = [(name, value) for scope in cg.env for name, value in scope.items()]
    cg.outlined_count += 1
    child = OutlinedCodegen(cg, f"{cg.function.name}.par{cg.outlined_count}", captured,
                            threads)
    child.run_chunk(extent, body)
    # The context: the records, the captured scalars, then only the buffers the body used.
    names = child.pointers.used
    context = _alloca(b, 1 + len(captured) + len(names), "parallel.ctx")
    records = _alloca(b, threads * _RECORD, "parallel.records")
    for thread in range(threads):
        b.store(ir.Constant(I64, 0), _slot(b, records, thread * _RECORD))
    b.store(records, _slot(b, context, 0))
    for index, (_, value) in enumerate(captured):
        b.store(value.value, _slot(b, context, 1 + index))
    for index, name in enumerate(names):
        b.store(cg.pointers[name], _slot(b, context, 1 + len(captured) + index))
    gomp = cg.declare("GOMP_parallel", ir.FunctionType(
        ir.VoidType(), [PTR, PTR, I32, I32]))
    b.call(gomp, [child.function, context, _thread_count(cg, threads), ir.Constant(I32, 0)])
    _report_first_failure(cg, records, threads)


def _thread_count(cg: C.KernelCodegen, threads: int) -> ir.Value:
    """min(threads, the runtime's cap), and a note that a parallel region ran."""
    b = cg.b
    state = b.load(thread_state_global(cg), typ=PTR)
    bound = b.icmp_unsigned("!=", state, ir.Constant(PTR, None))
    before = b.block
    with b.if_then(bound):
        cap = b.load(state, typ=I64)
        ran = _slot(b, state, 1)
        b.atomic_rmw("xchg", ran, ir.Constant(I64, 1), "monotonic")
        capped_end = b.block
    limit = b.phi(I64)
    limit.add_incoming(ir.Constant(I64, threads), before)
    limit.add_incoming(cap, capped_end)
    wanted = ir.Constant(I64, threads)
    count = b.select(b.icmp_signed("<", limit, wanted), limit, wanted)
    count = b.select(b.icmp_signed("<", count, ir.Constant(I64, 1)), ir.Constant(I64, 1), count)
    return b.trunc(count, I32)


def _report_first_failure(cg: C.KernelCodegen, records: ir.Value, threads: int) -> None:
    """The lowest thread whose record holds a failure: copy its error out and stop."""
    b = cg.b
    chosen: ir.Value = ir.Constant(I64, threads)
    for thread in reversed(range(threads)):
        status = b.load(_slot(b, records, thread * _RECORD), typ=I64)
        failed = b.icmp_signed("!=", status, ir.Constant(I64, 0))
        chosen = b.select(failed, ir.Constant(I64, thread), chosen)
    with b.if_then(b.icmp_signed("!=", chosen, ir.Constant(I64, threads)), likely=False):
        record = b.mul(chosen, ir.Constant(I64, _RECORD))
        for item in range(3):
            value = b.load(_slot(b, records, b.add(record, ir.Constant(I64, 1 + item))),
                           typ=I64)
            b.store(value, _slot(b, cg.err, item))
        cg.exit_with(b.load(_slot(b, records, record), typ=I64))


def _alloca(b: ir.IRBuilder, count: int, name: str) -> ir.Value:
    pointer = b.alloca(I64, size=ir.Constant(I64, count), name=name)
    pointer.type = PTR
    return pointer


def _slot(b: ir.IRBuilder, base: ir.Value, index) -> ir.Value:
    if isinstance(index, int):
        index = ir.Constant(I64, index)
    pointer = b.gep(base, [index], source_etype=I64)
    pointer.type = PTR
    return pointer


class CapturedPointers(dict):
    """The buffer pointers a region's body reads, each loaded from the context at the top of
    its entry block on first use: a region passes only those (MiniLM's kernel has ~230
    buffers; storing every one into each region's context was most of its code)."""

    def __init__(self, owner: C.KernelCodegen, entry: ir.Block, context: ir.Value,
                 first_slot: int, available):
        super().__init__()
        self.owner, self.entry, self.context = owner, entry, context
        self.first_slot = first_slot
        self.available = available  # the parent's pointers
        self.used: list[str] = []  # in context order

    def __missing__(self, name: str) -> ir.Value:
        if name not in self.available:
            raise KeyError(name)
        if self.owner.b.block is self.entry:
            # Still in the entry block: load here. An insert at its start would leave the
            # owner's builder one instruction short of its place (llvmlite keeps an index).
            b = self.owner.b
        else:
            b = ir.IRBuilder(self.entry)
            b.position_at_start(self.entry)
        pointer = b.load(_slot(b, self.context, self.first_slot + len(self.used)), typ=PTR)
        self.used.append(name)
        self[name] = pointer
        return pointer

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.available


class OutlinedCodegen(C.KernelCodegen):
    """The body of a parallel loop as `void fn(ptr context)`, run by every thread."""

    def __init__(self, parent: C.KernelCodegen, name: str, captured, threads: int):
        self._start_helper(parent, ir.Function(parent.module, ir.FunctionType(
            ir.VoidType(), [PTR]), name))
        context = self.function.args[0]
        b = self.b
        records = b.load(_slot(b, context, 0), typ=PTR)
        self.env = [{name: Val(b.load(_slot(b, context, 1 + i), typ=value.value.type), False)
                     for i, (name, value) in enumerate(captured)}]
        self.pointers = CapturedPointers(self, self.function.entry_basic_block, context,
                                          1 + len(captured), parent.pointers)
        self.thread_count = b.sext(b.call(self.declare(
            "omp_get_num_threads", ir.FunctionType(I32, [])), []), I64)
        self.thread_number = b.sext(b.call(self.declare(
            "omp_get_thread_num", ir.FunctionType(I32, [])), []), I64)
        # Never past the records allocated for `threads` (the count is at most that).
        number = b.select(b.icmp_signed("<", self.thread_number, ir.Constant(I64, threads)),
                          self.thread_number, ir.Constant(I64, threads - 1))
        record = b.mul(number, ir.Constant(I64, _RECORD))
        self.status_slot = _slot(b, records, record)
        self.err = _slot(b, records, b.add(record, ir.Constant(I64, 1)))

    def run_chunk(self, extent: int, body) -> None:
        b = self.b
        total = ir.Constant(I64, extent)
        me, count = self.thread_number, self.thread_count
        lo = b.sdiv(b.mul(me, total), count)
        hi = b.sdiv(b.mul(b.add(me, ir.Constant(I64, 1)), total), count)
        body(self, lo, hi)
        b.branch(self.exit_block)
        b.position_at_end(self.exit_block)
        b.ret_void()

    def exit_with(self, status: ir.Value) -> None:
        for pointer in self.cleanups:
            self.b.call(self._free(), [pointer])
        self.b.store(status, self.status_slot)
        self.b.branch(self.exit_block)
