"""Layouts, and the kernel families over one grid of tiles or elements: flat, tile,
alias2d."""

from __future__ import annotations

import numpy as np

from tests.tritongen.expressions import _choose, _numeric, grow
from tests.tritongen.outputs import _store, _store_results
from tests.tritongen.values import (
    DOMAINS,
    U,
    Val,
    _descriptor,
    _domain,
    _is_int,
    _Kernel,
    _lit,
    _load,
    _matrix,
    _output,
    _tolerate,
)

# ----------------------------------------------------------------------------- families


def _load_flat(k: _Kernel, n_arg: str, n: int) -> Val:
    """A 1-D input read at `offs`, gathered at `(offs * step) % N`, or reversed."""
    domain = _domain(k)
    ptr = k.tensor_arg("x", k.values(domain, n))
    index = k.pick(("contiguous", "contiguous", "contiguous", "gather", "reverse"))
    k.features.add(index)
    address = {"contiguous": "offs", "reverse": f"{n_arg} - 1 - offs",
               "gather": f"(offs * {int(k.rng.integers(2, 8))}) % {n_arg}"}[index]
    mask = "mask"
    if k.chance(0.2):  # holes inside the bounds read `other` too
        mask = f"mask & (offs % {int(k.rng.integers(2, 5))} != 0)"
        k.features.add("load_holes")
    mask = _data_mask(k, mask, ("C",))
    v = _load(k, "x", f"{ptr} + {address}", mask, domain, ("C",))
    if index == "contiguous" and domain in ("normal", "positive", "intval", "int", "bigint"):
        k.private.append((ptr, "offs", v.dtype))  # only this program reads these elements
    return v


def _data_mask(k: _Kernel, mask: str, shape: tuple[str, ...]) -> str:
    """Now and then a load's mask also depends on data loaded before (exact values)."""
    earlier = _choose(k, lambda v: v.exact and v.shape == shape and _numeric(v)
                      and v.name not in ("offs", "rows", "cols"))
    if earlier is None or not k.chance(0.2):
        return mask
    k.features.add("data_mask")
    return f"{mask} & ({earlier.name} > {_lit(0.0) if earlier.dtype == 'f32' else 0})"


