"""What `--run` draws and prints, shared by Kina programs (tilegen/cli_actions.py) and
`.loops` files (tilegen/loopfile.py): deterministic inputs, and durations."""

from __future__ import annotations

import numpy as np

from kina_frontend.diagnostics import KinaError
from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import Function
from kina_frontend.types import DType


def format_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: 850 ns, 12.3 us, 4.5 ms, 1.25 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.0f} ns"


def placeholder_values(function: Function, seed: int) -> list[np.ndarray]:
    """Deterministic inputs for an @main's placeholders, in order: floats are standard
    normal draws from numpy.random.default_rng(seed + k) for placeholder k; ids are drawn
    uniformly from [0, n) where n is the smallest bound of any op that reads them (a
    gather's table rows, a scatter_add's rows, a one_hot's class count; 8 when none
    does); BOOL values are true with probability 1/2. A seed + k below 0 is a diagnostic
    at placeholder k (NumPy seeds are non-negative)."""
    limits = id_limits(function)
    values = []
    for op in function.body:
        if op.op != "placeholder":
            continue
        number = op.attr("index")
        if seed + number < 0:
            raise KinaError("run", f"--seed {seed} gives placeholder {number} the NumPy seed "
                            f"{seed + number}, and seeds must be non-negative", op.span,
                            ("placeholder k is drawn with seed + k: use --seed 0 or more",))
        values.append(placeholder_value(op.result.type, seed + number,
                                        limits.get(op.result.name, 8)))
    return values


def placeholder_value(ttype, seed: int, id_limit: int) -> np.ndarray:
    """One deterministic value of `ttype`: standard normal floats from default_rng(seed),
    ids uniform in [0, id_limit), BOOL true with probability 1/2."""
    rng = np.random.default_rng(seed)
    shape = ttype.concrete_shape
    if ttype.dtype.is_float:
        return rng.standard_normal(shape).astype(ttype.dtype.numpy)
    if ttype.dtype == DType.BOOL:
        return rng.random(shape) < 0.5
    return rng.integers(0, id_limit, size=shape, dtype=np.int64)


def id_limits(function: Function) -> dict[str, int]:
    """For each I64 value an op reads as ids (its OpDef's `ids_bound`): the smallest bound."""
    limits: dict[str, int] = {}
    for op in function.body:
        definition = REGISTRY.get(op.op)
        if definition is None or definition.ids_bound is None:
            continue
        position, limit = definition.ids_bound(op)
        name = op.operands[position].name
        limits[name] = min(limit, limits.get(name, limit))
    return limits
