"""Every Kina op, one record each (see registry.py). Importing this package fills REGISTRY."""

from . import (  # noqa: F401  (registration)
    activations,
    compare,
    elementwise,
    indexing,
    layout,
    linalg,
    norms,
    reductions,
    slicing,
)
from .registry import REGISTRY, OpDef, Param, lookup

__all__ = ["REGISTRY", "OpDef", "Param", "lookup"]
