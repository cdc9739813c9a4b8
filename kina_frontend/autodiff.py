"""reverseMode as a program transform: tensor IR in, tensor IR out.

`gradient_function(program, f, wrt)` builds a new function `<f>__grad_<i>_<j>...` that
takes f's parameters and returns f's result followed by the gradient of that result
(seeded with ones of its shape) with respect to each parameter listed in `wrt`:

1. inline every call in f (nested `reverse_mode` expands the same way, so gradients of
   gradients work);
2. keep f's forward operations as they are;
3. walk them backward, handing each operation's result cotangent to the op's `vjp` rule
   (in its registry record, kina_frontend/ops/) and summing the cotangents of values
   used more than once with `add`;
4. simplify (kina_frontend/simplify.py): fold the identities the rules leave behind and
   drop dead code.

The output is ordinary typed tensor IR: the `Builder` types every operation it emits
with the op's own shape rule, so the result passes `verify.verify_function` and tilegen
compiles it like user code. docs/autodiff.md describes every rule.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from .diagnostics import KinaError, Span
from .inline import MAX_INLINED_OPS, inline_calls
from .names import NameSupply
from .ops import REGISTRY
from .simplify import simplify_function
from .tensor_ir import Function, Operation, Program, Value, make_attrs
from .types import DType, TensorType
from .verify import ShapeRuleError, freeze_attr, infer_types, types_equal


@dataclass(frozen=True)
class GradientFunction:
    """The transformed program (the input plus the new function) and the new function."""

    program: Program
    name: str

    @property
    def function(self) -> Function:
        return self.program.function(self.name)


# ---- the builder ----------------------------------------------------------------------------

class Builder:
    """Emits registry operations with fresh SSA names and the result types their shape rules
    give. VJP rules receive one and call `emit` or the named helpers below."""

    def __init__(self, used_names: set[str]):
        self.ops: list[Operation] = []
        self._names = NameSupply(used_names)
        self.hint = "g"  # base of the next result names (the driver sets it per rule)
        self.span: Span | None = None  # source span stamped on emitted operations

    def fresh(self, hint: str) -> str:
        return self._names.fresh(hint)

    def emit(self, opname: str, *operands: Value, **attrs) -> Value:
        """Append `opname(operands) {attrs}`; returns its (single) result."""
        normalized = dict(attrs)
        try:
            types = infer_types(opname, [v.type for v in operands], normalized)
        except ShapeRuleError as error:
            raise KinaError("autodiff", f"internal error: a gradient rule built an ill-typed "
                            f"operation: {error}", self.span) from None
        results = tuple(Value(self.fresh(self.hint), t) for t in types)
        frozen = {k: freeze_attr(v) for k, v in normalized.items()}
        self.ops.append(Operation(opname, tuple(operands), results, make_attrs(**frozen),
                                  self.span))
        (result,) = results
        return result

    # Elementwise.
    def add(self, lhs: Value, rhs: Value) -> Value:
        return self.emit("add", lhs, rhs)

    def sub(self, lhs: Value, rhs: Value) -> Value:
        return self.emit("sub", lhs, rhs)

    def mul(self, lhs: Value, rhs: Value) -> Value:
        return self.emit("mul", lhs, rhs)

    def div(self, lhs: Value, rhs: Value) -> Value:
        return self.emit("div", lhs, rhs)

    def neg(self, x: Value) -> Value:
        return self.emit("neg", x)

    def exp(self, x: Value) -> Value:
        return self.emit("exp", x)

    def fill(self, value: float, ttype: TensorType) -> Value:
        """A constant tensor of `ttype` (what a number literal operand becomes)."""
        number = float(value) if ttype.dtype.is_float else int(value)
        return self.emit("fill", value=number, shape=ttype.shape, dtype=ttype.dtype.value)

    def cast(self, x: Value, dtype: DType) -> Value:
        return x if x.type.dtype == dtype else self.emit("cast", x, dtype=dtype.value)

    # Layout and linear algebra.
    def reshape(self, x: Value, shape) -> Value:
        return self.emit("reshape", x, shape=tuple(shape))

    def broadcast(self, x: Value, shape) -> Value:
        return self.emit("broadcast", x, shape=tuple(shape))

    def transpose(self, x: Value, perm) -> Value:
        return self.emit("transpose", x, perm=tuple(perm))

    def matmul(self, a: Value, b: Value) -> Value:
        return self.emit("matmul", a, b)

    # Reductions.
    def sum(self, x: Value, axis: int) -> Value:
        return self.emit("sum", x, axis=axis)

    def restore_axis(self, reduced: Value, axis: int, like: TensorType) -> Value:
        """`reduced` (an axis-`axis` reduction of a `like`-shaped tensor) broadcast back along
        that axis: reshape with a 1 at `axis`, then broadcast to `like`'s shape."""
        kept = like.shape[:axis] + (1,) + like.shape[axis + 1:]
        return self.broadcast(self.reshape(reduced, kept), like.shape)


