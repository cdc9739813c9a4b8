"""Random expression trees over the values a kernel holds (`grow`): one `_op_*` per kind
of operation, each keeping intervals and error bounds."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tests.tritongen.values import (
    COMBINE_HELPERS,
    INT_CAP,
    LITERALS,
    MAG_CAP,
    U,
    Val,
    _bcast,
    _f32,
    _interval_mul,
    _Kernel,
    _lit,
    _union,
)

# ----------------------------------------------------------------------------- expressions


def _choose(k: _Kernel, pred=lambda v: True, recent: bool = True) -> Val | None:
    """A value of the pool satisfying pred, later ones likelier (trees grow deep)."""
    candidates = [v for v in k.pool if pred(v)]
    if not candidates:
        return None
    if not recent:
        return k.pick(candidates)
    weights = np.arange(1, len(candidates) + 1, dtype=float) ** 1.5
    return candidates[int(k.rng.choice(len(candidates), p=weights / weights.sum()))]


def _numeric(v: Val) -> bool:
    return v.dtype in ("f32", "i32")


def _as_float(v: Val, shape: tuple[str, ...]) -> str:
    text = _bcast(v, shape)
    return f"{text}.to(tl.float32)" if v.dtype == "i32" else text


def _arith(k: _Kernel, op: str, a: Val, b: Val) -> tuple[str, Val] | None:
    """a op b (op one of + - *), with Triton's promotions and broadcasting."""
    shape = _union(a.shape, b.shape)
    dtype = "i32" if a.dtype == b.dtype == "i32" else "f32"
    # mixed int/float: sometimes Triton's implicit promotion, sometimes an explicit cast
    explicit = dtype == "f32" and k.chance(0.5)
    ta = _as_float(a, shape) if explicit else _bcast(a, shape)
    tb = _as_float(b, shape) if explicit else _bcast(b, shape)
    if op == "*":
        lo, hi = _interval_mul(a, b)
    elif op == "+":
        lo, hi = a.lo + b.lo, a.hi + b.hi
    else:
        lo, hi = a.lo - b.hi, a.hi - b.lo
    mag = max(abs(lo), abs(hi))
    intval = a.intval and b.intval and mag < INT_CAP
    if dtype == "i32":
        if mag >= 2 ** 30:
            return None
        return f"{ta} {op} {tb}", Val("", shape, "i32", lo, hi, intval=True)
    if op == "*":
        exact = a.exact and b.exact
        err = a.err * b.mag + b.err * a.mag + (0.0 if exact else 2 * U * mag)
        return f"{ta} * {tb}", Val("", shape, "f32", lo, hi, err, exact, intval,
                                   fusable=not intval)
    # an add reading a product may be contracted into an fma (one rounding fewer)
    fused = a.fusable or b.fusable
    exact = a.exact and b.exact and (intval or not fused)
    err = 0.0 if exact else a.err + b.err + 2 * U * (mag + a.mag + b.mag)
    return f"{ta} {op} {tb}", Val("", shape, "f32", lo, hi, err, exact, intval)


def _op_arith(k: _Kernel) -> tuple[str, Val] | None:
    a = _choose(k, _numeric)
    b = _choose(k, _numeric, recent=False)
    if a is None or b is None:
        return None
    return _arith(k, k.pick(("+", "-", "*")), a, b)


def _op_scalar(k: _Kernel) -> tuple[str, Val] | None:
    """A value against a literal or a float argument."""
    a = _choose(k, lambda v: v.dtype == "f32")
    if a is None:
        return None
    if k.chance(0.5):
        c = k.pick(LITERALS)
        scalar = Val(_lit(c), (), "f32", c, c, intval=float(c).is_integer())
    else:
        c = _f32(k.rng.uniform(-2, 2))
        scalar = Val(k.float_arg(k.fresh("alpha"), c), (), "f32", c, c)
    op = k.pick(("+", "*", "-"))
    return _arith(k, op, a, scalar) if k.chance(0.7) else _arith(k, op, scalar, a)


