"""Storing a kernel's results: masked stores (with holes), narrow dtypes, read-backs,
atomics, and the tolerance each output gets."""

from __future__ import annotations

import numpy as np

from tests.tritongen.expressions import _condition, _numeric, grow
from tests.tritongen.values import (
    INT_CAP,
    OUTPUT_DTYPES,
    U,
    Val,
    _descriptor,
    _Kernel,
    _lit,
    _output,
    _tolerate,
)

# ----------------------------------------------------------------------------- outputs


def _store_results(k: _Kernel, *, only_shapes=None) -> None:
    """Stores one to three values of the pool (always the newest), each to an output of its
    own indexed so that programs never overlap, or in place into an input only its program
    reads; now and then atomically adds one. A value read back from where it was stored
    feeds a second round."""
    reloaded = _store_round(k, only_shapes, reload=True)
    if reloaded:
        grow(k, int(k.rng.integers(1, 4)), allow=("arith", "scalar", "unary", "minmax",
                                                   "where", "math"))
        _store_round(k, only_shapes, reload=False)


def _store_round(k: _Kernel, only_shapes, *, reload: bool) -> bool:
    candidates = [v for v in k.pool if _numeric(v) and v.name not in ("offs", "pid")]
    if only_shapes is not None:
        candidates = [v for v in candidates if v.shape in only_shapes]
    if not candidates:
        return False
    chosen = [candidates[-1]]
    for v in candidates[-2::-1]:
        if len(chosen) < 3 and k.chance(0.3):
            chosen.append(v)
    reloaded = False
    for v in chosen:
        reloaded |= _store(k, v, reload=reload and not reloaded)
    if k.chance(0.25):
        # integers mostly: their sums agree exactly in any order (a float sum's tolerance
        # over thousands of adds could hide a lost one)
        exact_sums = [v for v in candidates if v.dtype == "i32" or (v.intval and v.exact)]
        _atomic(k, k.pick(exact_sums if exact_sums and k.chance(0.7) else candidates))
    return reloaded


def _store_mask_holes(k: _Kernel, v: Val) -> str:
    """Now and then `& cond` on a store's mask: a comparison of exact values shaped as v."""
    cond = _condition(k) if k.chance(0.25) and v.shape else None
    # (a scalar condition is left out: the interpreter cannot `&` it into a tile's mask)
    if cond is None or not cond[1] or not set(cond[1]) <= set(v.shape):
        return ""
    ctext, cshape = cond
    if cshape != v.shape:
        ctext = f"{ctext}[:, None]" if cshape == ("R",) else f"{ctext}[None, :]"
    k.features.add("store_holes")
    return f" & {ctext}"


def _store(k: _Kernel, v: Val, *, reload: bool) -> bool:
    """Stores v; returns whether it read the stored value back into the pool."""
    two_d = "R" in k.block
    holes = _store_mask_holes(k, v)
    in_place = [p for p in k.private if p[2] == v.dtype]
    if v.shape == (("R", "C") if two_d else ("C",)) and in_place and k.chance(0.2):
        # in place: the program's own elements of an input it has read
        ptr, offsets, _ = k.pick(in_place)
        k.private.remove((ptr, offsets, v.dtype))
        spec = k.tensors[ptr]
        spec.output, spec.what = True, "input stored into in place"
        address, mask = f"{ptr} + {offsets}", f"mask{holes}"
        k.emit(f"tl.store({address}, {v.name}, mask={mask})")
        k.features.add("in_place")
        _tolerate(k, ptr, v)
        return _reload(k, v, address, mask) if reload and k.chance(0.3) else False
    dtype = v.dtype
    if v.exact and v.shape and k.chance(0.06):  # a condition stored as bytes
        return _store_bool(k, v, holes)
    if k.chance(0.12):  # a narrow output, converted as it is stored
        dtype = k.pick(("i8", "i16")) if v.dtype == "i32" else k.pick(("f16", "f64"))
        if dtype == "f16" and v.mag > 60000:
            dtype = "f32"
    value = v.name if dtype == v.dtype else f"{v.name}.to(tl.{_TL_TYPES[dtype]})"
    if (v.shape == ("R", "C") and dtype == v.dtype and not holes and k.block["C"] >= 4
            and k.family in ("tile", "matmul") and k.chance(0.1)):
        m, n = k.sizes["M"], k.sizes["N"]
        np_dtype, sentinel = OUTPUT_DTYPES[dtype]
        ptr, desc = _descriptor(k, m, n, lambda size: np.full(max(size, 1), sentinel, np_dtype),
                                "out")
        spec = k.tensors[ptr]
        spec.output, spec.what = True, "tile stored through a descriptor"
        k.emit(f"{desc}.store([pid_m * BLOCK_M, pid_n * BLOCK_N], {v.name})")
        _tolerate(k, ptr, v)
        return False
    if v.shape == ("R", "C"):
        m, n = k.sizes["M"], k.sizes["N"]
        layout = k.pick(("row", "col"))
        sr, sc = (n, 1) if layout == "row" else (1, m)
        ptr = _output(k, m * n, dtype, f"tile (M x N), {layout} layout")
        address = f"{ptr} + rows[:, None] * {sr} + cols[None, :] * {sc}"
        mask = f"mask{holes}"
    elif v.shape == ("R",):
        m = k.sizes["M"]
        ptr = _output(k, m * k.gn, dtype, "per row (num_pid_n x M)")
        address, mask = f"{ptr} + pid_n * {m} + rows", f"rmask{holes}"
    elif v.shape == ("C",) and two_d:
        n = k.sizes["N"]
        ptr = _output(k, n * k.gm, dtype, "per column (num_pid_m x N)")
        address, mask = f"{ptr} + pid_m * {n} + cols", f"cmask{holes}"
    elif v.shape == ("C",):
        ptr = _output(k, k.sizes["N"], dtype, "elementwise (N)")
        address, mask = f"{ptr} + offs", f"mask{holes}"
    else:
        tiles = k.gm * k.gn if two_d else int(np.prod(k.grid))
        ptr = _output(k, tiles, dtype, "per program (tile)")
        linear = "pid_m * num_pid_n + pid_n" if two_d else "pid"
        address, mask = f"{ptr} + {linear}", None
    k.emit(f"tl.store({address}, {value}" + (f", mask={mask})" if mask else ")"))
    _tolerate(k, ptr, v)
    if dtype != v.dtype:
        k.features.add(f"store_{dtype}")
        spec = k.tensors[ptr]
        if dtype == "f16" and not spec.exact:  # rounding to 11 bits may go either way
            spec.rtol, spec.atol = 2.0 ** -10, spec.atol + 2.0 ** -24
        return False
    if reload and mask and k.chance(0.3):
        return _reload(k, v, address, mask)
    return False


