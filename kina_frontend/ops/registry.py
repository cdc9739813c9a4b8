"""The op registry: one `OpDef` per Kina op holding every rule the pipeline needs.

An op module defines the record once -- its surface signature, its typing rule, its
NumPy reference semantics, and (as later stages attach them) its vector-Jacobian
rule, its loop-nest lowering and its MLIR emission. Drivers (checker, interpreter,
autodiff, lowering, MLIR printer) look the op up here and dispatch to the rule; a
missing rule is an error that names the op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..types import TensorType

# Parameter kinds a surface call can bind:
#   tensor             a tensor value
#   tensor_or_literal  a tensor, or a number literal broadcast to the other operand's type
#   dims               a list of dimension expressions, e.g. [1, T, 2, 2]
#   ints               a list of integer literals, e.g. a permutation
#   dim                one dimension expression (an int literal or a const)
#   axis               one integer literal, negative counts from the end
#   tensors            one or more tensors (the op's trailing positional arguments)
#   offset             one dimension expression that may be 0 (a start position)
#   number             a number literal or a const (its value), e.g. eps=1e-5 or pow(x, N)
#   dtype              an element type name: F32, F64, I64, BF16, BOOL
PARAM_KINDS = frozenset({"tensor", "tensor_or_literal", "dims", "ints", "dim", "axis",
                         "tensors", "offset", "number", "dtype"})

_NO_DEFAULT = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    keyword_only: bool = False
    default: Any = _NO_DEFAULT

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"unknown parameter kind {self.kind!r}")

    @property
    def is_operand(self) -> bool:
        return self.kind in ("tensor", "tensor_or_literal", "tensors")

    @property
    def variadic(self) -> bool:
        return self.kind == "tensors"

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT


class ShapeContext(Protocol):
    """What a typing rule may ask of the checker (implemented in checker.py)."""

    def prove_equal(self, lhs, rhs, kind: str, claim: str, message: str,
                    at: str | None = None, notes: tuple[str, ...] = ()) -> None: ...

    def fail(self, kind: str, message: str, at: str | None = None,
             notes: tuple[str, ...] = ()) -> None: ...

    def record(self, kind: str, claim: str) -> None: ...

    def prove_at_most(self, lhs, rhs, kind: str, claim: str, message: str,
                      at: str | None = None) -> None: ...


ShapeRule = Callable[[ShapeContext, list[TensorType], dict[str, Any]], tuple[TensorType, ...]]
Reference = Callable[[list[np.ndarray], dict[str, Any]], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class OpDef:
    """Everything about one op. `attrs` of an IR operation are the non-operand params."""

    name: str
    family: str
    params: tuple[Param, ...]
    shape_rule: ShapeRule
    reference: Reference
    summary: str
    # Attached by the autodiff stage: (builder, operation, cotangents) -> operand cotangents.
    vjp: Callable | None = None
    # Non-differentiable ops (integer outputs) pass no cotangent to their operands.
    differentiable: bool = True
    # Attached by the tilegen backend: how the op becomes loop-nest IR.
    lower: Callable | None = None
    # Attached by the MLIR emitter.
    mlir: Callable | None = None
    # Internal ops are produced by the compiler, not written by users.
    internal: bool = False

    @property
    def operand_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_operand)

    @property
    def attr_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.is_operand)


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} is defined twice")
    REGISTRY[op.name] = op
    return op


def lookup(name: str) -> OpDef | None:
    return REGISTRY.get(name)
