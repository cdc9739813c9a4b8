"""Loop fission for short row passes.

A row pass (softmax, log_softmax) lowers to one nest whose body runs several steps per row:
the row max, exp into the result, the sum, the scaling. Each step waits on the one before
(a horizontal max, then the exps, then a horizontal sum, then a division), so a row is one
long dependency chain. When rows are short, the CPU cannot look far enough ahead to overlap
the chains of neighbouring rows and the pass runs at the latency of that chain: on
StoryLM-0's 72 rows of 36 scores, ~37 cycles a row.

`fission_pass` splits such a nest into one nest per step. Scalars that a later step needs
(the row max, 1 / sum) are kept in small temporaries indexed by the row loops. Every nest
then has independent, short iterations the CPU overlaps freely (the same 72 rows: ~26
cycles a row). Long rows are left alone: their chains are already long enough to keep the
core busy, and a row that stays in L1 between steps is worth more than the overlap.
"""

from __future__ import annotations

import math
from dataclasses import replace

from . import loopir as L
from .target import Target

# Split only when no loop or reduction inside the row pass runs longer than this, and the
# buffers the pass reads and writes fit in half the target's L2 (each step re-reads them).
MAX_ROW_EXTENT = 128
# With fewer rows there is little to overlap, and each split step costs compile time.
MIN_ROWS = 16