# ---- the transform --------------------------------------------------------------------------

_CACHE_LOCK = threading.Lock()
_CACHE: dict[tuple[int, str, tuple[int, ...]], tuple[weakref.ref, GradientFunction]] = {}
_CACHE_LIMIT = 64


def gradient_function(program: Program, callee_name: str,
                      wrt: Sequence[int]) -> GradientFunction:
    """reverseMode(callee, wrt)(params) as a new function added to `program`.

    The new function takes the callee's parameters and returns (result, d result / d
    param[i] for i in wrt), the cotangent seed being ones of the result's shape. The
    interpreter and the inliner call this for every `reverse_mode` they meet; results are
    cached per program object.
    """
    wrt = tuple(int(i) for i in wrt)
    key = (id(program), callee_name, wrt)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0]() is program:
            return hit[1]
    result = _build(program, callee_name, wrt)
    with _CACHE_LOCK:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = (weakref.ref(program), result)
    return result


def expand_reverse_mode(program: Program, op: Operation, max_ops: int) -> Function:
    """What the inliner puts in place of a `reverse_mode` op: the gradient function, with
    its own calls (and nested reverse modes) inlined."""
    transformed = gradient_function(program, op.attr("callee"), op.attr("wrt"))
    return inline_calls(transformed.program, transformed.program.function(transformed.name),
                        max_ops, expand_reverse_mode)


def _build(program: Program, callee_name: str, wrt: tuple[int, ...]) -> GradientFunction:
    if callee_name not in program.function_names:
        raise KinaError("autodiff", f"reverseMode of unknown function '{callee_name}'", None)
    original = program.function(callee_name)
    _check_signature(original, wrt)
    inlined = inline_calls(program, original, MAX_INLINED_OPS, expand_reverse_mode)
    name = _fresh_function_name(program, f"{callee_name}__grad" +
                                "".join(f"_{i}" for i in wrt))
    gradient = reverse_function(inlined, wrt, name)
    gradient = simplify_function(gradient)
    return GradientFunction(Program(program.constants, program.functions + (gradient,)), name)


def _check_signature(function: Function, wrt: tuple[int, ...]) -> None:
    if len(function.results) != 1 or not function.results[0].type.dtype.is_float:
        raise KinaError("autodiff", f"reverseMode needs '{function.name}' to return one "
                        "floating-point tensor", function.span)
    for index in wrt:
        if not 0 <= index < len(function.params):
            raise KinaError("autodiff", f"wrt index {index} is out of range for "
                            f"'{function.name}' ({len(function.params)} parameters)",
                            function.span)
        if not function.params[index].type.dtype.is_float:
            raise KinaError("autodiff", f"cannot differentiate with respect to "
                            f"'{function.params[index].name}': it is "
                            f"{function.params[index].type.surface()}", function.span)
    if len(set(wrt)) != len(wrt):
        raise KinaError("autodiff", "a parameter appears twice in wrt", function.span)


