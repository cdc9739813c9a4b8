"""Where a kernel's temporaries live: its stack frame, or its heap workspace.

Temporaries up to 64 KiB used to be `alloca`s each, with no bound on their sum: the
gradient of a deep unrolled RNN (batch 32, hidden 500, 128 steps) kept over 500 of them
alive, 23 MiB of stack, and crashed with SIGSEGV. Now the stack holds small temporaries,
smallest first, only up to a budget for the whole frame, and everything else is carved
from the kernel's heap workspace (one block kept between calls, see tilegen/codegen.py).

The budget is fixed at compile time from the smallest stack a call can run on in this
process: the main thread's (RLIMIT_STACK) and a new thread's (`threading.stack_size()`,
or the C library's default thread stack): an eighth of that, at most 1 MiB, leaving the
rest to the caller (Python's frames) and the kernel's own spills. The separate `alloca`s
are counted by their sum (LLVM gives each its own slot).

In the workspace, temporaries whose live ranges (the top-level statements from the first
that touches one to the last) do not overlap share bytes: top-level statements run one
after another (a parallel region joins before the next), so the workspace is the peak of
the live bytes, not their sum.
"""

from __future__ import annotations

import ctypes
import functools
import resource
import threading
from dataclasses import dataclass

from . import loopir as L

# Temporaries up to this size may live on the stack.
STACK_TEMP_BYTES = 64 * 1024
# The most stack a kernel's temporaries take, whatever the stack limit.
MAX_STACK_FRAME = 1 << 20
# Workspace offsets are aligned to whole cache lines (and 64-byte vector loads), from a
# base the kernel aligns to a line as well (codegen's _allocate_temporaries).
ALIGN = 64


@dataclass(frozen=True)
class FramePlan:
    stack: tuple[str, ...]  # temporaries with an alloca of their own
    heap: tuple[tuple[str, int], ...]  # (temporary, byte offset in the workspace)
    heap_bytes: int

    @property
    def offsets(self) -> dict[str, int]:
        return dict(self.heap)


def stack_budget() -> int:
    """Stack bytes a kernel's temporaries may take in this process (see module doc)."""
    return min(MAX_STACK_FRAME, smallest_stack() // 8)


def smallest_stack() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    sizes = [threading.stack_size() or _default_thread_stack()]
    if soft != resource.RLIM_INFINITY:
        sizes.append(soft)
    return min(sizes)


@functools.cache
def _default_thread_stack() -> int:
    """The C library's default stack for new threads (glibc derives it from RLIMIT_STACK
    at start-up); 8 MiB when it cannot be asked."""
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, libc's among them
        attr = ctypes.create_string_buffer(128)  # pthread_attr_t is 56 bytes on x86-64
        size = ctypes.c_size_t()
        if libc.pthread_getattr_default_np(attr) != 0:
            return 8 << 20
        failed = libc.pthread_attr_getstacksize(attr, ctypes.byref(size))
        libc.pthread_attr_destroy(attr)
        return size.value if failed == 0 and size.value else 8 << 20
    except (OSError, AttributeError):
        return 8 << 20


def plan_frame(kernel: L.Kernel, budget: int) -> FramePlan:
    temps = [b for b in kernel.buffers if b.role == "temp"]
    small = [b for b in temps if b.nbytes <= STACK_TEMP_BYTES]
    if sum(b.nbytes for b in small) <= budget:
        stack = {b.name for b in small}
    else:
        stack, used = set(), 0
        for buffer in sorted(small, key=lambda b: b.nbytes):
            if used + buffer.nbytes > budget:
                break
            stack.add(buffer.name)
            used += buffer.nbytes
    heap = [b for b in temps if b.name not in stack]
    offsets, total = _pack(heap, live_ranges(kernel))
    return FramePlan(tuple(b.name for b in temps if b.name in stack),
                     tuple((b.name, offsets[b.name]) for b in heap), total)


def live_ranges(kernel: L.Kernel) -> dict[str, tuple[int, int]]:
    """For each buffer touched, the first and last top-level statement touching it."""
    ranges: dict[str, tuple[int, int]] = {}
    for position, stmt in enumerate(kernel.body):
        for name in touched_buffers(stmt):
            first, _ = ranges.get(name, (position, position))
            ranges[name] = (first, position)
    return ranges


def touched_buffers(stmt: L.Stmt) -> set[str]:
    """Every buffer `stmt` reads or writes."""
    names: set[str] = set()
    exprs: list[L.Expr] = []
    for node in L.statements([stmt]):
        if isinstance(node, L.Store):
            names.add(node.buffer)
            exprs.extend(node.index + (node.value,))
        elif isinstance(node, L.Let):
            exprs.append(node.value)
        elif isinstance(node, L.Gemm):
            names.add(node.out)
            exprs.extend((node.a_elem, node.b_elem))
        elif isinstance(node, (L.Attention, L.FusedStmt)):
            names |= node.reads() | node.writes()
    for expr in exprs:
        names.update(e.buffer for e in L.subexpressions(expr) if isinstance(e, L.Load))
    return names


def _pack(buffers: list[L.Buffer], ranges: dict[str, tuple[int, int]]):
    """Offsets such that buffers alive at once never share a byte (first fit, in order of
    first use); a buffer never touched gets a slot of its own."""
    never = (len(ranges) + 1, -1)
    placed: list[tuple[int, int, tuple[int, int]]] = []  # (offset, end, live range)
    offsets: dict[str, int] = {}
    total = 0
    for buffer in sorted(buffers, key=lambda b: ranges.get(b.name, never)):
        live = ranges.get(buffer.name, (0, len(ranges) + 1))
        size = -(-buffer.nbytes // ALIGN) * ALIGN
        busy = sorted((start, end) for start, end, other in placed
                      if other[0] <= live[1] and live[0] <= other[1])
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        placed.append((offset, offset + size, live))
        offsets[buffer.name] = offset
        total = max(total, offset + size)
    return offsets, total
