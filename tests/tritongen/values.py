"""What a generated kernel is made of: values with their bounds and errors, tensor
specs, the kernel under construction, and loads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

U = 2.0 ** -24  # f32 unit roundoff
MAG_CAP = 1.0e4  # no value grows past this, so errors stay small against the tolerance
INT_CAP = 2 ** 24  # integers (and integer-valued floats) stay exact in f32 below this
FLOAT_SENTINEL = -7777.25  # what outputs hold where the kernel must not store
INT_SENTINEL = -777777
LITERALS = (0.5, 2.0, -1.5, 3.0, 0.25, 1.0, -0.75, 0.1)


# ----------------------------------------------------------------------------- values


@dataclasses.dataclass
class Val:
    """A value in the kernel: a variable name, its shape over the kernel's axes ("R" rows,
    "C" columns; () a scalar), its dtype ("f32" or "i32") and what is known about it."""

    name: str
    shape: tuple[str, ...]
    dtype: str
    lo: float
    hi: float
    err: float = 0.0  # bound on |tilegen - interpreter|
    exact: bool = True  # bit for bit the same in both
    intval: bool = False  # an f32 holding an integer (always true of i32 values)
    fusable: bool = False  # a product, which an add reading it may fuse into an fma

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def _union(*shapes: tuple[str, ...]) -> tuple[str, ...]:
    axes = set().union(*shapes)
    return tuple(a for a in ("R", "C") if a in axes)


def _bcast(v: Val, shape: tuple[str, ...]) -> str:
    """The text of v broadcast to `shape` (scalars broadcast implicitly)."""
    if v.shape == shape or not v.shape:
        return v.name
    if shape == ("R", "C"):
        return f"{v.name}[:, None]" if v.shape == ("R",) else f"{v.name}[None, :]"
    raise AssertionError(f"cannot broadcast {v.shape} to {shape}")


def _interval_mul(a: Val, b: Val) -> tuple[float, float]:
    products = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return min(products), max(products)


def _f32(x: float) -> float:
    return float(np.float32(x))


def _lit(x: float) -> str:
    return repr(float(x))


# ----------------------------------------------------------------------------- kernels


@dataclasses.dataclass
class TensorSpec:
    """A tensor argument: `data` is its whole flat storage (for an output, what it holds
    before the launch); the kernel's pointer is `data[offset:]`."""

    data: np.ndarray
    offset: int = 0
    output: bool = False
    exact: bool = True  # outputs: compare bit for bit, else within atol + 1e-5 relative
    atol: float = 0.0
    rtol: float = 1e-5
    what: str = ""
    view_of: str | None = None  # the kernel gets this other tensor's storage (an alias)


@dataclasses.dataclass
class GeneratedKernel:
    source: str
    grid: tuple[int, ...]
    # (name, kind, value) in signature order; kind is "tensor" (value: a key of `tensors`),
    # "int", "float" or "constexpr"
    args: list[tuple[str, str, object]]
    tensors: dict[str, TensorSpec]
    family: str
    features: list[str]

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.py").write_text(self.source)
        np.savez(folder / "inputs.npz", **{n: t.data for n, t in self.tensors.items()})
        meta = {
            "grid": list(self.grid), "args": self.args, "family": self.family,
            "features": self.features,
            "tensors": {n: {"offset": t.offset, "output": t.output, "exact": t.exact,
                            "atol": t.atol, "rtol": t.rtol, "what": t.what,
                            "view_of": t.view_of}
                        for n, t in self.tensors.items()},
        }
        (folder / "launch.json").write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, folder: Path) -> GeneratedKernel:
        meta = json.loads((folder / "launch.json").read_text())
        with np.load(folder / "inputs.npz") as data:
            tensors = {n: TensorSpec(data=data[n], **t) for n, t in meta["tensors"].items()}
        return cls(source=(folder / "kernel.py").read_text(), grid=tuple(meta["grid"]),
                   args=[tuple(a) for a in meta["args"]], tensors=tensors,
                   family=meta["family"], features=meta["features"])