def _denominator(k: _Kernel) -> tuple[str, Val] | None:
    """A divisor away from zero: a value of the pool that is, or else `|v| + c`; returns
    a template for its text (`{}` where the broadcast value goes) and its bounds."""
    far = _choose(k, lambda v: v.dtype == "f32" and (v.lo >= 0.5 or v.hi <= -0.5))
    if far is not None and k.chance(0.6):
        return "{}", far
    v = _choose(k, lambda v: v.dtype == "f32", recent=False)
    if v is None:
        return None
    c = k.pick((1.0, 0.5, 2.0))
    return (f"(tl.abs({{}}) + {_lit(c)})",
            Val(v.name, v.shape, "f32", c, v.mag + c, v.err, v.exact, False))


def _op_div(k: _Kernel) -> tuple[str, Val] | None:
    a = _choose(k, lambda v: v.dtype == "f32")
    den = _denominator(k)
    if a is None or den is None:
        return None
    template, b = den
    shape = _union(a.shape, b.shape)
    tb = template.format(_bcast(b, shape))
    ends = [a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]
    bmin = min(abs(b.lo), abs(b.hi))
    mag = max(abs(x) for x in ends)
    # division by a scalar is a reciprocal and two multiplies in tilegen (1.5 ulp)
    err = a.err / bmin + mag * b.err / bmin + 4 * U * mag
    return f"{_bcast(a, shape)} / {tb}", Val("", shape, "f32", min(ends), max(ends), err,
                                               exact=False)


def _op_unary(k: _Kernel) -> tuple[str, Val] | None:
    a = _choose(k, lambda v: v.dtype == "f32")
    if a is None:
        return None
    op = k.pick(("exp", "log", "sqrt", "abs", "neg", "sigmoid"))
    t = a.name
    if op == "exp":
        if a.hi > 8:
            return None
        lo, hi = math.exp(max(a.lo, -80)), math.exp(a.hi)
        return f"tl.exp({t})", Val("", a.shape, "f32", lo, hi, hi * (a.err + 8 * U), False)
    if op == "log":
        if a.lo < 0.1:  # log(|a| + 1) instead
            lo, hi = math.log1p(max(a.lo, 0.0) if a.lo >= 0 else 0.0), math.log1p(a.mag)
            err = a.err + 8 * U * max(1.0, hi)
            return (f"tl.log(tl.abs({t}) + 1.0)",
                    Val("", a.shape, "f32", lo, hi, err, False))
        lo, hi = math.log(a.lo), math.log(a.hi)
        err = a.err / a.lo + 8 * U * max(1.0, abs(lo), abs(hi))
        return f"tl.log({t})", Val("", a.shape, "f32", lo, hi, err, False)
    if op == "sqrt":
        # IEEE sqrt is correctly rounded in both: exact of an exact operand
        text = f"tl.sqrt({t})" if a.lo >= 0 else f"tl.sqrt(tl.abs({t}))"
        lo = math.sqrt(a.lo) if a.lo >= 0 else 0.0
        hi = math.sqrt(a.mag)
        err = 0.0 if a.exact else math.sqrt(a.err) + 2 * U * hi
        return text, Val("", a.shape, "f32", lo, hi, err, a.exact)
    if op == "abs":
        lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
        return f"tl.abs({t})", Val("", a.shape, "f32", lo, a.mag, a.err, a.exact, a.intval)
    if op == "neg":
        return f"-{t}", Val("", a.shape, "f32", -a.hi, -a.lo, a.err, a.exact, a.intval,
                            fusable=a.fusable)  # -(a * b) + c contracts too
    lo, hi = 1 / (1 + math.exp(-max(a.lo, -80))), 1 / (1 + math.exp(-min(a.hi, 80)))
    return f"tl.sigmoid({t})", Val("", a.shape, "f32", lo, hi, 0.25 * a.err + 8 * U, False)


