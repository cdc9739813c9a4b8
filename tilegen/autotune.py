"""Autotuning of matmul tiles, like `triton.autotune`.

With TILEGEN_AUTOTUNE=1, the first compile of a matmul shape compiles each candidate
tiling as a stand-alone kernel, times it on random operands (best of a few runs) and
remembers the fastest: in memory, and in TILEGEN_CACHE_DIR/autotune.json when the disk
cache is on. Without it, `gemm.default_tiles` gives a deterministic choice.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import loopir as L
from .cache import _atomic_write
from .gemm import column_block, default_tiles
from .target import Target

# Register blocks (mr x nr) that keep 24 or fewer vector accumulators, and cache blocks.
REGISTER_BLOCKS = ((12, 2), (6, 4), (8, 3))  # (mr, vectors per row)
DEPTH_BLOCKS = (128, 256)
ROW_BLOCKS = (96, 192)

_forced = contextvars.ContextVar("tilegen_forced_tiles", default=None)
_memory: dict[str, L.GemmTiles] = {}
_lock = threading.Lock()


def candidates(dtype: str, m: int, n: int, k: int, target: Target) -> list[L.GemmTiles]:
    lanes = target.lanes(dtype)
    options = {default_tiles(dtype, m, n, k, target)}
    for mr, vectors in REGISTER_BLOCKS:
        nr = vectors * lanes
        if nr > 2 * max(n, lanes) or mr * vectors > target.vector_registers * 3 // 4:
            continue
        for kc in DEPTH_BLOCKS:
            kc = min(kc, k)
            for mc in ROW_BLOCKS:
                mc = max(mr, min(mc // mr * mr, -(-m // mr) * mr))
                options.add(L.GemmTiles(mr, nr, kc, mc, column_block(n, nr)))
    return sorted(options, key=lambda t: (t.mr, t.nr, t.kc, t.mc))


def choose(dtype: str, batch: tuple[int, ...], m: int, n: int, k: int, threads: int,
           cache_dir: str | None, target: Target) -> L.GemmTiles:
    """The fastest candidate measured on this machine; the default tiles for a target it
    cannot run (nothing to measure)."""
    forced = _forced.get()
    if forced is not None:
        return forced
    if not target.runs_on_host:
        return default_tiles(dtype, m, n, k, target)
    key = f"{target.name}:{target.cpu}|{dtype}|{batch}|{m}x{n}x{k}|t{threads}"
    with _lock:
        if key in _memory:
            return _memory[key]
        stored = _load(cache_dir).get(key)
    if stored is not None:
        tiles = L.GemmTiles(*stored)
    else:
        tiles = _measure(dtype, batch, m, n, k, target)
        if cache_dir:
            with _lock:
                table = _load(cache_dir)
                table[key] = list(tiles.__dict__.values())
                _atomic_write(Path(cache_dir) / "autotune.json",
                              json.dumps(table, indent=1, sort_keys=True).encode())
    with _lock:
        _memory[key] = tiles
    return tiles


def _load(cache_dir: str | None) -> dict:
    if not cache_dir:
        return {}
    try:
        table = json.loads((Path(cache_dir) / "autotune.json").read_text())
        return table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again (and rewrite it)


def _measure(dtype, batch, m, n, k, target: Target) -> L.GemmTiles:
    from kina_frontend import program_from_text

    from . import config
    from .pipeline import plan_program
    from .runtime import jit_module

    kina_type = {"f32": "F32", "f64": "F64"}[dtype]

    def ty(*dims):
        return f"Tensor[{kina_type}, [{', '.join(str(d) for d in batch + dims)}], @host]"

    program = program_from_text(f"fn tune(a: {ty(m, k)}, b: {ty(k, n)}) -> {ty(m, n)} "
                                "{ return matmul(a, b); }", "<autotune>")
    rng = np.random.default_rng(0)
    numpy_type = np.float32 if dtype == "f32" else np.float64
    a = rng.standard_normal(batch + (m, k)).astype(numpy_type)
    b = rng.standard_normal(batch + (k, n)).astype(numpy_type)
    best, best_time = None, float("inf")
    options = replace(config.load(), target=target)
    for tiles in candidates(dtype, m, n, k, target):
        # Straight through the pipeline: the compile caches must not hand back a module
        # built with another candidate.
        token = _forced.set(tiles)
        try:
            function = jit_module(plan_program(program, ("tune",), options)).tune
        finally:
            _forced.reset(token)
        out = function(a, b)
        elapsed = min(_time(function, a, b, out) for _ in range(3))
        if elapsed < best_time:
            best, best_time = tiles, elapsed
    return best


def _time(function, a, b, out) -> float:
    started = time.perf_counter()
    function(a, b, out=out)
    return time.perf_counter() - started
