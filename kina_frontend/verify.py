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

from .ops import REGISTRY
from .tensor_ir import Function, Operation, Program, format_operation
from .types import TensorType

# Lines of printed IR shown on each side of the operation that failed.
CONTEXT_OPS = 5


class IRVerifyError(ValueError):
    """The IR breaks an invariant; the message names the function and the operation."""


class ShapeRuleError(ValueError):
    """An op's shape rule rejected the operand types it was given."""


class RuleContext:
    """A `ShapeContext` that proves or raises (see ops/registry.py)."""

    def __init__(self, opname: str):
        self.opname = opname

    def prove_equal(self, lhs, rhs, kind: str, claim: str, message: str,
                    at: str | None = None, notes: tuple[str, ...] = ()) -> None:
        if not dims_equal(lhs, rhs):
            raise ShapeRuleError(f"{self.opname}: {message}")

    def fail(self, kind: str, message: str, at: str | None = None,
             notes: tuple[str, ...] = ()) -> None:
        raise ShapeRuleError(f"{self.opname}: {message}")

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
    return tuple(definition.shape_rule(RuleContext(opname), list(operand_types), attrs))


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
            raise IRVerifyError(f"@{function.name}: parameter %{param.name} is declared twice")
        defined[param.name] = param.type
    for position, op in enumerate(function.body):
        def fail(message: str, position=position) -> IRVerifyError:
            return IRVerifyError(f"@{function.name}: {message}\n" +
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
            raise IRVerifyError(f"@{function.name}: result %{value.name} is never defined")
        if not types_equal(defined[value.name], value.type):
            raise IRVerifyError(f"@{function.name}: result %{value.name} is returned as "
                                f"{value.type} but defined as {defined[value.name]}")


def _expected_types(program, function, op: Operation, fail) -> tuple[TensorType, ...]:
    if op.op == "placeholder":
        if not function.is_main:
            raise fail("placeholder outside the @main function")
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
        return infer_types(op.op, [v.type for v in op.operands], attrs)
    except ShapeRuleError as error:
        raise fail(str(error)) from None


def _context(function: Function, position: int) -> str:
    lo = max(0, position - CONTEXT_OPS)
    hi = min(len(function.body), position + CONTEXT_OPS + 1)
    lines = []
    for index in range(lo, hi):
        marker = ">>" if index == position else "  "
        lines.append(f"  {marker} {format_operation(function.body[index])}")
    return "\n".join(lines)


__all__ = ["IRVerifyError", "RuleContext", "ShapeRuleError", "dims_equal", "freeze_attr",
           "infer_types", "types_equal", "verify_function", "verify_program"]
