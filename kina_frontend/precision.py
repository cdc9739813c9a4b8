"""Precision transforms over tensor IR.

`bf16_weights`: an F32 program with its matmul weights in BF16. Every F32 parameter that is
the right operand of a `matmul` becomes a BF16 parameter, and the left operand of each such
product is rounded to BF16 (`cast`), so the product runs on bf16 operands with f32
accumulation and its F32 result feeds the rest of the program unchanged. Biases, norms and
everything else stay F32. A weight also read elsewhere is widened back (`cast` to F32) for
those reads, so the program sees one value of each weight.

`bf16x3_weights`: the same products on the BF16 dot-product hardware at close to F32
accuracy. Each float is split into two BF16 numbers, x = hi + lo + r with |r| <= 2^-17 |x|
(hi = x rounded to BF16, lo = x - hi rounded to BF16: the difference is exact in F32), and
a product keeps three of the four partial products, a·w ~ a_hi·w_hi + a_hi·w_lo + a_lo·w_hi
(a_lo·w_lo is below 2^-16 of the product). The three are one matmul over three times the
depth: the left operand is concat(a_hi, a_hi, a_lo) along its last axis and the weight
parameter becomes the BF16 stack [w_hi; w_lo; w_hi] along its row axis (`split_bf16x3`
builds it on the host). This is what PyTorch calls float32 matmul precision "high" when it
treats each float as the sum of two bfloat16 numbers; the Linear layers of
all-MiniLM-L6-v2 done this way stay within 3e-6 of the F32 embeddings. Only a weight read
as nothing but the right operand of F32 products is split; others keep their F32 products.
"""

from __future__ import annotations

import numpy as np

from .tensor_ir import Function, Operation, Program, Value, make_attrs
from .transforms import prepare_for_codegen
from .types import DType, TensorType
from .verify import freeze_attr, infer_types


class _Rewriter:
    """Appends new operations to a body, with fresh SSA names."""

    def __init__(self, function: Function):
        self.used = {p.name for p in function.params} | {r.name for op in function.body
                                                         for r in op.results}
        self.body: list[Operation] = []

    def fresh(self, base: str) -> str:
        candidate, number = base, 0
        while candidate in self.used:
            number += 1
            candidate = f"{base}.{number}"
        self.used.add(candidate)
        return candidate

    def emit(self, opname: str, hint: str, *operands: Value, **attrs) -> Value:
        normalized = dict(attrs)
        (result_type,) = infer_types(opname, [v.type for v in operands], normalized)
        # The shape rules compute in sympy; concrete IR spells its dims as ints.
        result_type = result_type.with_shape(int(d) for d in result_type.shape)
        result = Value(self.fresh(hint), result_type)
        frozen = {k: freeze_attr(v) for k, v in normalized.items()}
        self.body.append(Operation(opname, operands, (result,), make_attrs(**frozen)))
        return result

    def cast(self, value: Value, dtype: DType) -> Value:
        return self.emit("cast", f"{value.name}.{dtype.value}", value, dtype=dtype.value)


def bf16_weights(program: Program, name: str) -> tuple[Program, tuple[str, ...]]:
    """Function `name` of the concrete `program` (calls inlined) with BF16 matmul weights,
    as a program of that one function, and the names of the parameters made BF16 (in
    parameter order)."""
    function = prepare_for_codegen(program, name)
    params = {p.name: p for p in function.params}
    weights = {op.operands[1].name for op in function.body if op.op == "matmul"
               and op.operands[1].name in params
               and op.operands[1].type.dtype is DType.F32}
    rewriter = _Rewriter(function)
    new_params = tuple(Value(p.name, p.type.with_dtype(DType.BF16)) if p.name in weights
                       else p for p in function.params)
    narrow = {p.name: p for p in new_params if p.name in weights}
    widened: dict[str, Value] = {}   # a weight's F32 value, for reads other than matmul's b
    rounded: dict[str, Value] = {}   # an activation rounded to BF16 once for all its products

    def read(value: Value) -> Value:
        if value.name not in narrow:
            return value
        if value.name not in widened:
            widened[value.name] = rewriter.cast(narrow[value.name], DType.F32)
        return widened[value.name]

    for op in function.body:
        if op.op == "matmul" and op.operands[1].name in narrow:
            left = op.operands[0]
            if left.type.dtype is not DType.BF16:
                if left.name not in rounded:
                    rounded[left.name] = rewriter.cast(read(left), DType.BF16)
                left = rounded[left.name]
            operands = (left, narrow[op.operands[1].name])
        else:
            operands = tuple(read(v) for v in op.operands)
        rewriter.body.append(Operation(op.op, operands, op.results, op.attrs, op.span))
    return _one_function_program(program, function, new_params, rewriter.body, read), \
        tuple(p.name for p in function.params if p.name in weights)


