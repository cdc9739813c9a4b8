"""Where a compiled function spends its time, per top-level loop nest.

    TILEGEN_PROFILE=1 python -c "...; print(tilegen.profile.report(module.f))"

With TILEGEN_PROFILE=1 (or `cycles`) each kernel counts time-stamp-counter cycles (rdtsc,
wall time on the calling thread) per top-level loop nest in a global array; with
TILEGEN_PROFILE=cpu it counts nanoseconds of the process's CPU time instead (every
thread's, from clock_gettime), which does not grow while a loaded machine preempts the
process -- what to use when other jobs share the cores. `report` prints each nest (its
loops and the buffer it writes) with its share.
"""

from __future__ import annotations

import ctypes

from .loopir import Attention, For, FusedStmt, Gemm, Let, Store


def _compiled(function):
    """The CompiledFunction behind what a module hands out: the native keyword front's
    `__self__` is the Python wrapper, whose `slow_path` it is."""
    wrapper = getattr(function, "__self__", function)
    compiled = getattr(wrapper, "slow_path", wrapper)
    if getattr(compiled, "plan", None) is None:
        raise RuntimeError("profiling needs a function compiled in this process with "
                           "TILEGEN_PROFILE=1 (a library loaded with load_library has no plan)")
    return compiled


def counters(function) -> list[int]:
    compiled = _compiled(function)
    address = compiled._module.profile_address(compiled.plan)
    if address is None:
        raise RuntimeError("compile with TILEGEN_PROFILE=1 (or cpu) to count per nest")
    array = (ctypes.c_int64 * len(compiled.plan.kernel.body)).from_address(address)
    return list(array)


def reset(function) -> None:
    compiled = _compiled(function)
    address = compiled._module.profile_address(compiled.plan)
    if address is not None:
        ctypes.memset(address, 0, 8 * len(compiled.plan.kernel.body))


def report(function) -> str:
    compiled = _compiled(function)
    counts = counters(function)
    total = sum(counts) or 1
    unit = compiled._module.profile_unit(compiled.plan)
    lines = [f"{compiled.plan.kernel.name}: {total} {unit} over all calls"]
    for stmt, count in zip(compiled.plan.kernel.body, counts, strict=True):
        lines.append(f"  {100 * count / total:5.1f}%  {count:>12}  {_headline(stmt)}")
    return "\n".join(lines)


def _headline(stmt) -> str:
    loops, targets = [], []

    def walk(node):
        if isinstance(node, For):
            tag = f"v{node.width}" if node.kind == "vector" else ""
            loops.append(f"{node.var}<{node.extent}{tag}>")
            for inner in node.body:
                walk(inner)
        elif isinstance(node, Store) and node.buffer not in targets:
            targets.append(node.buffer)
        elif isinstance(node, Gemm):
            loops.append(f"gemm {node.m}x{node.n}x{node.k_extent}"
                         f"{'x' + str(node.batch_extents) if node.batch_extents else ''}")
            targets.append(node.out)
        elif isinstance(node, Attention):
            loops.append(f"attention {node.tq}x{node.tk}x{node.d_extent}")
            targets.append(node.out)
        elif isinstance(node, FusedStmt):
            loops.append(node.format_lines("")[0].split("[")[0])
            targets.extend(sorted(node.writes()))
        elif isinstance(node, Let):
            pass

    walk(stmt)
    return f"{' '.join(loops)} -> {', '.join(targets)}"
