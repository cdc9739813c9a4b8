"""Scheduling passes over loop-nest IR: choose which loops run in vector tiles and threads.

`vectorize_pass`: the innermost loop that stores contiguously along its index (or an outer
loop below which everything stores and reads contiguously along it) is split into
`width`-lane tiles (the target's vector: 16 x f32 / 8 x f64 on AVX-512) with a masked
tail; a reduction that is not inside a vector loop and reads contiguously along its own
index is run in vector tiles with a horizontal combine at the end (the row passes of
softmax).

`parallelize_pass` splits a large nest's outer loop across threads, only when the dependence
test (`tilegen/dependence.py`) proves its iterations touch disjoint elements;
`thread_interchange_pass` first moves an independent inner loop outwards where the outer
loop carries a dependence (scatter_add's positions adding into one row).
"""

from __future__ import annotations

from dataclasses import replace

from . import loopir as L
from .affine import to_affine
from .dependence import gemm_split_is_safe, independent
from .target import Target

# Loops shorter than this stay scalar (or shorter than one vector of the target): a masked
# tile would be mostly idle lanes.
MIN_VECTOR_EXTENT = {L.F32: 8, L.F64: 4, L.I64: 4}
MIN_REDUCE_EXTENT = 8


def vector_width(dtype: str, extent: int, target: Target) -> int:
    """Lanes for a loop of `extent` elements of `dtype`, or 0 to stay scalar: a full vector
    of `target`, halved while the loop is shorter and a half is still long enough."""
    if dtype == L.BOOL:
        return 0
    width = target.lanes(dtype)
    shortest = min(MIN_VECTOR_EXTENT[dtype], width)
    if extent < shortest:
        return 0
    while width // 2 >= shortest and extent < width:
        width //= 2
    return width


# A loop nest runs on several threads only when it does at least this much work: an OpenMP
# fork/join costs a few microseconds.
PARALLEL_WORK = 1 << 18


def parallelize_pass(kernel: L.Kernel, threads: int) -> L.Kernel:
    """The outermost loop of each large top-level nest is split across `threads` when no two
    of its iterations touch one element with a write; a Gemm whose operands read its own
    output (which another thread may already have overwritten) runs on one thread."""
    if threads <= 1:
        return kernel
    body = []
    for stmt in kernel.body:
        if isinstance(stmt, L.For) and stmt.kind == "serial" and stmt.extent >= 2 \
                and L.work([stmt]) >= PARALLEL_WORK and independent(stmt, stmt.var.name):
            stmt = replace(stmt, kind="parallel", width=threads)
        elif isinstance(stmt, L.For) and stmt.kind == "vector" and \
                stmt.extent >= 2 * stmt.width and L.work([stmt]) >= PARALLEL_WORK and \
                independent(stmt, stmt.var.name):
            stmt = replace(stmt, threads=threads)  # whole tiles per thread
        elif isinstance(stmt, L.Gemm) and stmt.threads > 1 and not gemm_split_is_safe(stmt):
            stmt = replace(stmt, threads=1)
        body.append(stmt)
    return replace(kernel, body=tuple(body))


def thread_interchange_pass(kernel: L.Kernel, threads: int, target: Target) -> L.Kernel:
    """A large nest whose outer loop carries a dependence gets an inner loop that is
    independent across the whole nest as its outermost loop, when that loop will run in
    vector tiles enough for every thread: scatter_add's `for p { let row = ids[p]; for j {
    out[row, j] += u[p, j] } }` (two positions may name one row) becomes `for j { for p {
    ... } }`, whose tiles of columns the threads then split. Each element still receives its
    additions in position order, so the result is bit-identical to one thread's (per-thread
    partial tables would change the order of the sums, and cost a table per thread)."""
    if threads <= 1:
        return kernel
    strides = {b.name: b.strides for b in kernel.buffers}
    body = []
    for stmt in kernel.body:
        if isinstance(stmt, L.For) and stmt.kind == "serial" and \
                L.work([stmt]) >= PARALLEL_WORK and not independent(stmt, stmt.var.name):
            stmt = _independent_loop_outside(stmt, strides, target) or stmt
        body.append(stmt)
    return replace(kernel, body=tuple(body))


def _independent_loop_outside(nest: L.For, strides, target: Target) -> L.For | None:
    """`nest` with the first inner loop that is independent across it moved outermost, or
    None. Only loops reached through bodies of lets and one loop qualify (anything else
    around them would run once per iteration of the moved loop)."""
    path = [nest]
    while True:
        inner = [s for s in path[-1].body if isinstance(s, L.For)]
        if len(inner) != 1 or not all(isinstance(s, (L.Let, L.For)) for s in path[-1].body):
            return None
        (candidate,) = inner
        if candidate.kind == "serial" and independent(nest, candidate.var.name):
            moved = replace(candidate, body=(_without(nest, candidate),))
            width = loop_width(moved, strides, target)
            if width and candidate.extent >= 2 * width:
                return moved
            return None
        path.append(candidate)


def _without(nest: L.For, loop: L.For) -> L.For:
    """`nest` with `loop` replaced by its body (the loop moves outside)."""
    body: list[L.Stmt] = []
    for stmt in nest.body:
        if stmt is loop:
            body.extend(loop.body)
        elif isinstance(stmt, L.For):
            body.append(_without(stmt, loop))
        else:
            body.append(stmt)
    return replace(nest, body=tuple(body))


def vectorize_pass(kernel: L.Kernel, target: Target) -> L.Kernel:
    strides = {b.name: b.strides for b in kernel.buffers}
    body = tuple(_schedule_stmt(s, strides, target, in_vector=False) for s in kernel.body)
    return replace(kernel, body=body)


