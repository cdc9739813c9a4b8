"""A generator of random well-typed Kina programs (for differential tests and fuzzing).

`generate_program(rng)` composes elementwise ops and activations, layouts (reshape,
transpose, broadcast, concat, slice), reductions, softmax, layer_norm / rms_norm,
comparisons with where, matmul, gather, one_hot and argmax over odd sizes,
and returns the source text plus the inputs to call it with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Sizes:
    """The extents a program's dims are drawn from, and the most elements a tensor may have."""
    dims: tuple[int, ...]
    max_elements: int


SMALL = Sizes((1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 33), 6000)
# Big enough for the parallel loops, packed products and fused attention's blocks: a
# campaign at these sizes found silu(-89) = -0 (the interpreter: -1.98e-37).
LARGE = Sizes((1, 3, 17, 31, 33, 63, 65, 100, 129, 257), 300_000)


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "F32" | "I64" | "BOOL"
    limit: int = 0  # for I64 ids: values lie in [0, limit)
    positive: bool = False  # all elements > 0 (safe for log/sqrt)


@dataclass
class GeneratedProgram:
    source: str
    inputs: list[np.ndarray]
    function: str = "generated"
    ops: list[str] = field(default_factory=list)


def _numel(shape) -> int:
    return int(np.prod(shape)) if shape else 1


def _type(t: _Tensor) -> str:
    return f"Tensor[{t.dtype}, [{', '.join(str(d) for d in t.shape)}], @host]"


