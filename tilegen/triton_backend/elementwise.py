"""Elementwise TTIR ops (arith, math, tt.mulhiui, casts) as LLVM instructions.

Every rule takes LLVM values that are all scalars or all vectors of one width, so the same
table serves scalar code, the vector chunks of a tile op and the combine regions of
reductions and scans. exp, log, erf, asin and acos go through tilegen's vecmath (vectorised,
straight-line code); libdevice calls with the same meaning as one of these ops (libdevice.exp,
.sqrt, .floor, ...) take that op's rule; other transcendental functions use LLVM's
intrinsics or libm, one call per lane.
"""

from __future__ import annotations

import struct

from llvmlite import ir

from ..codegen_values import type_suffix
from ..target import host_target
from ..vecmath import MathLibrary
from .tileir import ELEM_BITS, FLOAT_ELEMS, TileError

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()

# llvmlite has no bfloat type: bf16 values are their 16 bits (i16), converted to and from
# f32 with shifts (truncation rounds to nearest even); arithmetic happens in f32.
SCALAR_TYPES = {"i1": I1, "i8": I8, "i16": ir.IntType(16), "i32": I32, "i64": I64,
                "f16": ir.HalfType(), "bf16": ir.IntType(16), "f32": ir.FloatType(),
                "f64": ir.DoubleType()}


def scalar_type(elem: str) -> ir.Type:
    """The LLVM type computations on `elem` use (pointers are i64 addresses)."""
    if elem.startswith("ptr<"):
        return I64
    if elem not in SCALAR_TYPES:
        raise TileError(f"element type {elem} is not supported")
    return SCALAR_TYPES[elem]


def storage_type(elem: str) -> ir.Type:
    """The LLVM type a tile element is kept as in memory (booleans as bytes)."""
    return I8 if elem == "i1" else scalar_type(elem)


def of_width(ty: ir.Type, width: int) -> ir.Type:
    return ir.VectorType(ty, width) if width else ty


def splat_constant(ty: ir.Type, value, width: int) -> ir.Value:
    if isinstance(ty, ir.IntType):
        value = int(value) & ((1 << ty.width) - 1)
    constant = ir.Constant(ty, value)
    return VectorText(ir.VectorType(ty, width), f"splat ({constant})") if width else constant


def is_all_true(value: ir.Value) -> bool:
    """Whether `value` is the i1 splat constant true (an interior chunk's mask)."""
    return isinstance(value, VectorText) and value.type.element == I1 and \
        value.constant == f"splat ({ir.Constant(I1, 1)})"


