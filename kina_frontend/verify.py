"""Tensor-IR verifier: the invariants the checker establishes, re-checked on any IR.

`verify_function` checks that a function is in SSA form (every value defined once and
before its first use, results defined) and that every registry operation's result
types are what the op's own shape rule gives for its operand types and attributes.
`call` and `reverse_mode` are checked against the callee's signature. Passes
(autodiff, simplify, inlining) are tested by running this after them.

`RuleContext` is the `ShapeContext` used outside the checker: a proof obligation that
does not hold is an error instead of a diagnostic at a source span, and nothing is
recorded. The autodiff builder uses it to type the operations it emits.
"""

from __future__ import annotations

from typing import Any

import sympy

from .diagnostics import KinaError, Span
from .ops import REGISTRY
from .tensor_ir import Function, Operation, Program, format_attr, format_operation
from .types import DType, TensorType

# Lines of printed IR shown on each side of the operation that failed.
CONTEXT_OPS = 5


class IRVerifyError(ValueError):
    """The IR breaks an invariant; the message names the function and the operation. `span`
    is the operation's (or function's) source span when it has one; `context` shows the
    printed operations around it."""

    def __init__(self, reason: str, span: Span | None = None, context: str = ""):
        super().__init__(reason + ("\n" + context if context else ""))
        self.reason, self.span, self.context = reason, span, context


class ShapeRuleError(ValueError):
    """An op's shape rule rejected the operand types it was given."""


class RuleContext:
    """A `ShapeContext` that proves or raises (see ops/registry.py)."""

    def __init__(self, opname: str):
        self.opname = opname

    def prove_equal(self, lhs, rhs, kind: str, claim: str, message: str,
                    at: str | None = None, notes: tuple[str, ...] = ()) -> None:
        if not dims_equal(lhs, rhs):
            raise ShapeRuleError(self._named(message))

    def fail(self, kind: str, message: str, at: str | None = None,
             notes: tuple[str, ...] = ()) -> None:
        raise ShapeRuleError(self._named(message))

    def _named(self, message: str) -> str:
        return message if f"'{self.opname}'" in message else f"{self.opname}: {message}"

    def record(self, kind: str, claim: str) -> None:
        pass

    def prove_at_most(self, lhs, rhs, kind: str, claim: str, message: str,
                      at: str | None = None) -> None:
        gap = sympy.expand(sympy.sympify(rhs) - sympy.sympify(lhs))
        if not (gap.is_nonnegative or gap.is_Integer and int(gap) >= 0):
            raise ShapeRuleError(f"{self.opname}: {message}")


def dims_equal(lhs, rhs) -> bool:
    if isinstance(lhs, int) and isinstance(rhs, int):
        return lhs == rhs
    return sympy.expand(sympy.sympify(lhs) - sympy.sympify(rhs)) == 0


def types_equal(lhs: TensorType, rhs: TensorType) -> bool:
    return (lhs.dtype == rhs.dtype and lhs.rank == rhs.rank and
            all(dims_equal(a, b) for a, b in zip(lhs.shape, rhs.shape, strict=True)))


def freeze_attr(value: Any) -> Any:
    """Attribute values as the IR stores them: tuples, and plain ints for integer dims."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, sympy.Integer):
        return int(value)
    return value


def infer_types(opname: str, operand_types: list[TensorType],
                attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    """The result types of registry op `opname`; `attrs` is normalised in place (the rules
    resolve negative axes and reshape's -1)."""
    definition = REGISTRY.get(opname)
    if definition is None:
        raise ShapeRuleError(f"unknown op '{opname}'")
    expected = len(definition.operand_params)
    variadic = any(p.variadic for p in definition.operand_params)
    if len(operand_types) != expected and not (variadic and len(operand_types) >= expected):
        raise ShapeRuleError(f"{opname}: expected {expected} operand(s), got "
                             f"{len(operand_types)}")
    missing = [p.name for p in definition.attr_params if p.name not in attrs]
    if missing:
        raise ShapeRuleError(f"{opname}: missing attribute(s) {', '.join(missing)}")
    known = {p.name for p in definition.attr_params}
    unknown = sorted(name for name in attrs if name not in known)
    if unknown:
        raise ShapeRuleError(f"{opname}: unknown attribute(s) {', '.join(unknown)} (it takes: "
                             f"{', '.join(sorted(known)) or 'none'})")
    for param in definition.attr_params:
        if not _fits_kind(param.kind, attrs[param.name]):
            raise ShapeRuleError(f"{opname}: attribute {param.name} must be "
                                 f"{_KIND_TEXT[param.kind]}, got {attrs[param.name]!r}")
    return tuple(definition.shape_rule(RuleContext(opname), list(operand_types), attrs))


_KIND_TEXT = {"dims": "a list of dims", "ints": "a list of integers", "dim": "a dim",
              "offset": "a dim or 0",
              "axis": "an integer", "number": "a number",
              "dtype": "an element type name (" + ", ".join(d.value for d in DType) + ")"}


def _is_dim(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, sympy.Expr) and value.is_integer is True)