def bf16x3_weights(program: Program, name: str) -> tuple[Program, tuple[str, ...]]:
    """Function `name` of the concrete `program` (calls inlined) with each F32 matmul
    weight that is read only as the right operand of F32 products replaced by its
    [w_hi; w_lo; w_hi] BF16 stack (three times the rows) and each such product computed
    over the split left operand, as a program of that one function; and the names of the
    parameters replaced (in parameter order). See the module docstring."""
    function = prepare_for_codegen(program, name)
    params = {p.name: p for p in function.params}
    candidates = {op.operands[1].name for op in function.body if op.op == "matmul"
                  and op.operands[1].name in params
                  and op.operands[1].type.dtype is DType.F32
                  and op.operands[0].type.dtype is DType.F32}
    elsewhere = {v.name for op in function.body for position, v in enumerate(op.operands)
                 if op.op != "matmul" or position != 1
                 or op.operands[0].type.dtype is not DType.F32}
    elsewhere |= {v.name for v in function.results}
    weights = candidates - elsewhere
    rewriter = _Rewriter(function)

    def stacked(param: Value) -> Value:
        shape = param.type.shape
        rows = int(shape[-2]) * 3
        return Value(param.name, TensorType(DType.BF16, shape[:-2] + (rows,) + shape[-1:]))

    new_params = tuple(stacked(p) if p.name in weights else p for p in function.params)
    split = {p.name: p for p in new_params if p.name in weights}
    split_left: dict[str, Value] = {}   # an activation split once for all its products

    def split_activation(left: Value) -> Value:
        if left.name not in split_left:
            # Each rounding is its own single-use cast, so all three parts fuse into the
            # concat's one pass over `left` instead of materialising hi for its three reads.
            def high() -> Value:
                return rewriter.cast(left, DType.BF16)

            rest = rewriter.emit("sub", f"{left.name}.rest", left,
                                 rewriter.cast(high(), DType.F32))
            low = rewriter.cast(rest, DType.BF16)
            split_left[left.name] = rewriter.emit("concat", f"{left.name}.x3", high(),
                                                  high(), low, axis=left.type.rank - 1)
        return split_left[left.name]

    for op in function.body:
        if op.op == "matmul" and op.operands[1].name in split:
            operands = (split_activation(op.operands[0]), split[op.operands[1].name])
        else:
            operands = op.operands
        rewriter.body.append(Operation(op.op, operands, op.results, op.attrs, op.span))
    return _one_function_program(program, function, new_params, rewriter.body,
                                 lambda v: v), \
        tuple(p.name for p in function.params if p.name in weights)


def split_bf16x3(weight: np.ndarray):
    """The [w_hi; w_lo; w_hi] BF16 stack (along axis -2) that `bf16x3_weights` expects for
    an F32 weight."""
    import ml_dtypes

    weight = np.asarray(weight, dtype=np.float32)
    hi = weight.astype(ml_dtypes.bfloat16)
    lo = (weight - hi.astype(np.float32)).astype(ml_dtypes.bfloat16)
    return np.ascontiguousarray(np.concatenate((hi, lo, hi), axis=-2))


def _one_function_program(program: Program, function: Function, params, body,
                          read) -> Program:
    results = tuple(read(v) for v in function.results)
    transformed = Function(function.name, tuple(params), tuple(body), results, False,
                           function.span)
    return Program(program.constants, (transformed,))
