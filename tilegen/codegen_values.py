"""What the code generator's modules share: LLVM types, the per-dtype LLVM table, the
symbols the runtime binds, and the value a generated expression has (scalar or vector).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from llvmlite import ir

from . import loopir as L
from . import storage

I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
SCALAR_LLVM = {L.F32: ir.FloatType(), L.F64: ir.DoubleType(), L.I64: I64, L.BOOL: I1,
               **storage.STORAGE_LLVM}

# Temporaries up to 64 KiB live on the stack up to a budget for the frame; the rest share
# one heap workspace (tilegen/frame.py).
# Heap blocks (the workspace, gemm packing panels) are kept between calls, one per slot, so
# a call does not pay for page-faulting fresh memory (a 4 MB temporary costs ~1 ms of faults
# each time glibc hands it out through mmap). A call takes its slot's block with an atomic
# exchange (or mallocs one when another call holds it) and puts it back when it returns.
# The slots are an array the runtime owns: it reads their number from `<symbol>.blockcount`
# and stores the array's address in `<symbol>.blocks` (left null, nothing is cached), and
# frees the blocks when the code is unloaded -- without running code that may be gone.
BLOCKS_SUFFIX = ".blocks"
BLOCK_COUNT_SUFFIX = ".blockcount"
# TILEGEN_PROFILE's counters per mode: `<symbol><suffix>`, one i64 per top-level nest, and
# what they count.
PROFILE_COUNTERS = {"cycles": (".cycles", "cycles"), "cpu": (".cpu_ns", "ns of CPU time")}
# Float ops may be contracted into FMAs (more accurate, never less).
FLOAT_FLAGS = ("contract",)


@dataclass(frozen=True)
class Val:
    value: ir.Value
    vector: bool


def bind_flat_index(b: ir.IRBuilder, scope: dict, variables, extents, flat) -> None:
    """Bind each of `variables` in `scope` to its coordinate in `flat`, a row-major index
    over `extents` (the last variable varies fastest): the batch indices of a parallel unit
    that counts (batch entry, block) pairs."""
    remainder = flat
    for var, extent in reversed(list(zip(variables, extents, strict=True))):
        extent_value = ir.Constant(I64, extent)
        scope[var.name] = Val(b.srem(remainder, extent_value), False)
        remainder = b.sdiv(remainder, extent_value)


@dataclass
class Lane:
    """The vector tile being generated: lane variable, width, scalar base index, mask,
    and a number the base is known to be a multiple of (1: nothing known; 0: the base is
    0), which lets `//` and `%` of the lane variable load contiguously (codegen_memory)."""

    var: str
    width: int
    base: ir.Value
    mask: ir.Value | None
    aligned: int = 1


@functools.cache
def zeros(ty: ir.Type) -> ir.Constant:
    """The all-zero constant of `ty`, one object per type and printed `zeroinitializer`:
    llvmlite spells a vector constant out lane by lane, and formatted 16 floats again for
    each of the thousands of masked loads and selects that take one (a fifth of
    MiniLM's printed IR)."""
    value = ir.Constant(ty, None)
    value.constant = None  # llvmlite prints a None constant as the type's null
    return value


@functools.cache
def broadcast_mask(width: int) -> ir.Constant:
    """The shufflevector mask that broadcasts lane 0 to `width` lanes (one object, so
    printed once; a shuffle mask must list its lanes)."""
    return ir.Constant(ir.VectorType(I32, width), [0] * width)


def int_constant(value: ir.Value) -> int | None:
    if isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) \
            and isinstance(value.constant, int):
        return value.constant
    return None


def constant(dtype: str, value) -> ir.Constant:
    if dtype in (L.F32, L.F64):
        return ir.Constant(SCALAR_LLVM[dtype], float(value))
    return ir.Constant(SCALAR_LLVM[dtype], int(value))


def type_suffix(ty: ir.Type) -> str:
    """An LLVM intrinsic's overload suffix for `ty` (`v16f32`, `i64`, `p0`)."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.HalfType):
        return "f16"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    if isinstance(ty, ir.PointerType):
        return "p0"
    raise TypeError(ty)


def linear_offset(index: tuple[L.Expr, ...], shape: tuple[int, ...]) -> L.Expr:
    flat: L.Expr = L.const(0)
    stride = 1
    for position in reversed(range(len(shape))):
        flat = L.add(flat, L.mul(index[position], L.const(stride)))
        stride *= shape[position]
    return flat