def _op_minmax(k: _Kernel) -> tuple[str, Val] | None:
    a = _choose(k, _numeric)
    b = _choose(k, lambda v: _numeric(v) and v.dtype == a.dtype, recent=False) if a else None
    if b is None:
        return None
    fn = k.pick(("maximum", "minimum"))
    shape = _union(a.shape, b.shape)
    if fn == "maximum":
        lo, hi = max(a.lo, b.lo), max(a.hi, b.hi)
    else:
        lo, hi = min(a.lo, b.lo), min(a.hi, b.hi)
    return (f"tl.{fn}({_bcast(a, shape)}, {_bcast(b, shape)})",
            Val("", shape, a.dtype, lo, hi, max(a.err, b.err), a.exact and b.exact,
                a.intval and b.intval))


def _condition(k: _Kernel) -> tuple[str, tuple[str, ...]] | None:
    """A comparison of bit-exact values (or of one with a literal): never flips on an ulp."""
    a = _choose(k, lambda v: _numeric(v) and v.exact)
    if a is None:
        return None
    cmp = k.pick(("<", ">", "<=", ">=", "==", "!="))
    b = _choose(k, lambda v: _numeric(v) and v.exact and v is not a, recent=False)
    if b is not None and k.chance(0.6):
        shape = _union(a.shape, b.shape)
        return f"({_bcast(a, shape)} {cmp} {_bcast(b, shape)})", shape
    if a.dtype == "i32":
        literal = str(int(k.rng.integers(math.floor(a.lo), math.floor(a.hi) + 1)))
    elif a.intval:
        literal = _lit(float(k.rng.integers(math.floor(a.lo), math.floor(a.hi) + 1)))
    else:
        literal = _lit(_f32(k.rng.uniform(a.lo, a.hi)))
    return f"({a.name} {cmp} {literal})", a.shape


def _op_where(k: _Kernel) -> tuple[str, Val] | None:
    cond = _condition(k)
    flags = _choose(k, lambda v: v.dtype == "i1")
    if flags is not None and k.chance(0.5):  # a mask loaded from memory
        cond = flags.name, flags.shape
    a = _choose(k, _numeric)
    b = _choose(k, lambda v: _numeric(v) and v.dtype == a.dtype, recent=False) if a else None
    if cond is None or b is None:
        return None
    ctext, cshape = cond
    shape = _union(cshape, a.shape, b.shape)
    if cshape != shape and cshape:
        ctext = f"{ctext}[:, None]" if cshape == ("R",) else f"{ctext}[None, :]"
    return (f"tl.where({ctext}, {_bcast(a, shape)}, {_bcast(b, shape)})",
            Val("", shape, a.dtype, min(a.lo, b.lo), max(a.hi, b.hi), max(a.err, b.err),
                a.exact and b.exact, a.intval and b.intval))


def _op_cast(k: _Kernel) -> tuple[str, Val] | None:
    if k.chance(0.5):  # float -> int truncates: only of exact values (no boundary flips)
        a = _choose(k, lambda v: v.dtype == "f32" and v.exact)
        if a is None:
            return None
        return (f"{a.name}.to(tl.int32)",
                Val("", a.shape, "i32", math.trunc(a.lo), math.trunc(a.hi), intval=True))
    a = _choose(k, lambda v: v.dtype == "i32")
    if a is None:
        return None
    return f"{a.name}.to(tl.float32)", Val("", a.shape, "f32", a.lo, a.hi, intval=True)


def _op_intdiv(k: _Kernel) -> tuple[str, Val] | None:
    """`//` and `%` on integer tiles (index arithmetic), C semantics for negative ones."""
    a = _choose(k, lambda v: v.dtype == "i32")
    if a is None:
        return None
    d = int(k.rng.integers(1, 10))
    if k.chance(0.2):  # large divisors, negative ones
        d = int(k.pick((7, 100, 1000, 65537, 2 ** 20 + 1))) * k.pick((1, -1))
    elif k.chance(0.15):
        d = -d
    divisor = str(d) if d > 0 else f"({d})"
    if k.chance(0.3):  # a runtime divisor: uniform over the tile
        divisor = k.int_arg(k.fresh("div"), d)
    if k.chance(0.5):
        ends = (math.trunc(a.lo / d), math.trunc(a.hi / d))
        return f"{a.name} // {divisor}", Val("", a.shape, "i32", min(ends), max(ends),
                                              intval=True)
    r = abs(d) - 1  # the remainder takes the dividend's sign
    lo = 0 if a.lo >= 0 else -min(r, a.mag)
    hi = 0 if a.hi <= 0 else min(r, a.mag)
    return f"{a.name} % {divisor}", Val("", a.shape, "i32", lo, hi, intval=True)


