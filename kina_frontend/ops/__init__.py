"""Every Kina op, one record each (see registry.py). Importing this package fills REGISTRY."""

from . import elementwise, indexing, layout, linalg, reductions  # noqa: F401  (registration)
from .registry import REGISTRY, OpDef, Param, lookup

__all__ = ["REGISTRY", "OpDef", "Param", "lookup"]