def flat_coefficient(index: tuple[L.Expr, ...], strides: tuple[int, ...], var: str) -> int | None:
    """Coefficient of `var` in the flattened offset, None if it is not affine in `var`."""
    total = 0
    for component, stride in zip(index, strides, strict=True):
        affine = to_affine(component)
        if any(var in L.free_vars(e) for e, _ in affine.opaque):
            return None
        total += affine.coefficient(var) * stride
    return total


def _schedule_stmt(stmt: L.Stmt, strides, target: Target, in_vector: bool) -> L.Stmt:
    if isinstance(stmt, L.For):
        width = 0 if in_vector else loop_width(stmt, strides, target)
        body = tuple(_schedule_stmt(s, strides, target, in_vector or width > 0)
                     for s in stmt.body)
        if width:
            return replace(stmt, body=body, kind="vector", width=width)
        return replace(stmt, body=body)
    if isinstance(stmt, L.Let):
        return replace(stmt, value=_schedule_expr(stmt.value, strides, target, in_vector))
    if isinstance(stmt, L.Store):
        return replace(stmt, value=_schedule_expr(stmt.value, strides, target, in_vector))
    if isinstance(stmt, (L.Gemm, L.Attention, L.FusedStmt)):
        return stmt
    raise TypeError(stmt)


def loop_width(loop: L.For, strides, target: Target) -> int:
    if any(isinstance(s, L.For) for s in loop.body) and not _outer_vectorizable(loop, strides):
        return 0
    stores = [s for s in L.statements(loop.body) if isinstance(s, L.Store)]
    if not stores:
        return 0
    dtypes = set()
    for store in stores:
        if flat_coefficient(store.index, strides[store.buffer], loop.var.name) != 1:
            return 0
        dtypes.add(store.value.dtype)
    if len(dtypes) != 1:
        return 0
    # A lane-strided load inside a reduction turns every reduction step into a gather;
    # vectorising the reduction itself (contiguous loads) is then the better choice.
    for stmt in L.statements(loop.body):
        if isinstance(stmt, L.For):
            continue
        value = stmt.value
        if _has_reduce(value) and strided_load(value, loop.var.name, strides):
            return 0
    return vector_width(dtypes.pop(), loop.extent, target)


def _outer_vectorizable(loop: L.For, strides) -> bool:
    """A loop around loops (a row pass over columns: softmax along a non-contiguous axis)
    runs in tiles when everything below it stores contiguously along it and reads along it
    without gathers: each statement then works on `width` neighbouring rows at once, with
    vertical reductions (a [36, 72] softmax over axis 0: 12.3 -> 1.7 us)."""
    for stmt in L.statements(loop.body):
        if isinstance(stmt, L.Gemm):
            return False
        if isinstance(stmt, L.For):
            continue
        if isinstance(stmt, L.Store) and \
                flat_coefficient(stmt.index, strides[stmt.buffer], loop.var.name) != 1:
            return False
        if strided_load(stmt.value, loop.var.name, strides):
            return False
    return True


def _has_reduce(expr: L.Expr) -> bool:
    return L.contains(expr, (L.Reduce,))


def strided_load(expr: L.Expr, var: str, strides) -> bool:
    """Some load's flattened offset moves by other than 0 or 1 per step of `var` (or not
    affinely: a gather). `strides`: buffer name -> strides."""
    if isinstance(expr, L.Load):
        coefficient = flat_coefficient(expr.index, strides[expr.buffer], var)
        if coefficient not in (0, 1):
            return True
    return any(strided_load(c, var, strides) for c in L.children(expr))


def _schedule_expr(expr: L.Expr, strides, target: Target, in_vector: bool) -> L.Expr:
    if isinstance(expr, L.Reduce):
        width = 0
        if not in_vector and expr.op in ("sum", "max", "maxnum") and \
                expr.extent >= MIN_REDUCE_EXTENT \
                and _reads_contiguously(expr.body, expr.var.name, strides) \
                and not strided_load(expr.body, expr.var.name, strides):
            # Any strided load would make every step a gather (a nested reduction along
            # the rows' contiguous axis is then the one to vectorise).
            width = vector_width(expr.dtype, expr.extent, target)
        body = _schedule_expr(expr.body, strides, target, in_vector or width > 0)
        return replace(expr, body=body, vector_width=width)
    if isinstance(expr, L.Load):
        return replace(expr, index=tuple(_schedule_expr(i, strides, target, in_vector)
                                         for i in expr.index))
    if isinstance(expr, L.Binary):
        return replace(expr, lhs=_schedule_expr(expr.lhs, strides, target, in_vector),
                       rhs=_schedule_expr(expr.rhs, strides, target, in_vector))
    if isinstance(expr, (L.Unary, L.Cast)):
        return replace(expr, operand=_schedule_expr(expr.operand, strides, target, in_vector))
    if isinstance(expr, L.Select):
        return replace(expr, cond=_schedule_expr(expr.cond, strides, target, in_vector),
                       if_true=_schedule_expr(expr.if_true, strides, target, in_vector),
                       if_false=_schedule_expr(expr.if_false, strides, target, in_vector))
    if isinstance(expr, L.CheckedId):
        return replace(expr, value=_schedule_expr(expr.value, strides, target, in_vector))
    return expr


def _reads_contiguously(expr: L.Expr, var: str, strides) -> bool:
    if isinstance(expr, L.Load) and flat_coefficient(expr.index, strides[expr.buffer],
                                                      var) == 1:
        return True
    return any(_reads_contiguously(c, var, strides) for c in L.children(expr))
