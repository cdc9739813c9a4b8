"""The kernel families built around loops: rowloop, matmul, attention, alias."""

from __future__ import annotations

import math

import numpy as np

from tests.tritongen.expressions import _choose, _in_range, _numeric, grow
from tests.tritongen.families import _chunk_indices, _load_tile, _load_vector, _tile_setup
from tests.tritongen.outputs import _atomic, _store_results
from tests.tritongen.values import (
    DOMAINS,
    INT_CAP,
    U,
    Val,
    _f32,
    _Kernel,
    _lit,
    _load,
    _matrix,
    _other_for,
    _output,
    _tolerate,
)


def _family_rowloop(k: _Kernel) -> None:
    """Rows in blocks, the columns in a loop over chunks carrying accumulators (sum, max,
    min); the accumulators reduced along the row; then, often, a second loop over the
    chunks using those statistics (softmax and layer norm have this shape)."""
    rng = k.rng
    m, n = int(rng.integers(1, 120)), int(rng.integers(1, 301))
    bm, bn = int(k.pick((1, 2, 4, 8, 16))), int(k.pick((16, 32, 64, 128)))
    if k.chance(0.15):  # long rows in wide chunks
        m, n, bm, bn = int(rng.integers(1, 12)), int(rng.integers(300, 2500)), 1, 512
        k.features.add("long_rows")
    k.block = {"R": bm, "C": bn}
    k.gm = -(-m // bm) + (1 if k.chance(0.15) else 0)
    k.grid = (k.gm,)
    k.constexpr("BLOCK_M", bm)
    k.constexpr("BLOCK_N", bn)
    m_arg, n_arg = k.size_arg("M", m), k.size_arg("N", n)
    k.emit("pid_m = tl.program_id(0)")
    k.emit("pid_n = 0  # one program per block of rows: the per-row outputs' column")
    k.emit("num_pid_n = 1")
    k.emit("rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    k.emit(f"rmask = rows < {m_arg}")
    k.pool.append(Val("rows", ("R",), "i32", 0, k.gm * bm - 1, intval=True))
    k.features.add("loop")
    domain = k.pick(("normal", "positive", "intval", "half"))
    other = _other_for(k, domain)
    x_ptr, sr, sc = _matrix(k, m, n, domain, prefix="x")
    x_address = f"{x_ptr} + rows[:, None] * {sr} + cols[None, :] * {sc}"
    if k.chance(0.4):  # a loop-invariant row vector read in the body
        _load_vector(k, m, "R")
    outside = list(k.pool)
    fills = {"sum": 0.0, "max": -1000.0, "min": 1000.0, "rowsum": 0.0, "rowmax": -1000.0}
    accumulators = []
    for _ in range(int(rng.integers(1, 3))):
        # a tile per chunk, reduced after the loop, or a row vector of the chunks' reductions
        kind = k.pick(("sum", "sum", "max", "min", "rowsum", "rowmax", "total"))
        name = k.fresh("acc")
        if kind == "total":  # a scalar carried through the loop, from a Python float
            k.emit(f"{name} = 0.0")
            accumulators.append((name, kind))
            continue
        shape = "(BLOCK_M,)" if kind.startswith("row") else "(BLOCK_M, BLOCK_N)"
        k.emit(f"{name} = tl.full({shape}, {_lit(fills[kind])}, tl.float32)")
        accumulators.append((name, kind))
    forms = ["range", "range", "tl.range", "while", "pointers"]
    if ("N", "constexpr", n) in k.args and -(-n // bn) <= 8:
        forms.append("static_range")  # unrolled by Triton: N is known
    form = k.pick(forms)
    k.features.add(f"loop_{form}")
    if form == "static_range":
        k.emit(f"for start in tl.static_range(0, {n_arg}, BLOCK_N):")
    elif form == "while":
        k.emit("start = 0")
        k.emit(f"while start < {n_arg}:")
    elif form == "tl.range":
        k.emit(f"for start in tl.range(0, {n_arg}, BLOCK_N, num_stages={int(rng.integers(1, 4))}):")
    elif form == "pointers":  # a pointer tile carried through the loop, advanced each trip
        k.emit(f"x_ptrs = {x_ptr} + rows[:, None] * {sr} + tl.arange(0, BLOCK_N)[None, :] * {sc}")
        k.emit(f"for start in range(0, {n_arg}, BLOCK_N):")
    else:
        k.emit(f"for start in range(0, {n_arg}, BLOCK_N):")
    k.indent += 1
    _chunk_indices(k, n_arg)
    address = "x_ptrs" if form == "pointers" else x_address
    x = _load(k, "x", address, "mask", domain, ("R", "C"), other)
    if form == "pointers":
        k.emit(f"x_ptrs += BLOCK_N * {sc}")
    k.pool.append(Val("cols", ("C",), "i32", 0, n + bn - 1, intval=True))
    grow(k, int(rng.integers(1, 5)), allow=("arith", "scalar", "unary", "minmax", "where",
                                             "div", "cast", "branch"))
    if k.chance(0.15):  # atomics in the loop: every chunk's elements once
        v = _choose(k, lambda v: _numeric(v) and v.shape == ("R", "C"))
        if v is not None:
            _atomic(k, v)
            k.features.add("atomic_in_loop")
    updates = []
    for name, kind in accumulators:
        v = _choose(k, lambda v: v.dtype == "f32" and v.shape == ("R", "C")) or x
        if kind == "sum" and k.chance(0.3):  # masked lanes (reading `other`) count too
            k.emit(f"{name} += {v.name}")
        elif kind == "sum":
            k.emit(f"{name} += tl.where(mask, {v.name}, 0.0)")
        elif kind == "rowsum":
            k.emit(f"{name} += tl.sum(tl.where(mask, {v.name}, 0.0), axis=1)")
        elif kind == "total":
            k.emit(f"{name} += tl.sum(tl.where(mask, {v.name}, 0.0))")
        elif kind == "rowmax":
            k.emit(f"{name} = tl.maximum({name}, tl.max(tl.where(mask, {v.name}, -1000.0), "
                   f"axis=1))")
        else:
            k.emit(f"{name} = tl.{'maximum' if kind == 'max' else 'minimum'}"
                   f"({name}, tl.where(mask, {v.name}, {_lit(fills[kind])}))")
        updates.append((name, kind, v))
        k.features.add(f"acc_{kind}")
    if form == "while":
        k.emit("start += BLOCK_N")
    k.indent -= 1
    k.pool = outside
    trips = -(-n // bn)
    for name, kind, v in updates:
        if kind == "total":
            terms = trips * bn * bm
            lo, hi = terms * min(0.0, v.lo), terms * max(0.0, v.hi)
            intval = v.intval and max(abs(lo), abs(hi)) < INT_CAP
            err = 0.0 if intval else terms * v.err + terms * U * terms * v.mag
            k.pool.append(Val(name, (), "f32", lo, hi, err, intval, intval))
            continue
        if kind.startswith("row"):  # already one value per row
            if kind == "rowmax":
                lo, hi, terms = min(v.lo, -1000.0), max(v.hi, -1000.0), 1
            else:
                terms = trips * bn
                lo, hi = terms * min(0.0, v.lo), terms * max(0.0, v.hi)
            intval = v.intval and max(abs(lo), abs(hi)) < INT_CAP
            exact = v.exact and (kind == "rowmax" or intval)
            err = 0.0 if exact else terms * v.err + terms * U * terms * v.mag
            k.pool.append(Val(name, ("R",), "f32", lo, hi, err, exact, intval))
            continue
        # one lane of the accumulator: `trips` values, or its fill if none was kept
        if kind == "sum":
            lo, hi = trips * min(0.0, v.lo), trips * max(0.0, v.hi)
        else:
            lo, hi = min(v.lo, fills[kind]), max(v.hi, fills[kind])
        axis_op = k.pick(("sum", "sum", "max", "min")) if kind == "sum" else kind
        terms = trips * (bn if axis_op == "sum" else 1) if kind == "sum" else 1
        if axis_op == "sum":
            lo, hi = lo * bn, hi * bn
        mag = max(abs(lo), abs(hi))
        intval = v.intval and mag < INT_CAP
        exact = v.exact and (kind != "sum" or intval)
        err = 0.0 if exact else terms * v.err + terms * U * terms * v.mag
        k.define("stat", f"tl.{axis_op}({name}, axis=1)",
                 Val("", ("R",), "f32", lo, hi, err, exact, intval))
    if k.chance(0.6):
        _second_pass(k, m, n, n_arg, x_address, domain, other)
    _store_results(k, only_shapes=((), ("R",)))


def _second_pass(k: _Kernel, m: int, n: int, n_arg: str, x_address: str, domain: str,
                 other: float) -> None:
    """A loop over the chunks again, computing from the statistics, storing each chunk."""
    k.features.add("second_pass")
    out = _output(k, m * n, "f32", "second pass (M x N)")
    saved = list(k.pool)
    k.pool = [v for v in k.pool if _in_range(v)]
    k.emit(f"for start in range(0, {n_arg}, BLOCK_N):")
    k.indent += 1
    _chunk_indices(k, n_arg)
    x = _load(k, "x", x_address, "mask", domain, ("R", "C"), other)
    grow(k, int(k.rng.integers(2, 6)), allow=("arith", "scalar", "unary", "minmax", "where",
                                               "div"))
    final = _choose(k, lambda v: v.dtype == "f32" and v.shape == ("R", "C")) or x
    k.emit(f"tl.store({out} + rows[:, None] * {n_arg} + cols[None, :], {final.name}, "
           f"mask=mask)")
    _tolerate(k, out, final)
    k.indent -= 1
    k.pool = saved


def _family_matmul(k: _Kernel) -> None:
    """A K loop of f32 dots (ieee precision) into an accumulator, then an epilogue. The
    operands' rows and columns masked or, as in the tutorial, wrapped (`% M`) with only the
    store masked; b loaded as it lies or transposed and `tl.trans`-ed; K = 0 now and then
    (no trips); the accumulator rescaled in the dot now and then."""
    rng = k.rng
    m, n = int(rng.integers(1, 200)), int(rng.integers(1, 200))
    kk = 0 if k.chance(0.05) else int(rng.integers(1, 200))
    bm, bn, bk = int(k.pick((16, 32, 64))), int(k.pick((16, 32, 64))), int(k.pick((16, 32)))
    k.constexpr("BLOCK_K", bk)
    _tile_setup(k, m, n, bm, bn)
    k_arg = k.size_arg("K", kk)
    # integer-valued operands make the dot exact whatever the order of its sums; int8 dots
    # accumulate in int32, f16 ones in f32
    domain = k.pick(("normal", "intval", "intval", "i8", "halfint"))
    integer = domain == "i8"
    zero = "0" if integer else "0.0"
    k.features.add(f"dot_{domain}")
    a_ptr, sam, sak = _matrix(k, m, kk, domain, prefix="a")
    b_ptr, sbk, sbn = _matrix(k, kk, n, domain, prefix="b")
    operand_mag = DOMAINS[domain][2]
    k.features.add("dot")
    if k.chance(0.3):  # the tutorial's offsets: wrapped, so the loads need no row mask
        k.features.add("wrapped_offsets")
        k.emit(f"rows_a = rows % {k.m_arg}")
        k.emit(f"cols_b = cols % {k.n_arg}")
        a_rows, b_cols, a_rmask, b_cmask = "rows_a", "cols_b", "", ""
    else:
        a_rows, b_cols, a_rmask, b_cmask = "rows", "cols", "rmask[:, None] & ", " & cmask[None, :]"
    init = Val("", ("R", "C"), "i32" if integer else "f32", 0.0, 0.0, intval=True)
    if k.chance(0.3):  # a loaded initial accumulator
        init_domain = {"i8": "int", "normal": "normal"}.get(domain, "intval")
        init = _load_tile(k, m, n, init_domain, prefix="c")
        k.pool.remove(init)
        k.emit(f"acc = {init.name}")
        k.features.add("acc_init")
    else:
        acc_type = "int32" if integer else "float32"
        k.emit(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.{acc_type})")
    transposed_b = k.chance(0.2)  # b read as a BLOCK_N x BLOCK_K tile, then tl.trans
    advancing = k.chance(0.5)
    b_index = (f"{b_cols}[:, None] * {sbn} + ks[None, :] * {sbk}" if transposed_b
               else f"ks[:, None] * {sbk} + {b_cols}[None, :] * {sbn}")
    if advancing:  # the tutorial's style: pointer tiles advanced each trip
        k.features.add("advancing_pointers")
        k.emit("ks = tl.arange(0, BLOCK_K)")
        k.emit(f"a_ptrs = {a_ptr} + {a_rows}[:, None] * {sam} + ks[None, :] * {sak}")
        k.emit(f"b_ptrs = {b_ptr} + {b_index}")
    start, stop = "0", k_arg
    if k.chance(0.2):  # trip counts that differ between programs (B's panels are cached)
        start, stop = k.pick((("0", f"{k_arg} - (pid_m % 2) * BLOCK_K"),
                              ("(pid_n % 2) * BLOCK_K", k_arg)))
        k.features.add("dot_program_trips")
    k.emit(f"for k in range({start}, {stop}, BLOCK_K):")
    k.indent += 1
    if advancing:
        k.emit(f"kmask = (k + ks) < {k_arg}")
        a_addr, b_addr = "a_ptrs", "b_ptrs"
        a_k, b_k = "kmask[None, :]", ("kmask[None, :]" if transposed_b else "kmask[:, None]")
    else:
        k.emit("ks = k + tl.arange(0, BLOCK_K)")
        a_addr = f"{a_ptr} + {a_rows}[:, None] * {sam} + ks[None, :] * {sak}"
        b_addr = f"{b_ptr} + {b_index}"
        a_k = f"(ks[None, :] < {k_arg})"
        b_k = f"(ks[None, :] < {k_arg})" if transposed_b else f"(ks[:, None] < {k_arg})"
    if transposed_b:
        b_mask = f"cmask[:, None] & {b_k}" if b_cmask else b_k
    else:
        b_mask = f"{b_k}{b_cmask}"
    k.emit(f"a = tl.load({a_addr}, mask={a_rmask}{a_k}, other={zero})")
    k.emit(f"b = tl.load({b_addr}, mask={b_mask}, other={zero})")
    if transposed_b:
        k.emit("b = tl.trans(b)")
        k.features.add("dot_trans_b")
    scale = 1.0
    transforms = ["none", "none", "abs", "where", "relu"]
    if not integer:  # (int8 products would wrap)
        transforms += ["scale", "program"]
    transform = k.pick(transforms)
    operand_type = {"i8": "int8", "halfint": "float16"}.get(domain, "float32")
    if transform == "scale":
        k.emit("a = a * 2.0")
        scale = 2.0
    elif transform == "program":  # b's values depend on the program, not only its columns
        k.emit(f"b = b * (pid_m % 3 + 1).to(tl.{operand_type})")
        scale = 3.0
    elif transform == "abs":
        k.emit("b = tl.abs(b)")
    elif transform == "where":
        k.emit(f"a = tl.where(a > {zero}, a, -a)")
    elif transform == "relu":
        k.emit(f"b = tl.maximum(b, {zero})")
    if transform != "none":
        k.features.add(f"dot_operand_{transform}")
    # ieee: exact f32 products; the default (tf32, or bf16x3 on AMX) is exact for small
    # integers too
    precision = ""
    if not integer:
        precision = ', input_precision="ieee"'
        if domain != "normal" and k.chance(0.4):
            precision = ""
            k.features.add("dot_default_precision")
    rescaled = not integer and k.chance(0.15)
    if rescaled:  # the old accumulator scaled as it enters the dot: halves, not integers
        k.emit(f"acc = tl.dot(a, b, acc * 0.5{precision})")
        k.features.add("dot_acc_rescaled")
    elif k.chance(0.5):
        k.emit(f"acc += tl.dot(a, b{precision})")
    else:
        k.emit(f"acc = tl.dot(a, b, acc{precision})")
        k.features.add("dot_acc")
    if advancing:
        k.emit(f"a_ptrs += BLOCK_K * {sak}")
        k.emit(f"b_ptrs += BLOCK_K * {sbk}")
    k.indent -= 1
    terms = -(-kk // bk) * bk
    mag = terms * scale * operand_mag ** 2 + init.mag
    if integer:
        k.pool.append(Val("acc", ("R", "C"), "i32", -mag, mag, intval=True))
    else:
        intval = domain != "normal" and init.intval and mag < INT_CAP and not rescaled
        err = 0.0 if intval else 2 * terms * U * mag
        k.pool.append(Val("acc", ("R", "C"), "f32", -mag, mag, err, intval, intval))
    if mag > 256 and not integer:  # scaled down (a power of two: exact): epilogue in bounds
        factor = 2.0 ** -math.ceil(math.log2(mag / 16))
        k.define("acc", f"acc * {_lit(factor)}",
                 Val("", ("R", "C"), "f32", -mag * factor, mag * factor, err * factor,
                     intval, False))
    if k.chance(0.5):
        _load_vector(k, n, "C")
    grow(k, int(rng.integers(0, 5)))
    _store_results(k)


def _family_attention(k: _Kernel) -> None:
    """Flash attention's forward loop: S = Q K^T, an online softmax (running max and sum,
    the accumulator rescaled each block), P V into the accumulator; causal or not."""
    rng = k.rng
    m, n = int(rng.integers(1, 160)), int(rng.integers(1, 160))
    d = int(k.pick((16, 32, 64)))
    bm, bn = int(k.pick((16, 32, 64))), int(k.pick((16, 32, 64)))
    causal = k.chance(0.4)
    k.block = {"R": bm, "C": d}
    k.gm = -(-m // bm)
    k.grid = (k.gm,)
    k.constexpr("BLOCK_M", bm)
    k.constexpr("BLOCK_N", bn)
    k.constexpr("HEAD_D", d)
    m_arg, n_arg = k.size_arg("M", m), k.size_arg("N", n)
    q_ptr, sqm, sqd = _matrix(k, m, d, "normal", prefix="q")
    k_ptr, skn, skd = _matrix(k, n, d, "normal", prefix="k")
    v_ptr, svn, svd = _matrix(k, n, d, "normal", prefix="v")
    scale = _f32(1 / math.sqrt(d))
    k.features.update({"attention", "dot"} | ({"causal"} if causal else set()))
    k.emit("pid_m = tl.program_id(0)")
    k.emit("rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    k.emit("dcols = tl.arange(0, HEAD_D)")
    k.emit(f"rmask = rows < {m_arg}")
    k.emit(f"q = tl.load({q_ptr} + rows[:, None] * {sqm} + dcols[None, :] * {sqd}, "
           f"mask=rmask[:, None], other=0.0)")
    k.emit('m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)')
    k.emit("l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)")
    k.emit("acc = tl.zeros((BLOCK_M, HEAD_D), dtype=tl.float32)")
    # keys past the causal diagonal never count: the loop may stop at the block's last row
    end = f"tl.minimum({n_arg}, (pid_m + 1) * BLOCK_M)" if causal and k.chance(0.5) else n_arg
    k.emit(f"for start in range(0, {end}, BLOCK_N):")
    k.indent += 1
    k.emit("cols = start + tl.arange(0, BLOCK_N)")
    k.emit(f"cmask = cols < {n_arg}")
    if k.chance(0.5):  # K^T read directly: a transposed load
        k.emit(f"kt = tl.load({k_ptr} + cols[None, :] * {skn} + dcols[:, None] * {skd}, "
               f"mask=cmask[None, :], other=0.0)")
    else:
        k.emit(f"kt = tl.trans(tl.load({k_ptr} + cols[:, None] * {skn} + dcols[None, :] * "
               f"{skd}, mask=cmask[:, None], other=0.0))")
    k.emit(f's = tl.dot(q, kt, input_precision="ieee") * {_lit(scale)}')
    valid = "cmask[None, :]"
    if causal:
        valid += " & (rows[:, None] >= cols[None, :])"
    k.emit(f's = tl.where({valid}, s, float("-inf"))')
    k.emit("m_new = tl.maximum(m_i, tl.max(s, axis=1))")
    if k.chance(0.5):
        k.emit("p = tl.exp(s - m_new[:, None])")
        k.emit("alpha = tl.exp(m_i - m_new)")
    else:  # the tutorial's exp2 form
        k.features.add("exp2")
        k.emit("p = tl.exp2((s - m_new[:, None]) * 1.4426950408889634)")
        k.emit("alpha = tl.exp2((m_i - m_new) * 1.4426950408889634)")
    k.emit("l_i = l_i * alpha + tl.sum(p, axis=1)")
    k.emit(f"v = tl.load({v_ptr} + cols[:, None] * {svn} + dcols[None, :] * {svd}, "
           f"mask=cmask[:, None], other=0.0)")
    if k.chance(0.5):
        k.emit('acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")')
    else:
        k.emit("acc = acc * alpha[:, None]")
        k.emit('acc += tl.dot(p, v, input_precision="ieee")')
    k.emit("m_i = m_new")
    k.indent -= 1
    out = _output(k, m * d, "f32", "attention output (M x D)")
    k.emit(f"tl.store({out} + rows[:, None] * {d} + dcols[None, :], acc / l_i[:, None], "
           f"mask=rmask[:, None])")
    # a weighted mean of V's rows (|v| <= 2): the weights' rounding (exp, the dots' sums)
    # moves it by a few ulp of the scores and of the sums
    k.tensors[out].exact, k.tensors[out].atol, k.tensors[out].rtol = False, 2e-5 * d / 16, 1e-5
    sums = _output(k, m, "f32", "softmax denominators (M)")
    k.emit(f"tl.store({sums} + rows, l_i, mask=rmask)")
    k.tensors[sums].exact, k.tensors[sums].rtol, k.tensors[sums].atol = False, 5e-5, 1e-6


def _family_alias(k: _Kernel) -> None:
    """One program per row of X, which it reads, stores into shifted (overlapping what it
    read), reads again, and reads through a second argument that is a view of the same
    storage: memory order within a program, on overlapping addresses."""
    rng = k.rng
    m, n = int(rng.integers(1, 40)), int(rng.integers(1, 300))
    block = max(16, 1 << (n - 1).bit_length())
    k.block = {"C": block}
    k.grid = (m,)
    k.sizes["N"] = m * n  # elementwise outputs are M x N, at `offs`
    k.constexpr("BLOCK", block)
    n_arg = k.int_arg("N", n)
    row_stride = n + int(rng.integers(0, 3))
    storage = k.values("normal", (m - 1) * row_stride + n)
    x_ptr = k.tensor_arg("x", storage)
    k.tensors[x_ptr].output, k.tensors[x_ptr].what = True, "input stored into, shifted"
    k.features.add("alias")
    k.emit("pid = tl.program_id(0)")
    k.emit("cols = tl.arange(0, BLOCK)")
    k.emit(f"mask = cols < {n_arg}")
    k.emit(f"offs = pid * {n_arg} + cols")
    k.emit(f"row = {x_ptr} + pid * {k.int_arg('stride', row_stride)}")
    if k.chance(0.35):
        _alias_chunks(k, n_arg)
    k.pool.append(Val("cols", ("C",), "i32", 0, block - 1, intval=True))
    x = _load(k, "x", "row + cols", "mask", "normal", ("C",))
    if "alias_chunks" in k.features:  # the row now holds sigmoids and fmas: a few ulp off
        x.exact, x.err = False, 2e-6
    grow(k, int(rng.integers(1, 4)), allow=("arith", "scalar", "unary", "minmax", "where"))
    stored = []
    for _ in range(int(rng.integers(1, 3))):
        v = _choose(k, lambda v: v.dtype == "f32" and v.shape == ("C",))
        shift = int(rng.integers(-3, 4))
        if k.chance(0.25):  # reversed: every element moves
            k.emit(f"tl.store(row + ({n_arg} - 1 - cols), {v.name}, mask=mask)")
            k.features.add("alias_reversed")
        else:
            k.emit(f"tl.store(row + cols + {shift}, {v.name}, "
                   f"mask=(cols + {shift} >= 0) & (cols + {shift} < {n_arg}))")
            k.features.add("alias_shifted")
        stored.append(v)
        # what the row holds now: any of the values stored or the input
        lo = min([-2.0] + [s.lo for s in stored])
        hi = max([2.0] + [s.hi for s in stored])
        err = max(s.err for s in stored)
        exact = all(s.exact for s in stored)
        other = k.pick((0.0, 1.0))
        if k.chance(0.5):
            k.define("y", f"tl.load(row + cols, mask=mask, other={_lit(other)})",
                     Val("", ("C",), "f32", min(lo, other), max(hi, other), err, exact))
        else:  # through another argument: the same storage, `delta` elements on
            delta = int(rng.integers(0, 3))
            view = k.tensor_arg("view", np.zeros(1, np.float32), offset=0)
            k.tensors[view].view_of, k.tensors[view].offset = x_ptr, k.tensors[x_ptr].offset
            k.features.add("alias_view")
            k.define("y", f"tl.load({view} + pid * stride + {delta} + cols, "
                          f"mask=cols + {delta} < {n_arg}, other={_lit(other)})",
                     Val("", ("C",), "f32", min(lo, other), max(hi, other), err, exact))
        grow(k, int(rng.integers(1, 3)), allow=("arith", "scalar", "unary", "minmax",
                                                 "where"))
    if "alias_chunks" in k.features:  # a few ulp from each trip's sigmoid or fma
        lo, hi, err, exact = min(lo, -2.0), max(hi, 2.0), err + 1e-6, False
    _tolerate(k, x_ptr, Val("", ("C",), "f32", lo, hi, err, exact))
    _store_results(k)


# maps of [-2, 2] into itself: applied again to what an earlier trip stored, they stay small
CHUNK_MAPS = ("-{x}", "tl.abs({x})", "{x} * 0.5 + 0.25", "tl.minimum({x}, 1.0)",
              "tl.sigmoid({x})", "tl.where({x} > 0.0, {x}, 0.5)")


def _alias_chunks(k: _Kernel, n_arg: str) -> None:
    """The row in chunks, each stored shifted into the row it is reading: a later trip
    reads what an earlier one stored (a shift right) or what it will overwrite (left)."""
    chunk = int(k.pick((16, 32, 64)))
    shift = int(k.pick((-3, -1, 1, 2, 5, 16)))
    k.features.add("alias_chunks")
    k.emit(f"for start in range(0, {n_arg}, {chunk}):")
    k.indent += 1
    k.emit(f"c = start + tl.arange(0, {chunk})")
    k.emit(f"xc = tl.load(row + c, mask=c < {n_arg}, other=0.0)")
    value = k.pick(CHUNK_MAPS).format(x="xc")
    k.emit(f"tl.store(row + c + {shift}, {value}, "
           f"mask=(c + {shift} >= 0) & (c + {shift} < {n_arg}))")
    k.indent -= 1
