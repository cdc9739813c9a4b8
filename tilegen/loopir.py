"""Loop-nest IR: buffers, loops, scalar lets, stores, and scalar expressions.

A `Kernel` is what one Kina function compiles to: a list of statements over named
row-major buffers (inputs, outputs, temporaries). Expressions are trees of small frozen
nodes; `Reduce` folds an expression over a fresh index. Loops carry a schedule tag:
`serial`, `vector` (split into `width`-lane tiles with a masked tail) or `parallel`.
The grammar is documented in docs/loopnest.md; `format_kernel` prints it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

# Scalar types of expressions.
F32, F64, I64, BOOL = "f32", "f64", "i64", "i1"
FLOAT_TYPES = (F32, F64)
# Storage-only buffer types: a load widens to the value type, a store narrows (bf16 rounds
# to nearest even, a bool is one byte holding 0 or 1, as in NumPy).
BF16_STORAGE, BOOL_STORAGE = "bf16", "bool"
STORAGE_VALUE_TYPES = {BF16_STORAGE: F32, BOOL_STORAGE: BOOL}


# The names of the IR's operations and kinds. They are `StrEnum`s, so a node built with the
# plain string ("exp") is equal to one built with the member and prints the same; the
# verifier (tilegen/loopir_verify.py) and codegen's dispatch tables reject any other name.
class ScalarType(enum.StrEnum):
    F32 = F32
    F64 = F64
    I64 = I64
    BOOL = BOOL


class StorageType(enum.StrEnum):
    """What a buffer element may be: a scalar type or a storage-only type."""

    F32 = F32
    F64 = F64
    I64 = I64
    BF16 = BF16_STORAGE
    BOOL = BOOL_STORAGE


class BinaryOp(enum.StrEnum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    FLOORDIV = "floordiv"
    MOD = "mod"
    LT = "lt"
    LE = "le"
    EQ = "eq"
    NE = "ne"
    GT = "gt"
    GE = "ge"
    AND = "and"
    OR = "or"


class UnaryOp(enum.StrEnum):
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    TANH = "tanh"
    ERF = "erf"
    ABS = "abs"
    ROUND_BF16 = "round_bf16"


class ReduceOp(enum.StrEnum):
    """`maxnum` ignores NaN (for row maxima whose NaNs surface anyway, as in softmax);
    `max` returns NaN when any element is NaN, like numpy."""

    SUM = "sum"
    MAX = "max"
    MAXNUM = "maxnum"
    ARGMAX = "argmax"


class LoopKind(enum.StrEnum):
    SERIAL = "serial"
    VECTOR = "vector"
    PARALLEL = "parallel"


class BufferRole(enum.StrEnum):
    INPUT = "input"
    OUTPUT = "output"
    TEMP = "temp"


BINARY_OPS = tuple(BinaryOp)
COMPARISONS = (BinaryOp.LT, BinaryOp.LE, BinaryOp.EQ, BinaryOp.NE, BinaryOp.GT, BinaryOp.GE)
UNARY_OPS = tuple(UnaryOp)
# What one evaluation of a unary costs, in the units of `expr_cost` (others cost 1): the
# transcendentals are a range reduction and a polynomial each. Passes that weigh or avoid
# expensive element work (materialisation, fission) read this table, not op names.
UNARY_COST = {"exp": 12, "log": 12, "tanh": 12, "erf": 16, "round_bf16": 3}
REDUCE_OPS = tuple(ReduceOp)
# Bytes per element of a buffer.
ELEMENT_BYTES = {F32: 4, F64: 8, I64: 8, BF16_STORAGE: 2, BOOL_STORAGE: 1}


def unknown_op(kind: str, op: str, known: type[enum.Enum]):
    """The error (a KinaError) for an op name outside its enum, raised by whoever
    dispatches on it."""
    from kina_frontend.diagnostics import KinaError  # the IR itself imports no front end

    return KinaError("lowering", f"internal error: unknown {kind} op {str(op)!r} in the loop "
                     f"IR (known: {', '.join(m.value for m in known)})", None)


def value_type(dtype: str) -> str:
    """The scalar type loads from a buffer of `dtype` produce (f32 for bf16, i1 for bool)."""
    return STORAGE_VALUE_TYPES.get(dtype, dtype)


class Expr:
    """Base of expression nodes; `dtype` is the scalar type the node evaluates to."""

    dtype: str

    def __add__(self, other):
        return add(self, other)

    def __mul__(self, other):
        return mul(self, other)


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: float | int
    dtype: str

    def __str__(self) -> str:
        if self.dtype == I64:
            return str(int(self.value))
        return f"{float(self.value)!r}:{self.dtype}"


@dataclass(frozen=True, eq=True)
class Var(Expr):
    name: str
    dtype: str = I64

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=True)
class Load(Expr):
    buffer: str
    index: tuple[Expr, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.buffer}[{', '.join(str(i) for i in self.index)}]"


@dataclass(frozen=True, eq=True)
class Binary(Expr):
    op: str
    lhs: Expr
    rhs: Expr
    dtype: str

    def __str__(self) -> str:
        symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//",
                  "mod": "%", "lt": "<", "le": "<=", "eq": "==", "ne": "!=", "gt": ">",
                  "ge": ">=", "and": "&&", "or": "||"}.get(self.op)
        if symbol:
            return f"({self.lhs} {symbol} {self.rhs})"
        return f"{self.op}({self.lhs}, {self.rhs})"


@dataclass(frozen=True, eq=True)
class Unary(Expr):
    op: str
    operand: Expr
    dtype: str

    def __str__(self) -> str:
        return f"{self.op}({self.operand})"


@dataclass(frozen=True, eq=True)
class Select(Expr):
    cond: Expr
    if_true: Expr
    if_false: Expr
    dtype: str

    def __str__(self) -> str:
        return f"select({self.cond}, {self.if_true}, {self.if_false})"


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    operand: Expr
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}({self.operand})"


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """Fold `body` over `var` in [0, extent) with `op` (see REDUCE_OPS); argmax yields the
    first best index."""

    op: str
    var: Var
    extent: int
    body: Expr
    dtype: str
    vector_width: int = 0  # >0: the reduction loop itself runs in vector tiles

    def __str__(self) -> str:
        tag = f" vector<{self.vector_width}>" if self.vector_width else ""
        return f"{self.op}[{self.var} < {self.extent}{tag}]({self.body})"


@dataclass(frozen=True, eq=True)
class CheckedId(Expr):
    """An integer id that must lie in [0, limit); otherwise the kernel stops with an
    error naming `site` (an index into the kernel's check sites) and the id's position."""

    value: Expr
    limit: int
    site: int
    position: tuple[Expr, ...]
    dtype: str = I64

    def __str__(self) -> str:
        position = ", ".join(str(p) for p in self.position)
        return f"checked({self.value} < {self.limit}, site {self.site}, at [{position}])"


# ---- statements -----------------------------------------------------------------------------

class Stmt:
    pass


class FusedStmt(Stmt):
    """A top-level statement that is a whole fused nest of its own (the attention backward,
    tilegen/attention_ir.py): it prints, counts its work and names its buffers itself."""

    def format_lines(self, pad: str) -> list[str]:
        raise NotImplementedError

    def work(self) -> int:
        raise NotImplementedError

    def reads(self) -> set[str]:
        raise NotImplementedError

    def writes(self) -> set[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    extent: int
    body: tuple[Stmt, ...]
    kind: str = "serial"  # serial | vector | parallel
    width: int = 1  # lanes of a vector loop, threads of a parallel one
    threads: int = 1  # a vector loop's tiles split across this many threads


@dataclass(frozen=True)
class Let(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True)
class Store(Stmt):
    buffer: str
    index: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True)
class GemmTiles:
    """Register block mr x nr, cache blocks mc x kc (A, L2) and kc x nc (B, L3)."""

    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    # B read where it lies, not packed (tilegen/gemm_small.py: products of few rows).
    b_in_place: bool = False


@dataclass(frozen=True)
class Gemm(Stmt):
    """out[batch..., i, j] = sum over k < k_extent of a_elem * b_elem, where a_elem reads
    A at (batch..., i, k) and b_elem reads B at (batch..., k, j) through the free vars
    `batch`, `i`, `j`, `k`. Lowered to packed panels and a register-blocked micro-kernel,
    split across `threads` threads by rows."""

    out: str
    batch: tuple[Var, ...]
    batch_extents: tuple[int, ...]
    i: Var
    j: Var
    k: Var
    m: int
    n: int
    k_extent: int
    a_elem: Expr
    b_elem: Expr
    dtype: str
    tiles: GemmTiles
    threads: int = 1


@dataclass(frozen=True)
class Attention(Stmt):
    """Fused attention (tilegen/attention.py): out[batch..., i, d] = sum over j < tk of
    softmax_j(score)[i, j] * v[batch..., j, d], where `score` is the element of the scores
    at (batch..., i, j) written in terms of `s`, the dot product of row i of `q` with
    column j of `kt`. `q` is [batch..., tq, d_extent], `kt` [batch..., key blocks,
    d_extent, block_keys] and `v` [batch..., tk padded, dv padded] (zero padding, see
    attention.padded_copy). Blocked with an online softmax; no tq x tk buffer. With `causal`
    = c, score is masked (its exp is 0) wherever j > i + c: key blocks past that are
    skipped and only blocks crossing it evaluate `score`, the rest `unmasked`."""

    out: str
    q: str
    kt: str
    v: str
    batch: tuple[Var, ...]
    batch_extents: tuple[int, ...]
    i: Var
    j: Var
    s: Var
    tq: int
    tk: int
    d_extent: int
    dv: int
    score: Expr
    unmasked: Expr
    causal: int | None
    dtype: str
    block_rows: int
    block_keys: int
    threads: int = 1
    stats: str | None = None  # [batch..., tq, 3]: each row's max and sum stored in 0 and 1

    def reads(self) -> set[str]:
        loads = {e.buffer for expr in (self.score, self.unmasked)
                 for e in subexpressions(expr) if isinstance(e, Load)}
        return loads | {self.q, self.kt, self.v}

    def writes(self) -> set[str]:
        return {self.out} | ({self.stats} if self.stats else set())


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str  # input | output | temp

    @property
    def strides(self) -> tuple[int, ...]:
        strides = []
        step = 1
        for dim in reversed(self.shape):
            strides.append(step)
            step *= dim
        return tuple(reversed(strides))

    @property
    def size(self) -> int:
        total = 1
        for dim in self.shape:
            total *= dim
        return total

    @property
    def nbytes(self) -> int:
        return self.size * ELEMENT_BYTES[self.dtype]


@dataclass(frozen=True)
class CheckSite:
    """Where an id check came from, to turn a failing check into a Python error."""

    op: str
    location: str
    limit: int
    ids_shape: tuple[int, ...]
    ids_argument: str | None  # the parameter the ids came from, when they did


@dataclass(frozen=True)
class Kernel:
    name: str
    buffers: tuple[Buffer, ...]
    body: tuple[Stmt, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    check_sites: tuple[CheckSite, ...] = field(default=())

    def buffer(self, name: str) -> Buffer:
        for buffer in self.buffers:
            if buffer.name == name:
                return buffer
        raise KeyError(name)


@dataclass(frozen=True)
class BufferWriter:
    """What a lowering rule returns when its result must be written into a buffer by its own
    statements rather than read as a view (softmax's row pass, a packed gemm, concat's
    parts, scatter_add): `emit(ctx, buffer_name)` gives them."""

    type: object
    emit: object


# ---- constructors with light constant folding on index arithmetic ---------------------------

def const(value: float, dtype: str = I64) -> Const:
    return Const(value, dtype)


def _is_const(expr: Expr, value=None) -> bool:
    return isinstance(expr, Const) and (value is None or expr.value == value)


def add(lhs: Expr, rhs: Expr) -> Expr:
    if lhs.dtype == I64:
        if _is_const(lhs, 0):
            return rhs
        if _is_const(rhs, 0):
            return lhs
        if _is_const(lhs) and _is_const(rhs):
            return Const(lhs.value + rhs.value, I64)
    return Binary("add", lhs, rhs, lhs.dtype)


def mul(lhs: Expr, rhs: Expr) -> Expr:
    if lhs.dtype == I64:
        if _is_const(lhs, 0) or _is_const(rhs, 0):
            return Const(0, I64)
        if _is_const(lhs, 1):
            return rhs
        if _is_const(rhs, 1):
            return lhs
        if _is_const(lhs) and _is_const(rhs):
            return Const(lhs.value * rhs.value, I64)
    return Binary("mul", lhs, rhs, lhs.dtype)


def binary(op: str, lhs: Expr, rhs: Expr) -> Expr:
    if op == "add":
        return add(lhs, rhs)
    if op == "mul":
        return mul(lhs, rhs)
    dtype = BOOL if op in COMPARISONS else lhs.dtype
    return Binary(op, lhs, rhs, dtype)


# ---- traversal ------------------------------------------------------------------------------

def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Load):
        return expr.index
    if isinstance(expr, Binary):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, (Unary,)):
        return (expr.operand,)
    if isinstance(expr, Cast):
        return (expr.operand,)
    if isinstance(expr, Select):
        return (expr.cond, expr.if_true, expr.if_false)
    if isinstance(expr, Reduce):
        return (expr.body,)
    if isinstance(expr, CheckedId):
        return (expr.value,) + expr.position
    return ()


def subexpressions(expr: Expr):
    """`expr` and every expression below it, parents first."""
    yield expr
    for child in children(expr):
        yield from subexpressions(child)


def map_children(expr: Expr, fn) -> Expr:
    """`expr` with `fn` applied to each direct child (index components, operands, a
    reduction's body)."""
    if isinstance(expr, Load):
        return Load(expr.buffer, tuple(fn(e) for e in expr.index), expr.dtype)
    if isinstance(expr, Binary):
        return Binary(expr.op, fn(expr.lhs), fn(expr.rhs), expr.dtype)
    if isinstance(expr, Unary):
        return Unary(expr.op, fn(expr.operand), expr.dtype)
    if isinstance(expr, Cast):
        return Cast(fn(expr.operand), expr.dtype)
    if isinstance(expr, Select):
        return Select(fn(expr.cond), fn(expr.if_true), fn(expr.if_false), expr.dtype)
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.var, expr.extent, fn(expr.body), expr.dtype,
                      expr.vector_width)
    if isinstance(expr, CheckedId):
        return CheckedId(fn(expr.value), expr.limit, expr.site,
                         tuple(fn(e) for e in expr.position), expr.dtype)
    return expr


def substitute(expr: Expr, values: dict[str, Expr]) -> Expr:
    """`expr` with the variables named in `values` replaced (loop and let variables are
    unique within a kernel, so no scoping is involved)."""
    if isinstance(expr, Var):
        return values.get(expr.name, expr)
    return map_children(expr, lambda child: substitute(child, values))


def perfect_nest(stmt: Stmt) -> list[For]:
    """The serial loops of `stmt` down to the first one whose body is not a single loop."""
    loops: list[For] = []
    inner = stmt
    while isinstance(inner, For) and inner.kind == "serial":
        loops.append(inner)
        if len(inner.body) != 1 or not isinstance(inner.body[0], For):
            break
        inner = inner.body[0]
    return loops


def statements(stmts):
    """Every statement in `stmts` and in the loops among them, parents first."""
    for stmt in stmts:
        yield stmt
        if isinstance(stmt, For):
            yield from statements(stmt.body)


def free_vars(expr: Expr) -> frozenset[str]:
    if isinstance(expr, Var):
        return frozenset((expr.name,))
    names: set[str] = set()
    for child in children(expr):
        names |= free_vars(child)
    if isinstance(expr, Reduce):
        names.discard(expr.var.name)
    return frozenset(names)


def is_expensive(expr: Expr) -> bool:
    """A transcendental unary (see UNARY_COST): worth keeping out of short dependent chains."""
    return isinstance(expr, Unary) and UNARY_COST.get(expr.op, 1) >= 12


def round_bf16(expr: Expr) -> Expr:
    """`expr` (f32) rounded to the nearest bfloat16, still as an f32 value. Loads from a
    bf16 buffer and already-rounded values are returned as they are."""
    if isinstance(expr, Unary) and expr.op == "round_bf16":
        return expr
    if isinstance(expr, Const):
        return Const(_bf16_value(float(expr.value)), F32)
    return Unary("round_bf16", expr, F32)


def _bf16_value(value: float) -> float:
    import ml_dtypes
    import numpy as np

    return float(np.float32(value).astype(ml_dtypes.bfloat16))


def contains(expr: Expr, kinds: tuple[type, ...]) -> bool:
    if isinstance(expr, kinds):
        return True
    return any(contains(c, kinds) for c in children(expr))


def expr_cost(expr: Expr) -> int:
    """A rough count of work to evaluate `expr` once (drives materialisation decisions)."""
    if isinstance(expr, (Const, Var)):
        return 0
    if isinstance(expr, Reduce):
        return expr.extent * (1 + expr_cost(expr.body))
    own = 1
    if isinstance(expr, Unary):
        own = UNARY_COST.get(expr.op, 1)
    elif isinstance(expr, Binary) and expr.op in ("div", "floordiv", "mod"):
        own = 4
    return own + sum(expr_cost(c) for c in children(expr))


def work(stmts) -> int:
    """Element operations a statement list performs (loop trip counts x expression cost)."""
    total = 0
    for stmt in stmts:
        if isinstance(stmt, For):
            total += stmt.extent * work(stmt.body)
        elif isinstance(stmt, Gemm):
            total += 2 * stmt.m * stmt.n * stmt.k_extent * _product(stmt.batch_extents)
        elif isinstance(stmt, Attention):
            total += 2 * stmt.tq * stmt.tk * (stmt.d_extent + stmt.dv) * \
                _product(stmt.batch_extents)
        elif isinstance(stmt, FusedStmt):
            total += stmt.work()
        else:
            total += max(1, expr_cost(stmt.value))
    return total


def _product(values) -> int:
    total = 1
    for value in values:
        total *= value
    return total


# ---- printer --------------------------------------------------------------------------------

def attention_blocks_text(rows: int, keys: int, causal: int | None, threads: int) -> str:
    """The blocking line of a fused attention statement, forward or backward (parsed back
    by loopir_parse's attention_blocks)."""
    return (f"blocks rows={rows} keys={keys} causal={'none' if causal is None else causal} "
            f"threads={threads}")


def format_kernel(kernel: Kernel) -> str:
    """The kernel as text; `tilegen.loopir_parse.parse_kernel` reads it back."""
    lines = [f"kernel @{kernel.name}"]
    for buffer in kernel.buffers:
        shape = "x".join(str(d) for d in buffer.shape) or "scalar"
        lines.append(f"  {buffer.role:<6} {buffer.name}: {buffer.dtype}[{shape}]")
    if list(kernel.outputs) != [b.name for b in kernel.buffers if b.role == "output"]:
        lines.append(f"  results {', '.join(kernel.outputs)}")
    for number, site in enumerate(kernel.check_sites):
        shape = "x".join(str(d) for d in site.ids_shape) or "scalar"
        source = f" from {site.ids_argument}" if site.ids_argument else ""
        lines.append(f"  check {number}: {site.op} {json.dumps(site.location)} limit "
                     f"{site.limit} ids [{shape}]{source}")
    lines.append("{")
    for stmt in kernel.body:
        lines.extend(_format_stmt(stmt, 1))
    lines.append("}")
    return "\n".join(lines)


def _format_stmt(stmt: Stmt, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(stmt, For):
        tag = "" if stmt.kind == "serial" else (
            f" vector<{stmt.width}>" if stmt.kind == "vector" else
            f" parallel<{stmt.width}>")
        if stmt.threads > 1:
            tag += f" parallel<{stmt.threads}>"
        lines = [f"{pad}for {stmt.var} in 0..{stmt.extent}{tag} {{"]
        for inner in stmt.body:
            lines.extend(_format_stmt(inner, depth + 1))
        lines.append(f"{pad}}}")
        return lines
    if isinstance(stmt, Let):
        return [f"{pad}let {stmt.var}: {stmt.var.dtype} = {stmt.value}"]
    if isinstance(stmt, Store):
        index = ", ".join(str(i) for i in stmt.index)
        return [f"{pad}{stmt.buffer}[{index}] = {stmt.value}"]
    if isinstance(stmt, Gemm):
        batch = "".join(f"{v}<{e}>, " for v, e in zip(stmt.batch, stmt.batch_extents,
                                                       strict=True))
        t = stmt.tiles
        return [f"{pad}gemm {stmt.out}[{batch}{stmt.i}<{stmt.m}>, {stmt.j}<{stmt.n}>] = "
                f"sum[{stmt.k} < {stmt.k_extent}](({stmt.a_elem} * {stmt.b_elem}))",
                f"{pad}  tiles mr={t.mr} nr={t.nr} kc={t.kc} mc={t.mc} nc={t.nc} "
                + ("b=in_place " if t.b_in_place else "") +
                f"threads={stmt.threads} dtype={stmt.dtype}"]
    if isinstance(stmt, Attention):
        batch = "".join(f"{v}<{e}>, " for v, e in zip(stmt.batch, stmt.batch_extents,
                                                       strict=True))
        return [f"{pad}attention {stmt.out}[{batch}{stmt.i}<{stmt.tq}>, d<{stmt.dv}>], "
                f"{stmt.s}: {stmt.s.dtype} = dot[{stmt.d_extent}]({stmt.q}, {stmt.kt})",
                f"{pad}  = softmax[{stmt.j} < {stmt.tk}]({stmt.score}) @ {stmt.v}",
                f"{pad}  unmasked {stmt.unmasked}",
                f"{pad}  " + attention_blocks_text(stmt.block_rows, stmt.block_keys, stmt.causal,
                                                   stmt.threads) +
                (f" stats={stmt.stats}" if stmt.stats else "")]
    if isinstance(stmt, FusedStmt):
        return stmt.format_lines(pad)
    raise TypeError(stmt)