def _fits_kind(kind: str, value: Any) -> bool:
    """Whether an attribute value has the shape its registry parameter kind promises."""
    if kind == "dims":
        return isinstance(value, tuple) and all(_is_dim(v) for v in value)
    if kind == "ints":
        return isinstance(value, tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
    if kind == "dim":
        return _is_dim(value)
    if kind == "offset":
        return _is_dim(value) and not (isinstance(value, int) and value < 0)
    if kind == "axis":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "dtype":
        return isinstance(value, str) and value in {d.value for d in DType}
    return False


# ---- the verifier ---------------------------------------------------------------------------

def verify_program(program: Program) -> None:
    names = [f.name for f in program.functions]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise IRVerifyError(f"function(s) defined twice: {', '.join(duplicates)}")
    for function in program.functions:
        verify_function(program, function)


def verify_function(program: Program | None, function: Function) -> None:
    """Raise IRVerifyError on the first broken invariant. `program` resolves callees; it may
    be None for a function without `call`/`reverse_mode`."""
    defined: dict[str, TensorType] = {}
    for param in function.params:
        if param.name in defined:
            raise IRVerifyError(f"@{function.name}: parameter %{param.name} is declared twice",
                                function.span)
        defined[param.name] = param.type
    for position, op in enumerate(function.body):
        def fail(message: str, position=position, op=op) -> IRVerifyError:
            # An operation without a span (built in Python) is shown in its context instead.
            return IRVerifyError(f"@{function.name}: {message}", op.span,
                                 _context(function, position))
        for operand in op.operands:
            if operand.name not in defined:
                raise fail(f"%{operand.name} is used before it is defined")
            if not types_equal(defined[operand.name], operand.type):
                raise fail(f"%{operand.name} is used as {operand.type} but defined as "
                           f"{defined[operand.name]}")
        for result in op.results:
            if result.name in defined:
                raise fail(f"%{result.name} is defined twice")
        names = [name for name, _ in op.attrs]
        if len(set(names)) != len(names):
            raise fail(f"'{op.op}' has an attribute given twice: {format_attrs(op)}")
        expected = _expected_types(program, function, op, fail)
        actual = tuple(r.type for r in op.results)
        if len(expected) != len(actual) or not all(
                types_equal(e, a) for e, a in zip(expected, actual, strict=True)):
            shown = ", ".join(str(t) for t in expected)
            raise fail(f"'{op.op}' is typed {', '.join(str(t) for t in actual)} but its rule "
                       f"gives {shown}")
        for result in op.results:
            defined[result.name] = result.type
    for value in function.results:
        if value.name not in defined:
            raise IRVerifyError(f"@{function.name}: result %{value.name} is never defined",
                                function.span)
        if not types_equal(defined[value.name], value.type):
            raise IRVerifyError(f"@{function.name}: result %{value.name} is returned as "
                                f"{value.type} but defined as {defined[value.name]}",
                                function.span)


# ---- the API's gate: tensor IR that code generation can take --------------------------------

def check_program(program: Program) -> None:
    """Raise a KinaError (kind `ir`, at the operation's span when it has one) unless
    `program` is tensor IR that code generation can take: well typed by `verify_program`,
    every type concrete and within the checker's size limits, at most one @main, no call of
    the @main, no recursion, placeholders numbered in order. `tilegen.compile_program` runs
    this on every program before lowering, so IR built or parsed by hand cannot reach
    native code ill-typed."""
    try:
        _check_concrete(program)
        _check_calls(program)
        verify_program(program)
    except IRVerifyError as error:
        notes = () if error.span is not None or not error.context else (
            "in context:\n" + error.context,)
        raise KinaError("ir", error.reason, error.span, notes) from None


def _check_concrete(program: Program) -> None:
    from .checked import MAX_DIM, MAX_ELEMENTS  # the limits the checker puts on source

    def check(ttype, what: str, span) -> None:
        if not isinstance(ttype, TensorType):
            raise IRVerifyError(f"{what} has no tensor type: {ttype!r}", span)
        for dim in ttype.shape:
            if isinstance(dim, bool) or not isinstance(dim, int):
                raise IRVerifyError(f"{what} has the symbolic type {ttype}: compile_program "
                                    f"takes concrete IR (specialize the program first)", span)
            if not 1 <= dim <= MAX_DIM:
                raise IRVerifyError(f"{what} has type {ttype}: dims must lie in "
                                    f"[1, {MAX_DIM}]", span)
        count = 1
        for dim in ttype.shape:
            count *= dim
        if count > MAX_ELEMENTS:
            raise IRVerifyError(f"{what} has type {ttype}: {count} elements, more than the "
                                f"limit of {MAX_ELEMENTS}", span)

    if sum(1 for f in program.functions if f.is_main) > 1:
        raise IRVerifyError("more than one function is the @main: "
                            + ", ".join(f"@{f.name}" for f in program.functions if f.is_main))
    for function in program.functions:
        for param in function.params:
            check(param.type, f"@{function.name}: parameter %{param.name}", function.span)
        for op in function.body:
            for result in op.results:
                check(result.type, f"@{function.name}: %{result.name} = {op.op}(...)",
                      op.span or function.span)
        for value in function.results:
            check(value.type, f"@{function.name}: result %{value.name}", function.span)
        placeholders = [op for op in function.body if op.op == "placeholder"]
        for number, op in enumerate(placeholders):
            if op.attr("index") != number:
                raise IRVerifyError(f"@{function.name}: placeholder {number} has index "
                                    f"{op.attr('index')!r}; placeholders are numbered 0, 1, ... "
                                    f"in order", op.span or function.span)


def _check_calls(program: Program) -> None:
    """No `call`/`reverse_mode` of the @main and no cycle of calls (functions are inlined)."""
    names = set(program.function_names)
    callees: dict[str, list[tuple[str, Operation]]] = {}
    for function in program.functions:
        callees[function.name] = []
        for op in function.body:
            if op.op not in ("call", "reverse_mode"):
                continue
            callee = op.attr("callee")
            if not isinstance(callee, str) or callee not in names:
                raise IRVerifyError(f"@{function.name}: '{op.op}' of unknown function "
                                    f"{callee!r}", op.span or function.span)
            if program.function(callee).is_main:
                raise IRVerifyError(f"@{function.name}: '{op.op}' of the @main function "
                                    f"@{callee}", op.span or function.span)
            callees[function.name].append((callee, op))
    # Depth-first, with an explicit stack (a chain of thousands of calls is legal).
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in program.function_names:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(callees[root]))]
        while stack:
            name, edges = stack[-1]
            edge = next(edges, None)
            if edge is None:
                state[name] = 2
                stack.pop()
                continue
            callee, op = edge
            if state.get(callee) == 1:
                raise IRVerifyError(f"@{name}: '{op.op}' of @{callee} makes the calls "
                                    f"recursive (functions are inlined)", op.span)
            if callee not in state:
                state[callee] = 1
                stack.append((callee, iter(callees[callee])))


