"""The driver's side of autotuning: the tile chooser lowering calls for each matmul, and
the measurement it hands `autotune.choose` (a candidate compiled on its own and timed).

Lowering only calls the chooser it is given and autotune only calls the measure it is
given; this module, above both and above the runtime, is where they meet.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from kina_frontend import program_from_text
from kina_frontend.types import DType

from . import autotune
from . import loopir as L
from .config import Config
from .lower import TileChooser
from .pipeline import plan_program
from .runtime import jit_module


def tile_chooser(options: Config) -> TileChooser | None:
    """What lowering asks for a matmul's tiles under `options`: the autotuned choice when
    options.autotune (TILEGEN_AUTOTUNE=1), else None (the deterministic defaults)."""
    if not options.autotune:
        return None
    untuned = replace(options, autotune=False)

    def choose(dtype: str, batch: tuple[int, ...], m: int, n: int, k: int,
               threads: int) -> L.GemmTiles:
        def measure(dtype, batch, m, n, k, tiles) -> float:
            return time_candidate(dtype, batch, m, n, k, tiles, untuned)

        return autotune.choose(dtype, batch, m, n, k, threads, options.cache_dir,
                               options.target, measure)

    return choose


def time_candidate(dtype: str, batch: tuple[int, ...], m: int, n: int, k: int,
                   tiles: L.GemmTiles, options: Config) -> float:
    """Seconds for the best of three runs of a stand-alone batch x (m x k) @ (k x n) kernel
    compiled with `tiles`. Straight through the pipeline: the compile caches must not hand
    back a module built with another candidate."""
    kina_type = DType(dtype).kina_name

    def ty(*dims):
        return f"Tensor[{kina_type}, [{', '.join(str(d) for d in batch + dims)}], @host]"

    program = program_from_text(f"fn tune(a: {ty(m, k)}, b: {ty(k, n)}) -> {ty(m, n)} "
                                "{ return matmul(a, b); }", "<autotune>")
    plans = plan_program(program, ("tune",), options,
                         choose_tiles=lambda *shape: tiles)
    function = jit_module(plans).tune
    rng = np.random.default_rng(0)
    numpy_type = DType(dtype).numpy
    a = rng.standard_normal(batch + (m, k)).astype(numpy_type)
    b = rng.standard_normal(batch + (k, n)).astype(numpy_type)
    out = function(a, b)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        function(a, b, out=out)
        best = min(best, time.perf_counter() - started)
    return best
