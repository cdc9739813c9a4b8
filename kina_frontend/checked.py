"""What the checker hands on: the symbolic tensor IR with the proofs discharged for it, and
its specialisation (every const replaced by its value).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .diagnostics import Span
from .tensor_ir import Function, Operation, Program, Value
from .types import TensorType, const_symbol

# Guards that keep hostile programs from asking for absurd allocations.
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**34

@dataclass(frozen=True)
class Obligation:
    function: str
    kind: str
    claim: str
    span: Span | None


@dataclass(frozen=True)
class CheckedProgram:
    """The symbolic tensor IR plus what was proved about it."""

    program: Program
    constants: dict[str, int]
    symbols: dict[str, sympy.Expr]
    obligations: tuple[Obligation, ...]


_EVALUATED: dict[tuple, int] = {}
_FREE_NAMES: dict = {}  # dim -> the names of the consts it mentions


def evaluate_dim(dim, constants: dict[str, int]) -> int:
    """int(dim) with each const symbol replaced by its value; memoised, since the same few
    dims recur through a program (sympy's subs is slow)."""
    if isinstance(dim, int):
        return dim
    if dim.is_Integer:
        return int(dim)
    # Only the consts the dim mentions: keying and substituting over every const made a
    # program with thousands of consts quadratic.
    names = _FREE_NAMES.get(dim)
    if names is None:
        names = tuple(sorted(symbol.name for symbol in dim.free_symbols))
        if len(_FREE_NAMES) > 100_000:
            _FREE_NAMES.clear()
        _FREE_NAMES[dim] = names
    used = tuple((name, constants[name]) for name in names if name in constants)
    key = (dim, used)
    value = _EVALUATED.get(key)
    if value is None:
        mapping = {const_symbol(n): sympy.Integer(v) for n, v in used}
        value = int(dim.xreplace(mapping))
        if len(_EVALUATED) > 100_000:
            _EVALUATED.clear()
        _EVALUATED[key] = value
    return value


def specialize(checked: CheckedProgram) -> Program:
    """Substitute every const's value: all shapes and dim attributes become ints."""

    def concrete(dim):
        return evaluate_dim(dim, checked.constants)

    def ttype(t: TensorType) -> TensorType:
        return TensorType(t.dtype, tuple(concrete(d) for d in t.shape))

    def value(v: Value) -> Value:
        return Value(v.name, ttype(v.type))

    def attr(key, v):
        if key in ("shape", "n") or (isinstance(v, sympy.Expr)):
            if isinstance(v, tuple):
                return tuple(concrete(d) for d in v)
            return concrete(v) if not isinstance(v, (str, float)) else v
        return v

    functions = []
    for function in checked.program.functions:
        body = tuple(Operation(op.op, tuple(value(v) for v in op.operands),
                               tuple(value(v) for v in op.results),
                               tuple((k, attr(k, v)) for k, v in op.attrs), op.span)
                     for op in function.body)
        functions.append(Function(function.name, tuple(value(v) for v in function.params), body,
                                  tuple(value(v) for v in function.results), function.is_main,
                                  function.span))
    return Program(checked.program.constants, tuple(functions))