class _Builder:
    def __init__(self, rng: np.random.Generator, sizes: Sizes):
        self.rng = rng
        self.sizes = sizes
        self.params: list[_Tensor] = []
        self.inputs: list[np.ndarray] = []
        self.lines: list[str] = []
        self.pool: list[_Tensor] = []
        self.counter = 0
        self.ops: list[str] = []

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 4)) if rank is None else rank
        while True:
            shape = tuple(int(self.rng.choice(self.sizes.dims)) for _ in range(rank))
            if _numel(shape) <= self.sizes.max_elements:
                return shape

    def param(self, shape, dtype="F32", limit=0, positive=False) -> _Tensor:
        t = _Tensor(self.fresh("p"), tuple(shape), dtype, limit, positive)
        self.params.append(t)
        if dtype == "F32":
            data = self.rng.standard_normal(shape).astype(np.float32)
            if positive:
                data = np.abs(data) + np.float32(0.5)
        else:
            data = self.rng.integers(0, limit, size=shape, dtype=np.int64)
        self.inputs.append(data)
        self.pool.append(t)
        return t

    def let(self, expr: str, shape, dtype="F32", limit=0, positive=False, op="") -> _Tensor:
        t = _Tensor(self.fresh("v"), tuple(shape), dtype, limit, positive)
        self.lines.append(f"  let {t.name} = {expr};")
        self.pool.append(t)
        self.ops.append(op)
        return t

    def pick(self, dtype="F32", predicate=lambda t: True) -> _Tensor | None:
        options = [t for t in self.pool if t.dtype == dtype and predicate(t)]
        if not options:
            return None
        return options[int(self.rng.integers(len(options)))]

    # ---- one random step ----------------------------------------------------------------------

    def step(self) -> None:
        choice = self.rng.choice(["binary", "literal", "unary", "transpose", "reshape",
                                  "broadcast", "reduce", "softmax", "matmul", "gather",
                                  "one_hot", "argmax", "activation", "masked", "norm",
                                  "concat_slice"])
        getattr(self, "_" + str(choice))()

    def _binary(self):
        a = self.pick()
        op = str(self.rng.choice(["add", "sub", "mul", "div"]))
        if op == "div":
            b = self.pick(predicate=lambda t: t.shape == a.shape and t.positive) or \
                self.param(a.shape, positive=True)
        else:
            b = self.pick(predicate=lambda t: t.shape == a.shape) or self.param(a.shape)
        positive = a.positive and b.positive and op in ("add", "mul", "div")
        if self.rng.random() < 0.3:  # infix sugar
            symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
            self.let(f"{a.name} {symbol} {b.name}", a.shape, positive=positive, op=op)
        else:
            self.let(f"{op}({a.name}, {b.name})", a.shape, positive=positive, op=op)

    def _literal(self):
        a = self.pick()
        value = float(self.rng.choice([0.5, 2.0, -1.25, 3.0]))
        op = str(self.rng.choice(["add", "mul"]))
        positive = a.positive and value > 0
        self.let(f"{op}({a.name}, {value})", a.shape, positive=positive, op=op)

    def _unary(self):
        op = str(self.rng.choice(["neg", "exp", "log", "sqrt", "tanh"]))
        if op in ("log", "sqrt"):
            a = self.pick(predicate=lambda t: t.positive) or self.param(self.shape(),
                                                                         positive=True)
        elif op == "exp":
            # Keep exp's argument bounded so values stay finite through later ops.
            a = self.pick()
            inner = self.let(f"tanh({a.name})", a.shape, op="tanh")
            self.let(f"exp({inner.name})", a.shape, positive=True, op="exp")
            return
        else:
            a = self.pick()
        positive = op == "sqrt" or (op == "tanh" and False)
        self.let(f"{op}({a.name})", a.shape, positive=positive, op=op)

    def _transpose(self):
        a = self.pick(predicate=lambda t: len(t.shape) >= 2)
        if a is None:
            return self._reshape()
        perm = [int(p) for p in self.rng.permutation(len(a.shape))]
        shape = tuple(a.shape[p] for p in perm)
        self.let(f"transpose({a.name}, {perm})", shape, positive=a.positive, op="transpose")

    def _reshape(self):
        a = self.pick()
        total = _numel(a.shape)
        factors = []
        rest = total
        for _ in range(int(self.rng.integers(0, 3))):
            divisors = [d for d in range(2, rest + 1) if rest % d == 0]
            if not divisors:
                break
            d = int(self.rng.choice(divisors))
            factors.append(d)
            rest //= d
        factors.append(rest)
        self.rng.shuffle(factors)
        shape = tuple(factors)
        self.let(f"reshape({a.name}, {list(shape)})", shape, positive=a.positive, op="reshape")

    def _broadcast(self):
        a = self.pick(predicate=lambda t: len(t.shape) <= 3)
        if a is None:
            return
        target = list(a.shape)
        for axis, dim in enumerate(target):
            if dim == 1 and self.rng.random() < 0.7:
                target[axis] = int(self.rng.choice(self.sizes.dims))
        if self.rng.random() < 0.5:
            target.insert(0, int(self.rng.choice(self.sizes.dims[:6])))
        if _numel(target) > self.sizes.max_elements:
            return
        self.let(f"broadcast({a.name}, {target})", tuple(target), positive=a.positive,
                 op="broadcast")

    def _reduce(self):
        a = self.pick(predicate=lambda t: len(t.shape) >= 1)
        axis = int(self.rng.integers(len(a.shape)))
        op = str(self.rng.choice(["sum", "max", "mean", "min"]))
        shape = a.shape[:axis] + a.shape[axis + 1:]
        positive = a.positive
        self.let(f"{op}({a.name}, axis={axis})", shape, positive=positive, op=op)

    def _softmax(self):
        a = self.pick(predicate=lambda t: len(t.shape) >= 1)
        axis = int(self.rng.integers(len(a.shape)))
        op = str(self.rng.choice(["softmax", "log_softmax"]))
        self.let(f"{op}({a.name}, axis={axis})", a.shape, positive=(op == "softmax"), op=op)

    def _matmul(self):
        a = self.pick(predicate=lambda t: 2 <= len(t.shape) <= 4)
        if a is None:
            a = self.param(self.shape(2))
        n = int(self.rng.choice(self.sizes.dims))
        b_shape = a.shape[:-2] + (a.shape[-1], n)
        limit = self.sizes.max_elements
        if _numel(b_shape) > limit or _numel(a.shape[:-1] + (n,)) > limit:
            return
        b = self.pick(predicate=lambda t: t.shape == b_shape) or self.param(b_shape)
        self.let(f"matmul({a.name}, {b.name})", a.shape[:-1] + (n,), op="matmul")

    def _gather(self):
        ids = self.pick("I64", predicate=lambda t: len(t.shape) <= 2)
        rows = int(self.rng.choice(self.sizes.dims))
        if ids is None:
            ids = self.param(self.shape(int(self.rng.integers(1, 3))), "I64", limit=rows)
        rows = max(rows, ids.limit)
        width = int(self.rng.choice(self.sizes.dims))
        if _numel(ids.shape) * width > self.sizes.max_elements:
            return
        table = self.param((rows, width))
        self.let(f"gather({table.name}, {ids.name})", ids.shape + (width,), op="gather")

    def _one_hot(self):
        ids = self.pick("I64", predicate=lambda t: len(t.shape) <= 2)
        if ids is None:
            ids = self.param(self.shape(1), "I64", limit=int(self.rng.choice(self.sizes.dims)))
        n = max(ids.limit, int(self.rng.choice(self.sizes.dims)))
        if _numel(ids.shape) * n > self.sizes.max_elements:
            return
        self.let(f"one_hot({ids.name}, {n})", ids.shape + (n,), op="one_hot")

    def _activation(self):
        a = self.pick()
        op = str(self.rng.choice(["relu", "gelu", "gelu_tanh", "erf", "sigmoid", "silu",
                                  "abs", "maximum", "minimum"]))
        if op in ("maximum", "minimum"):
            b = self.pick(predicate=lambda t: t.shape == a.shape) or self.param(a.shape)
            self.let(f"{op}({a.name}, {b.name})", a.shape, op=op)
            return
        self.let(f"{op}({a.name})", a.shape, positive=op == "sigmoid", op=op)

    def _masked(self):
        # A comparison picks between a tensor and a number (attention-mask style).
        a = self.pick()
        b = self.pick(predicate=lambda t: t.shape == a.shape) or self.param(a.shape)
        op = str(self.rng.choice(["less", "less_equal", "greater", "greater_equal", "equal",
                                  "not_equal"]))
        mask = self.let(f"{op}({a.name}, {b.name})", a.shape, "BOOL", op=op)
        self.let(f"where({mask.name}, {a.name}, -1e4)", a.shape, op="where")

    def _norm(self):
        a = self.pick(predicate=lambda t: len(t.shape) >= 1)
        axis = int(self.rng.integers(len(a.shape)))
        gamma = self.param((a.shape[axis],))
        if self.rng.random() < 0.5:
            beta = self.param((a.shape[axis],))
            self.let(f"layer_norm({a.name}, {gamma.name}, {beta.name}, axis={axis}, eps=1e-3)",
                     a.shape, op="layer_norm")
        else:
            self.let(f"rms_norm({a.name}, {gamma.name}, axis={axis}, eps=1e-3)", a.shape,
                     op="rms_norm")

    def _concat_slice(self):
        a = self.pick(predicate=lambda t: len(t.shape) >= 1)
        axis = int(self.rng.integers(len(a.shape)))
        extent = a.shape[axis]
        if self.rng.random() < 0.5 and 2 * _numel(a.shape) <= self.sizes.max_elements:
            b = self.pick(predicate=lambda t: t.shape == a.shape) or self.param(a.shape)
            shape = a.shape[:axis] + (2 * extent,) + a.shape[axis + 1:]
            self.let(f"concat({a.name}, {b.name}, axis={axis})", shape, op="concat")
            return
        start = int(self.rng.integers(extent))
        size = int(self.rng.integers(1, extent - start + 1))
        shape = a.shape[:axis] + (size,) + a.shape[axis + 1:]
        self.let(f"slice({a.name}, axis={axis}, start={start}, size={size})", shape,
                 positive=a.positive, op="slice")

    def _argmax(self):
        a = self.pick(predicate=lambda t: len(t.shape) >= 2)
        if a is None:
            return
        axis = int(self.rng.integers(len(a.shape)))
        shape = a.shape[:axis] + a.shape[axis + 1:]
        self.let(f"argmax({a.name}, axis={axis})", shape, "I64", limit=a.shape[axis],
                 op="argmax")


def generate_program(rng: np.random.Generator, steps: int | None = None,
                     sizes: Sizes = SMALL) -> GeneratedProgram:
    builder = _Builder(rng, sizes)
    builder.param(builder.shape())
    for _ in range(steps if steps is not None else int(rng.integers(2, 9))):
        builder.step()
    floats = [t for t in builder.pool if t.dtype == "F32" and t not in builder.params]
    ints = [t for t in builder.pool if t.dtype == "I64" and t not in builder.params]
    results = (floats[-1:] or builder.params[:1]) + ints[-1:]
    params = ", ".join(f"{p.name}: {_type(p)}" for p in builder.params)
    if len(results) == 1:
        signature = _type(results[0])
        returned = results[0].name
    else:
        signature = "(" + ", ".join(_type(r) for r in results) + ")"
        returned = "(" + ", ".join(r.name for r in results) + ")"
    body = "\n".join(builder.lines)
    source = (f"fn generated({params}) -> {signature} {{\n{body}\n"
              f"  return {returned};\n}}\n")
    return GeneratedProgram(source, builder.inputs, ops=[o for o in builder.ops if o])
