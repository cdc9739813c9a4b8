"""Deferring a row scaling into the contraction that reads it.

softmax ends by scaling each row by 1 / its sum: one more pass over the whole [rows, n]
result. When the only reader of that result is a sum over the row (attention's p @ v:
o[i, d] = sum over k of p[i, k] v[k, d]), the scale can be applied to each finished sum
instead, as flash attention does: sum(p * s * v) = s * sum(p * v). The pass over p goes,
and each output pays one multiply (StoryLM-0: 2 592 scaled elements become 144 scaled
sums). The rounding differs by at most an ulp or so of each output, as any other order
of a float sum would.

`defer_row_scaling` finds a top-level nest `B[idx] = B[idx] * scale` (idx made of the
nest's own loop variables, scale constant along the innermost one) and moves the scale
into every later reader when each reads B only as a factor of a product summed over the
scaled axis, and B is a temporary nothing else reads or writes afterwards.
"""

from __future__ import annotations

from dataclasses import replace

from . import loopir as L


def defer_row_scaling(kernel: L.Kernel) -> L.Kernel:
    body = list(kernel.body)
    position = 0
    while position < len(body):
        rewritten = _defer(body[position], body[position + 1:], kernel)
        if rewritten is None:
            position += 1
            continue
        body = body[:position] + rewritten
    return replace(kernel, body=tuple(body)) if len(body) != len(kernel.body) else kernel


class _NotDeferrable(Exception):
    """B is read some other way than as a summed factor."""


def _defer(stmt: L.Stmt, later: list[L.Stmt], kernel: L.Kernel) -> list[L.Stmt] | None:
    """`later` with the scaling `stmt` moved into its readers, or None."""
    scaling = _scaling(stmt, kernel)
    if scaling is None:
        return None
    buffer = scaling[0]
    readers = {}
    for statement in L.statements(later):
        if isinstance(statement, L.Gemm):
            if _mentions(statement.a_elem, buffer) or _mentions(statement.b_elem, buffer) \
                    or statement.out == buffer:
                return None
            continue
        if isinstance(statement, (L.Attention, L.FusedStmt)):
            if buffer in statement.reads() or buffer in statement.writes():
                return None
            continue
        if isinstance(statement, L.Store) and statement.buffer == buffer:
            return None
        if isinstance(statement, L.For) or not _mentions(statement.value, buffer):
            continue
        try:
            readers[id(statement)] = _rescale(statement.value, *scaling)
        except _NotDeferrable:
            return None
        if isinstance(statement, L.Store) and any(_mentions(e, buffer)
                                                  for e in statement.index):
            return None
    if not readers:
        return None
    return [_replace_values(s, readers) for s in later]


def _scaling(stmt: L.Stmt, kernel: L.Kernel):
    """(buffer, {row var: axis}, scaled axis, scale) when `stmt` is a row-scaling nest."""
    nest = L.perfect_nest(stmt)
    if len(nest) < 2 or len(nest[-1].body) != 1 or not isinstance(nest[-1].body[0], L.Store):
        return None
    loops = [loop.var.name for loop in nest]
    inner = nest[-1].body[0]
    buffer = kernel.buffer(inner.buffer)
    value = inner.value
    if buffer.role != "temp" or not isinstance(value, L.Binary) or value.op != "mul":
        return None
    own = L.Load(inner.buffer, inner.index, buffer.dtype)
    if value.lhs == own:
        scale = value.rhs
    elif value.rhs == own:
        scale = value.lhs
    else:
        return None
    axes = {}
    for axis, component in enumerate(inner.index):
        if isinstance(component, L.Var) and component.name in loops \
                and component.name not in axes:
            axes[component.name] = axis
        elif not isinstance(component, L.Const):
            return None
    innermost = loops[-1]
    if set(axes) != set(loops) or innermost in L.free_vars(scale) or \
            _mentions(scale, inner.buffer) or L.contains(scale, (L.Reduce, L.CheckedId)):
        return None
    scaled_axis = axes.pop(innermost)
    return inner.buffer, axes, scaled_axis, scale


def _rescale(expr: L.Expr, buffer: str, positions: dict[str, int], scaled_axis: int,
             scale: L.Expr) -> L.Expr:
    """`expr` with each `sum[k](B[...] * other)` turned into `sum[k](B[...] * other) *
    scale'` (scale at that row); _NotDeferrable when B is read any other way."""
    if isinstance(expr, L.Reduce) and expr.op == "sum":
        factor = _summed_factor(expr, buffer, positions, scaled_axis)
        if factor is not None:
            row = {var: factor.index[axis] for var, axis in positions.items()}
            return L.Binary("mul", expr, L.substitute(scale, row), expr.dtype)
    if isinstance(expr, L.Load) and expr.buffer == buffer:
        raise _NotDeferrable
    return L.map_children(expr, lambda child: _rescale(child, buffer, positions,
                                                       scaled_axis, scale))


def _summed_factor(reduce: L.Reduce, buffer: str, positions, scaled_axis) -> L.Load | None:
    """The load of B in `sum[k](B[...] * other)` when B's row axes do not depend on k and
    nothing else in the product reads B."""
    body = reduce.body
    if not isinstance(body, L.Binary) or body.op != "mul":
        return None
    for factor, other in ((body.lhs, body.rhs), (body.rhs, body.lhs)):
        if isinstance(factor, L.Load) and factor.buffer == buffer and \
                not _mentions(other, buffer) and \
                not any(_mentions(component, buffer) for component in factor.index) and \
                not any(reduce.var.name in L.free_vars(factor.index[axis])
                        for axis in positions.values()):
            return factor
    return None


def _mentions(expr: L.Expr, buffer: str) -> bool:
    return any(isinstance(e, L.Load) and e.buffer == buffer for e in L.subexpressions(expr))


def _replace_values(stmt: L.Stmt, values: dict[int, L.Expr]) -> L.Stmt:
    if isinstance(stmt, L.For):
        return replace(stmt, body=tuple(_replace_values(s, values) for s in stmt.body))
    if id(stmt) in values:
        return replace(stmt, value=values[id(stmt)])
    return stmt
