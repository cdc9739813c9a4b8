"""Vectorisable exp and log, generated as LLVM IR.

LLVM lowers `llvm.exp`/`llvm.log` on vectors to one libm call per lane, which makes
softmax call-bound. These versions are branch-free straight-line code (range reduction
plus a polynomial), so they work on scalars and on vectors of any width alike and stay
within 2 ulp over the whole float range (checked by tests/test_vecmath.py against float64
NumPy over millions of inputs).

exp(x):  n = rint(x / ln 2), r = x - n ln 2 in two steps (Cody-Waite: ln 2 split in a
         short high part, exact for |n| < 2^8, and a low part); e^r by a polynomial with
         constant term 1 on |r| <= ln2/2, in Horner form: for f32 a degree-5 minimax fit
         (1.07 ulp before rounding, see _EXP_F32; 1.91 ulp measured over every f32 input),
         for f64 the degree-13 Taylor series (truncation below half an ulp); 2^n applied
         so that results in the subnormal range are rounded once. On AVX-512, vscalefps
         computes poly * 2^n in one instruction and gives inf, +0 or NaN by itself for a
         huge, infinite or NaN n, so x is not clamped: only r is, to the polynomial's
         interval, by one vrangeps (AVX-512DQ; without it x is clamped by compare and
         select). Otherwise x is clamped to [underflow, overflow] and 2^n applied as two
         exact powers of two.
log(x):  x = 2^k m with m in [sqrt(2)/2, sqrt(2)) (subnormals pre-scaled), f = m - 1,
         s = f / (2 + f), log(1 + f) = f - (f^2/2 - s (f^2/2 + R)) with R the atanh
         series 2 s^2/3 + 2 s^4/5 + ... (|s| <= 0.172: 5 terms for f32, 11 for f64),
         and k ln 2 added as a high part (exact product) and a low part.
exp2(x): n = rint(x), f = x - n (exact, |f| <= 1/2), 2^f by a polynomial with constant term 1
         (f32: a degree-6 minimax fit, 0.09 ulp before rounding, see _EXP2_F32; f64: the
         Taylor series of e^(f ln 2) to degree 13), 2^n applied as in exp: on AVX-512 by
         vscalefps, with no clamp at all (its special cases give inf, +0 and NaN for
         x = +inf, -inf and NaN, where f is NaN), otherwise x is clamped and 2^n is two
         exact powers of two. No second range reduction (exp of
         f ln 2 would round f ln 2 and reduce again): about half exp's instructions.
Special values (NaN, +-inf, 0, negative log arguments) are fixed up with selects, except
in the AVX-512 exp, where vscalefps's own special cases give them.
erf(x), f32: evaluated in f64 (one widening per lane): erf(a)/a for a = min(|x|, 4) is a
         degree-20 polynomial in u = a^2/8 - 1 (the Chebyshev fit of erf(a)/a on a^2 in
         [0, 16], converted to monomials, whose coefficients stay below 0.36, so Horner's
         rule loses nothing; evaluated as four Horner chains in u^4 joined by Estrin's
         rule, _interleaved_horner), 1.5e-11 relative at worst, then a * poly rounded once to f32
         and the sign of x put back: the result is the correctly rounded erf(x) but for
         inputs within 1e-11 of a rounding boundary (every x >= 4 rounds to 1). NaN is
         passed through. f64: libm's erf per lane (no f64 polynomial is this accurate).
asin(x), acos(x), f32: with a = |x|, for a < 1/2 z = a^2 and y = a, else z = (1 - a)/2
         (exact) and y = sqrt(z), so that asin(a) = y + q with q = y z P(z) for the first
         and pi/2 - 2 (y + q) for the second (asin(a) = pi/2 - 2 asin(sqrt((1 - a)/2))).
         P is a degree-4 fit of (asin(sqrt z) - sqrt z) / z^1.5 on z in [0, 1/4] (relative
         error 5e-9 of asin, see _ASIN_F32), so one polynomial and one sqrt per lane, no
         branch. pi/2 and pi are split in a high and a low part and the large terms added
         first (pi/2_hi - 2y, its rounding error recovered by Fast2Sum), so neither the
         cancellation near a = 1/2 nor pi/2 - 2y rounding above 1 for a result below 1
         costs accuracy: max 1.16 ulp (asin) and 1.14 ulp (acos) on every 7th f32 in
         [-1, 1]; tests/test_triton_math.py sweeps the hard regions.
         |x| > 1 gives sqrt of a negative number, NaN; the sign is put back by copysign
         (asin) or by the choice between 2 asin(y) and pi - 2 asin(y) (acos). f64: libm
         per lane.
tanh stays on the libm intrinsic (not on any hot path).
"""

