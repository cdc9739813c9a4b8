"""Fuse an element-wise producer nest into the nest that consumes it.

The lowering stores a value to a temporary when it is expensive and read more than once
(`LowerContext.reusable`): a GELU read by the three parts of a bf16x3 split, say. When every
one of those reads is in the very next nest, at the element that nest is working on, the
temporary is a round trip through memory for nothing: the consumer can compute the element
itself, once, in a `let`. At MiniLM's 32 x 128 tokens that temporary is 4096 x 1536 floats,
25 MB written and read back per layer.

`fuse_producers_pass` does that when it cannot change a result or lose a schedule:
- the producer is a perfect nest storing one temporary, an element per iteration, and the
  consumer right after it loops over the same extents;
- nothing else in the kernel touches the temporary, and the consumer reads it only at the
  element the producer stores in the same iteration (so each is still computed once);
- the consumer writes nothing the producer reads (the producer's reads move after the
  consumer's earlier iterations);
- the fused nest still runs in vector tiles and across threads wherever the producer did.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from . import loopir as L
from .dependence import independent
from .frame import touched_buffers
from .schedule import loop_width
from .target import Target


def fuse_producers_pass(kernel: L.Kernel, target: Target) -> L.Kernel:
    strides = {b.name: b.strides for b in kernel.buffers}
    temps = {b.name: b for b in kernel.buffers if b.role == "temp"}
    touched = [touched_buffers(stmt) for stmt in kernel.body]
    touchers = Counter(name for names in touched for name in names)
    body: list[L.Stmt] = []
    fused_away: set[str] = set()
    position = 0
    while position < len(kernel.body):
        stmt = kernel.body[position]
        if position + 1 < len(kernel.body):
            consumer = kernel.body[position + 1]
            following = touched[position + 1]
            only_here = {name for name in touched[position]
                         if touchers[name] == 1 + (name in following)}
            fused = _fused(stmt, consumer, temps, only_here, strides, target)
            if fused is not None:
                nest, temporary = fused
                fused_away.add(temporary)
                body.append(nest)
                position += 2
                continue
        body.append(stmt)
        position += 1
    if not fused_away:
        return kernel
    buffers = tuple(b for b in kernel.buffers if b.name not in fused_away)
    return replace(kernel, buffers=buffers, body=tuple(body))


def _fused(producer: L.Stmt, consumer: L.Stmt, temps: dict[str, L.Buffer],
           only_here: set[str], strides, target: Target) -> tuple[L.For, str] | None:
    """The fused nest and the temporary it removes, or None; `only_here`: the buffers the
    producer touches that no statement but the two does."""
    loops = L.perfect_nest(producer)
    inner_loops = L.perfect_nest(consumer)
    if not loops or len(loops) != len(inner_loops):
        return None
    if [loop.extent for loop in loops] != [loop.extent for loop in inner_loops]:
        return None
    *lets, store = loops[-1].body
    if not isinstance(store, L.Store) or not all(isinstance(s, L.Let) for s in lets):
        return None
    buffer = temps.get(store.buffer)
    if buffer is None or buffer.dtype != store.value.dtype or buffer.name not in only_here:
        return None
    if not _one_element_per_iteration(store.index, loops):
        return None
    producer_reads = touched_buffers(producer) - {buffer.name}
    consumer_body = inner_loops[-1].body
    if not all(isinstance(s, (L.Let, L.Store)) for s in consumer_body):
        return None
    if any(s.buffer in producer_reads for s in consumer_body if isinstance(s, L.Store)):
        return None
    renamed = {old.var.name: new.var for old, new in zip(loops, inner_loops, strict=True)}
    at = tuple(L.substitute(component, renamed) for component in store.index)
    if not _reads_only_at(consumer_body, buffer.name, at):
        return None

    element = L.Var(f"{buffer.name}_element", store.value.dtype)
    computed = [replace(s, value=L.substitute(s.value, renamed)) for s in lets]
    computed.append(L.Let(element, L.substitute(store.value, renamed)))
    uses = [_with_loads_replaced(s, buffer.name, element) for s in consumer_body]
    nest = _rebuilt(inner_loops, tuple(computed + uses))
    if not _keeps_schedule(loops, producer, nest, strides, target):
        return None
    return nest, buffer.name


def _one_element_per_iteration(index: tuple[L.Expr, ...], loops: list[L.For]) -> bool:
    """Whether each component is a constant or one of the loop variables, each variable
    used once: every iteration then stores its own element (a unit axis the lowering
    indexed by 0 leaves a constant)."""
    names = [e.name for e in index if isinstance(e, L.Var)]
    return sorted(names) == sorted(loop.var.name for loop in loops) and \
        all(isinstance(e, (L.Var, L.Const)) for e in index)


def _reads_only_at(stmts, name: str, index: tuple[L.Var, ...]) -> bool:
    for stmt in stmts:
        exprs = [stmt.value] + (list(stmt.index) if isinstance(stmt, L.Store) else [])
        for expr in exprs:
            for sub in L.subexpressions(expr):
                if isinstance(sub, L.Load) and sub.buffer == name and sub.index != index:
                    return False
    return True


def _with_loads_replaced(stmt: L.Stmt, name: str, element: L.Var) -> L.Stmt:
    def replaced(expr: L.Expr) -> L.Expr:
        if isinstance(expr, L.Load) and expr.buffer == name:
            return element
        return L.map_children(expr, replaced)
    if isinstance(stmt, L.Store):
        return replace(stmt, index=tuple(replaced(e) for e in stmt.index),
                       value=replaced(stmt.value))
    return replace(stmt, value=replaced(stmt.value))


def _rebuilt(loops: list[L.For], body: tuple[L.Stmt, ...]) -> L.For:
    for loop in reversed(loops):
        body = (replace(loop, body=body),)
    return body[0]


def _keeps_schedule(loops: list[L.For], producer: L.Stmt, nest: L.For, strides,
                    target: Target) -> bool:
    """Whether the fused nest still vectorises its innermost loop and may still split its
    outer loop across threads wherever the producer alone could."""
    fused_loops = L.perfect_nest(nest)
    if loop_width(loops[-1], strides, target) and not loop_width(fused_loops[-1], strides,
                                                                  target):
        return False
    outer = loops[0].var.name
    return not independent(producer, outer) or independent(nest, fused_loops[0].var.name)