def _op_math(k: _Kernel) -> tuple[str, Val] | None:
    """More of tl's math: floor/ceil and clamp (exact), exp2/log2/erf/sin/cos/rsqrt and fma
    (not correctly rounded everywhere: within a few ulp)."""
    a = _choose(k, lambda v: v.dtype == "f32")
    if a is None:
        return None
    op = k.pick(("floor", "ceil", "clamp", "exp2", "log2", "erf", "sin", "cos", "rsqrt",
                 "fma"))
    t = a.name
    if op in ("floor", "ceil"):
        fn = math.floor if op == "floor" else math.ceil
        return f"tl.{op}({t})", Val("", a.shape, "f32", fn(a.lo), fn(a.hi), a.err + 1.0,
                                     a.exact, a.exact or a.intval)
    if op == "clamp":
        lo = _f32(k.rng.uniform(-2, 0.5))
        hi = _f32(lo + k.rng.uniform(0.25, 3))
        return (f"tl.clamp({t}, {_lit(lo)}, {_lit(hi)})",
                Val("", a.shape, "f32", max(min(a.lo, hi), lo), min(max(a.hi, lo), hi), a.err,
                    a.exact, a.intval and float(lo).is_integer() and float(hi).is_integer()))
    if op == "exp2":
        if a.hi > 12:
            return None
        lo, hi = 2.0 ** max(a.lo, -120), 2.0 ** a.hi
        return f"tl.exp2({t})", Val("", a.shape, "f32", lo, hi, hi * (a.err + 8 * U), False)
    if op == "log2":
        if a.lo < 0.1:
            return None
        lo, hi = math.log2(a.lo), math.log2(a.hi)
        err = 1.5 * a.err / a.lo + 8 * U * max(1.0, abs(lo), abs(hi))
        return f"tl.log2({t})", Val("", a.shape, "f32", lo, hi, err, False)
    if op == "erf":
        return (f"tl.erf({t})",
                Val("", a.shape, "f32", math.erf(a.lo), math.erf(a.hi), 1.2 * a.err + 8 * U,
                    False))
    if op in ("sin", "cos"):
        if a.mag > 100:  # far from 0 the argument reduction's accuracy matters
            return None
        return f"tl.{op}({t})", Val("", a.shape, "f32", -1.0, 1.0, a.err + 8 * U, False)
    if op == "rsqrt":
        if a.lo < 0.1:
            return None
        hi = 1 / math.sqrt(a.lo)
        err = a.err * 0.5 * a.lo ** -1.5 + 8 * U * hi
        return f"tl.rsqrt({t})", Val("", a.shape, "f32", 1 / math.sqrt(a.hi), hi, err, False)
    b = _choose(k, lambda v: v.dtype == "f32", recent=False)
    c = _choose(k, lambda v: v.dtype == "f32", recent=False)
    shape = _union(a.shape, b.shape, c.shape)
    lo, hi = _interval_mul(a, b)
    lo, hi = lo + c.lo, hi + c.hi
    mag = max(abs(lo), abs(hi))
    exact = a.intval and b.intval and c.intval and mag < INT_CAP
    # the interpreter rounds the product and the sum; a real fma rounds once
    err = 0.0 if exact else (a.err * b.mag + b.err * a.mag + c.err
                             + 2 * U * (a.mag * b.mag + mag))
    if shape != a.shape and not a.shape:  # fma wants its first operand as a tile
        return None
    return (f"tl.fma({_bcast(a, shape)}, {_bcast(b, shape)}, {_bcast(c, shape)})",
            Val("", shape, "f32", lo, hi, err, exact, exact))


