"""Storage-only element types in LLVM IR: bf16 and bool buffers.

A bf16 element is the upper half of an f32: a load widens it exactly (shift into the high
16 bits), a store rounds the f32 value to nearest, ties to even, keeping NaN a (quiet) NaN --
the rounding ml_dtypes and PyTorch use. A bool element is a byte holding 0 or 1 (NumPy's
bool_), so loads compare against 0 and stores zero-extend; an i1 vector in memory would be
bit-packed instead.
"""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L

I1, I8, I16, I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
STORAGE_LLVM = {L.BF16_STORAGE: I16, L.BOOL_STORAGE: I8}


def _like(value: ir.Value, element) -> ir.Type:
    if isinstance(value.type, ir.VectorType):
        return ir.VectorType(element, value.type.count)
    return element


def _splat(value: ir.Value, element, constant: int) -> ir.Constant:
    ty = _like(value, element)
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [constant] * ty.count)
    return ir.Constant(ty, constant)


def widen(b: ir.IRBuilder, stored: ir.Value, storage: str) -> ir.Value:
    """A loaded storage element (or vector of them) as its value type."""
    if storage == L.BOOL_STORAGE:
        return b.icmp_unsigned("!=", stored, _splat(stored, I8, 0))
    bits = b.shl(b.zext(stored, _like(stored, I32)), _splat(stored, I32, 16))
    return b.bitcast(bits, _like(stored, ir.FloatType()))


def _rounded_high_half(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """The f32 `value`'s bits rounded to the nearest bf16, in the low 16 bits of an i32."""
    bits = b.bitcast(value, _like(value, I32))
    odd = b.and_(b.lshr(bits, _splat(bits, I32, 16)), _splat(bits, I32, 1))
    rounded = b.lshr(b.add(b.add(bits, _splat(bits, I32, 0x7FFF)), odd), _splat(bits, I32, 16))
    quiet_nan = b.or_(b.lshr(bits, _splat(bits, I32, 16)), _splat(bits, I32, 0x40))
    return b.select(b.fcmp_unordered("uno", value, value), quiet_nan, rounded)


def narrow(b: ir.IRBuilder, value: ir.Value, storage: str) -> ir.Value:
    """A value (or vector) converted to the storage element that holds it."""
    if storage == L.BOOL_STORAGE:
        return b.zext(value, _like(value, I8))
    return b.trunc(_rounded_high_half(b, value), _like(value, I16))


def round_bf16(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """The f32 `value` rounded to the nearest bf16, as an f32."""
    bits = b.shl(_rounded_high_half(b, value), _splat(value, I32, 16))
    return b.bitcast(bits, value.type)
