"""`split-divided-loops`: a loop whose index is only used divided by a constant is split
into the quotient and remainder loops, so the division disappears from its indices.

A reshape that merges axes reads its source at `i // c` and `i % c` (docs/loopnest.md,
"Layout"); when such a reshape is fused into a reduction no view removes the arithmetic.
Attention's context for short sequences is the case that made this pass
(`reshape(transpose(p @ v, [0, 2, 1, 3]), [T, H * Dh])`, one nest):

    for i0 in 0..T { for i1 in 0..H*Dh {                     scalar: no store or load is
      out[i0, i1] = sum[k](p[(i1 // Dh) % H, i0, k]           affine in i1, every element
                           * v[(i1 // Dh) % H, k, i1 % Dh]) } }   pays a div and a mod

becomes, with i1 = Dh * q + r (0 <= r < Dh, 0 <= q < H):

    for i0 in 0..T { for q in 0..H { for r in 0..Dh {       r runs in vector tiles
      out[i0, Dh * q + r] = sum[k](p[q, i0, k] * v[q, k, r]) } } }

The rewrite is exact (same elements, same sums in the same order); it is made only when
every `//` and `%` that involved the loop's index simplifies away afterwards (by the loop
ranges, `affine.IndexSimplifier`), so a split never adds loops without removing work. One
sentence of MiniLM (T = 16): each layer's context nest took ~73 k cycles on each of two
threads, and its element cost (the div and mod) made it a parallel region.
"""

from __future__ import annotations

from dataclasses import replace

from . import loopir as L
from .affine import IndexSimplifier, to_affine
from .fission import fresh_name, var_names
from .schedule import loop_width
from .target import Target

_DIVISIONS = ("floordiv", "mod")


def split_divided_loops_pass(kernel: L.Kernel, target: Target) -> L.Kernel:
    """Every serial loop of `kernel` that the vectorizer cannot tile as it is and whose index
    is divided by a single constant divisor of its extent becomes the quotient and remainder
    loops, when that removes every division by its index."""
    taken = {b.name for b in kernel.buffers} | var_names(kernel.body)
    splitter = _Splitter(taken, {b.name: b.strides for b in kernel.buffers}, target)
    return replace(kernel, body=tuple(splitter.stmt(stmt, {}) for stmt in kernel.body))


class _Splitter:
    def __init__(self, taken: set[str], strides: dict[str, tuple[int, ...]], target: Target):
        self.taken = taken
        self.strides = strides
        self.target = target

    def stmt(self, stmt: L.Stmt, extents: dict[str, int]) -> L.Stmt:
        if not (isinstance(stmt, L.For) and stmt.kind == "serial"):
            return stmt
        split = self.split(stmt, extents)
        if split is not None:
            return split
        inside = {**extents, stmt.var.name: stmt.extent}
        return replace(stmt, body=tuple(self.stmt(s, inside) for s in stmt.body))

    def split(self, loop: L.For, extents: dict[str, int]) -> L.For | None:
        if not all(isinstance(s, (L.For, L.Let, L.Store)) for s in L.statements(loop.body)):
            return None  # a gemm, attention or fused statement keeps its loop as it is
        if loop_width(loop, self.strides, self.target):
            # Already tiled as it is (`y[i] = x[i // 4]`): a split would make its vector
            # loop the remainder's, maybe too short for one.
            return None
        return self.divide(loop, extents)

    def divide(self, loop: L.For, extents: dict[str, int]) -> L.For | None:
        """`loop` as its quotient and remainder loops, or None when no split removes its
        divisions."""
        var = loop.var.name
        divisors = {divisor for expr in _expressions(loop.body)
                    for divisor in _divisors_of(expr, var)
                    if 1 < divisor < loop.extent and loop.extent % divisor == 0}
        if len(divisors) != 1:
            return None
        (divisor,) = divisors
        quotient = L.Var(fresh_name(f"{var}_q", self.taken), L.I64)
        remainder = L.Var(fresh_name(f"{var}_r", self.taken), L.I64)
        value = L.add(L.mul(quotient, L.const(divisor)), remainder)
        inside = {**extents, quotient.name: loop.extent // divisor, remainder.name: divisor}
        simplifier = _Simplifier(inside, frozenset((quotient.name, remainder.name)))
        body = tuple(simplifier.stmt(s, {var: value}) for s in loop.body)
        if any(_divisors_of(expr, quotient.name) or _divisors_of(expr, remainder.name)
               for expr in _expressions(body)):
            return None  # some division by the loop's index stays: nothing gained
        body = tuple(self.stmt(s, inside) for s in body)
        inner = L.For(remainder, divisor, body)
        return replace(loop, var=quotient, extent=loop.extent // divisor, body=(inner,))


class _Simplifier:
    """Substitutes the split index into statements and rebuilds each `//` and `%` by a
    constant that involves the new loop variables with the loop ranges in scope."""

    def __init__(self, extents: dict[str, int], new_vars: frozenset[str]):
        self.extents = dict(extents)
        self.new_vars = new_vars

    def stmt(self, stmt: L.Stmt, values: dict[str, L.Expr]) -> L.Stmt:
        if isinstance(stmt, L.For):
            self.extents[stmt.var.name] = stmt.extent
            return replace(stmt, body=tuple(self.stmt(s, values) for s in stmt.body))
        if isinstance(stmt, L.Let):
            return replace(stmt, value=self.expr(L.substitute(stmt.value, values)))
        if isinstance(stmt, L.Store):
            return replace(stmt, index=tuple(self.expr(L.substitute(e, values))
                                             for e in stmt.index),
                           value=self.expr(L.substitute(stmt.value, values)))
        raise TypeError(stmt)

    def expr(self, expr: L.Expr) -> L.Expr:
        if isinstance(expr, L.Reduce):
            self.extents[expr.var.name] = expr.extent
        expr = L.map_children(expr, self.expr)
        if isinstance(expr, L.Binary) and expr.op in _DIVISIONS and \
                isinstance(expr.rhs, L.Const) and L.free_vars(expr.lhs) & self.new_vars:
            simplifier = IndexSimplifier()
            for name, extent in self.extents.items():
                simplifier.declare(L.Var(name, L.I64), extent)
            divisor = int(expr.rhs.value)
            if expr.op == "floordiv":
                return simplifier.floordiv(expr.lhs, divisor)
            return simplifier.mod(expr.lhs, divisor)
        return expr


def _divisors_of(expr: L.Expr, var: str) -> set[int]:
    """The constant divisors of the `//` and `%` in `expr` whose dividend has `var` with
    coefficient 1, and 0 for any other dividend involving `var` (`2 * var // c`: no split
    of var's loop removes it)."""
    found = set()
    for sub in L.subexpressions(expr):
        if isinstance(sub, L.Binary) and sub.op in _DIVISIONS and \
                isinstance(sub.rhs, L.Const) and var in L.free_vars(sub.lhs):
            affine = to_affine(sub.lhs)
            if affine.coefficient(var) == 1 and not any(
                    var in L.free_vars(e) for e, _ in affine.opaque):
                found.add(int(sub.rhs.value))
            else:
                found.add(0)  # another use of var in a division: never split for it
    return found


def _expressions(stmts):
    for stmt in L.statements(stmts):
        if isinstance(stmt, L.Let):
            yield stmt.value
        elif isinstance(stmt, L.Store):
            yield from stmt.index
            yield stmt.value
