"""Affine index arithmetic with known loop ranges.

Layout ops turn into index arithmetic: a reshape linearises the result index and
splits it by the source's dims with `//` and `%`. `floordiv` and `mod` here simplify
those away whenever the loop ranges prove it (e.g. (4*t + 2*h + d) // 4 == t when
2*h + d < 4), so views cost nothing in the generated loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .loopir import I64, Binary, Const, Expr, Var, add, free_vars, map_children, mul, substitute


@dataclass(frozen=True)
class Affine:
    terms: tuple[tuple[str, int], ...]  # (var name, coefficient), sorted
    constant: int
    opaque: tuple[tuple[Expr, int], ...] = ()  # non-affine sub-expressions with coefficients

    def coefficient(self, name: str) -> int:
        return dict(self.terms).get(name, 0)


def to_affine(expr: Expr) -> Affine:
    terms: dict[str, int] = {}
    opaque: dict[Expr, int] = {}
    constant = _collect(expr, 1, terms, opaque)
    return Affine(tuple(sorted((k, v) for k, v in terms.items() if v)), constant,
                  tuple((e, c) for e, c in opaque.items() if c))


def _collect(expr: Expr, scale: int, terms: dict, opaque: dict) -> int:
    if isinstance(expr, Const):
        return scale * int(expr.value)
    if isinstance(expr, Var):
        terms[expr.name] = terms.get(expr.name, 0) + scale
        return 0
    if isinstance(expr, Binary) and expr.op == "add":
        return _collect(expr.lhs, scale, terms, opaque) + _collect(expr.rhs, scale, terms, opaque)
    if isinstance(expr, Binary) and expr.op == "sub":
        return _collect(expr.lhs, scale, terms, opaque) - _collect(expr.rhs, scale, terms, opaque)
    if isinstance(expr, Binary) and expr.op == "mul":
        if isinstance(expr.rhs, Const):
            return _collect(expr.lhs, scale * int(expr.rhs.value), terms, opaque)
        if isinstance(expr.lhs, Const):
            return _collect(expr.rhs, scale * int(expr.lhs.value), terms, opaque)
    opaque[expr] = opaque.get(expr, 0) + scale
    return 0


def from_affine(affine: Affine, variables: dict[str, Var]) -> Expr:
    result: Expr = Const(affine.constant, I64)
    for name, coefficient in affine.terms:
        result = add(result, mul(variables[name], Const(coefficient, I64)))
    for expr, coefficient in affine.opaque:
        result = add(result, mul(expr, Const(coefficient, I64)))
    return result


def value_range(affine: Affine, extents: dict[str, int]) -> tuple[int, int] | None:
    """[min, max] of an affine index given each var's extent; None if unbounded."""
    if affine.opaque:
        return None
    lo = hi = affine.constant
    for name, coefficient in affine.terms:
        if name not in extents:
            return None
        top = coefficient * (extents[name] - 1)
        lo += min(0, top)
        hi += max(0, top)
    return lo, hi


class IndexSimplifier:
    """Builds `//` and `%` by constants, simplified with the ranges of the loop vars."""

    def __init__(self) -> None:
        self.extents: dict[str, int] = {}
        self.variables: dict[str, Var] = {}

    def declare(self, var: Var, extent: int) -> None:
        self.extents[var.name] = extent
        self.variables[var.name] = var

    def _split(self, expr: Expr, divisor: int):
        affine = to_affine(expr)
        quotient_terms, rest_terms = [], []
        for name, coefficient in affine.terms:
            if coefficient % divisor == 0:
                quotient_terms.append((name, coefficient // divisor))
            else:
                rest_terms.append((name, coefficient))
        q_const, r_const = divmod(affine.constant, divisor)
        quotient = Affine(tuple(quotient_terms), q_const)
        rest = Affine(tuple(rest_terms), r_const, affine.opaque)
        return quotient, rest

    def floordiv(self, expr: Expr, divisor: int) -> Expr:
        if divisor == 1:
            return expr
        quotient, rest = self._split(expr, divisor)
        q_expr = from_affine(quotient, self.variables)
        bounds = value_range(rest, self.extents)
        if bounds is not None:
            lo, hi = bounds
            if lo // divisor == hi // divisor:
                return add(q_expr, Const(lo // divisor, I64))
        rest_expr = from_affine(rest, self.variables)
        return add(q_expr, Binary("floordiv", rest_expr, Const(divisor, I64), I64))

    def mod(self, expr: Expr, divisor: int) -> Expr:
        if divisor == 1:
            return Const(0, I64)
        _, rest = self._split(expr, divisor)
        bounds = value_range(rest, self.extents)
        rest_expr = from_affine(rest, self.variables)
        if bounds is not None and bounds[0] >= 0 and bounds[1] < divisor:
            return rest_expr
        return Binary("mod", rest_expr, Const(divisor, I64), I64)

    def linearize(self, index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
        flat: Expr = Const(0, I64)
        stride = 1
        for position in reversed(range(len(shape))):
            flat = add(flat, mul(index[position], Const(stride, I64)))
            stride *= shape[position]
        return flat

    def delinearize(self, flat: Expr, shape: tuple[int, ...]) -> tuple[Expr, ...]:
        index = []
        stride = 1
        for dim in reversed(shape):
            index.append(self.mod(self.floordiv(flat, stride), dim) if dim != 1
                         else Const(0, I64))
            stride *= dim
        return tuple(reversed(index))


def split_aligned_lanes(expr: Expr, lane: str, base: str, width: int, aligned: int,
                        varying: frozenset[str] = frozenset()) -> Expr:
    """`expr` for the lanes of a vector tile, lane = base + l with 0 <= l < width and
    `base` a multiple of `aligned` (0: base is 0), with each `e // c` and `e % c` that
    the tile's alignment decides rewritten without the lane: e = lane + r, where every
    coefficient and the constant of r, c and `aligned` share a factor g >= width, keeps
    e // c at its value at the base for all lanes, and e % c = (e at the base) % c + l
    (base + r is a multiple of g, so its remainder is at most c - g, and adding l < g
    does not carry). A reshape's `(i * 384 + k) // 32` and `k % 32` then load as one
    contiguous vector along k instead of a gather. Anything else, and any argument with
    another lane-varying name (`varying`), is left as it is."""
    if not isinstance(expr, Binary):
        return map_children(expr, lambda child: split_aligned_lanes(
            child, lane, base, width, aligned, varying))
    lhs = split_aligned_lanes(expr.lhs, lane, base, width, aligned, varying)
    rhs = split_aligned_lanes(expr.rhs, lane, base, width, aligned, varying)
    rebuilt = Binary(expr.op, lhs, rhs, expr.dtype)
    if expr.op not in ("floordiv", "mod") or not isinstance(rhs, Const) or \
            int(rhs.value) <= 0 or lane not in free_vars(lhs) or free_vars(lhs) & varying:
        return rebuilt
    affine = to_affine(lhs)
    if affine.coefficient(lane) != 1 or any(lane in free_vars(e) for e, _ in affine.opaque):
        return rebuilt
    factor = math.gcd(aligned, int(rhs.value), affine.constant,
                      *(c for name, c in affine.terms if name != lane),
                      *(c for _, c in affine.opaque))
    if factor < width:
        return rebuilt
    at_base = Binary(expr.op, substitute(lhs, {lane: Var(base)}), rhs, expr.dtype)
    if expr.op == "floordiv":
        return at_base
    return add(at_base, Binary("sub", Var(lane), Var(base), I64))
