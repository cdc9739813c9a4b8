"""B10: sharing the cores. The B5 matmul 333x1000x777 of each library timed right after the
other library's matmul of the same shape, as programs that mix them run it: tilegen after
NumPy (OpenBLAS) and after PyTorch, and each of those after tilegen. Compare each median
with the same provider's isolated B5 median: the thread pools (OpenBLAS's, libgomp's,
PyTorch's OpenMP) each spin a while after their work and then fight over the cores.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.bench_b5_kernels import MATMULS
from bench.common import (
    BENCH_EXAMPLES,
    NUMPY,
    TILEGEN,
    TORCH,
    Case,
    check_close,
    measure,
    need,
    numpy_threads,
    tilegen_threads,
)

SHAPE = next(s for s in MATMULS if s.label == "333x1000x777")


@pytest.fixture(scope="module")
def pair(kina_function):
    """The inputs, the float64 reference and each library's matmul into its own buffer."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((SHAPE.m, SHAPE.k), dtype=np.float32)
    b = rng.standard_normal((SHAPE.k, SHAPE.n), dtype=np.float32)
    function = kina_function(BENCH_EXAMPLES / "matmul.kina", SHAPE.function)
    outs = {name: np.empty((SHAPE.m, SHAPE.n), np.float32) for name in (TILEGEN, NUMPY, TORCH)}
    calls = {TILEGEN: lambda: function(a, b, out=outs[TILEGEN]),
             NUMPY: lambda: np.matmul(a, b, out=outs[NUMPY])}
    return a, b, a.astype(np.float64) @ b.astype(np.float64), calls, outs


def _torch_call(a, b, out):
    torch = need("torch")
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
    return lambda: torch.matmul(ta, tb, out=tout)


@pytest.mark.parametrize("timed, neighbour", [(TILEGEN, NUMPY), (NUMPY, TILEGEN),
                                              (TILEGEN, TORCH), (TORCH, TILEGEN)])
def test_b10_matmul_next_to_another_library(benchmark, pair, timed, neighbour):
    a, b, expected, calls, outs = pair
    calls = dict(calls)
    if TORCH in (timed, neighbour):
        calls[TORCH] = _torch_call(a, b, outs[TORCH])
    threads = {TILEGEN: tilegen_threads, NUMPY: numpy_threads}.get(timed, lambda: "default")()
    case = Case(calls[timed], lambda c: check_close(f"B10 {timed}", np.asarray(outs[timed]),
                                                    expected, rtol=1e-5),
                threads, before_each=calls[neighbour])
    measure(benchmark, f"B10 matmul {SHAPE.label} after {neighbour}", timed, case, units=1,
            unit="call", flops=SHAPE.flops)