from __future__ import annotations

import math

from llvmlite import ir

from .target import Target

_LIBM_INTRINSICS = {"tanh": "llvm.tanh"}
# The functions MathLibrary emits.
MATH_OPS = ("exp", "exp2", "log", "erf", "tanh", "asin", "acos")

# e^r ~ 1 + c1 r + ... + c5 r^5 on |r| <= ln2 (1/2 + 2^-16) (the margin covers the rounding
# of x / ln 2 before rint, 150 ulp of 2^-24 at most): minimax for the error in f32 ulps of
# the result (weight 2^24 for r < 0, where e^r is in [1/2, 1), 2^23 above), by a Remez
# exchange in float64, each coefficient rounded to f32 in turn (c1 first) and the rest
# refitted. Max 1.07 ulp before the evaluation's roundings; ARM's optimized-routines
# v_expf has nearly the same degree-5 set. tests/test_vecmath.py re-runs the fit.
_EXP_REDUCED_BOUND = math.log(2) * (0.5 + 2.0**-16)
_EXP_F32 = tuple(float.fromhex(c) for c in (
    "0x1.ffffeep-1", "0x1.fffdb8p-2", "0x1.555d8cp-3", "0x1.573f34p-5", "0x1.0e89e6p-7"))

# 2^f ~ 1 + c1 f + ... + c6 f^6 on |f| <= 1/2 (f = x - rint(x) is exact, so no margin): the
# same Remez fit as _EXP_F32 (error in f32 ulps of the result, each coefficient rounded to
# f32 in turn, c1 first), max 0.09 ulp before the evaluation's roundings (degree 5 would be
# 2.35: c1 = ln 2 rounded to f32 costs that much). tests/test_vecmath_exp2.py re-runs it.
_EXP2_F32 = tuple(float.fromhex(c) for c in (
    "0x1.62e430p-1", "0x1.ebfbb2p-3", "0x1.c6af6ep-5", "0x1.3b4e26p-7", "0x1.5f0ffap-10",
    "0x1.2b5050p-13"))

# erf(a)/a ~ sum c_k u^k, u = a^2/8 - 1 on a in [0, 4]; tests/test_vecmath.py re-runs the fit
# (numpy's chebfit at 4000 Chebyshev nodes, cheb2poly) and sweeps the f32 range.
ERF_CLAMP = 4.0
_ERF_F64_POLY = tuple(float.fromhex(c) for c in (
    "0x1.6a040781a7b95p-2", "-0x1.69a0ccd72c81cp-3", "0x1.0dabaf0033610p-3",
    "-0x1.b92e978104aeep-4", "0x1.717efe4bd8491p-4", "-0x1.3215b3396b636p-4",
    "0x1.ea97b8b080dc0p-5", "-0x1.76eb44e57404cp-5", "0x1.0ed6ed1529e3ap-5",
    "-0x1.701600d170db6p-6", "0x1.d614c3d912f35p-7", "-0x1.1aca00be97fb7p-7",
    "0x1.3ecee749904f2p-8", "-0x1.4ba8ae25833b9p-9", "0x1.4d883ff2cc5fap-10",
    "-0x1.60e42271c575ap-11", "0x1.39b6b92fb1130p-12", "-0x1.2f51a92b2b3c3p-14",
    "0x1.04abfaa551ef4p-15", "-0x1.33faeb0659603p-15", "0x1.bcc7e26df7451p-17"))

