"""Tensor-IR simplification: small named rewrite patterns, then CSE and dead code removal.

The gradient rules are written for the general case, so their output is full of
identities: reshapes and broadcasts to the shape a value already has, sums over axes of
size 1, transposes of transposes, products with a tensor of ones, sums with zeros. The
patterns below remove them. Each pattern sees one operation (its operands already
renamed) and the defining operation of every earlier value, and returns

- a `Value` of the same type to use instead of the operation's result,
- an `Operation` producing the same result value (a cheaper op), or
- None to leave it alone.

`simplify_function` runs the patterns, common subexpression elimination and dead code
elimination until nothing changes. Every rewrite keeps each value's type, so the
result still passes `verify.verify_function`. Nothing here changes a computed number:
only exact identities are folded (`x * 1`, `x + 0`, `-(-x)`; never `x * 0`, which is
not 0 for inf or nan).
"""

from __future__ import annotations

from collections.abc import Callable

from .tensor_ir import Function, Operation, Value, make_attrs
from .verify import dims_equal, types_equal

Defs = dict[str, Operation]
Pattern = Callable[[Operation, Defs], "Value | Operation | None"]

# Iterations of (patterns, CSE, DCE) before giving up on reaching a fixed point.
MAX_ROUNDS = 16


# ---- helpers --------------------------------------------------------------------------------

def _fill_value(value: Value, defs: Defs):
    """The number a value is filled with, or None when it is not a `fill`."""
    op = defs.get(value.name)
    return op.attr("value") if op is not None and op.op == "fill" else None


def _is_fill(value: Value, defs: Defs, number: float) -> bool:
    filled = _fill_value(value, defs)
    return filled is not None and filled == number


def _ints(op: Operation, key: str) -> tuple[int, ...]:
    value = op.attr(key)
    assert isinstance(value, tuple), (op.op, key)
    return tuple(int(v) for v in value)


def _int(op: Operation, key: str) -> int:
    value = op.attr(key)
    assert isinstance(value, int), (op.op, key)
    return value


def _with_op(op: Operation, opname: str, operands: tuple[Value, ...], **attrs) -> Operation:
    return Operation(opname, operands, op.results, make_attrs(**attrs), op.span)


def _refill(op: Operation, number) -> Operation:
    ttype = op.result.type
    return _with_op(op, "fill", (), value=number, shape=ttype.shape, dtype=ttype.dtype.value)


# ---- patterns -------------------------------------------------------------------------------

def fold_noop_layout(op: Operation, defs: Defs):
    """reshape / broadcast to the operand's own shape, transpose by the identity: the operand."""
    if op.op in ("reshape", "broadcast") and types_equal(op.operands[0].type, op.result.type):
        return op.operands[0]
    if op.op == "transpose" and _ints(op, "perm") == tuple(range(len(_ints(op, "perm")))):
        return op.operands[0]
    return None


def fold_layout_chains(op: Operation, defs: Defs):
    """transpose(transpose(x, p), q) = transpose(x, p[q]); reshape(reshape(x)) = reshape(x);
    broadcast(broadcast(x)) = broadcast(x) (numpy broadcasting composes)."""
    if op.op not in ("transpose", "reshape", "broadcast"):
        return None
    inner = defs.get(op.operands[0].name)
    if inner is None or inner.op != op.op:
        return None
    source = inner.operands[0]
    if op.op == "transpose":
        first, second = _ints(inner, "perm"), _ints(op, "perm")
        composed = tuple(first[axis] for axis in second)
        if composed == tuple(range(len(composed))):
            return source
        return _with_op(op, "transpose", (source,), perm=composed)
    if types_equal(source.type, op.result.type):
        return source
    return _with_op(op, op.op, (source,), shape=op.result.type.shape)


def fold_unit_sum(op: Operation, defs: Defs):
    """sum over an axis of extent 1 is a reshape that drops the axis."""
    if op.op != "sum":
        return None
    (x,) = op.operands
    if not dims_equal(x.type.shape[_int(op, "axis")], 1):
        return None
    return _with_op(op, "reshape", (x,), shape=tuple(op.result.type.shape))


def fold_fill_layout(op: Operation, defs: Defs):
    """A layout op or a negation of a constant tensor is a constant tensor."""
    if op.op in ("reshape", "broadcast", "transpose") and \
            _fill_value(op.operands[0], defs) is not None:
        return _refill(op, _fill_value(op.operands[0], defs))
    if op.op == "neg" and _fill_value(op.operands[0], defs) is not None:
        return _refill(op, -_fill_value(op.operands[0], defs))
    return None


