"""Precision transforms over tensor IR.

`bf16_weights`: an F32 program with its matmul weights in BF16. Every F32 parameter that is
the right operand of a `matmul` becomes a BF16 parameter, and the left operand of each such
product is rounded to BF16 (`cast`), so the product runs on bf16 operands with f32
accumulation and its F32 result feeds the rest of the program unchanged. Biases, norms and
everything else stay F32. A weight also read elsewhere is widened back (`cast` to F32) for
those reads, so the program sees one value of each weight.
"""

from __future__ import annotations

from .tensor_ir import Function, Operation, Program, Value, make_attrs
from .transforms import prepare_for_codegen
from .types import DType


def bf16_weights(program: Program, name: str) -> tuple[Program, tuple[str, ...]]:
    """Function `name` of the concrete `program` (calls inlined) with BF16 matmul weights,
    as a program of that one function, and the names of the parameters made BF16 (in
    parameter order)."""
    function = prepare_for_codegen(program, name)
    params = {p.name: p for p in function.params}
    weights = {op.operands[1].name for op in function.body if op.op == "matmul"
               and op.operands[1].name in params
               and op.operands[1].type.dtype is DType.F32}
    used = {p.name for p in function.params} | {r.name for op in function.body
                                                for r in op.results}

    def fresh(base: str) -> str:
        candidate, number = base, 0
        while candidate in used:
            number += 1
            candidate = f"{base}.{number}"
        used.add(candidate)
        return candidate

    def cast(value: Value, dtype: DType, body: list[Operation]) -> Value:
        result = Value(fresh(f"{value.name}.{dtype.value}"), value.type.with_dtype(dtype))
        body.append(Operation("cast", (value,), (result,), make_attrs(dtype=dtype.value)))
        return result

    new_params = tuple(Value(p.name, p.type.with_dtype(DType.BF16)) if p.name in weights
                       else p for p in function.params)
    narrow = {p.name: p for p in new_params if p.name in weights}
    body: list[Operation] = []
    widened: dict[str, Value] = {}   # a weight's F32 value, for reads other than matmul's b
    rounded: dict[str, Value] = {}   # an activation rounded to BF16 once for all its products

    def read(value: Value) -> Value:
        if value.name not in narrow:
            return value
        if value.name not in widened:
            widened[value.name] = cast(narrow[value.name], DType.F32, body)
        return widened[value.name]

    for op in function.body:
        if op.op == "matmul" and op.operands[1].name in narrow:
            left = op.operands[0]
            if left.type.dtype is not DType.BF16:
                if left.name not in rounded:
                    rounded[left.name] = cast(read(left), DType.BF16, body)
                left = rounded[left.name]
            operands = (left, narrow[op.operands[1].name])
        else:
            operands = tuple(read(v) for v in op.operands)
        body.append(Operation(op.op, operands, op.results, op.attrs, op.span))
    results = tuple(read(v) for v in function.results)
    transformed = Function(function.name, new_params, tuple(body), results, False,
                           function.span)
    return Program(program.constants, (transformed,)), \
        tuple(p.name for p in function.params if p.name in weights)
