"""The Kina syntax tree: small frozen nodes, each with the span it came from."""

from __future__ import annotations

from dataclasses import dataclass

from .diagnostics import Span


@dataclass(frozen=True)
class Node:
    span: Span


# ---- expressions -----------------------------------------------------------------------------

@dataclass(frozen=True)
class IntLit(Node):
    value: int


@dataclass(frozen=True)
class FloatLit(Node):
    value: float
    text: str


@dataclass(frozen=True)
class Name(Node):
    ident: str


@dataclass(frozen=True)
class Unary(Node):
    op: str  # "-"
    operand: Expr


@dataclass(frozen=True)
class Binary(Node):
    op: str  # one of + - * / @
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class ListExpr(Node):
    elements: tuple[Expr, ...]


@dataclass(frozen=True)
class TupleExpr(Node):
    elements: tuple[Expr, ...]


@dataclass(frozen=True)
class Keyword(Node):
    name: str
    value: Expr


@dataclass(frozen=True)
class Call(Node):
    callee: Expr
    args: tuple[Expr, ...]
    kwargs: tuple[Keyword, ...]


@dataclass(frozen=True)
class TensorTypeExpr(Node):
    dtype: Name
    dims: tuple[Expr, ...]
    placement: Name


Expr = IntLit | FloatLit | Name | Unary | Binary | ListExpr | TupleExpr | Call | TensorTypeExpr


# ---- statements and declarations ------------------------------------------------------------

@dataclass(frozen=True)
class Let(Node):
    targets: tuple[Name, ...]
    destructure: bool  # `let (a, b) = ...`
    annotation: TensorTypeExpr | None
    value: Expr


@dataclass(frozen=True)
class Return(Node):
    value: Expr


@dataclass(frozen=True)
class ExprStmt(Node):
    value: Expr


Stmt = Let | Return | ExprStmt


@dataclass(frozen=True)
class Param(Node):
    name: Name
    type: TensorTypeExpr


@dataclass(frozen=True)
class FnDecl(Node):
    name: Name
    attributes: tuple[Name, ...]
    params: tuple[Param, ...]
    results: tuple[TensorTypeExpr, ...]
    tuple_result: bool
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class ConstDecl(Node):
    name: Name
    value: Expr


@dataclass(frozen=True)
class Module(Node):
    consts: tuple[ConstDecl, ...]
    functions: tuple[FnDecl, ...]


def dump(node: object, indent: int = 0) -> str:
    """An indented, span-annotated rendering of a tree (`--emit ast`)."""
    pad = "  " * indent
    if isinstance(node, tuple):
        return "\n".join(dump(item, indent) for item in node)
    if not isinstance(node, Node):
        return f"{pad}{node!r}"
    fields = [(k, v) for k, v in vars(node).items() if k != "span"]
    scalars = [f"{k}={v!r}" for k, v in fields if not isinstance(v, (Node, tuple)) or v == ()]
    children = [(k, v) for k, v in fields if isinstance(v, (Node, tuple)) and v != ()]
    head = f"{pad}{type(node).__name__} @{node.span.line}:{node.span.column}"
    if scalars:
        head += " " + " ".join(scalars)
    lines = [head]
    for key, value in children:
        lines.append(f"{pad}  .{key}")
        lines.append(dump(value, indent + 2))
    return "\n".join(lines)