def fold_identities(op: Operation, defs: Defs):
    """x * 1, 1 * x, x / 1, x + 0, 0 + x, x - 0 are x; 0 - x is -x; -(-x) is x."""
    if op.op in ("mul", "add", "sub", "div"):
        lhs, rhs = op.operands
        unit = 1 if op.op in ("mul", "div") else 0
        if _is_fill(rhs, defs, unit):
            return lhs
        if op.op in ("mul", "add") and _is_fill(lhs, defs, unit):
            return rhs
        if op.op == "sub" and _is_fill(lhs, defs, 0):
            return _with_op(op, "neg", (rhs,))
    if op.op == "neg":
        inner = defs.get(op.operands[0].name)
        if inner is not None and inner.op == "neg":
            return inner.operands[0]
    return None


PATTERNS: tuple[tuple[str, Pattern], ...] = (
    ("fold-noop-layout", fold_noop_layout),
    ("fold-layout-chains", fold_layout_chains),
    ("fold-unit-sum", fold_unit_sum),
    ("fold-fill-layout", fold_fill_layout),
    ("fold-identities", fold_identities),
)


# ---- passes ---------------------------------------------------------------------------------

def rewrite_pass(function: Function, patterns=PATTERNS) -> Function:
    """Apply `patterns` to each operation in order until none matches it."""
    rename: dict[str, Value] = {}
    defs: Defs = {}
    body: list[Operation] = []
    for op in function.body:
        op = Operation(op.op, tuple(rename.get(v.name, v) for v in op.operands), op.results,
                       op.attrs, op.span)
        replacement: Value | None = None
        changed = True
        while changed and replacement is None:
            changed = False
            for _, pattern in patterns:
                outcome = pattern(op, defs)
                if outcome is None:
                    continue
                if isinstance(outcome, Value):
                    replacement = outcome
                else:
                    op, changed = outcome, True
                break
        if replacement is not None:
            (result,) = op.results
            if not types_equal(replacement.type, result.type):
                raise AssertionError(f"simplify replaced {result} ({result.type}) by "
                                     f"{replacement} ({replacement.type})")
            rename[result.name] = replacement
            continue
        body.append(op)
        for result in op.results:
            defs[result.name] = op
    return _rebuild(function, body, rename)


def cse_pass(function: Function) -> Function:
    """Common subexpression elimination: an operation identical to an earlier one (same op,
    operands and attributes) reuses the earlier result. Every Kina op is pure."""
    rename: dict[str, Value] = {}
    seen: dict[tuple, tuple[Value, ...]] = {}
    body: list[Operation] = []
    for op in function.body:
        op = Operation(op.op, tuple(rename.get(v.name, v) for v in op.operands), op.results,
                       op.attrs, op.span)
        if op.op != "placeholder":
            key = (op.op, tuple(v.name for v in op.operands), _attr_key(op.attrs),
                   tuple(r.type for r in op.results))
            earlier = seen.get(key)
            if earlier is not None:
                for result, previous in zip(op.results, earlier, strict=True):
                    rename[result.name] = previous
                continue
            seen[key] = op.results
        body.append(op)
    return _rebuild(function, body, rename)


def _attr_key(attrs) -> tuple:
    # repr keeps 0.0 and -0.0 apart (they compare equal but are different fills).
    return tuple((k, repr(v)) for k, v in attrs)


def dce_pass(function: Function) -> Function:
    """Drop operations none of whose results reaches a function result."""
    return eliminate_dead_code(function)


def _rebuild(function: Function, body: list[Operation], rename: dict[str, Value]) -> Function:
    results = tuple(rename.get(v.name, v) for v in function.results)
    return Function(function.name, function.params, tuple(body), results, function.is_main,
                    function.span)


PASSES: tuple[tuple[str, Callable[[Function], Function]], ...] = (
    ("rewrite", rewrite_pass),
    ("cse", cse_pass),
    ("dce", dce_pass),
)


def simplify_function(function: Function) -> Function:
    """Run PASSES until the function stops changing. An @main function without a `return`
    keeps its body (its outputs are its unread values, which DCE would remove)."""
    if function.is_main and not function.results:
        return function
    for _ in range(MAX_ROUNDS):
        before = function
        for _, pass_fn in PASSES:
            function = pass_fn(function)
        if function.body == before.body and function.results == before.results:
            break
    return function


def eliminate_dead_code(function: Function) -> Function:
    """Drop operations none of whose results reaches a function result."""
    live = {v.name for v in function.results}
    kept = []
    for op in reversed(function.body):
        if any(r.name in live for r in op.results):
            kept.append(op)
            live.update(v.name for v in op.operands)
    return Function(function.name, function.params, tuple(reversed(kept)), function.results,
                    function.is_main, function.span)