# asin(y) ~ y + y z P(z), z = y^2 in [0, 1/4]: P(z) = c0 + c1 z + ... + c4 z^4 minimises the
# relative error z (P - g) of asin, g = (asin(sqrt z) - sqrt z) / z^1.5 (Lawson's iteration on
# weighted least squares at 4000 Chebyshev nodes, g from mpmath), rounded to f32;
# tests/test_vecmath.py re-runs the fit.
_ASIN_F32 = tuple(float.fromhex(c) for c in (
    "0x1.5555cap-3", "0x1.33014ep-4", "0x1.748c64p-5", "0x1.8ba262p-6", "0x1.59dac0p-5"))
_PI_HI = float.fromhex("0x1.921fb6p+1")  # pi rounded to f32; _PI_LO = pi - _PI_HI
_PI_LO = float.fromhex("-0x1.777a5cp-24")


def _interleaved_horner(b: ir.IRBuilder, fma, u, coefficients: list, chains: int = 4):
    """sum c_k u^k as `chains` (a power of two) Horner chains in u^chains, one per
    residue of k, joined by Estrin's rule ((P0 + u P1) + u^2 (P2 + u P3) for 4): as many
    multiply-adds and two more multiplies, but dependent chains a quarter as long. erf's
    20 f64 multiply-adds in one chain (4 cycles each) were its latency, which out-of-order
    execution did not hide: the erf of 6.3M floats took 8.3-11.7 ms on one thread, 5.5-6.1
    with four chains (ad hoc, loaded machine); the rounding differs from Horner's by a few
    f64 ulps, far below erf's 2e-11 fit."""
    while chains > max(1, len(coefficients)):  # a power of two, each chain one term or more
        chains //= 2
    powers = [u]
    while len(powers) < chains.bit_length() - 1:
        powers.append(b.fmul(powers[-1], powers[-1]))
    step = b.fmul(powers[-1], powers[-1]) if chains > 1 else u
    parts = []
    for residue in range(chains):
        terms = coefficients[residue::chains]
        value = terms[-1]
        for coefficient in reversed(terms[:-1]):
            value = fma(value, step, coefficient)
        parts.append(value)
    level = 0
    while len(parts) > 1:
        parts = [fma(parts[i + 1], powers[level], parts[i]) for i in range(0, len(parts), 2)]
        level += 1
    return parts[0]


class _Format:
    def __init__(self, is_double: bool):
        self.is_double = is_double
        self.float = ir.DoubleType() if is_double else ir.FloatType()
        self.int = ir.IntType(64 if is_double else 32)
        self.mantissa_bits = 52 if is_double else 23
        self.bias = 1023 if is_double else 127
        # ln 2 split: the high part has few significant bits so n * ln2_hi is exact.
        self.ln2_hi = 0.693145751953125 if is_double else 0.693359375
        self.ln2_lo = _ln2_low_part(self.ln2_hi)
        # c0 = 1, c1, c2, ... of the polynomial for e^r on |r| <= ln2/2.
        self.exp_coefficients = (tuple(1 / math.factorial(k) for k in range(14)) if is_double
                                 else (1.0, *_EXP_F32))
        self.exp2_coefficients = _exp2_taylor_f64() if is_double else (1.0, *_EXP2_F32)
        self.log_terms = 11 if is_double else 5
        # Clamp bounds just past where exp over/underflows: exp(overflow) rounds to inf and
        # exp(underflow) is below half the smallest subnormal, so it rounds to 0.
        self.overflow = 709.79 if is_double else 88.73
        self.underflow = -745.2 if is_double else -104.0
        self.subnormal_scale_bits = 54 if is_double else 25
        # exp2 below exp2_underflow rounds to +0 (2^-150 is half the smallest f32 subnormal,
        # a tie that rounds to even, 0); the clamps lie one past both ends.
        self.exp2_underflow = -1075.0 if is_double else -150.0
        self.exp2_clamp = 1076.0 if is_double else 151.0


