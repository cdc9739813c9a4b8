"""Which loops may run their iterations on several threads: a dependence test over loop IR.

A loop over `v` is *independent* when no two iterations `v != v'` touch the same element of
a buffer with at least one of the two accesses a write. Then its iterations can run in any
order or at once, and it can also be moved outside the loops that enclose it (each element
is then still reached in the original order, by one value of `v`).

Accesses are compared one index component at a time: the two iterations are proved apart
when some component differs for every pair of iterations. With the component affine in the
loop variables (`tilegen/affine.py`), two tests prove that:

- the same nonzero coefficient `c` of `v` on both sides, and what remains of the difference
  (the other loops' indices, each side its own copy) lies strictly between -|c| and |c|:
  `c * (v - v')` can never be cancelled (`out[i, j]`, `x[64 * i + j]` with j < 64);
- the two components' value ranges are disjoint (`buf[i]` against `buf[N + k]`).

Anything else is a possible conflict: an index read from memory (`out[ids[p], j]`: two
positions may hold the same id), an opaque `//` or `%`, a `Gemm` inside the loop. Lets are
substituted into the indices first, so `let row = ids[p]` is seen as the load it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import loopir as L
from .affine import Affine, to_affine, value_range

# Suffix of the renamed copy of the loop variables on the second access of a pair (not a
# character Kina or the lowering uses in names).
_OTHER = "'"


@dataclass(frozen=True)
class Access:
    buffer: str
    index: tuple[L.Expr, ...]
    write: bool


@dataclass(frozen=True)
class NestAccesses:
    """Every buffer access below a statement, with the extent of every loop and reduction
    variable bound there; `opaque` when a statement cannot be analysed (a Gemm)."""

    accesses: tuple[Access, ...]
    extents: dict[str, int]
    opaque: bool


def nest_accesses(stmt: L.Stmt) -> NestAccesses:
    accesses: list[Access] = []
    extents: dict[str, int] = {}
    lets: dict[str, L.Expr] = {}
    opaque = False

    def expr(value: L.Expr) -> L.Expr:
        value = L.substitute(value, lets)
        for sub in L.subexpressions(value):
            if isinstance(sub, L.Load):
                accesses.append(Access(sub.buffer, sub.index, False))
            elif isinstance(sub, L.Reduce):
                extents[sub.var.name] = sub.extent
        return value

    def walk(node: L.Stmt) -> None:
        nonlocal opaque
        if isinstance(node, L.For):
            extents[node.var.name] = node.extent
            for inner in node.body:
                walk(inner)
        elif isinstance(node, L.Let):
            lets[node.var.name] = expr(node.value)
        elif isinstance(node, L.Store):
            index = tuple(expr(component) for component in node.index)
            expr(node.value)
            accesses.append(Access(node.buffer, index, True))
        else:
            opaque = True

    walk(stmt)
    return NestAccesses(tuple(accesses), extents, opaque)


def independent(nest: L.Stmt, var: str, enclosing: dict[str, int] | None = None) -> bool:
    """No two iterations of the loop over `var` (a loop inside `nest`, or `nest` itself)
    touch one element with a write, counting every access anywhere in `nest`: the loop can
    run in parallel, and be moved outside the loops of `nest` that enclose it.

    `enclosing` gives the extents of loops around `nest`. Both iterations of a pair see the
    same values of those, so they are not renamed; their ranges only help prove two
    accesses apart (a bf16x3 split's parts at `32 * q + r` and `32 * q + r + 768` with
    q < 12 lie in disjoint column ranges)."""
    found = nest_accesses(nest)
    if found.opaque or var not in found.extents:
        return False
    renamed: dict[str, L.Expr] = {name: L.Var(name + _OTHER) for name in found.extents}
    extents = {name: extent for name, extent in (enclosing or {}).items()
               if name not in found.extents}
    extents.update(found.extents)
    extents.update({name + _OTHER: extent for name, extent in found.extents.items()})
    accesses = found.accesses
    for position, first in enumerate(accesses):
        for second in accesses[position:]:
            if first.buffer != second.buffer or not (first.write or second.write):
                continue
            other = tuple(L.substitute(e, renamed) for e in second.index)
            if not _apart(first.index, other, var, extents):
                return False
    return True


def _apart(first: tuple[L.Expr, ...], second: tuple[L.Expr, ...], var: str,
           extents: dict[str, int]) -> bool:
    """Some component of the two indices differs whenever `var` differs between them."""
    for a_expr, b_expr in zip(first, second, strict=True):
        a, b = to_affine(a_expr), to_affine(b_expr)
        if _disjoint(a, b, extents) or _never_cancelled(a, b, var, extents):
            return True
    return False


def _disjoint(a: Affine, b: Affine, extents: dict[str, int]) -> bool:
    a_range, b_range = value_range(a, extents), value_range(b, extents)
    return a_range is not None and b_range is not None and \
        (a_range[1] < b_range[0] or b_range[1] < a_range[0])


def _never_cancelled(a: Affine, b: Affine, var: str, extents: dict[str, int]) -> bool:
    coefficient = a.coefficient(var)
    if coefficient == 0 or b.coefficient(var + _OTHER) != coefficient:
        return False
    rest = _difference(a, b, skip=(var, var + _OTHER))
    if rest is None:
        return False
    bounds = value_range(rest, extents)
    return bounds is not None and -abs(coefficient) < bounds[0] and bounds[1] < abs(coefficient)


def _difference(a: Affine, b: Affine, skip: tuple[str, ...]) -> Affine | None:
    """a - b without the terms in `skip`; None when opaque parts do not cancel (identical
    loop-invariant sub-expressions do)."""
    terms: dict[str, int] = {}
    for name, coefficient in a.terms:
        terms[name] = terms.get(name, 0) + coefficient
    for name, coefficient in b.terms:
        terms[name] = terms.get(name, 0) - coefficient
    opaque: dict[L.Expr, int] = {}
    for sub, coefficient in a.opaque:
        opaque[sub] = opaque.get(sub, 0) + coefficient
    for sub, coefficient in b.opaque:
        opaque[sub] = opaque.get(sub, 0) - coefficient
    if any(opaque.values()):
        return None
    return Affine(tuple(sorted((n, c) for n, c in terms.items() if c and n not in skip)),
                  a.constant - b.constant)


def gemm_split_is_safe(gemm: L.Gemm) -> bool:
    """A Gemm's threads write disjoint blocks of `out`; that is safe unless an operand reads
    `out` itself (then a thread could read what another has already overwritten)."""
    return all(not (isinstance(sub, L.Load) and sub.buffer == gemm.out)
               for operand in (gemm.a_elem, gemm.b_elem) for sub in L.subexpressions(operand))
