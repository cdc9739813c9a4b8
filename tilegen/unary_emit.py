"""How codegen emits each loop-IR unary op: one rule per `loopir.UnaryOp`, looked up by
`KernelCodegen._unary`. An op without a rule is an error naming it, never some other op's
code (before this table an unknown name fell through to the math library, which compiled
whatever of its methods had that name).

A rule is `(builder, value, dtype, intrinsic, math) -> value`: `value` is the operand (a
scalar or a vector), `dtype` its loop-IR type, `intrinsic(name, ret, args)` declares an LLVM
intrinsic in the module and `math` is the module's vecmath library.
"""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L
from . import storage

I1 = ir.IntType(1)


def _neg(b: ir.IRBuilder, value, dtype: str, intrinsic, math):
    return b.fneg(value) if dtype in L.FLOAT_TYPES else b.neg(value)


def _float_intrinsic(name: str):
    def emit(b: ir.IRBuilder, value, dtype: str, intrinsic, math):
        return b.call(intrinsic(name, value.type, [value.type]), [value])
    return emit


def _abs(b: ir.IRBuilder, value, dtype: str, intrinsic, math):
    if dtype in L.FLOAT_TYPES:
        return b.call(intrinsic("llvm.fabs", value.type, [value.type]), [value])
    return b.call(intrinsic("llvm.abs", value.type, [value.type, I1]),
                  [value, ir.Constant(I1, 0)])


def _round_bf16(b: ir.IRBuilder, value, dtype: str, intrinsic, math):
    return storage.round_bf16(b, value)


def _math(op: str):
    def emit(b: ir.IRBuilder, value, dtype: str, intrinsic, math):
        return math.call(b, op, value)
    return emit


UNARY_EMIT = {
    L.UnaryOp.NEG: _neg,
    L.UnaryOp.SQRT: _float_intrinsic("llvm.sqrt"),
    L.UnaryOp.ABS: _abs,
    L.UnaryOp.ROUND_BF16: _round_bf16,
    **{op: _math(op) for op in (L.UnaryOp.EXP, L.UnaryOp.LOG, L.UnaryOp.TANH, L.UnaryOp.ERF)},
}
