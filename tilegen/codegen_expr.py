"""Code generation for expressions: binary and unary ops (from tables that raise on an
unknown op), casts, and index arithmetic folded on constants."""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L
from .codegen_values import (
    FLOAT_FLAGS,
    I32,
    SCALAR_LLVM,
    Val,
    broadcast_mask,
    constant,
    int_constant,
    zeros,
)
from .unary_emit import UNARY_EMIT


def _fold_index(op: str, lhs: ir.Value, rhs: ir.Value) -> ir.Value | None:
    """Integer arithmetic on constants (unrolled loop indices) folded here, so the unrolled
    address arithmetic reaches LLVM as constants instead of instructions for it to fold."""
    a, b = int_constant(lhs), int_constant(rhs)
    if a is None and b is None:
        return None
    if op == "add" and (a == 0 or b == 0):
        return rhs if a == 0 else lhs
    if op == "mul" and (a == 1 or b == 1):
        return rhs if a == 1 else lhs
    if op == "mul" and (a == 0 or b == 0):
        return ir.Constant(lhs.type, 0)
    if op == "sub" and b == 0:
        return lhs
    if a is None or b is None:
        return None
    if op in ("add", "sub", "mul"):
        value = {"add": a + b, "sub": a - b, "mul": a * b}[op]
    elif op in ("floordiv", "mod") and a >= 0 and b > 0:  # udiv/urem on non-negatives
        value = a // b if op == "floordiv" else a % b
    else:
        return None
    if not -(2 ** 63) <= value < 2 ** 63:
        return None
    return ir.Constant(lhs.type, value)


# The ops `_binary` has branches for; any other name is an error.
_BINARY_OPS = frozenset(L.BinaryOp)