def _family_flat(k: _Kernel) -> None:
    rng = k.rng
    n = int(rng.integers(1, 301))
    block = int(k.pick((16, 32, 64, 128)))
    if k.chance(0.1):  # rows of 2 KB and more: prefetched, many interior chunks
        n, block = int(rng.integers(300, 3000)), int(k.pick((512, 1024)))
        k.features.add("long_rows")
    elif k.chance(0.1):  # blocks narrower than a vector
        n, block = int(rng.integers(1, 40)), int(k.pick((1, 2, 4, 8)))
        k.features.add("small_blocks")
    k.block = {"C": block}
    programs = -(-n // block) + int(rng.integers(0, 2))  # now and then one masked program
    k.grid = (programs,)
    n_arg = k.size_arg("N", n)
    k.constexpr("BLOCK", block)
    if k.chance(0.15) and programs > 1:  # the same programs as a 3-D grid, linearised
        nx = int(k.pick([d for d in (1, 2, 3) if d <= programs]))
        ny = int(rng.integers(1, 3))
        nz = -(-programs // (nx * ny))
        programs = nx * ny * nz
        k.grid = (nx, ny, nz)
        k.emit("pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + "
               "tl.num_programs(1) * tl.program_id(2))")
        k.features.add("grid3d")
    else:
        k.emit("pid = tl.program_id(0)")
    k.emit("offs = pid * BLOCK + tl.arange(0, BLOCK)")
    if k.chance(0.15):  # true hints, as tutorial 09 gives them
        k.emit("offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK)")
        k.features.add("hints")
    mask = _bound(k, "offs", n_arg)
    if k.chance(0.15):  # a window: a lower bound too, or a limit that differs per program
        low = k.int_arg("LO", int(rng.integers(0, n + 1)))
        mask = k.pick((f"(offs >= {low}) & ({mask})", f"({mask}) & (offs < {n_arg} - pid * 5)",
                       f"({mask}) & (offs + {low} < {n_arg} + 3)"))
        k.features.add("window_mask")
    k.emit(f"mask = {mask}")
    _early_return(k, "pid")
    k.pool.append(Val("offs", ("C",), "i32", 0, programs * block - 1, intval=True))
    k.pool.append(Val("pid", (), "i32", 0, programs - 1, intval=True))
    for _ in range(int(rng.integers(1, 4))):
        _load_flat(k, n_arg, n)
    if k.chance(0.2):
        ptr = k.tensor_arg("s", k.values("normal", 3))
        k.define("s", f"tl.load({ptr} + pid % 3)", Val("", (), "f32", -2.0, 2.0))
        k.features.add("scalar_load")
    grow(k, int(rng.integers(2, 9)))
    if k.chance(0.1):
        _histogram(k)
    _store_results(k)


def _histogram(k: _Kernel) -> None:
    """tl.histogram of an integer tile's low bits, stored per program."""
    v = _choose(k, lambda v: v.dtype == "i32" and v.shape == ("C",))
    if v is None:
        return
    bins = int(k.pick((4, 8, 16, 32)))
    name = k.fresh("hist")
    masked = ", mask=mask" if k.chance(0.5) else ""
    k.emit(f"{name} = tl.histogram({v.name} & {bins - 1}, {bins}{masked})")
    out = _output(k, bins * int(np.prod(k.grid)), "i32", "histogram per program")
    k.emit(f"tl.store({out} + pid * {bins} + tl.arange(0, {bins}), {name})")
    k.features.add("histogram")


def _bound(k: _Kernel, index: str, size: str) -> str:
    """`index < size`, written one of several equivalent ways."""
    form = k.pick(("lt", "lt", "lt", "gt", "le", "le_plus", "i64"))
    if form != "lt":
        k.features.add(f"bound_{form}")
    return {"lt": f"{index} < {size}", "gt": f"{size} > {index}",
            "le": f"{index} <= {size} - 1", "le_plus": f"{index} + 1 <= {size}",
            "i64": f"{index}.to(tl.int64) < {size}"}[form]


def _early_return(k: _Kernel, pid: str) -> None:
    """Now and then some programs return before doing anything (their outputs keep the
    sentinel)."""
    if k.chance(0.08) and not k.persistent:  # (Triton refuses a return inside a loop)
        k.emit(f"if {pid} % {int(k.rng.integers(2, 4))} == {int(k.rng.integers(0, 2))}:")
        k.emit("    return")
        k.features.add("early_return")


def _program_ids_2d(k: _Kernel, m: int, n: int, bm: int, bn: int) -> None:
    """pid_m, pid_n from a 2-D grid (either axis order) or a 1-D grid split in two; now and
    then one more block than needed along an axis (all of its lanes masked)."""
    gm = -(-m // bm) + (1 if k.chance(0.15) else 0)
    gn = -(-n // bn) + (1 if k.chance(0.15) else 0)
    k.gm, k.gn = gm, gn
    mode = k.pick(("grid2d", "grid2d_swapped", "split", "grouped", "persistent"))
    k.features.add(mode)
    if mode == "grid2d":
        k.grid = (gm, gn)
        k.emit("pid_m = tl.program_id(0)")
        k.emit("pid_n = tl.program_id(1)")
        k.emit("num_pid_n = tl.num_programs(1)")
    elif mode == "grid2d_swapped":
        k.grid = (gn, gm)
        k.emit("pid_m = tl.program_id(1)")
        k.emit("pid_n = tl.program_id(0)")
        k.emit("num_pid_n = tl.num_programs(0)")
    elif mode == "split":
        k.grid = (gm * gn,)
        k.emit("pid = tl.program_id(0)")
        k.emit(f"num_pid_n = {k.int_arg('GN', gn)}")
        k.emit("pid_m = pid // num_pid_n")
        k.emit("pid_n = pid % num_pid_n")
    elif mode == "grouped":  # tutorial 03's swizzle: GROUP_M row blocks share columns
        k.grid = (gm * gn,)
        k.emit("pid = tl.program_id(0)")
        k.emit(f"num_pid_m = {k.int_arg('GM', gm)}")
        k.emit(f"num_pid_n = {k.int_arg('GN', gn)}")
        k.emit(f"num_pid_in_group = {k.constexpr('GROUP_M', int(k.pick((1, 2, 3, 8))))} * "
               f"num_pid_n")
        k.emit("group_id = pid // num_pid_in_group")
        k.emit("first_pid_m = group_id * GROUP_M")
        k.emit("group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)")
        k.emit("pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)")
        k.emit("pid_n = (pid % num_pid_in_group) // group_size_m")
    else:  # persistent: fewer programs than tiles, each looping over its share
        programs = int(k.rng.integers(1, min(gm * gn, 4) + 1))
        k.grid = (programs,)
        k.persistent = True
        k.emit("pid = tl.program_id(0)")
        k.emit(f"num_pid_n = {k.int_arg('GN', gn)}")
        k.emit(f"for tile_id in range(pid, {k.int_arg('TILES', gm * gn)}, "
               f"tl.num_programs(0)):")
        k.indent += 1
        k.emit("pid_m = tile_id // num_pid_n")
        k.emit("pid_n = tile_id % num_pid_n")


def _tile_setup(k: _Kernel, m: int, n: int, bm: int, bn: int) -> None:
    """The 2-D families' ids, row and column indices and masks."""
    k.block = {"R": bm, "C": bn}
    k.constexpr("BLOCK_M", bm)
    k.constexpr("BLOCK_N", bn)
    _program_ids_2d(k, m, n, bm, bn)
    m_arg, n_arg = k.size_arg("M", m), k.size_arg("N", n)
    k.m_arg, k.n_arg = m_arg, n_arg
    k.emit("rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    k.emit("cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    k.emit(f"rmask = {_bound(k, 'rows', m_arg)}")
    k.emit(f"cmask = {_bound(k, 'cols', n_arg)}")
    if k.chance(0.5):
        k.emit("mask = rmask[:, None] & cmask[None, :]")
    else:  # the same mask, written from the indices
        k.emit(f"mask = (rows[:, None] < {m_arg}) & (cols[None, :] < {n_arg})")
    _early_return(k, k.pick(("pid_m", "pid_n")))
    k.pool.append(Val("rows", ("R",), "i32", 0, k.gm * bm - 1, intval=True))
    k.pool.append(Val("cols", ("C",), "i32", 0, k.gn * bn - 1, intval=True))


def _load_tile(k: _Kernel, m: int, n: int, domain: str, prefix: str = "x") -> Val:
    if (domain in ("normal", "positive", "intval", "int") and k.block["C"] >= 4
            and k.chance(0.1)):  # through a descriptor: out of bounds reads zeros
        _, desc = _descriptor(k, m, n, lambda size: k.values(domain, size), prefix)
        _, lo, hi = DOMAINS[domain]
        return k.define(prefix, f"{desc}.load([pid_m * BLOCK_M, pid_n * BLOCK_N])",
                        Val("", ("R", "C"), "i32" if _is_int(domain) else "f32", min(lo, 0),
                            max(hi, 0), intval=domain in ("intval", "int")))
    ptr, sr, sc = _matrix(k, m, n, domain, prefix=prefix)
    address = f"rows[:, None] * {sr} + cols[None, :] * {sc}"
    if k.chance(0.1):
        address = f"rows[:, None].to(tl.int64) * {sr} + cols[None, :] * {sc}"
        k.features.add("int64_offsets")
    mask = "mask"
    if k.chance(0.15):
        mask = f"mask & ((rows[:, None] + cols[None, :]) % {int(k.rng.integers(2, 5))} != 0)"
        k.features.add("load_holes")
    mask = _data_mask(k, mask, ("R", "C"))
    v = _load(k, prefix, f"{ptr} + {address}", mask, domain, ("R", "C"))
    if domain in ("normal", "positive", "intval", "int", "bigint"):
        k.private.append((ptr, address, v.dtype))  # only this program reads these elements
    return v


def _load_vector(k: _Kernel, length: int, axis: str) -> Val:
    """A row (axis "R", length M) or column (axis "C", length N) vector, broadcast later."""
    domain = _domain(k)
    stride = 2 if k.chance(0.25) else 1
    ptr = k.tensor_arg("vec", k.values(domain, max((length - 1) * stride + 1, 1)))
    index, mask = ("rows", "rmask") if axis == "R" else ("cols", "cmask")
    address = f"{ptr} + {index}"
    if stride != 1:
        address += f" * {k.int_arg(k.fresh('vstride'), stride)}"
    k.features.add(f"vector_{axis}")
    return _load(k, "b", address, mask, domain, (axis,))


def _family_tile(k: _Kernel) -> None:
    rng = k.rng
    m, n = int(rng.integers(1, 301)), int(rng.integers(1, 301))
    bm, bn = int(k.pick((16, 32, 64, 128))), int(k.pick((16, 32, 64, 128)))
    while bm * bn > 4096:  # the interpreter's time grows with the tile
        bm, bn = max(bm // 2, 16), max(bn // 2, 16)
    if k.chance(0.2):  # rows or columns narrower than a vector
        m, bm = (int(rng.integers(1, 40)), int(k.pick((1, 2, 4, 8)))) if k.chance(0.5) \
            else (m, bm)
        n, bn = (int(rng.integers(1, 40)), int(k.pick((1, 2, 4, 8)))) if k.chance(0.5) \
            else (n, bn)
        k.features.add("small_blocks")
    elif k.chance(0.08):  # big tiles (a big frame), few programs
        m, n = int(rng.integers(1, 260)), int(rng.integers(1, 260))
        bm, bn = k.pick(((128, 128), (256, 64), (64, 256), (128, 64)))
        k.features.add("big_tiles")
    _tile_setup(k, m, n, bm, bn)
    many = k.chance(0.1)  # long programs: many live values
    for _ in range(int(rng.integers(1, 3)) + (4 if many else 0)):
        _load_tile(k, m, n, _domain(k))
    for _ in range(int(rng.integers(0, 3))):
        axis = k.pick(("R", "C"))
        _load_vector(k, m if axis == "R" else n, axis)
    if k.chance(0.15):
        _special_values(k, m, n)
    grow(k, int(rng.integers(3, 10)) + (20 if many else 0))
    if k.chance(0.15):
        _softmax(k, m, n)
    _store_results(k)


SPECIAL_VALUES = np.array([0.0, -0.0, np.inf, -np.inf, 1e30, -1e30, 1e-30, -1e-30, 1e-40,
                           -1e-40, 1.5, -2.5], np.float32)  # (1e-40 is subnormal)


def _special_values(k: _Kernel, m: int, n: int) -> None:
    """A tile of infinities, signed zeros, subnormals and huge values (no NaN) through the
    ops that must pass them on exactly: abs, negation, max, min, where, comparisons,
    max / min / argmax / argmin reductions; each result stored straight away."""
    ptr, sr, sc = _matrix(k, m, n, "normal", prefix="sp")
    spec = k.tensors[ptr]
    spec.data = k.rng.choice(SPECIAL_VALUES, spec.data.size)
    other = k.pick(("0.0", 'float("inf")', 'float("-inf")', "1e-40"))
    sp = k.fresh("sp")
    k.emit(f"{sp} = tl.load({ptr} + rows[:, None] * {sr} + cols[None, :] * {sc}, mask=mask, "
           f"other={other})")
    k.features.add("special_values")
    results = []
    for _ in range(int(k.rng.integers(1, 4))):
        op = k.pick(("abs", "neg", "maximum", "minimum", "where", "clamp", "max", "min",
                     "argmax", "argmin", "compare"))
        axis = int(k.rng.integers(0, 2))
        text = {"abs": f"tl.abs({sp})", "neg": f"-{sp}", "maximum": f"tl.maximum({sp}, 0.0)",
                "minimum": f"tl.minimum({sp}, 1e-40)",
                "where": f'tl.where({sp} > 0.0, {sp}, float("-inf"))',
                "clamp": f"tl.clamp({sp}, -1e30, 1e-30)",
                "max": f"tl.max({sp}, axis={axis})", "min": f"tl.min({sp}, axis={axis})",
                "argmax": f"tl.argmax({sp}, axis={axis})",
                "argmin": f"tl.argmin({sp}, axis={axis})",
                "compare": f"({sp} >= 1e-40).to(tl.int32)"}[op]
        shape = (("C",) if axis == 0 else ("R",)) if op in ("max", "min", "argmax",
                                                              "argmin") else ("R", "C")
        dtype = "i32" if op in ("argmax", "argmin", "compare") else "f32"
        name = k.fresh("sv")
        k.emit(f"{name} = {text}")
        results.append(Val(name, shape, dtype, 0, 0))
        k.features.add(f"special_{op}")
    for v in results:  # exact, though not numbers the pool's bounds can hold
        k.pool.append(v)
        _store(k, v, reload=False)
        k.pool.remove(v)


def _softmax(k: _Kernel, m: int, n: int) -> None:
    """The fused softmax's shape, on a load whose masked lanes read -inf (so its max and
    exp ignore them): stored straight away, kept out of the pool (a row with no lane
    inside the bounds is NaN throughout, and only the store's mask keeps it out)."""
    axis = int(k.rng.integers(0, 2))
    ptr, sr, sc = _matrix(k, m, n, k.pick(("normal", "intval")), prefix="sx")
    sx = k.fresh("sx")
    k.emit(f"{sx} = tl.load({ptr} + rows[:, None] * {sr} + cols[None, :] * {sc}, mask=mask, "
           f'other=-float("inf"))')
    keep = "[:, None]" if axis == 1 else "[None, :]"
    k.emit(f"{sx} = tl.exp({sx} - tl.max({sx}, axis={axis}){keep})")
    k.emit(f"{sx} = {sx} / tl.sum({sx}, axis={axis}){keep}")
    out = _output(k, m * n, "f32", "softmax (M x N)")
    k.emit(f"tl.store({out} + rows[:, None] * {n} + cols[None, :], {sx}, mask=mask)")
    lanes = k.block["R" if axis == 0 else "C"]
    spec = k.tensors[out]
    spec.exact, spec.atol = False, 4 * (16 + 2 * lanes) * U
    k.features.add("softmax_inf")


def _family_alias2d(k: _Kernel) -> None:
    """One program, a square matrix read as a tile and stored into itself transposed, then
    read again: the store's addresses are the load's, in another order."""
    rng = k.rng
    size = int(rng.integers(1, 65))
    block = max(16, 1 << (size - 1).bit_length())
    k.block = {"R": block, "C": block}
    k.grid = (1,)
    k.constexpr("BLOCK_M", block)
    k.constexpr("BLOCK_N", block)
    k.sizes["M"] = k.sizes["N"] = size
    s_arg = k.size_arg("S", size)
    domain = k.pick(("normal", "intval"))
    x_ptr = k.tensor_arg("x", k.values(domain, size * size))
    k.features.add("alias_transposed")
    k.emit("pid_m = tl.program_id(0)")
    k.emit("pid_n = 0")
    k.emit("num_pid_n = 1")
    k.emit("rows = tl.arange(0, BLOCK_M)")
    k.emit("cols = tl.arange(0, BLOCK_N)")
    k.emit(f"rmask = rows < {s_arg}")
    k.emit(f"cmask = cols < {s_arg}")
    k.emit("mask = rmask[:, None] & cmask[None, :]")
    k.pool.append(Val("rows", ("R",), "i32", 0, block - 1, intval=True))
    k.pool.append(Val("cols", ("C",), "i32", 0, block - 1, intval=True))
    spec = k.tensors[x_ptr]
    _load(k, "x", f"{x_ptr} + rows[:, None] * {s_arg} + cols[None, :]", "mask", domain,
          ("R", "C"))
    grow(k, int(rng.integers(1, 4)), allow=("arith", "scalar", "unary", "minmax", "where",
                                             "math"))
    v = _choose(k, lambda v: v.dtype == "f32" and v.shape == ("R", "C"))
    k.emit(f"tl.store({x_ptr} + cols[None, :] * {s_arg} + rows[:, None], {v.name}, mask=mask)")
    spec.output, spec.what = True, "stored into transposed"
    _tolerate(k, x_ptr, v)
    if k.chance(0.7):
        other = k.pick((0.0, 1.0))
        k.define("y", f"tl.load({x_ptr} + rows[:, None] * {s_arg} + cols[None, :], mask=mask, "
                      f"other={_lit(other)})",
                 Val("", ("R", "C"), "f32", min(v.lo, other), max(v.hi, other), v.err, v.exact,
                     v.intval and float(other).is_integer()))
    grow(k, int(rng.integers(1, 3)), allow=("arith", "scalar", "unary", "minmax", "where"))
    _store_results(k)


def _chunk_indices(k: _Kernel, n_arg: str) -> None:
    k.emit("cols = start + tl.arange(0, BLOCK_N)")
    k.emit(f"cmask = cols < {n_arg}")
    k.emit("mask = rmask[:, None] & cmask[None, :]")