def fission_pass(kernel: L.Kernel, target: Target) -> L.Kernel:
    taken = {b.name for b in kernel.buffers} | var_names(kernel.body)
    temps: list[L.Buffer] = []
    body: list[L.Stmt] = []
    for stmt in kernel.body:
        for nest in _split_nest(stmt, kernel, temps, taken, target.l2_bytes // 2):
            merged = _with_row_reduction(body[-1], nest, kernel) if body else None
            if merged is not None:
                body[-1] = merged
            else:
                body.append(nest)
    if not temps and body == list(kernel.body):
        return kernel
    return replace(kernel, buffers=kernel.buffers + tuple(temps), body=tuple(body))


def _with_row_reduction(producer: L.Stmt, consumer: L.Stmt,
                        kernel: L.Kernel) -> L.Stmt | None:
    """`producer` (row loops around one loop storing a row of T) with `consumer` (the same
    row loops around scalar statements that reduce that row of T: the row max of softmax
    over the scores just computed) appended to its rows, or None. The reduction then reads
    the row while it is in L1 and the extra pass over T goes. Only for producers without
    exp/log/tanh: a row whose values are that expensive is a long chain already, and the
    reduction after it is better left to a pass of its own (measured on StoryLM-0: scores
    then max fused, ~3 % faster; exp then sum fused, ~8 % slower)."""
    producer_loops = L.perfect_nest(producer)
    if len(producer_loops) < 2:
        return None
    rows, inner = producer_loops[:-1], producer_loops[-1]
    if len(inner.body) != 1 or not isinstance(inner.body[0], L.Store) or \
            inner.extent > MAX_ROW_EXTENT:
        return None
    store = inner.body[0]
    if any(L.is_expensive(e) for e in L.subexpressions(store.value)) or \
            L.contains(store.value, (L.CheckedId,)):
        return None
    consumer_loops = L.perfect_nest(consumer)
    if [loop.extent for loop in consumer_loops] != [loop.extent for loop in rows]:
        return None
    statements = consumer_loops[-1].body
    if not statements or not all(isinstance(s, (L.Let, L.Store)) for s in statements):
        return None
    rename = {c.var.name: p.var for c, p in zip(consumer_loops, rows, strict=True)}
    statements = tuple(_substitute_stmt(s, rename) for s in statements)
    # The row of T must be the whole row the producer writes: T's other axes indexed by
    # the row variables (or constants) exactly as the producer stores them.
    buffer = kernel.buffer(store.buffer)
    if store.index.count(inner.var) != 1 or \
            buffer.shape[store.index.index(inner.var)] != inner.extent:
        return None
    row_axes = [axis for axis, e in enumerate(store.index) if e != inner.var]
    if any(inner.var.name in L.free_vars(store.index[axis]) for axis in row_axes):
        return None
    reads = False
    producer_reads = {load.buffer for load in _loads(store.value)}
    for s in statements:
        if isinstance(s, L.Store) and (s.buffer == store.buffer or s.buffer in producer_reads):
            return None
        if L.contains(s.value, (L.CheckedId,)):
            return None
        for load in _loads(s.value):
            if load.buffer == store.buffer:
                if any(load.index[axis] != store.index[axis] for axis in row_axes):
                    return None
                reads = True
    if not reads:
        return None
    return _wrap(rows, (inner, *statements))


def _split_nest(stmt: L.Stmt, kernel: L.Kernel, temps: list[L.Buffer],
                taken: set[str], budget: int) -> list[L.Stmt]:
    """`stmt` split into one row nest per step, when the buffers it touches take at most
    `budget` bytes (and splitting pays and is legal); else [stmt]."""
    loops = L.perfect_nest(stmt)
    if not loops or len(loops[-1].body) < 2:
        return [stmt]
    steps = _steps(loops[-1].body)
    if len(steps) < 2 or not _pays(loops, kernel, budget) or not _legal(loops, kernel):
        return [stmt]
    row_index = tuple(loop.var for loop in loops)
    row_shape = tuple(loop.extent for loop in loops)
    # Lets a later step reads become row temporaries; the later steps load them.
    kept: dict[str, L.Load] = {}
    nests, row_temps = [], []
    for position, step in enumerate(steps):
        later = [s for following in steps[position + 1:] for s in following]
        step = [_substitute_stmt(s, kept) for s in step]
        stores = []
        for s in step:
            if isinstance(s, L.Let) and any(s.var.name in _stmt_vars(t)
                                             for t in L.statements(later)):
                if s.var.dtype not in L.FLOAT_TYPES + (L.I64,):
                    return [stmt]
                name = fresh_name(s.var.name + "_rows", taken)
                row_temps.append(L.Buffer(name, s.var.dtype, row_shape, "temp"))
                kept[s.var.name] = L.Load(name, row_index, s.var.dtype)
                stores.append(L.Store(name, row_index, s.var))
        nests.append(_wrap(loops, tuple(step + stores)))
    temps.extend(row_temps)
    return nests


def _steps(body: tuple[L.Stmt, ...]) -> list[list[L.Stmt]]:
    """Each inner loop and each reduction starts a step of its own; the scalar arithmetic
    that follows a reduction (1 / sum, log of the sum) stays in its step."""
    steps: list[list[L.Stmt]] = []
    for stmt in body:
        starts = isinstance(stmt, L.For) or L.contains(stmt.value, (L.Reduce,))
        if starts or not steps or isinstance(steps[-1][-1], L.For):
            steps.append([stmt])
        else:
            steps[-1].append(stmt)
    return steps


def _pays(loops: list[L.For], kernel: L.Kernel, budget: int) -> bool:
    if math.prod(loop.extent for loop in loops) < MIN_ROWS:
        return False
    body = loops[-1].body
    for stmt in L.statements(body):
        if isinstance(stmt, L.Gemm):
            return False
        if isinstance(stmt, L.For) and stmt.extent > MAX_ROW_EXTENT:
            return False
        if not isinstance(stmt, L.For) and any(
                r.extent > MAX_ROW_EXTENT for r in _reductions(stmt.value)):
            return False
    touched = set()
    for stmt in L.statements(body):
        if isinstance(stmt, L.Store):
            touched.add(stmt.buffer)
        if not isinstance(stmt, L.For):
            touched |= {load.buffer for load in _loads(stmt.value)}
    total = sum(kernel.buffer(name).nbytes for name in touched)
    return total <= budget


def _legal(loops: list[L.For], kernel: L.Kernel) -> bool:
    """Different rows must touch different elements of every buffer the nest writes: then
    running step 1 for all rows before step 2 keeps every read after the write it needs.
    That holds when each row variable indexes one fixed axis of every access to such a
    buffer as itself. Id checks stay in one nest, so a failing id is reported exactly as
    before."""
    statements = list(L.statements(loops[-1].body))
    if any(not isinstance(s, L.For) and L.contains(s.value, (L.CheckedId,))
           for s in statements):
        return False
    written = {s.buffer for s in statements if isinstance(s, L.Store)}
    accesses: dict[str, list[tuple[L.Expr, ...]]] = {name: [] for name in written}
    for stmt in statements:
        if isinstance(stmt, L.Store) and stmt.buffer in written:
            accesses[stmt.buffer].append(stmt.index)
        if not isinstance(stmt, L.For):
            for load in _loads(stmt.value):
                if load.buffer in written:
                    accesses[load.buffer].append(load.index)
    for indices in accesses.values():
        for loop in loops:
            axes = [{axis for axis, e in enumerate(index) if e == loop.var} for index in indices]
            if not set.intersection(*axes):
                return False
    return True


def _wrap(loops: list[L.For], body: tuple[L.Stmt, ...]) -> L.Stmt:
    for loop in reversed(loops):
        body = (replace(loop, body=body),)
    return body[0]


def _loads(expr: L.Expr):
    return [e for e in L.subexpressions(expr) if isinstance(e, L.Load)]


def _reductions(expr: L.Expr):
    return [e for e in L.subexpressions(expr) if isinstance(e, L.Reduce)]


def _stmt_vars(stmt: L.Stmt) -> frozenset[str]:
    if isinstance(stmt, L.For):
        return frozenset()
    names = L.free_vars(stmt.value)
    if isinstance(stmt, L.Store):
        for component in stmt.index:
            names |= L.free_vars(component)
    return names




def _substitute_stmt(stmt: L.Stmt, kept: dict[str, L.Load]) -> L.Stmt:
    if not kept:
        return stmt
    if isinstance(stmt, L.For):
        return replace(stmt, body=tuple(_substitute_stmt(s, kept) for s in stmt.body))
    if isinstance(stmt, L.Let):
        return replace(stmt, value=L.substitute(stmt.value, kept))
    if isinstance(stmt, L.Store):
        return replace(stmt, index=tuple(L.substitute(e, kept) for e in stmt.index),
                       value=L.substitute(stmt.value, kept))
    return stmt


def var_names(stmts) -> set[str]:
    """Every loop, let and reduction variable named in `stmts` (what a new name must avoid:
    loop and let variables are unique within a kernel)."""
    names: set[str] = set()
    for stmt in L.statements(stmts):
        if isinstance(stmt, (L.For, L.Let)):
            names.add(stmt.var.name)
        if isinstance(stmt, (L.Let, L.Store)):
            exprs = (stmt.value, *stmt.index) if isinstance(stmt, L.Store) else (stmt.value,)
            for expr in exprs:
                names |= L.free_vars(expr)
                names |= {e.var.name for e in L.subexpressions(expr) if isinstance(e, L.Reduce)}
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_2`, `base_3`, ... the first not in `taken`; added to `taken`."""
    name, suffix = base, 1
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    taken.add(name)
    return name