def _fresh_function_name(program: Program, base: str) -> str:
    name, suffix = base, 1
    while name in program.function_names:
        name = f"{base}_{suffix}"
        suffix += 1
    return name


def active_values(function: Function, wrt: Sequence[int]) -> set[str]:
    """Names of the values that depend on a `wrt` parameter through differentiable ops
    (only these need cotangents; integer values never do)."""
    active = {function.params[i].name for i in wrt}
    for op in function.body:
        definition = REGISTRY.get(op.op)
        if definition is None or not definition.differentiable:
            continue
        if any(v.name in active for v in op.operands):
            active.update(r.name for r in op.results if r.type.dtype.is_float)
    return active


def reverse_function(function: Function, wrt: Sequence[int], name: str) -> Function:
    """The forward body of an inlined `function`, then its reverse sweep (unsimplified)."""
    if any(op.op in ("call", "reverse_mode") for op in function.body):
        raise ValueError(f"reverse_function needs an inlined function; @{function.name} "
                         "still has calls")
    (result,) = function.results
    active = active_values(function, wrt)
    used = {p.name for p in function.params} | {r.name for op in function.body
                                                 for r in op.results}
    builder = Builder(used)
    builder.span = function.span
    cotangents: dict[str, Value] = {}
    if result.name in active:
        builder.hint = "seed"
        cotangents[result.name] = builder.fill(1.0, result.type)
    for op in reversed(function.body):
        if not any(r.name in cotangents for r in op.results):
            continue
        if not any(v.name in active for v in op.operands):
            continue
        for operand, cotangent in zip(op.operands, _pull_back(builder, op, cotangents),
                                      strict=True):
            if cotangent is None or operand.name not in active:
                continue
            if not types_equal(cotangent.type, operand.type):
                raise KinaError("autodiff", f"internal error: the vjp rule of '{op.op}' gave "
                                f"a {cotangent.type} cotangent for %{operand.name}: "
                                f"{operand.type}", op.span)
            previous = cotangents.get(operand.name)
            if previous is not None:  # a value used more than once: cotangents add up
                builder.hint = f"{operand.name}.ct"
                cotangent = builder.add(previous, cotangent)
            cotangents[operand.name] = cotangent
    gradients = []
    for index in wrt:
        param = function.params[index]
        gradient = cotangents.get(param.name)
        if gradient is None:  # the result does not depend on this parameter
            builder.hint = f"{param.name}.zero"
            gradient = builder.fill(0.0, param.type)
        gradients.append(gradient)
    return Function(name, function.params, function.body + tuple(builder.ops),
                    (result, *gradients), False, function.span)


def _pull_back(builder: Builder, op: Operation,
               cotangents: dict[str, Value]) -> tuple[Value | None, ...]:
    definition = REGISTRY.get(op.op)
    if definition is None:
        raise KinaError("autodiff", f"cannot differentiate through '{op.op}'", op.span)
    if not definition.differentiable:
        return (None,) * len(op.operands)
    if definition.vjp is None:
        raise KinaError("autodiff", f"op '{op.op}' has no vector-Jacobian rule", op.span,
                        (f"give the '{op.op}' OpDef ({definition.family} family, "
                         "kina_frontend/ops/) a vjp= rule, or mark it differentiable=False",))
    builder.span = op.span
    builder.hint = f"{op.results[0].name}.vjp"
    result_cotangents = tuple(cotangents.get(r.name) for r in op.results)
    operand_cotangents = tuple(definition.vjp(builder, op, result_cotangents))
    if len(operand_cotangents) != len(op.operands):
        raise KinaError("autodiff", f"internal error: the vjp rule of '{op.op}' returned "
                        f"{len(operand_cotangents)} cotangent(s) for {len(op.operands)} "
                        "operand(s)", op.span)
    return operand_cotangents