def scaled_reciprocal(b: ir.IRBuilder, divisor: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(s, r) with x / d = (x * s) * r, r = 1 / (d * s) rounded, for a scalar f32/f64 d:
    `/` by a value uniform over a tile as two multiplies per lane (Triton's `/` is not
    IEEE on its GPUs either: div.full.f32, ~2 ulp). x * s is exact (s a power of two)
    unless it overflows or underflows where x / d does too, so the result is within 1.5
    ulp: 0.5 for rounding the product, under 1 for r's rounding. s keeps d * s normal,
    so r is neither subnormal nor infinite: 1 in the normal range, 1/4 above 2^(emax-1),
    2^p below the least normal (0, inf and NaN come out as IEEE's)."""
    ty = divisor.type
    bits = 53 if isinstance(ty, ir.DoubleType) else 24
    emax = 1023 if bits == 53 else 127
    magnitude = b.call(_declare_fabs(b, ty), [divisor])
    huge = b.fcmp_ordered(">=", magnitude, ir.Constant(ty, 2.0 ** (emax - 1)))
    tiny = b.fcmp_ordered("<", magnitude, ir.Constant(ty, 2.0 ** (1 - emax)))
    scale = b.select(huge, ir.Constant(ty, 0.25),
                     b.select(tiny, ir.Constant(ty, 2.0 ** bits), ir.Constant(ty, 1.0)))
    return scale, b.fdiv(ir.Constant(ty, 1.0), b.fmul(divisor, scale))


def _declare_fabs(b: ir.IRBuilder, ty: ir.Type) -> ir.Function:
    module = b.module
    name = f"llvm.fabs.{type_suffix(ty)}"
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(
        module, ir.FunctionType(ty, [ty]), name)


class VectorText(ir.Constant):
    """A vector constant written as LLVM's short forms (`splat (float 1.0)`, `undef`), not
    `<T v, T v, ...>`: a third of a kernel's IR text was vector constants, formatted
    element by element by llvmlite and parsed again by LLVM in a cold compile."""

    def __init__(self, vector_type: ir.VectorType, text: str):
        self.type = vector_type
        self.constant = text

    def _get_reference(self) -> str:
        return self.constant


_INT_BINARY = {"arith.addi": "add", "arith.subi": "sub", "arith.muli": "mul",
               "arith.divsi": "sdiv", "arith.divui": "udiv", "arith.remsi": "srem",
               "arith.remui": "urem", "arith.andi": "and_", "arith.ori": "or_",
               "arith.xori": "xor", "arith.shli": "shl", "arith.shrsi": "ashr",
               "arith.shrui": "lshr"}
_FLOAT_BINARY = {"arith.addf": "fadd", "arith.subf": "fsub", "arith.mulf": "fmul",
                 "arith.divf": "fdiv", "arith.remf": "frem"}
_INT_MINMAX = {"arith.maxsi": ("smax", ">"), "arith.minsi": ("smin", "<"),
               "arith.maxui": ("umax", ">"), "arith.minui": ("umin", "<")}
# maxnum/minnum ignore a NaN operand; maximum/minimum propagate it (tl.maximum's default).
_FLOAT_MINMAX = {"arith.maxnumf": "llvm.maxnum", "arith.minnumf": "llvm.minnum",
                 "arith.maximumf": "llvm.maximum", "arith.minimumf": "llvm.minimum"}
_FLOAT_INTRINSIC_UNARY = {"math.sqrt": "llvm.sqrt", "math.absf": "llvm.fabs",
                          "math.floor": "llvm.floor", "math.ceil": "llvm.ceil",
                          "math.log2": "llvm.log2",
                          "math.sin": "llvm.sin", "math.cos": "llvm.cos",
                          "math.tanh": "llvm.tanh", "math.trunc": "llvm.trunc",
                          "math.round": "llvm.round", "math.roundeven": "llvm.roundeven",
                          "math.log10": "llvm.log10"}
# Functions vecmath emits as straight-line vector code (f64 erf/asin/acos: libm per lane).
_VECMATH_UNARY = {"math.exp": "exp", "math.exp2": "exp2", "math.log": "log", "math.erf": "erf",
                  "math.asin": "asin", "math.acos": "acos"}
# libdevice names (libdevice.py) with a rule of their own above: vector code, not a libm
# call per lane.
_EXTERN_AS_OP = {"exp": "math.exp", "log": "math.log", "exp2": "math.exp2",
                 "erf": "math.erf", "asin": "math.asin", "acos": "math.acos",
                 "sqrt": "math.sqrt", "floor": "math.floor", "ceil": "math.ceil",
                 "trunc": "math.trunc", "round": "math.round", "fabs": "math.absf",
                 "log2": "math.log2", "log10": "math.log10", "copysign": "math.copysign",
                 "fmin": "arith.minnumf", "fmax": "arith.maxnumf"}
# libm functions (float suffix "f" for f32) without an LLVM intrinsic.
_LIBM_UNARY = {"math.tan": "tan", "math.atan": "atan", "math.sinh": "sinh",
               "math.cosh": "cosh", "math.asinh": "asinh", "math.acosh": "acosh",
               "math.atanh": "atanh", "math.expm1": "expm1", "math.log1p": "log1p",
               "math.cbrt": "cbrt"}
_CMPF = {"oeq": ("==", True), "ogt": (">", True), "oge": (">=", True), "olt": ("<", True),
         "ole": ("<=", True), "one": ("!=", True), "ord": ("ord", True),
         "ueq": ("==", False), "ugt": (">", False), "uge": (">=", False),
         "ult": ("<", False), "ule": ("<=", False), "une": ("!=", False),
         "uno": ("uno", False)}
_CMPI = {"eq": ("==", True), "ne": ("!=", True), "slt": ("<", True), "sle": ("<=", True),
         "sgt": (">", True), "sge": (">=", True), "ult": ("<", False), "ule": ("<=", False),
         "ugt": (">", False), "uge": (">=", False)}
_CASTS = ("arith.extsi", "arith.extui", "arith.trunci", "arith.sitofp", "arith.uitofp",
          "arith.fptosi", "arith.fptoui", "arith.extf", "arith.truncf", "arith.bitcast",
          "tt.bitcast", "tt.fp_to_fp", "tt.int_to_ptr", "tt.ptr_to_int", "arith.index_cast")

ELEMENTWISE_OPS = frozenset(
    list(_INT_BINARY) + list(_FLOAT_BINARY) + list(_INT_MINMAX) + list(_FLOAT_MINMAX)
    + list(_FLOAT_INTRINSIC_UNARY) + list(_LIBM_UNARY) + list(_VECMATH_UNARY) + list(_CASTS)
    + ["arith.cmpi", "arith.cmpf", "arith.select", "arith.negf", "math.rsqrt",
       "math.fma", "math.absi", "tt.mulhiui", "arith.mulhiui",
       "tt.extern_elementwise", "tt.precise_sqrt", "tt.precise_divf", "arith.ceildivsi",
       "arith.floordivsi", "math.copysign", "math.powf", "math.atan2", "tt.clampf"])


class Elementwise:
    """Emits elementwise ops into one module (declaring intrinsics and libm functions)."""

    def __init__(self, module: ir.Module):
        self.module = module
        self.math = MathLibrary(module, host_target())  # kernels run in this process

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, ir.FunctionType(ret, args), name)

    def intrinsic(self, b: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
        ty = args[0].type
        function = self.declare(f"{name}.{type_suffix(ty)}", ty, [a.type for a in args])
        return b.call(function, args)

    def libm(self, b: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
        """A libm function applied lane by lane (f32 uses the `f` variant)."""
        ty = args[0].type
        scalar = ty.element if isinstance(ty, ir.VectorType) else ty
        if isinstance(scalar, ir.HalfType):
            wide = of_width(ir.FloatType(), ty.count if isinstance(ty, ir.VectorType) else 0)
            result = self.libm(b, name, [b.fpext(a, wide) for a in args])
            return b.fptrunc(result, ty)
        symbol = name + ("f" if isinstance(scalar, ir.FloatType) else "")
        function = self.declare(symbol, scalar, [scalar] * len(args))
        if not isinstance(ty, ir.VectorType):
            return b.call(function, args)
        result = ir.Constant(ty, ir.Undefined)
        for lane in range(ty.count):
            index = ir.Constant(I32, lane)
            value = b.call(function, [b.extract_element(a, index) for a in args])
            result = b.insert_element(result, value, index)
        return result

    def emit(self, b: ir.IRBuilder, name: str, attrs, args: list[ir.Value],
             arg_elems: list[str], result_elem: str) -> ir.Value:
        width = args[0].type.count if isinstance(args[0].type, ir.VectorType) else 0
        if "bf16" in arg_elems and name not in _CASTS and name != "arith.select":
            return self._bf16(b, name, attrs, args, arg_elems, result_elem, width)
        result_ty = of_width(scalar_type(result_elem), width)
        if name in _INT_BINARY:
            return getattr(b, _INT_BINARY[name])(args[0], args[1])
        if name in _FLOAT_BINARY:
            return getattr(b, _FLOAT_BINARY[name])(args[0], args[1])
        if name in _INT_MINMAX:
            _, op = _INT_MINMAX[name]
            compare = b.icmp_signed if name.endswith("si") else b.icmp_unsigned
            return b.select(compare(op, args[0], args[1]), args[0], args[1])
        if name in _FLOAT_MINMAX:
            return self.intrinsic(b, _FLOAT_MINMAX[name], args)
        if name in ("arith.cmpi", "arith.cmpf"):
            return self._compare(b, name, dict(attrs)["predicate"], args)
        if name == "arith.select":
            return b.select(args[0], args[1], args[2])
        if name == "arith.negf":
            return b.fneg(args[0])
        if name in _VECMATH_UNARY:
            return self._vecmath(b, _VECMATH_UNARY[name], args[0])
        if name in _FLOAT_INTRINSIC_UNARY:
            return self.intrinsic(b, _FLOAT_INTRINSIC_UNARY[name], args)
        if name in ("math.rsqrt",):
            root = self.intrinsic(b, "llvm.sqrt", args)
            return b.fdiv(splat_constant(root.type.element if width else root.type, 1.0,
                                         width), root)
        if name == "tt.precise_sqrt":
            return self.intrinsic(b, "llvm.sqrt", args)
        if name == "tt.precise_divf":
            return b.fdiv(args[0], args[1])
        if name == "math.fma":
            return self.intrinsic(b, "llvm.fma", args)
        if name == "math.copysign":
            return self.intrinsic(b, "llvm.copysign", args)
        if name == "math.powf":
            return self.intrinsic(b, "llvm.pow", args)
        if name == "math.atan2":
            return self.libm(b, "atan2", args)
        if name == "math.absi":
            negative = b.icmp_signed("<", args[0], splat_constant(
                args[0].type.element if width else args[0].type, 0, width))
            return b.select(negative, b.neg(args[0]), args[0])
        if name in _LIBM_UNARY:
            return self.libm(b, _LIBM_UNARY[name], args)
        if name in ("tt.mulhiui", "arith.mulhiui"):
            return self._mulhi(b, args, width)
        if name in ("arith.ceildivsi", "arith.floordivsi"):
            return self._rounded_division(b, name, args, width)
        if name == "tt.clampf":
            low = self.intrinsic(b, "llvm.maxnum", [args[0], args[1]])
            return self.intrinsic(b, "llvm.minnum", [low, args[2]])
        if name == "tt.extern_elementwise":
            return self._extern(b, dict(attrs)["symbol"], args, arg_elems, result_elem)
        if name in _CASTS:
            return self._cast(b, name, args[0], arg_elems[0], result_elem, result_ty)
        raise TileError(f"no elementwise rule for {name}")

    def _bf16(self, b, name, attrs, args, arg_elems, result_elem, width) -> ir.Value:
        """bf16 arithmetic as torch does it on the CPU: in f32, each result rounded to
        bf16 (to nearest even)."""
        wide = [bf16_to_f32(b, arg, width) if elem == "bf16" else arg
                for arg, elem in zip(args, arg_elems, strict=True)]
        elems = ["f32" if elem == "bf16" else elem for elem in arg_elems]
        if result_elem != "bf16":
            return self.emit(b, name, attrs, wide, elems, result_elem)
        return f32_to_bf16(b, self.emit(b, name, attrs, wide, elems, "f32"), width)

    def _vecmath(self, b: ir.IRBuilder, op: str, value: ir.Value) -> ir.Value:
        ty = value.type
        scalar = ty.element if isinstance(ty, ir.VectorType) else ty
        if isinstance(scalar, ir.HalfType):
            wide = of_width(ir.FloatType(), ty.count if isinstance(ty, ir.VectorType) else 0)
            return b.fptrunc(self.math.call(b, op, b.fpext(value, wide)), ty)
        return self.math.call(b, op, value)

    def _compare(self, b: ir.IRBuilder, name: str, predicate: str, args) -> ir.Value:
        if name == "arith.cmpi":
            op, signed = _CMPI[predicate]
            compare = b.icmp_signed if signed else b.icmp_unsigned
            return compare(op, args[0], args[1])
        op, ordered = _CMPF[predicate]
        compare = b.fcmp_ordered if ordered else b.fcmp_unordered
        return compare(op, args[0], args[1])

    def _mulhi(self, b: ir.IRBuilder, args, width: int) -> ir.Value:
        narrow = args[0].type
        bits = (narrow.element if width else narrow).width
        wide = of_width(ir.IntType(2 * bits), width)
        product = b.mul(b.zext(args[0], wide), b.zext(args[1], wide))
        return b.trunc(b.lshr(product, splat_constant(ir.IntType(2 * bits), bits, width)),
                       narrow)

    def _rounded_division(self, b, name, args, width):
        ty = args[0].type.element if width else args[0].type
        zero, one = splat_constant(ty, 0, width), splat_constant(ty, 1, width)
        quotient = b.sdiv(args[0], args[1])
        remainder = b.srem(args[0], args[1])
        inexact = b.icmp_signed("!=", remainder, zero)
        same_sign = b.icmp_signed("==", b.icmp_signed("<", args[0], zero),
                                  b.icmp_signed("<", args[1], zero))
        if name == "arith.ceildivsi":
            return b.select(b.and_(inexact, same_sign), b.add(quotient, one), quotient)
        return b.select(b.and_(inexact, b.not_(same_sign)), b.sub(quotient, one), quotient)

    def _extern(self, b: ir.IRBuilder, symbol: str, args, arg_elems, result_elem) -> ir.Value:
        base = symbol[:-1] if symbol.endswith("f") and symbol[:-1] in _LIBDEVICE_BASES \
            else symbol
        if base not in _LIBDEVICE_BASES:
            raise TileError(f"extern function `{symbol}` is not available on the CPU")
        if base in _EXTERN_AS_OP:
            return self.emit(b, _EXTERN_AS_OP[base], (), args, arg_elems, result_elem)
        return self.libm(b, base, args)

    def _cast(self, b, name, value, source: str, target: str, result_ty) -> ir.Value:
        if name in ("tt.int_to_ptr", "tt.ptr_to_int"):
            return value if value.type == result_ty else b.sext(value, result_ty)
        if name in ("arith.bitcast", "tt.bitcast"):
            return value if value.type == result_ty else b.bitcast(value, result_ty)
        if name in ("arith.extsi", "arith.index_cast"):
            if value.type == result_ty:
                return value
            if ELEM_BITS[source] > ELEM_BITS[target]:
                return b.trunc(value, result_ty)
            return b.sext(value, result_ty)
        if name == "arith.extui":
            return b.zext(value, result_ty)
        if name == "arith.trunci":
            return b.trunc(value, result_ty)
        if name == "arith.sitofp":
            return b.sitofp(value, result_ty)
        if name == "arith.uitofp":
            return b.uitofp(value, result_ty)
        if name == "arith.fptosi":
            return b.fptosi(value, result_ty)
        if name == "arith.fptoui":
            return b.fptoui(value, result_ty)
        if source not in FLOAT_ELEMS or target not in FLOAT_ELEMS:
            raise TileError(f"conversion {source} -> {target} is not supported")
        if source == target:
            return value
        width = _width(value)
        if source == "bf16":
            value, source = bf16_to_f32(b, value, width), "f32"
            if target == "f32":
                return value
        if target == "bf16":
            if source != "f32":
                value = b.fpext(value, of_width(ir.FloatType(), width)) \
                    if ELEM_BITS[source] < 32 else b.fptrunc(value, of_width(ir.FloatType(), width))
            return f32_to_bf16(b, value, width)
        if ELEM_BITS[target] > ELEM_BITS[source]:
            return b.fpext(value, result_ty)
        return b.fptrunc(value, result_ty)


def bf16_to_f32(b: ir.IRBuilder, bits: ir.Value, width: int) -> ir.Value:
    wide = b.shl(b.zext(bits, of_width(I32, width)), splat_constant(I32, 16, width))
    return b.bitcast(wide, of_width(ir.FloatType(), width))


def bf16_bits(value: float) -> int:
    """A constant's bf16 bits, rounded from f32 to nearest even as f32_to_bf16 rounds."""
    if value != value:
        return 0x7FC0
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def f32_to_bf16(b: ir.IRBuilder, value: ir.Value, width: int) -> ir.Value:
    """Round to nearest even (NaN stays NaN: its rounding carry cannot reach the sign)."""
    bits = b.bitcast(value, of_width(I32, width))
    odd = b.and_(b.lshr(bits, splat_constant(I32, 16, width)), splat_constant(I32, 1, width))
    rounded = b.add(bits, b.add(splat_constant(I32, 0x7FFF, width), odd))
    is_nan = b.fcmp_unordered("uno", value, value)
    quiet = b.or_(bits, splat_constant(I32, 0x400000, width))
    chosen = b.select(is_nan, quiet, rounded)
    return b.trunc(b.lshr(chosen, splat_constant(I32, 16, width)), of_width(ir.IntType(16), width))


def _width(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 0


# libm functions a libdevice call (tl.extra.libdevice / tl.math) may name; see libdevice.py.
_LIBDEVICE_BASES = frozenset(
    ["asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf",
     "erfc", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
     "sqrt", "cbrt", "floor", "ceil", "trunc", "round", "fabs", "pow", "atan2", "fmod",
     "hypot", "tgamma", "lgamma", "fmin", "fmax", "copysign", "nearbyint", "rint"])
