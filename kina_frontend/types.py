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
    # BF16 is a storage type: values widen to f32 on load, arithmetic runs in f32 and each
    # op's result rounds to nearest even (NumPy has no bfloat16: arrays are ml_dtypes').
    BF16 = "bf16"
    # BOOL: comparisons produce it, `where` consumes it; one byte per element (NumPy bool_).
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        if self is DType.BF16:
            # Imported on first use: ml_dtypes costs a compile that never meets BF16 ~10 ms.
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return _NUMPY_DTYPES[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64, DType.BF16)

    @property
    def compute(self) -> DType:
        """The type arithmetic on this type runs in: F32 for BF16, itself otherwise."""
        return DType.F32 if self is DType.BF16 else self

    @property
    def kina_name(self) -> str:
        return self.name

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> DType | None:
        for member in cls:
            if member.numpy == np.dtype(dtype):
                return member
        return None


_NUMPY_DTYPES = {DType.F32: np.dtype(np.float32), DType.F64: np.dtype(np.float64),
                 DType.I64: np.dtype(np.int64), DType.BOOL: np.dtype(np.bool_)}

# Names the surface accepts, with the dtypes the compiler cannot yet handle listed apart so
# the diagnostic can say "not supported" instead of "unknown".
SURFACE_DTYPES = {"F32": DType.F32, "F64": DType.F64, "I64": DType.I64, "BF16": DType.BF16,
                  "BOOL": DType.BOOL}
RESERVED_DTYPES = frozenset({"F16", "I32", "I8"})
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