def _op_bits(k: _Kernel) -> tuple[str, Val] | None:
    """Bitwise and shift ops on integer tiles (negative values included)."""
    a = _choose(k, lambda v: v.dtype == "i32")
    if a is None:
        return None
    op = k.pick(("&", "|", "^", ">>", "<<"))
    if op in (">>", "<<"):
        shift = int(k.rng.integers(0, 4))
        if op == ">>":
            return f"{a.name} >> {shift}", Val("", a.shape, "i32", int(a.lo) >> shift,
                                                int(a.hi) >> shift, intval=True)
        if a.mag * 2 ** shift >= 2 ** 30:
            return None
        return f"{a.name} << {shift}", Val("", a.shape, "i32", a.lo * 2 ** shift,
                                            a.hi * 2 ** shift, intval=True)
    if op == "&" and k.chance(0.5):
        m = k.pick((1, 3, 7, 15, 255))
        return f"{a.name} & {m}", Val("", a.shape, "i32", 0, m, intval=True)
    b = _choose(k, lambda v: v.dtype == "i32", recent=False)
    shape = _union(a.shape, b.shape)
    power = 2 ** math.ceil(math.log2(max(a.mag, b.mag) + 1))
    return (f"{_bcast(a, shape)} {op} {_bcast(b, shape)}",
            Val("", shape, "i32", -power, power - 1, intval=True))


def _op_trans(k: _Kernel) -> tuple[str, Val] | None:
    """tl.trans of a square tile (the shape names stay: BLOCK_M == BLOCK_N)."""
    if k.block.get("R") != k.block.get("C"):
        return None
    a = _choose(k, lambda v: _numeric(v) and v.shape == ("R", "C"))
    if a is None:
        return None
    val = dataclasses.replace(a, name="")
    return f"tl.trans({a.name})", val


def _op_branch(k: _Kernel) -> tuple[str, Val] | None:
    """An `if` on a scalar condition (an scf.if), each arm computing the result its own
    way."""
    target = _choose(k, _numeric)
    if target is None:
        return None
    cond = _condition(k)
    if cond is None or cond[1]:
        ids = "pid_m" if "R" in k.block else "pid"
        cond = (f"{ids} % {int(k.rng.integers(2, 4))} == {int(k.rng.integers(0, 2))}", ())
    name = k.fresh("br")
    arms = []
    k.emit(f"if {cond[0]}:")
    for arm in ("if", "else"):
        if arm == "else":
            k.emit("else:")
        k.indent += 1
        saved = list(k.pool)
        made = None
        for _attempt in range(8):
            rule = k.pick((_op_arith, _op_unary, _op_scalar, _op_minmax, _op_where))
            mark = len(k.lines), len(k.args)
            made = rule(k)
            if (made is not None and made[1].shape == target.shape
                    and made[1].dtype == target.dtype and _in_range(made[1])):
                break
            del k.lines[mark[0]:], k.args[mark[1]:]
            made = None
        if made is None:
            made = target.name, dataclasses.replace(target)
        k.emit(f"{name} = {made[0]}")
        arms.append(made[1])
        if k.chance(0.2) and made[1].shape:  # a store inside the arm (the other arm's
            k.features.add("store_in_branch")  # output keeps its sentinel)
            from tests.tritongen.outputs import _store  # (outputs grows values: a cycle)
            _store(k, dataclasses.replace(made[1], name=name), reload=False)
        k.pool = saved  # what an arm defines is gone after the if
        k.indent -= 1
    a, b = arms
    k.features.add("branch")
    return name, Val("", target.shape, target.dtype, min(a.lo, b.lo), max(a.hi, b.hi),
                     max(a.err, b.err), a.exact and b.exact, a.intval and b.intval)


