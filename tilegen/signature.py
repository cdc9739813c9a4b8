"""What the runtime needs to know about one compiled function, without its IR.

A function compiled in this process has its KernelPlan; a function loaded back from a
library (tilegen.load_library) has only what the library recorded about it. Both reduce
to a `Signature`: the parameters and results the calls are checked against, and the id
check sites a failed call's error record points into. The library stores it as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .loopir import CheckSite


@dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[tuple[str, np.dtype, tuple[int, ...]], ...]  # (name, dtype, shape)
    results: tuple[tuple[np.dtype, tuple[int, ...]], ...]  # (dtype, shape)
    check_sites: tuple[CheckSite, ...]

    @classmethod
    def of_plan(cls, plan) -> Signature:
        function = plan.function
        return cls(function.name,
                   tuple((p.name, p.type.dtype.numpy, p.type.concrete_shape)
                         for p in function.params),
                   tuple((v.type.dtype.numpy, v.type.concrete_shape) for v in function.results),
                   plan.kernel.check_sites)

    def to_json(self) -> dict:
        return {"name": self.name,
                "params": [[n, d.name, list(s)] for n, d, s in self.params],
                "results": [[d.name, list(s)] for d, s in self.results],
                "check_sites": [[c.op, c.location, c.limit, list(c.ids_shape), c.ids_argument]
                                for c in self.check_sites]}

    @classmethod
    def from_json(cls, data: dict) -> Signature:
        return cls(data["name"],
                   tuple((n, np.dtype(d), tuple(s)) for n, d, s in data["params"]),
                   tuple((np.dtype(d), tuple(s)) for d, s in data["results"]),
                   tuple(CheckSite(op, location, limit, tuple(shape), argument)
                         for op, location, limit, shape, argument in data["check_sites"]))