class MathLibrary:
    """Emits calls to per-(op, type) helper functions, defined once per module and
    marked always-inline. Instruction choices (AVX-512's vscalefps and vrangeps) follow
    `target`'s features."""

    def __init__(self, module: ir.Module, target: Target):
        self.module = module
        self.target = target

    def call(self, builder: ir.IRBuilder, op: str, value: ir.Value) -> ir.Value:
        if op not in MATH_OPS:  # never an _Emitter method that happens to have the name
            raise ValueError(f"vecmath: no function {op!r} (it has {', '.join(MATH_OPS)})")
        if op in _LIBM_INTRINSICS:
            return builder.call(self._libm(op, value.type), [value])
        return builder.call(self._helper(op, value.type), [value])

    def _libm(self, op: str, ty) -> ir.Function:
        name = _LIBM_INTRINSICS[op] + "." + _suffix(ty)
        existing = self.module.globals.get(name)
        return existing or ir.Function(self.module, ir.FunctionType(ty, [ty]), name)

    def _helper(self, op: str, ty) -> ir.Function:
        name = f"tilegen.{op}.{_suffix(ty)}"
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        function = ir.Function(self.module, ir.FunctionType(ty, [ty]), name)
        function.linkage = "internal"
        function.attributes.add("alwaysinline")
        function.attributes.add("nounwind")
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        emit = _Emitter(self.module, builder, ty, self.target)
        if op in ("exp", "exp2") and isinstance(ty, ir.VectorType):
            emit.skip_if_all_underflow(function, emit.fmt.underflow if op == "exp"
                                       else emit.fmt.exp2_underflow)
        builder.ret(getattr(emit, op)(function.args[0]))
        return function


