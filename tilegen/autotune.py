"""Autotuning of matmul tiles, like `triton.autotune`.

With TILEGEN_AUTOTUNE=1, the first compile of a matmul shape times each candidate tiling
and remembers the fastest: in memory, and in TILEGEN_CACHE_DIR/autotune.json when the
disk cache is on. Timing a candidate means compiling and running it, which only the
driver can do: it hands `choose` a `measure` callback (tilegen/tuning.py), so this module
imports no pipeline stage. Without autotuning, `gemm_tiles.default_tiles` gives a
deterministic choice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from . import loopir as L
from .cache import _atomic_write
from .gemm_tiles import column_block, default_tiles
from .target import Target

# Register blocks (mr x nr) that keep 24 or fewer vector accumulators, and cache blocks.
REGISTER_BLOCKS = ((12, 2), (6, 4), (8, 3))  # (mr, vectors per row)
DEPTH_BLOCKS = (128, 256)
ROW_BLOCKS = (96, 192)

# (dtype, batch, m, n, k, tiles) -> the best time of a few runs of the product
Measure = Callable[[str, tuple[int, ...], int, int, int, L.GemmTiles], float]

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
           cache_dir: str | None, target: Target, measure: Measure) -> L.GemmTiles:
    """The fastest candidate by `measure`, remembered; the
    default tiles for a target this machine cannot run (nothing to measure)."""
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
        tiles = min(candidates(dtype, m, n, k, target),
                    key=lambda t: measure(dtype, batch, m, n, k, t))
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
