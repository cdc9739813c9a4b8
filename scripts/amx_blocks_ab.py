#!/usr/bin/env python3
"""Time tilegen's BF16 product of one shape under variants of its AMX blocks and kernel
constants, interleaved in one process (ad hoc; not a benchmark). Each variant is
`name=mc,kc,nc[,CONSTANT=value...]`: 0 keeps amx_tiles' choice, constants are set on
tilegen/amx_kernel.py (RUN_STEPS, PREFETCH_C, C_ROWS_PER_STEP, AHEAD_ROWS, ...) or
tilegen/gemm_amx.py (COPY_ROWS, SPREAD_ROW_BYTES) while that variant compiles. Every
variant's result is checked against the float64 product first. Prints per variant the
best of the rounds' mean per call in CPU time (time.process_time: preemption on the
shared machine does not count, waiting threads do) and in wall time.

    TILEGEN_NUM_THREADS=1 python scripts/amx_blocks_ab.py 2048x2048x1024 \\
        now=0,0,0 narrow=0,0,512 runs8=0,0,0,RUN_STEPS=8

One thread's share of a two-thread product is the product of its columns on one thread
(2048^3 splits into two of 2048 x 2048 x 1024).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np


def _variant(spec: str):
    name, _, values = spec.partition("=")
    parts = values.split(",")
    blocks = tuple(int(value) for value in parts[:3])
    constants = {key: int(value) for key, value in (part.split("=") for part in parts[3:])}
    return name, blocks, constants


def _compile(m: int, k: int, n: int, index: int, blocks, constants, folder: Path):
    """The product compiled with the variant's blocks and constants in force."""
    import tilegen
    from tilegen import amx_kernel, gemm_amx, gemm_bf16

    chosen = gemm_bf16.amx_tiles

    def tiles(*args, **kwargs):
        picked = chosen(*args, **kwargs)
        mc, kc, nc = blocks
        return replace(picked, mc=mc or picked.mc, kc=kc or picked.kc, nc=nc or picked.nc)

    saved = []
    try:
        gemm_bf16.amx_tiles = tiles
        for key, value in constants.items():
            module = amx_kernel if hasattr(amx_kernel, key) else gemm_amx
            saved.append((module, key, getattr(module, key)))
            setattr(module, key, type(getattr(module, key))(value))
        path = folder / f"v{index}.kina"  # its own source: no cached module is reused
        path.write_text(f"fn v{index}(a: Tensor[BF16, [{m}, {k}], @host], "
                        f"b: Tensor[BF16, [{k}, {n}], @host]) -> "
                        f"Tensor[F32, [{m}, {n}], @host] {{ return matmul(a, b); }}\n")
        function = getattr(tilegen.compile_file(path, jit=True), f"v{index}")
        function.__name__  # noqa: B018 -- compiles now, while the settings hold
        return function
    finally:
        gemm_bf16.amx_tiles = chosen
        for module, key, value in saved:
            setattr(module, key, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help="MxKxN")
    parser.add_argument("variants", nargs="+", help="name=mc,kc,nc[,CONSTANT=value...]")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=3, help="calls per round")
    args = parser.parse_args()
    os.environ.setdefault("TILEGEN_BF16_DOT", "amx")
    m, k, n = (int(extent) for extent in args.shape.split("x"))
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n), np.float32).astype(ml_dtypes.bfloat16)
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    exact, bound = wide_a @ wide_b, k * 2.0 ** -24 * (np.abs(wide_a) @ np.abs(wide_b))
    out = np.empty((m, n), np.float32)
    functions = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, spec in enumerate(args.variants):
            name, blocks, constants = _variant(spec)
            function = _compile(m, k, n, index, blocks, constants, Path(scratch))
            function(a, b, out=out)
            if np.max(np.abs(out - exact) - bound) > 1e-30:
                raise SystemExit(f"{name}: wrong result")
            functions.append((name, function))
    cpu = {name: float("inf") for name, _ in functions}
    wall = dict(cpu)
    for _ in range(args.rounds):
        for name, function in functions:
            started, clock = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                function(a, b, out=out)
            cpu[name] = min(cpu[name], (time.process_time() - started) / args.calls)
            wall[name] = min(wall[name], (time.perf_counter() - clock) / args.calls)
    dots = m * n * k / (16 * 16 * 32)  # tdpbf16ps of whole tiles
    for name, _ in functions:
        print(f"{name:16s} cpu {cpu[name] * 1e3:8.3f} ms  wall {wall[name] * 1e3:8.3f} ms  "
              f"{cpu[name] * 1e9 / dots:6.2f} ns of CPU a tdpbf16ps")


if __name__ == "__main__":
    main()