class _Kernel:
    """A kernel under construction: its parameters, host data and body lines."""

    def __init__(self, rng: np.random.Generator, family: str):
        self.rng = rng
        self.family = family
        self.args: list[tuple[str, str, object]] = []
        self.tensors: dict[str, TensorSpec] = {}
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.features: set[str] = set()
        self.pool: list[Val] = []
        self.grid: tuple[int, ...] = (1,)
        self.sizes: dict[str, int] = {}  # the problem's sizes by name: "M", "N", "K"
        self.block: dict[str, int] = {}  # the block along each axis, "R" and "C"
        self.gm = self.gn = 1  # programs along the row and column blocks
        self.persistent = False  # the body is inside a loop over tiles (no early return)
        self.helpers: set[str] = set()  # combine functions the kernel calls
        # inputs only their own program reads, at (pointer, offsets, dtype): safe to store
        # into in place
        self.private: list[tuple[str, str, str]] = []

    # --- randomness
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def define(self, prefix: str, text: str, val: Val) -> Val:
        val.name = self.fresh(prefix)
        self.emit(f"{val.name} = {text}")
        self.pool.append(val)
        return val

    # --- parameters
    def int_arg(self, name: str, value: int) -> str:
        self.args.append((name, "int", int(value)))
        return name

    def float_arg(self, name: str, value: float) -> str:
        self.args.append((name, "float", _f32(value)))
        return name

    def constexpr(self, name: str, value: int) -> str:
        self.args.append((name, "constexpr", int(value)))
        return name

    def size_arg(self, name: str, value: int) -> str:
        """A size or stride: an int argument (Triton specialises 1 and multiples of 16) or,
        now and then, a constexpr (known to the compiler)."""
        if name in ("M", "N", "K"):
            self.sizes[name] = value
        return self.constexpr(name, value) if self.chance(0.2) else self.int_arg(name, value)

    def tensor_arg(self, prefix: str, storage: np.ndarray, *, output: bool = False,
                   what: str = "", offset: int | None = None) -> str:
        name = self.fresh(prefix) + "_ptr"
        if offset is None:  # a base not 16-byte aligned now and then
            offset = int(self.rng.integers(1, 4)) if self.chance(0.15) else 0
        filler = storage[:1] if storage.size else np.zeros(1, storage.dtype)
        data = np.concatenate([np.resize(filler, offset), storage]).astype(storage.dtype)
        self.tensors[name] = TensorSpec(data=data, offset=offset, output=output, what=what)
        self.args.append((name, "tensor", name))
        return name

    def source(self) -> str:
        params = []
        for name, kind, _ in self.args:
            params.append(f"{name}: tl.constexpr" if kind == "constexpr" else name)
        head = ["import triton", "import triton.language as tl", "", ""]
        for helper in sorted(self.helpers):
            head += ["@triton.jit", *COMBINE_HELPERS[helper].splitlines(), "", ""]
        head += ["@triton.jit", f"def kernel({', '.join(params)}):"]
        return "\n".join(head + self.lines) + "\n"

    def finish(self) -> GeneratedKernel:
        return GeneratedKernel(source=self.source(), grid=self.grid, args=self.args,
                               tensors=self.tensors, family=self.family,
                               features=sorted(self.features))

    # --- host data
    def values(self, domain: str, size: int) -> np.ndarray:
        dtype, lo, hi = DOMAINS[domain]
        if domain in ("normal", "positive", "half", "double"):
            return self.rng.uniform(lo, hi, size).astype(dtype)
        if domain == "bool":
            return self.rng.random(size) < 0.5
        # integers; as floats ("intval"): sums exact whatever the order, and ties
        return self.rng.integers(lo, hi + 1, size).astype(dtype)


# what inputs hold: storage dtype and the range of the values
DOMAINS = {
    "normal": (np.float32, -2.0, 2.0), "positive": (np.float32, 0.25, 3.0),
    "intval": (np.float32, -4.0, 4.0), "int": (np.int32, -20, 20),
    # the whole int32 range (INT_MIN aside: INT_MIN // -1 overflows)
    "bigint": (np.int32, -2 ** 31 + 1, 2 ** 31 - 1),
    # narrow storage, converted to f32 / i32 as it is loaded
    "half": (np.float16, -2.0, 2.0), "i8": (np.int8, -100, 100), "i16": (np.int16, -3000, 3000),
    "u8": (np.uint8, 0, 255), "bool": (np.bool_, 0, 1),
    "halfint": (np.float16, -4, 4),  # integer-valued halves (dot operands: exact sums)
    "double": (np.float64, -2.0, 2.0),
}
NARROW = {"half": "tl.float32", "double": "tl.float32", "i8": "tl.int32", "i16": "tl.int32",
          "u8": "tl.int32"}


def _is_int(domain: str) -> bool:
    return domain == "bool" or np.issubdtype(DOMAINS[domain][0], np.integer)