def _op_reduce(k: _Kernel, *, prefer: Val | None = None) -> tuple[str, Val] | None:
    """tl.sum / max / min / argmax / argmin along an axis of a tile."""
    v = prefer or _choose(k, lambda v: _numeric(v) and bool(v.shape))
    if v is None:
        return None
    op = k.pick(("sum", "sum", "max", "min", "argmax", "argmin"))
    if op.startswith("arg") and not v.exact:  # a near tie would flip the index
        op = "max"
    if len(v.shape) == 2 and not op.startswith("arg") and k.chance(0.15):
        n, rest = k.block["R"] * k.block["C"], ()  # the whole tile to a scalar
        call = f"tl.{op}({v.name})"
    else:
        axis_name = k.pick(v.shape)
        axis = v.shape.index(axis_name)
        n = k.block[axis_name]
        rest = tuple(a for a in v.shape if a != axis_name)
        call = f"tl.{op}({v.name}, axis={axis})"
    k.features.add(op)
    if op.startswith("arg"):
        return call, Val("", rest, "i32", 0, n - 1, intval=True)
    if v.dtype == "i32" and op == "sum" and not rest and k.chance(0.5):
        pass  # (an integer sum of the whole tile: as below)
    if op in ("max", "min"):
        return call, Val("", rest, v.dtype, v.lo, v.hi, v.err, v.exact, v.intval)
    lo, hi = n * v.lo, n * v.hi
    mag = max(abs(lo), abs(hi))
    if v.dtype == "i32" or (v.intval and mag < INT_CAP):
        if v.dtype == "i32" and mag >= 2 ** 30:
            return None
        return call, Val("", rest, v.dtype, lo, hi, intval=True)
    # summation order is open (rounding depends on it): n roundings of partial sums
    err = n * v.err + n * U * n * v.mag
    return call, Val("", rest, "f32", lo, hi, err, exact=False)


def _op_cumsum(k: _Kernel) -> tuple[str, Val] | None:
    v = _choose(k, lambda v: _numeric(v) and bool(v.shape))
    if v is None:
        return None
    axis_name = k.pick(v.shape)
    n = k.block[axis_name]
    k.features.add("cumsum")
    lo, hi = min(0.0, n * v.lo), max(0.0, n * v.hi)
    lo, hi = min(lo, v.lo), max(hi, v.hi)
    mag = max(abs(lo), abs(hi))
    if v.dtype == "i32" and mag >= 2 ** 30:
        return None
    reverse = ", reverse=True" if k.chance(0.3) else ""
    call = f"tl.cumsum({v.name}, axis={v.shape.index(axis_name)}{reverse})"
    if v.dtype == "i32" or (v.intval and mag < INT_CAP):
        return call, Val("", v.shape, v.dtype, lo, hi, intval=True)
    return call, Val("", v.shape, "f32", lo, hi, n * v.err + n * U * n * v.mag, False)


def _local_index(k: _Kernel, axis_name: str, shape: tuple[str, ...]) -> str:
    """A permutation-ish index in [0, block) along axis_name, shaped as `shape`."""
    if "R" not in k.block:
        block = "BLOCK"
    else:
        block = "BLOCK_M" if axis_name == "R" else "BLOCK_N"
    step, shift = int(k.rng.integers(1, 8)), int(k.rng.integers(0, 5))
    index = f"((tl.arange(0, {block}) * {step} + {shift}) % {block})"
    if len(shape) == 2:
        index = f"{index}[:, None]" if axis_name == "R" else f"{index}[None, :]"
        index = f"tl.broadcast_to({index}, (BLOCK_M, BLOCK_N))"
    return index


