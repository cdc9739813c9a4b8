"""Calls of registry ops while checking: binding a call's arguments to the op's parameters,
and the context its typing rule sees (`OpContext`: proofs, failures at the argument).
"""

from __future__ import annotations

import sympy

from . import ast
from .checked import Obligation
from .diagnostics import KinaError, Span
from .ops import OpDef
from .types import format_dim


class OpContext:
    """The `ShapeContext` handed to an op's typing rule for one call site."""

    def __init__(self, checker, opname: str, span: Span, arg_spans: dict[str, Span]):
        self.checker = checker
        self.opname = opname
        self.span = span
        self.arg_spans = arg_spans

    def _span(self, at: str | None) -> Span:
        return self.arg_spans.get(at, self.span) if at else self.span

    def record(self, kind: str, claim: str) -> None:
        function = self.checker.scope.name if self.checker.scope else ""
        self.checker.obligations.append(Obligation(function, kind, claim, self.span))

    def prove_equal(self, lhs, rhs, kind, claim, message, at=None, notes=()) -> None:
        lhs_expanded, rhs_expanded = sympy.expand(lhs), sympy.expand(rhs)
        # Expanded polynomials are canonical, so equal ones need no subtraction (which builds
        # an Add, and sympy's first Add costs ~30 ms of lazy imports).
        if lhs_expanded == rhs_expanded:
            self.record(kind, claim)
            return
        difference = sympy.expand(lhs_expanded - rhs_expanded)
        if difference == 0:
            self.record(kind, claim)
            return
        values = self.checker.substitution
        concrete_lhs = sympy.sympify(lhs).subs(values)
        concrete_rhs = sympy.sympify(rhs).subs(values)
        extra = [f"{format_dim(lhs)} - ({format_dim(rhs)}) simplifies to "
                 f"{format_dim(difference)}, not 0"]
        if concrete_lhs == concrete_rhs:
            extra.append(f"they are equal for the current values ({concrete_lhs}), but not "
                         "for every value of the constants, and shapes are checked for all "
                         "values")
            lhs_e, rhs_e = sympy.sympify(lhs), sympy.sympify(rhs)
            if kind == "reshape-count":
                extra.append("write the target dims with the consts of the source shape")
            elif lhs_e.is_Integer != rhs_e.is_Integer:
                symbolic, literal = (rhs_e, lhs_e) if lhs_e.is_Integer else (lhs_e, rhs_e)
                extra.append(f"write {format_dim(symbolic)} instead of the literal {literal}")
            else:
                extra.append("define one const in terms of the other (e.g. const D = H * Dh)")
        raise KinaError("shape", message, self._span(at), tuple(notes) + tuple(extra))

    def fail(self, kind, message, at=None, notes=()) -> None:
        raise KinaError(kind, message, self._span(at), tuple(notes))

    def prove_at_most(self, lhs, rhs, kind, claim, message, at=None) -> None:
        """lhs <= rhs: proved for every value of the consts when sympy can (T - 1 >= 0),
        otherwise checked at the declared values and recorded as such."""
        gap = sympy.expand(sympy.sympify(rhs) - sympy.sympify(lhs))
        if gap.is_nonnegative:
            self.record(kind, claim)
            return
        if self.checker.evaluate(gap) < 0:
            raise KinaError("shape", message, self._span(at))
        self.record(kind, claim + " (at the declared const values)")


# ---- helpers --------------------------------------------------------------------------------

def literal_value(expr: ast.Expr):
    if isinstance(expr, ast.IntLit):
        return expr.value
    if isinstance(expr, ast.FloatLit):
        return expr.value
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = literal_value(expr.operand)
        return None if inner is None else -inner
    return None


def freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, sympy.Integer):
        return int(value)
    return value


def bind_arguments(op: OpDef, call: ast.Call) -> dict[str, ast.Expr]:
    params = op.params
    positional = [p for p in params if not p.keyword_only]
    args: list = list(call.args)
    if positional and positional[-1].variadic:
        # The trailing variadic parameter takes every remaining positional argument.
        fixed = len(positional) - 1
        if len(args) <= fixed:
            raise KinaError("arity", f"'{op.name}' needs at least one tensor", call.span,
                            (signature_text(op),))
        args = args[:fixed] + [args[fixed:]]
    if len(args) > len(positional):
        raise KinaError("arity", f"'{op.name}' takes at most {len(positional)} positional "
                        f"argument(s), got {len(call.args)}", call.args[len(positional)].span,
                        (signature_text(op),))
    bound: dict[str, ast.Expr] = {}
    for param, arg in zip(positional, args, strict=False):
        bound[param.name] = arg
    by_name = {p.name: p for p in params}
    for kwarg in call.kwargs:
        if kwarg.name not in by_name:
            raise KinaError("arity", f"'{op.name}' has no argument named '{kwarg.name}'",
                            kwarg.span, (signature_text(op),))
        if kwarg.name in bound:
            raise KinaError("arity", f"argument '{kwarg.name}' of '{op.name}' is given twice",
                            kwarg.span)
        bound[kwarg.name] = kwarg.value
    for param in params:
        if param.name not in bound and not param.has_default:
            raise KinaError("arity", f"'{op.name}' is missing argument '{param.name}'",
                            call.span, (signature_text(op),))
    return bound


def signature_text(op: OpDef) -> str:
    shown = {"tensor": "tensor", "tensor_or_literal": "tensor or number", "dims": "[dims]",
             "ints": "[ints]", "dim": "dim", "axis": "int", "tensors": "tensor, ...",
             "offset": "dim", "number": "number", "dtype": "DTYPE"}
    parts = [f"{p.name}: {shown[p.kind]}" for p in op.params]
    return f"signature: {op.name}({', '.join(parts)})"


def did_you_mean(name: str, candidates: list[str]) -> tuple[str, ...]:
    import difflib

    close = difflib.get_close_matches(name, candidates, n=1)
    return (f"did you mean '{close[0]}'?",) if close else ()