class _Emitter:
    """Builds the math on one scalar or vector type."""

    def __init__(self, module: ir.Module, builder: ir.IRBuilder, ty, target: Target):
        self.module = module
        self.target = target
        self.b = builder
        self.ty = ty
        self.width = ty.count if isinstance(ty, ir.VectorType) else 0
        element = ty.element if self.width else ty
        self.fmt = _Format(isinstance(element, ir.DoubleType))
        self.int_ty = ir.VectorType(self.fmt.int, self.width) if self.width else self.fmt.int

    def f(self, value: float) -> ir.Constant:
        if self.width:
            return ir.Constant(self.ty, [ir.Constant(self.fmt.float, value).constant] * self.width)
        return ir.Constant(self.ty, value)

    def i(self, value: int) -> ir.Constant:
        if self.width:
            return ir.Constant(self.int_ty, [value] * self.width)
        return ir.Constant(self.int_ty, value)

    def intrinsic(self, name: str, *args):
        full = f"{name}.{_suffix(self.ty)}"
        function = self.module.globals.get(full)
        if function is None:
            function = ir.Function(self.module, ir.FunctionType(self.ty, [self.ty] * len(args)),
                                   full)
        return self.b.call(function, list(args))

    def fma(self, a, b, c):
        return self.intrinsic("llvm.fma", a, b, c)

    def pow2(self, n_int):
        """2^n as a float, for n in the normal exponent range."""
        biased = self.b.add(n_int, self.i(self.fmt.bias))
        return self.b.bitcast(self.b.shl(biased, self.i(self.fmt.mantissa_bits)), self.ty)

    def avx512_intrinsic(self, op: str, *features: str):
        """llvm.x86.avx512.mask.<op> for 128/256/512-bit vectors when the target has
        AVX-512 (VL for the narrow ones) and `features`. Called as `self.avx512_call`."""
        if not self.width or not all(self.target.has(feature)
                                     for feature in ("avx512f", "avx512vl", *features)):
            return None
        bits = self.width * (64 if self.fmt.is_double else 32)
        if bits not in (128, 256, 512):
            return None
        kind = "pd" if self.fmt.is_double else "ps"
        name = f"llvm.x86.avx512.mask.{op}.{kind}.{bits}"
        function = self.module.globals.get(name)
        if function is None:
            i32 = ir.IntType(32)
            # range takes an immediate after the two sources; 512-bit forms end with an
            # i32 rounding/SAE control.
            args = ([self.ty, self.ty] + ([i32] if op == "range" else [])
                    + [self.ty, ir.IntType(max(8, self.width))] + ([i32] if bits == 512 else []))
            function = ir.Function(self.module, ir.FunctionType(self.ty, args), name)
        return function

    def avx512_call(self, function: ir.Function, a, b, *immediate: int):
        """function(a, b[, immediate]) on all lanes (passthrough a, mask all ones), in the
        current rounding direction."""
        i32 = ir.IntType(32)
        args = [a, b, *(ir.Constant(i32, value) for value in immediate), a,
                ir.Constant(ir.IntType(max(8, self.width)), -1)]
        if self.width * (64 if self.fmt.is_double else 32) == 512:
            args.append(ir.Constant(i32, 4))  # _MM_FROUND_CUR_DIRECTION
        return self.b.call(function, args)

    # ---- exp ----------------------------------------------------------------------------------

    def skip_if_all_underflow(self, function: ir.Function, bound: float) -> None:
        """Return +0 for the whole vector when every lane is below `bound`, where exp (or
        exp2) rounds to +0 anyway (bit-identical). Masked softmax rows are full of such
        vectors (the causal half of the scores, -1e9 minus the row max): they then cost a
        compare and a branch instead of the polynomial. NaN lanes compare false."""
        b, x = self.b, function.args[0]
        below = b.fcmp_ordered("<", x, self.f(bound))
        bits = b.bitcast(below, ir.IntType(self.width))
        every = b.icmp_unsigned("==", bits, ir.Constant(bits.type, (1 << self.width) - 1))
        underflow = function.append_basic_block("underflow")
        compute = function.append_basic_block("compute")
        b.cbranch(every, underflow, compute)
        b.position_at_end(underflow)
        b.ret(ir.Constant(self.ty, None))
        b.position_at_end(compute)

    def exp(self, x):
        fmt, b = self.fmt, self.b
        scalef = self.avx512_intrinsic("scalef")
        vrange = self.avx512_intrinsic("range", "avx512dq") if scalef is not None else None
        if vrange is not None:
            # x is not clamped: NaN, +-inf and huge x give n = NaN, +-inf or huge, and
            # vscalefps returns NaN, inf or +0 for those n whatever its (finite, positive)
            # first operand. Only r can then be NaN (inf - inf) or far out of range, so r is
            # clamped instead, by vrangeps: imm 0b0010 is min(|r|, bound) with the sign of r,
            # one instruction, and it returns the bound for a NaN r. The bound is the
            # polynomial's interval: wherever the result is neither inf nor 0 (|n| <= 150 for
            # f32, 1075 for f64), r is exact to rounding and already inside it.
            n = self.intrinsic("llvm.rint", b.fmul(x, self.f(1 / math.log(2))))
            r = self.fma(n, self.f(-fmt.ln2_hi), x)
            r = self.fma(n, self.f(-fmt.ln2_lo), r)
            r = self.avx512_call(vrange, r, self.f(_EXP_REDUCED_BOUND), 0b0010)
        else:
            if scalef is not None:
                # Compare-and-select clamps keep a NaN (the compares are false), and NaN
                # then flows through every step below, vscalefps included: no fix-up.
                low = b.select(b.fcmp_ordered("<", x, self.f(fmt.underflow)),
                               self.f(fmt.underflow), x)
                clamped = b.select(b.fcmp_ordered(">", low, self.f(fmt.overflow)),
                                   self.f(fmt.overflow), low)
            else:
                clamped = self.intrinsic("llvm.minnum", self.intrinsic(
                    "llvm.maxnum", x, self.f(fmt.underflow)), self.f(fmt.overflow))
            n = self.intrinsic("llvm.rint", b.fmul(clamped, self.f(1 / math.log(2))))
            r = self.fma(n, self.f(-fmt.ln2_hi), clamped)
            r = self.fma(n, self.f(-fmt.ln2_lo), r)
        *lower, top = fmt.exp_coefficients
        poly = self.f(top)
        for coefficient in reversed(lower):
            poly = self.fma(poly, r, self.f(coefficient))
        if scalef is not None:
            # AVX-512's vscalefps computes poly * 2^n in one instruction with a single
            # rounding, subnormal results included.
            return self.avx512_call(scalef, poly, n)
        n_int = b.fptosi(n, self.int_ty)
        half = b.ashr(n_int, self.i(1))
        rest = b.sub(n_int, half)
        # Below the underflow bound the second factor is 0 outright: the product of the
        # clamped value would round to 0 anyway, but through a subnormal intermediate that
        # costs x86 a microcode assist (softmax rows full of -1e9 mask entries hit this).
        underflowed = b.fcmp_ordered("<", x, self.f(fmt.underflow))
        second = b.select(underflowed, self.f(0.0), self.pow2(rest))
        result = b.fmul(b.fmul(poly, self.pow2(half)), second)
        # Above the overflow bound the product itself rounds to inf; NaN stays NaN.
        return b.select(b.fcmp_unordered("uno", x, x), x, result)

    def exp2(self, x):
        fmt, b = self.fmt, self.b
        scalef = self.avx512_intrinsic("scalef")
        if scalef is None:
            # Compare-and-select clamps keep a NaN; past the clamps the result is inf or 0.
            x = b.select(b.fcmp_ordered("<", x, self.f(-fmt.exp2_clamp)),
                         self.f(-fmt.exp2_clamp), x)
            x = b.select(b.fcmp_ordered(">", x, self.f(fmt.exp2_clamp)),
                         self.f(fmt.exp2_clamp), x)
        n = self.intrinsic("llvm.rint", x)
        f = b.fsub(x, n)  # exact; NaN only for x = +-inf (inf - inf) or NaN
        *lower, top = fmt.exp2_coefficients
        poly = self.f(top)
        for coefficient in reversed(lower):
            poly = self.fma(poly, f, self.f(coefficient))
        if scalef is not None:
            # No clamp and no fix-up: a huge finite x has f = 0 and n past the range, and
            # vscalefps's special cases give the rest: (QNaN, +inf) is +inf, (QNaN, -inf) is
            # +0, a NaN n is NaN.
            return self.avx512_call(scalef, poly, n)
        n_int = b.fptosi(b.select(b.fcmp_unordered("uno", n, n), self.f(0.0), n), self.int_ty)
        half = b.ashr(n_int, self.i(1))
        # Below the underflow bound the second factor is 0 outright (no subnormal
        # intermediate, see exp).
        underflowed = b.fcmp_ordered("<", x, self.f(fmt.exp2_underflow))
        second = b.select(underflowed, self.f(0.0), self.pow2(b.sub(n_int, half)))
        # A NaN x has a NaN poly: the product is NaN (n_int, whose fptosi would be poison,
        # was taken as 0).
        return b.fmul(b.fmul(poly, self.pow2(half)), second)

    # ---- erf ----------------------------------------------------------------------------------

    def erf(self, x):
        b = self.b
        if self.fmt.is_double:
            return self._per_lane_libm("erf", x)
        wide = ir.VectorType(ir.DoubleType(), self.width) if self.width else ir.DoubleType()
        magnitude = self.intrinsic("llvm.fabs", x)
        clamped = self.intrinsic("llvm.minnum", magnitude, self.f(ERF_CLAMP))
        a = b.fpext(clamped, wide)

        def wide_constant(value: float):
            if self.width:
                return ir.Constant(wide, [ir.Constant(ir.DoubleType(), value).constant]
                                   * self.width)
            return ir.Constant(wide, value)
        u = b.fsub(b.fmul(b.fmul(a, a), wide_constant(0.125)), wide_constant(1.0))
        fma = f"llvm.fma.{_suffix(wide)}"
        function = self.module.globals.get(fma) or ir.Function(
            self.module, ir.FunctionType(wide, [wide] * 3), fma)
        poly = _interleaved_horner(b, lambda x, y, z: b.call(function, [x, y, z]), u,
                                   [wide_constant(c) for c in _ERF_F64_POLY])
        result = self.intrinsic("llvm.copysign", b.fptrunc(b.fmul(a, poly), self.ty), x)
        return b.select(b.fcmp_unordered("uno", x, x), x, result)

    # ---- asin, acos ---------------------------------------------------------------------------

    def _asin_parts(self, x):
        """(a < 1/2, y, q) for a = |x|: asin(a) = y + q below 1/2, pi/2 - 2 (y + q) above."""
        b = self.b
        a = self.intrinsic("llvm.fabs", x)
        small = b.fcmp_ordered("<", a, self.f(0.5))
        z = b.select(small, b.fmul(a, a), self.fma(a, self.f(-0.5), self.f(0.5)))
        y = b.select(small, a, self.intrinsic("llvm.sqrt", z))
        poly = self.f(_ASIN_F32[-1])
        for coefficient in reversed(_ASIN_F32[:-1]):
            poly = self.fma(poly, z, self.f(coefficient))
        return small, y, b.fmul(b.fmul(y, z), poly)

    def _pi_minus(self, fraction: float, scale: float, y, q):
        """fraction * pi - scale (y + q) (|scale y| <= fraction * pi): head = hi - scale y
        rounded, and its rounding error recovered exactly (Fast2Sum), since head can
        round at twice the result's ulp (head just above 1, the result just below); then
        that error, lo and -scale q are added to it."""
        b = self.b
        high = self.f(fraction * _PI_HI)
        head = self.fma(y, self.f(-scale), high)
        error = self.fma(y, self.f(-scale), b.fsub(high, head))
        tail = self.fma(q, self.f(-scale), b.fadd(error, self.f(fraction * _PI_LO)))
        return b.fadd(head, tail)

    def asin(self, x):
        if self.fmt.is_double:
            return self._per_lane_libm("asin", x)
        small, y, q = self._asin_parts(x)
        magnitude = self.b.select(small, self.b.fadd(y, q), self._pi_minus(0.5, 2.0, y, q))
        return self.intrinsic("llvm.copysign", magnitude, x)

    def acos(self, x):
        """acos(x) = pi/2 - asin(x) below 1/2; above, 2 asin(y) for x > 0 and
        pi - 2 asin(y) for x < 0."""
        if self.fmt.is_double:
            return self._per_lane_libm("acos", x)
        b = self.b
        small, y, q = self._asin_parts(x)
        signed_y = self.intrinsic("llvm.copysign", y, x)
        signed_q = self.intrinsic("llvm.copysign", q, x)
        near_zero = self._pi_minus(0.5, 1.0, signed_y, signed_q)
        negative = b.fcmp_ordered("<", x, self.f(0.0))
        far = b.select(negative, self._pi_minus(1.0, 2.0, y, q), b.fmul(self.f(2.0),
                                                                       b.fadd(y, q)))
        return b.select(small, near_zero, far)

    def _per_lane_libm(self, name: str, x):
        """libm's `name` on each lane (f64 only)."""
        b = self.b
        scalar = ir.DoubleType()
        function = self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(scalar, [scalar]), name)
        if not self.width:
            return b.call(function, [x])
        result = ir.Constant(self.ty, None)
        for lane in range(self.width):
            index = ir.Constant(ir.IntType(32), lane)
            result = b.insert_element(result, b.call(function, [b.extract_element(x, index)]),
                                      index)
        return result

    # ---- log ----------------------------------------------------------------------------------

    def log(self, x):
        fmt, b = self.fmt, self.b
        smallest_normal = 2.0 ** (1 - fmt.bias)
        is_subnormal = b.fcmp_ordered("<", x, self.f(smallest_normal))
        scaled = b.select(is_subnormal, b.fmul(x, self.f(2.0 ** fmt.subnormal_scale_bits)), x)
        exponent_adjust = b.select(is_subnormal, self.i(-fmt.subnormal_scale_bits), self.i(0))
        bits = b.bitcast(scaled, self.int_ty)
        # Shift the mantissa range to [sqrt(2)/2, sqrt(2)) by biasing with sqrt(2)/2's bits.
        sqrt_half_bits = _float_bits(math.sqrt(0.5), fmt.is_double)
        one_bits = _float_bits(1.0, fmt.is_double)
        shifted = b.add(bits, self.i(one_bits - sqrt_half_bits))
        k = b.sub(b.ashr(shifted, self.i(fmt.mantissa_bits)), self.i(fmt.bias))
        k = b.add(k, exponent_adjust)
        mantissa_mask = (1 << fmt.mantissa_bits) - 1
        m_bits = b.add(b.and_(shifted, self.i(mantissa_mask)), self.i(sqrt_half_bits))
        m = b.bitcast(m_bits, self.ty)
        f = b.fsub(m, self.f(1.0))
        s = b.fdiv(f, b.fadd(self.f(2.0), f))
        z = b.fmul(s, s)
        series = self.f(2.0 / (2 * fmt.log_terms + 1))
        for term in range(fmt.log_terms - 1, 0, -1):
            series = self.fma(series, z, self.f(2.0 / (2 * term + 1)))
        r = b.fmul(series, z)
        hfsq = b.fmul(self.f(0.5), b.fmul(f, f))
        dk = b.sitofp(k, self.ty)
        low = self.fma(s, b.fadd(hfsq, r), b.fmul(dk, self.f(fmt.ln2_lo)))
        result = b.fadd(b.fadd(b.fsub(low, hfsq), f), b.fmul(dk, self.f(fmt.ln2_hi)))
        result = b.select(b.fcmp_ordered("==", x, self.f(0.0)), self.f(-math.inf), result)
        result = b.select(b.fcmp_ordered("<", x, self.f(0.0)), self.f(math.nan), result)
        result = b.select(b.fcmp_ordered("==", x, self.f(math.inf)), x, result)
        return b.select(b.fcmp_unordered("uno", x, x), x, result)


def _ln2_low_part(high: float) -> float:
    """ln 2 - high, computed in 40-digit decimal arithmetic: in double arithmetic the
    rounding of math.log(2) itself (4e-17) would be multiplied by |n| up to 1075."""
    import decimal

    with decimal.localcontext() as context:
        context.prec = 40
        return float(decimal.Decimal(2).ln() - decimal.Decimal(high))


def _exp2_taylor_f64() -> tuple[float, ...]:
    """(ln 2)^k / k! for k = 0..13, in 50-digit decimal arithmetic: 2^f = e^(f ln 2), whose
    Taylor series to degree 13 is below half an ulp on |f ln 2| <= ln2/2, as exp's."""
    import decimal

    with decimal.localcontext() as context:
        context.prec = 50
        ln2 = decimal.Decimal(2).ln()
        return tuple(float(ln2**k / math.factorial(k)) for k in range(14))


def _float_bits(value: float, is_double: bool) -> int:
    import struct

    if is_double:
        return struct.unpack("<q", struct.pack("<d", value))[0]
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _suffix(ty) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    return "f32" if isinstance(ty, ir.FloatType) else "f64"