def _store_bool(k: _Kernel, v: Val, holes: str) -> bool:
    threshold = _lit(0.5) if v.dtype == "f32" else "0"
    value = f"({v.name} > {threshold})"
    if v.shape == ("R", "C"):
        m, n = k.sizes["M"], k.sizes["N"]
        ptr = k.tensor_arg("out", np.ones(m * n, np.bool_), output=True, what="bool tile")
        k.emit(f"tl.store({ptr} + rows[:, None] * {n} + cols[None, :], {value}, "
               f"mask=mask{holes})")
    elif v.shape == ("C",) and "R" not in k.block:
        ptr = k.tensor_arg("out", np.ones(k.sizes["N"], np.bool_), output=True,
                           what="bool elementwise")
        k.emit(f"tl.store({ptr} + offs, {value}, mask=mask{holes})")
    else:
        return False
    k.features.add("store_bool")
    return False


_TL_TYPES = {"f64": "float64", "f16": "float16", "i8": "int8", "i16": "int16",
             "f32": "float32", "i32": "int32"}


def _reload(k: _Kernel, v: Val, address: str, mask: str) -> bool:
    """Reads back what was just stored (read after write through memory)."""
    other = 0 if v.dtype == "i32" else k.pick((0.0, 1.0))
    text = f"tl.load({address}, mask={mask}, other={other})"
    k.define("w", text, Val("", v.shape, v.dtype, min(v.lo, other), max(v.hi, other), v.err,
                            v.exact, v.intval))
    k.features.add("reload")
    return True


def _atomic(k: _Kernel, v: Val) -> None:
    """tl.atomic_add / max / min of v into a few slots, many programs into each: a float
    sum's rounding depends on the order, so only integers' sums must agree exactly."""
    two_d = "R" in k.block
    slots = int(k.rng.integers(1, 8))
    start = k.values("intval" if v.dtype == "f32" else "int", slots)
    op = k.pick(("add", "add", "max", "min"))
    ptr = k.tensor_arg("atom", start, output=True, what=f"atomic_{op} into {slots} slots")
    programs = k.gm * k.gn if two_d else int(np.prod(k.grid))
    if v.shape == ("R", "C"):
        index, mask = f"(rows[:, None] * 3 + cols[None, :]) % {slots}", "mask"
        count = k.sizes["M"] * k.sizes["N"]
    elif v.shape == ("R",):
        index, mask, count = f"rows % {slots}", "rmask", k.sizes["M"] * k.gn
    elif v.shape == ("C",) and two_d:
        index, mask, count = f"cols % {slots}", "cmask", k.sizes["N"] * k.gm
    elif v.shape == ("C",):
        index, mask, count = f"offs % {slots}", "mask", k.sizes["N"]
    else:
        index, mask, count = f"{'pid_m' if two_d else 'pid'} % {slots}", None, programs
    masked = f", mask={mask}" if mask else ""
    k.emit(f"tl.atomic_{op}({ptr} + {index}, {v.name}{masked})")
    k.features.add(f"atomic_{op}")
    spec = k.tensors[ptr]
    if op != "add":  # max and min do not round: the same whatever the order
        spec.exact = v.exact
        spec.atol = 0.0 if v.exact else 4 * v.err
        return
    count = 2 * -(-max(count, 1) // slots)  # at most about as many adds into each slot
    total = count * v.mag + 4  # bounds every partial sum of a slot, its start included
    spec.exact = v.dtype == "i32" or (v.exact and v.intval and total < INT_CAP)
    # each add rounds by at most U times the partial sum (bounded by total)
    spec.atol = 0.0 if spec.exact else 2 * count * v.err + 1.5 * count * U * total
