"""Transcendental functions for generated code.

`MathLibrary.call(builder, op, value)` emits exp, log or tanh of a scalar or a vector.
"""

from __future__ import annotations

from llvmlite import ir

_INTRINSICS = {"exp": "llvm.exp", "log": "llvm.log", "tanh": "llvm.tanh"}


class MathLibrary:
    def __init__(self, module: ir.Module):
        self.module = module

    def call(self, builder: ir.IRBuilder, op: str, value: ir.Value) -> ir.Value:
        name = _INTRINSICS[op] + "." + _suffix(value.type)
        function = self.module.globals.get(name)
        if function is None:
            function = ir.Function(self.module, ir.FunctionType(value.type, [value.type]), name)
        return builder.call(function, [value])


def _suffix(ty) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    return "f32" if isinstance(ty, ir.FloatType) else "f64"
