"""Element types and tensor types. Dimensions are sympy expressions while checking
(every `const` is a positive-integer symbol) and plain ints after specialisation."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import sympy

Dim = sympy.Expr | int


class DType(enum.Enum):
    F32 = "f32"
    F64 = "f64"
    I64 = "i64"

    @property
    def numpy(self) -> np.dtype:
        return np.dtype({"f32": np.float32, "f64": np.float64, "i64": np.int64}[self.value])

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64)

    @property
    def kina_name(self) -> str:
        return self.name

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> DType | None:
        for member in cls:
            if member.numpy == np.dtype(dtype):
                return member
        return None


# Names the surface accepts, with the dtypes the compiler cannot yet handle listed apart so
# the diagnostic can say "not supported" instead of "unknown".
SURFACE_DTYPES = {"F32": DType.F32, "F64": DType.F64, "I64": DType.I64}
RESERVED_DTYPES = frozenset({"BF16", "F16", "I32", "I8", "BOOL"})
SUPPORTED_PLACEMENTS = frozenset({"host"})


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    @property
    def concrete_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.shape)

    def numel(self):
        total = sympy.Integer(1)
        for dim in self.shape:
            total = total * dim
        return total

    def __str__(self) -> str:
        return f"{self.dtype.value}[{', '.join(format_dim(d) for d in self.shape)}]"

    def surface(self) -> str:
        """The Kina spelling, `Tensor[F32, [1, T, 4], @host]`."""
        dims = ", ".join(format_dim(d) for d in self.shape)
        return f"Tensor[{self.dtype.kina_name}, [{dims}], @host]"


_FORMATTED: dict = {}


def format_dim(dim: Dim) -> str:
    if isinstance(dim, int):
        return str(dim)
    # Memoised: the checker formats the same few dims for every obligation it records.
    text = _FORMATTED.get(dim)
    if text is None:
        text = sympy.sstr(dim).replace(" ", "")
        if len(_FORMATTED) > 100_000:
            _FORMATTED.clear()
        _FORMATTED[dim] = text
    return text


def const_symbol(name: str) -> sympy.Symbol:
    """The symbol a `const` stands for while shapes are checked: a positive integer."""
    return sympy.Symbol(name, integer=True, positive=True)
