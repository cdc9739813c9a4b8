"""What lowering rules hand each other: a `View` is a tensor as an element rule (index ->
loop-IR expression), with the buffer it reads when it is stored."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kina_frontend.types import TensorType

from . import loopir as L


@dataclass
class View:
    type: TensorType
    at: Callable[[tuple[L.Expr, ...]], L.Expr]
    buffer: str | None = None
    param: str | None = None  # the function parameter this view reads, if it is one
    depth: int = 0  # how many fused ops deep its element expression is