def _load(k: _Kernel, prefix: str, address: str, mask: str, domain: str,
          shape: tuple[str, ...], other: float | None = None) -> Val:
    """Defines a masked load of `domain` values, converted to f32 / i32 if narrow."""
    if other is None:
        other = _other_for(k, domain)
    text = f"tl.load({address}, mask={mask}, other={_other_text(domain, other)})"
    if domain in NARROW:
        text += f".to({NARROW[domain]})"
        k.features.add(f"load_{domain}")
    _, lo, hi = DOMAINS[domain]
    if domain == "bool":  # an i1 tile: a condition, not a number
        k.features.add("load_bool")
        return k.define(prefix, text, Val("", shape, "i1", 0, 1))
    is_int = _is_int(domain)
    intval = is_int or (domain == "intval" and float(other).is_integer())
    return k.define(prefix, text, Val("", shape, "i32" if is_int else "f32", min(lo, other),
                                      max(hi, other), intval=intval))


def _other_for(k: _Kernel, domain: str) -> float:
    if domain == "bool":
        return k.pick((0, 1))
    if domain == "positive":
        return k.pick((1.0, 0.5, 2.0))
    if domain == "u8":
        return k.pick((0, 1, 7))
    if _is_int(domain):
        return k.pick((0, 1, -3))
    return k.pick((0.0, 1.0, -1.0, 2.0, 0.5))


def _other_text(domain: str, other: float) -> str:
    return str(int(other)) if _is_int(domain) else _lit(other)


def _domain(k: _Kernel, *, narrow: bool = True) -> str:
    choices = ["normal", "normal", "positive", "intval", "int", "bigint"]
    if narrow and k.chance(0.2):
        return k.pick(("half", "i8", "i16", "u8", "bool", "double"))
    return k.pick(choices)


COMBINE_HELPERS = {  # associative and commutative: any order of combining is allowed
    "combine_add": "def combine_add(a, b):\n    return a + b",
    "combine_max": "def combine_max(a, b):\n    return tl.maximum(a, b)",
    "combine_maxabs": "def combine_maxabs(a, b):\n    return tl.maximum(tl.abs(a), tl.abs(b))",
}


# ----------------------------------------------------------------------------- layouts


def _matrix(k: _Kernel, rows: int, cols: int, domain: str, *, prefix: str):
    """A rows x cols input in a random layout; returns (pointer, stride_r, stride_c
    texts)."""
    layout = k.pick(("row", "row", "padded", "col"))
    pad = int(k.rng.integers(1, 5)) if layout == "padded" else 0
    if layout == "col":
        sr, sc = 1, rows
    else:
        sr, sc = cols + pad, 1
    size = (rows - 1) * sr + (cols - 1) * sc + 1 if rows and cols else 1
    storage = k.values(domain, size)
    k.features.add(f"layout_{layout}")
    ptr = k.tensor_arg(prefix, storage)
    stride_r = k.size_arg(k.fresh("stride_r"), sr)
    stride_c = k.size_arg(k.fresh("stride_c"), sc)
    return ptr, stride_r, stride_c


OUTPUT_DTYPES = {"f32": (np.float32, FLOAT_SENTINEL), "i32": (np.int32, INT_SENTINEL),
                 "f16": (np.float16, -777.5), "i8": (np.int8, -77), "i16": (np.int16, -7777),
                 "f64": (np.float64, FLOAT_SENTINEL)}


def _output(k: _Kernel, size: int, dtype: str, what: str) -> str:
    np_dtype, sentinel = OUTPUT_DTYPES[dtype]
    storage = np.full(max(size, 1), sentinel, np_dtype)
    return k.tensor_arg("out", storage, output=True, what=what)


def _tolerate(k: _Kernel, ptr: str, v: Val) -> None:
    spec = k.tensors[ptr]
    spec.exact = v.dtype == "i32" or v.exact
    # four times the tracked bound, plus the 1e-5 relative term at comparison time
    spec.atol = 0.0 if spec.exact else 4 * v.err + 1e-30


def _descriptor(k: _Kernel, m: int, n: int, storage_of, prefix: str) -> tuple[str, str]:
    """A row-major matrix (rows 16-byte aligned, base unshifted) and a tensor descriptor
    of it made in the kernel, with the tile as its block; returns (pointer, descriptor)."""
    stride = -(-n // 4) * 4 + 4 * int(k.rng.integers(0, 2))
    ptr = k.tensor_arg(prefix, storage_of((m - 1) * stride + n), offset=0)
    desc = k.fresh("desc")
    k.emit(f"{desc} = tl.make_tensor_descriptor({ptr}, shape=[{k.m_arg}, {k.n_arg}], "
           f"strides=[{k.int_arg(k.fresh('dstride'), stride)}, 1], "
           f"block_shape=[BLOCK_M, BLOCK_N])")
    k.features.add("tensor_descriptor")
    return ptr, desc
