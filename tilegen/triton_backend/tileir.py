"""The tile IR: a kernel's TTIR, after libtriton's passes, as small frozen dataclasses.

Every value is a scalar or a static-shape tile (`TileType.shape == ()` for scalars); ops
keep TTIR's names (`arith.addf`, `tt.load`, `scf.for`, ...) with their attributes decoded
into Python values (predicates as names, float constants as floats, `order` as a tuple),
and their source location. `format_program` prints it in an MLIR-like form; it is the
`ttile` stage of the backend (the text Triton's cache and `TRITON_KERNEL_DUMP` keep).
"""

from __future__ import annotations

from dataclasses import dataclass

# Element types, as TTIR spells them (pointers are `ptr<elem>`).
FLOAT_ELEMS = ("f16", "bf16", "f32", "f64")
INT_ELEMS = ("i1", "i8", "i16", "i32", "i64")
ELEM_BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64,
             "f16": 16, "bf16": 16, "f32": 32, "f64": 64}


def element_bytes(elem: str) -> int:
    """Bytes per element in memory: booleans are bytes, pointers 8-byte addresses."""
    if elem.startswith("ptr<"):
        return 8
    return max(1, ELEM_BITS[elem] // 8)


class TileError(Exception):
    """A kernel uses something the tilegen backend does not support; the message names the
    op and the kernel's source line."""


@dataclass(frozen=True)
class Loc:
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class TileType:
    elem: str  # f32, i32, i1, ptr<f32>, ...
    shape: tuple[int, ...] = ()

    @property
    def is_pointer(self) -> bool:
        return self.elem.startswith("ptr<")

    @property
    def pointee(self) -> str:
        return self.elem[4:-1]

    @property
    def numel(self) -> int:
        total = 1
        for dim in self.shape:
            total *= dim
        return total

    def __str__(self) -> str:
        if not self.shape:
            return self.elem
        return f"tensor<{'x'.join(str(d) for d in self.shape)}x{self.elem}>"


@dataclass(frozen=True)
class Value:
    id: int
    type: TileType

    def __str__(self) -> str:
        return f"%{self.id}"


@dataclass(frozen=True)
class Block:
    args: tuple[Value, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Op:
    name: str
    results: tuple[Value, ...]
    operands: tuple[Value, ...]
    attrs: tuple[tuple[str, object], ...] = ()
    regions: tuple[Block, ...] = ()
    loc: Loc | None = None

    def attr(self, key: str, default=None):
        for name, value in self.attrs:
            if name == key:
                return value
        return default

    @property
    def result(self) -> Value:
        return self.results[0]

    def where(self, kernel: str) -> str:
        place = f" at {self.loc}" if self.loc else ""
        return f"`{self.name}` in kernel `{kernel}`{place}"


@dataclass(frozen=True)
class Param:
    name: str
    value: Value
    divisibility: int = 1


@dataclass(frozen=True)
class Program:
    name: str
    params: tuple[Param, ...]
    body: Block


def walk(block: Block):
    """Every op of `block` and of the regions below it, parents first."""
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk(region)


def reaches_any(roots, found, below) -> bool:
    """Whether a node reachable from `roots` (roots included) satisfies `found`, where
    `below(node)` gives the nodes to go on to (none: stop there). Each node is visited once:
    values and lazy tiles form DAGs in which one value read twice (`y = y * 0.5 + y`
    unrolled, tl.sort's bitonic network) makes a walk over paths take 2^depth steps."""
    stack, seen = list(roots), set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if found(node):
            return True
        stack.extend(below(node))
    return False


# ---- printer --------------------------------------------------------------------------------

def format_program(program: Program) -> str:
    params = ", ".join(f"{p.value}: {p.value.type}" +
                       (f" {{divisibility = {p.divisibility}}}" if p.divisibility > 1 else "")
                       + f" /* {p.name} */" for p in program.params)
    lines = [f"tile.kernel @{program.name}({params}) {{"]
    lines.extend(_format_block(program.body, 1))
    lines.append("}")
    return "\n".join(lines)


def _format_block(block: Block, depth: int) -> list[str]:
    pad = "  " * depth
    lines = []
    if block.args:
        args = ", ".join(f"{a}: {a.type}" for a in block.args)
        lines.append(f"{pad[:-2]}^({args}):")
    for op in block.ops:
        lines.extend(_format_op(op, depth))
    return lines


def _format_op(op: Op, depth: int) -> list[str]:
    pad = "  " * depth
    results = ", ".join(str(r) for r in op.results)
    head = f"{results} = " if results else ""
    operands = ", ".join(str(o) for o in op.operands)
    attrs = ""
    if op.attrs:
        attrs = " {" + ", ".join(f"{k} = {_format_attr(v)}" for k, v in op.attrs) + "}"
    types = ", ".join(str(r.type) for r in op.results)
    tail = f" : {types}" if types else ""
    loc = f"  // {op.loc}" if op.loc else ""
    line = f"{pad}{head}{op.name}({operands}){attrs}{tail}"
    if not op.regions:
        return [line + loc]
    lines = [line + " {" + loc]
    for number, region in enumerate(op.regions):
        if number:
            lines.append(f"{pad}}} {{")
        lines.extend(_format_block(region, depth + 1))
    lines.append(f"{pad}}}")
    return lines


def _format_attr(value) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_format_attr(v) for v in value) + "]"
    if isinstance(value, str):
        return value
    return str(value)