class ExpressionCodegen:
    """KernelCodegen's expressions (a mixin: it uses the kernel's state)."""

    # ---- expressions --------------------------------------------------------------------------

    def expr(self, expr: L.Expr) -> Val:
        for cache in reversed(self.cache):
            hit = cache.get(expr)
            if hit is not None:
                return hit
        value = self._expr(expr)
        self.cache[-1][expr] = value
        return value

    def _expr(self, expr: L.Expr) -> Val:
        if isinstance(expr, L.Const):
            return Val(constant(expr.dtype, expr.value), False)
        if isinstance(expr, L.Var):
            return self._var(expr)
        if isinstance(expr, L.Load):
            return self._load(expr)
        if isinstance(expr, L.Binary):
            return self._binary(expr.op, self.expr(expr.lhs), self.expr(expr.rhs),
                                expr.lhs.dtype)
        if isinstance(expr, L.Unary):
            return self._unary(expr.op, self.expr(expr.operand), expr.dtype)
        if isinstance(expr, L.Select):
            cond, yes, no = (self.expr(expr.cond), self.expr(expr.if_true),
                             self.expr(expr.if_false))
            cond, yes, no = self._unify(cond, yes, no)
            return Val(self.b.select(cond.value, yes.value, no.value), cond.vector)
        if isinstance(expr, L.Cast):
            return self._cast(self.expr(expr.operand), expr.operand.dtype, expr.dtype)
        if isinstance(expr, L.Reduce):
            return self._reduce(expr)
        if isinstance(expr, L.CheckedId):
            return self._checked_id(expr)
        raise TypeError(expr)

    def _var(self, var: L.Var) -> Val:
        if self.lane is not None and var.name == self.lane.var:
            return Val(self._lane_offsets(self.lane.base, 1), True)
        for scope in reversed(self.env):
            if var.name in scope:
                return scope[var.name]
        raise KeyError(f"unbound variable {var.name}")

    def splat(self, value: ir.Value, width: int) -> ir.Value:
        vtype = ir.VectorType(value.type, width)
        inserted = self.b.insert_element(zeros(vtype), value, ir.Constant(I32, 0))
        return self.b.shuffle_vector(inserted, zeros(vtype), broadcast_mask(width))

    def as_vector(self, value: Val) -> ir.Value:
        return value.value if value.vector else self.splat(value.value, self.lane.width)

    def _unify(self, *values: Val) -> tuple[Val, ...]:
        if any(v.vector for v in values):
            return tuple(Val(self.as_vector(v), True) for v in values)
        return values

    def _binary(self, op: str, lhs: Val, rhs: Val, dtype: str) -> Val:
        if op not in _BINARY_OPS:  # the branches below cover exactly these
            raise L.unknown_op("binary", op, L.BinaryOp)
        lhs, rhs = self._unify(lhs, rhs)
        a, b, vector = lhs.value, rhs.value, lhs.vector
        is_float = dtype in L.FLOAT_TYPES
        builder = self.b
        if op in L.COMPARISONS:
            symbol = {"lt": "<", "le": "<=", "eq": "==", "ne": "!=", "gt": ">", "ge": ">="}[op]
            if is_float:
                result = (builder.fcmp_unordered(symbol, a, b) if op == "ne"
                          else builder.fcmp_ordered(symbol, a, b))
            else:
                result = builder.icmp_signed(symbol, a, b)
            return Val(result, vector)
        if op in ("and", "or"):
            return Val(builder.and_(a, b) if op == "and" else builder.or_(a, b), vector)
        if is_float:
            if op in ("max", "min"):
                name = "llvm.maximum" if op == "max" else "llvm.minimum"
                return Val(builder.call(self._intrinsic(name, a.type, [a.type, a.type]), [a, b]),
                           vector)
            method = {"add": builder.fadd, "sub": builder.fsub, "mul": builder.fmul,
                      "div": builder.fdiv}[op]
            return Val(method(a, b, flags=FLOAT_FLAGS), vector)
        if op in ("max", "min"):
            name = "llvm.smax" if op == "max" else "llvm.smin"
            return Val(builder.call(self._intrinsic(name, a.type, [a.type, a.type]), [a, b]),
                       vector)
        if not vector:
            folded = _fold_index(op, a, b)
            if folded is not None:
                return Val(folded, False)
        method = {"add": builder.add, "sub": builder.sub, "mul": builder.mul,
                  "div": builder.sdiv, "floordiv": builder.udiv, "mod": builder.urem}[op]
        return Val(method(a, b), vector)

    def _unary(self, op: str, operand: Val, dtype: str) -> Val:
        emit = UNARY_EMIT.get(op)  # tilegen/unary_emit.py
        if emit is None:
            raise L.unknown_op("unary", op, L.UnaryOp)
        return Val(emit(self.b, operand.value, dtype, self._intrinsic, self.math),
                   operand.vector)

    def _cast(self, value: Val, source: str, target: str) -> Val:
        ty = SCALAR_LLVM[target]
        if value.vector:
            ty = ir.VectorType(ty, self.lane.width)
        if source == target:
            return value
        if source == L.I64 and target in L.FLOAT_TYPES:
            return Val(self.b.sitofp(value.value, ty), value.vector)
        if source in L.FLOAT_TYPES and target == L.I64:
            # Saturating: NaN gives 0 and out-of-range values the nearest bound (plain
            # fptosi would be poison there).
            function = self._intrinsic("llvm.fptosi.sat", ty, [value.value.type],
                                       overload=(ty, value.value.type))
            return Val(self.b.call(function, [value.value]), value.vector)
        if source == L.F32 and target == L.F64:
            return Val(self.b.fpext(value.value, ty), value.vector)
        if source == L.F64 and target == L.F32:
            return Val(self.b.fptrunc(value.value, ty), value.vector)
        if source == L.BOOL:
            return Val(self.b.uitofp(value.value, ty) if target in L.FLOAT_TYPES
                       else self.b.zext(value.value, ty), value.vector)
        if target == L.BOOL:  # nonzero is true; NaN is nonzero, as in NumPy
            zero = ir.Constant(value.value.type, None)
            return Val(self.b.fcmp_unordered("!=", value.value, zero) if source in
                       L.FLOAT_TYPES else self.b.icmp_signed("!=", value.value, zero),
                       value.vector)
        raise TypeError(f"cast {source} -> {target}")