def _op_shuffle(k: _Kernel) -> tuple[str, Val] | None:
    """Values moved around inside the tile, exactly: tl.gather along an axis, tl.flip,
    tl.sort, and tl.join with a reduction or tl.split over the new axis."""
    v = _choose(k, lambda v: _numeric(v) and bool(v.shape))
    if v is None:
        return None
    if "attention" in k.features or "alias" in k.features:
        return None  # (their blocks are not named BLOCK_M / BLOCK_N)
    op = k.pick(("gather", "flip", "sort", "join_sum", "join_max", "split", "reshape"))
    axis_name = k.pick(v.shape)
    if op in ("flip", "sort") and min(k.block[a] for a in v.shape) < 2:
        return None  # (Triton's flip and sort reshape into halves: one lane is refused)
    axis = v.shape.index(axis_name)
    same = dataclasses.replace(v, name="", fusable=False)
    k.features.add(op)
    if op == "gather":
        return f"tl.gather({v.name}, {_local_index(k, axis_name, v.shape)}, {axis})", same
    if op == "flip":
        return f"tl.flip({v.name}, {axis})", same
    if op == "reshape":  # to one dimension and back: the same tile
        if len(v.shape) != 2:
            return None
        return (f"tl.reshape(tl.reshape({v.name}, (BLOCK_M * BLOCK_N,)), (BLOCK_M, BLOCK_N))",
                same)
    if op == "sort":  # (along the last axis only: Triton sorts the minor dimension)
        elements = int(np.prod([k.block[a] for a in v.shape]))
        if k.block[v.shape[-1]] > 64 or elements * max(k.gm * k.gn, *k.grid) > 20000:
            return None  # the interpreter's sorting network is slow
        descending = ", descending=True" if k.chance(0.5) else ""
        return f"tl.sort({v.name}, {len(v.shape) - 1}{descending})", same
    b = _choose(k, lambda w: w.shape == v.shape and w.dtype == v.dtype, recent=False)
    new_axis = len(v.shape)
    if op == "split":
        return f"tl.split(tl.join({v.name}, {b.name}))[1]", dataclasses.replace(b, name="")
    if op == "join_max":
        return (f"tl.max(tl.join({v.name}, {b.name}), axis={new_axis})",
                Val("", v.shape, v.dtype, max(v.lo, b.lo), max(v.hi, b.hi), max(v.err, b.err),
                    v.exact and b.exact, v.intval and b.intval))
    made = _arith(k, "+", v, b)
    if made is None:
        return None
    return f"tl.sum(tl.join({v.name}, {b.name}), axis={new_axis})", made[1]


def _op_fmod(k: _Kernel) -> tuple[str, Val] | None:
    """`%` on floats: C's fmod (exact: the remainder is representable)."""
    a = _choose(k, lambda v: v.dtype == "f32")
    b = _choose(k, lambda v: v.dtype == "f32" and v.lo >= 0.5, recent=False)
    if a is None:
        return None
    if b is None:
        c = k.pick((0.75, 1.5, 2.0, 3.0))
        b = Val(_lit(c), (), "f32", c, c, intval=float(c).is_integer())
    shape = _union(a.shape, b.shape)
    if not (a.exact and b.exact):  # near a multiple of b an error flips the remainder
        return None
    lo, hi = (-b.hi if a.lo < 0 else 0.0), (b.hi if a.hi > 0 else 0.0)
    return (f"{_bcast(a, shape)} % {_bcast(b, shape)}",
            Val("", shape, "f32", lo, hi, 0.0, True, a.intval and b.intval))


def _op_combine(k: _Kernel) -> tuple[str, Val] | None:
    """tl.reduce / tl.associative_scan with a combine function of the module's (1-D tiles
    only: the interpreter runs these a combine call per element)."""
    v = _choose(k, lambda v: _numeric(v) and len(v.shape) == 1)
    if v is None or k.block[v.shape[0]] > 128:
        return None
    helper = k.pick(tuple(COMBINE_HELPERS))
    n = k.block[v.shape[0]]
    scan = k.chance(0.4)
    if scan:
        reverse = ", reverse=True" if k.chance(0.3) else ""
        call, shape = f"tl.associative_scan({v.name}, 0, {helper}{reverse})", v.shape
    else:
        call, shape = f"tl.reduce({v.name}, 0, {helper})", ()
    k.helpers.add(helper)
    k.features.add("combine_scan" if scan else "combine_reduce")
    if helper == "combine_add":
        lo, hi = min(v.lo, n * v.lo), max(v.hi, n * v.hi)
        mag = max(abs(lo), abs(hi))
        if v.dtype == "i32" and mag >= 2 ** 30:
            return None
        if v.dtype == "i32" or (v.intval and mag < INT_CAP):
            return call, Val("", shape, v.dtype, lo, hi, intval=True)
        return call, Val("", shape, "f32", lo, hi, n * v.err + n * U * n * v.mag, False)
    if helper == "combine_max":
        return call, Val("", shape, v.dtype, v.lo, v.hi, v.err, v.exact, v.intval)
    # max of |.|; a scan's first element is left as it is (not its absolute value)
    return call, Val("", shape, v.dtype, min(v.lo, 0.0), v.mag, v.err, v.exact, v.intval)