def _expected_types(program, function, op: Operation, fail) -> tuple[TensorType, ...]:
    if op.op == "placeholder":
        if not function.is_main:
            raise fail("placeholder outside the @main function")
        if op.operands or len(op.results) != 1 or set(op.attr_dict) != {"index"}:
            raise fail("'placeholder' takes no operands, has one result and one attribute, "
                       "index")
        return tuple(r.type for r in op.results)
    if op.op in ("call", "reverse_mode"):
        callee_name = op.attr("callee")
        if program is None or callee_name not in program.function_names:
            raise fail(f"'{op.op}' of unknown function '{callee_name}'")
        callee = program.function(callee_name)
        if len(op.operands) != len(callee.params):
            raise fail(f"'{op.op}' passes {len(op.operands)} argument(s) to @{callee_name}, "
                       f"which takes {len(callee.params)}")
        for operand, param in zip(op.operands, callee.params, strict=True):
            if not types_equal(operand.type, param.type):
                raise fail(f"argument %{operand.name}: {operand.type} does not match "
                           f"@{callee_name}'s parameter %{param.name}: {param.type}")
        if op.op == "call":
            return callee.result_types
        wrt = op.attr("wrt")
        if not isinstance(wrt, tuple) or not all(
                isinstance(i, int) and 0 <= i < len(callee.params) for i in wrt):
            raise fail(f"'reverse_mode' has a bad wrt list {wrt!r} for @{callee_name}")
        return callee.result_types + tuple(callee.params[i].type for i in wrt)
    attrs = dict(op.attrs)
    try:
        types = infer_types(op.op, [v.type for v in op.operands], attrs)
        # The rules resolve a negative axis and reshape's -1; lowering reads the attributes
        # as they stand, so the IR must hold them resolved (as the checker writes them).
        for name, value in op.attrs:
            if attrs[name] is not value and freeze_attr(attrs[name]) != value:
                raise fail(f"'{op.op}' attribute {name} = {format_attr(value)} must be written "
                           f"resolved, as {format_attr(freeze_attr(attrs[name]))}")
        return types
    except ShapeRuleError as error:
        raise fail(str(error)) from None
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as error:
        # The attribute kinds were checked, so this is a rule meeting values it did not
        # expect (a huge axis, say): still the IR's fault, never a crash of the verifier.
        raise fail(f"'{op.op}' rejects its attributes {format_attrs(op)}: {error}") from None


def format_attrs(op: Operation) -> str:
    return "{" + ", ".join(f"{k} = {format_attr(v)}" for k, v in op.attrs) + "}"


def _context(function: Function, position: int) -> str:
    lo = max(0, position - CONTEXT_OPS)
    hi = min(len(function.body), position + CONTEXT_OPS + 1)
    lines = []
    for index in range(lo, hi):
        marker = ">>" if index == position else "  "
        lines.append(f"  {marker} {format_operation(function.body[index])}")
    return "\n".join(lines)


__all__ = ["IRVerifyError", "RuleContext", "ShapeRuleError", "check_program", "dims_equal",
           "freeze_attr", "infer_types", "types_equal", "verify_function", "verify_program"]