def _op_normalize(k: _Kernel) -> tuple[str, Val] | None:
    """softmax-like: a tile minus its own max / min / sum along an axis, or over its
    (positive) sum, the reduction broadcast back."""
    v = _choose(k, lambda v: v.dtype == "f32" and bool(v.shape))
    if v is None:
        return None
    if len(v.shape) == 2 and k.chance(0.3):  # keep_dims: no [:, None] needed
        axis = int(k.rng.integers(0, 2))
        op = k.pick(("max", "min"))
        r = k.fresh("r")
        k.emit(f"{r} = tl.{op}({v.name}, axis={axis}, keep_dims=True)")
        k.features.add("keep_dims")
        lo, hi = (v.lo - v.hi, 0.0) if op == "max" else (0.0, v.hi - v.lo)
        exact = v.exact and not v.fusable
        err = 0.0 if exact else 2 * v.err + 4 * U * v.mag
        return f"{v.name} - {r}", Val("", v.shape, "f32", lo, hi, err, exact, v.intval)
    red = _op_reduce(k, prefer=v)
    if red is None or red[1].dtype != v.dtype or red[1].mag > MAG_CAP:
        return None
    r = k.define("r", *red)
    k.features.add("broadcast_back")
    if red[0].startswith("tl.sum") and r.lo >= 0.5:
        mag = v.mag / r.lo
        err = v.err / r.lo + mag * r.err / r.lo + 4 * U * mag
        return (f"{v.name} / {_bcast(r, v.shape)}",
                Val("", v.shape, "f32", -mag, mag, err, exact=False))
    made = _arith(k, "-", v, r)
    if made is None:
        return None
    text, out = made
    if red[0].startswith("tl.max"):
        out.hi = min(out.hi, 0.0)  # x - max(x) <= 0: exp of it never overflows
    elif red[0].startswith("tl.min"):
        out.lo = max(out.lo, 0.0)
    return text, out


OPS = {
    "arith": (_op_arith, 6), "scalar": (_op_scalar, 2), "div": (_op_div, 2),
    "unary": (_op_unary, 5), "minmax": (_op_minmax, 2), "where": (_op_where, 2),
    "cast": (_op_cast, 1.5), "intdiv": (_op_intdiv, 1), "reduce": (_op_reduce, 1.5),
    "cumsum": (_op_cumsum, 0.4), "normalize": (_op_normalize, 1),
    "math": (_op_math, 1.5), "bits": (_op_bits, 0.7), "trans": (_op_trans, 0.5),
    "branch": (_op_branch, 0.6), "shuffle": (_op_shuffle, 1), "fmod": (_op_fmod, 0.5),
    "combine": (_op_combine, 0.4),
}


def _in_range(v: Val) -> bool:
    """Floats stay small (errors and exp() in range); integers stay in int32."""
    return math.isfinite(v.mag) and v.mag <= (MAG_CAP if v.dtype == "f32" else 2 ** 31 - 1)


def grow(k: _Kernel, n_ops: int, *, allow: tuple[str, ...] = tuple(OPS)) -> None:
    """Adds n_ops values computed from the pool."""
    names = [n for n in OPS if n in allow]
    weights = np.array([OPS[n][1] for n in names], dtype=float)
    for _ in range(n_ops):
        for _attempt in range(30):
            name = names[int(k.rng.choice(len(names), p=weights / weights.sum()))]
            mark = len(k.lines), len(k.pool), len(k.args), set(k.features)
            made = OPS[name][0](k)
            if made is None or not _in_range(made[1]):
                # undo what the rule emitted on the way (an argument, a reduction)
                del k.lines[mark[0]:], k.pool[mark[1]:], k.args[mark[2]:]
                k.features = mark[3]
                continue
            k.features.add(name)
            k.define("v", *made)
            break
