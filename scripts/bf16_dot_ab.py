#!/usr/bin/env python3
"""Time the `vdpbf16ps` BF16 kernel against tilegen's fp32 kernel on one thread (ad hoc;
not a benchmark): examples/bench/matmul_bf16.kina compiled with TILEGEN_BF16_DOT=1 (and
with 0, the f32 kernel on operands widened while packing, with --widen; with AMX, with
--amx) against examples/bench/matmul.kina on the same values in f32, the calls
interleaved, the best CPU time of --calls each. Every result is checked against the
float64 product of the bf16 values first. Compare the GF/s with the ceilings
scripts/bf16_peaks.py measures.

    TILEGEN_NUM_THREADS=1 python scripts/bf16_dot_ab.py [--widen] [--amx] [--2048]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ml_dtypes
import numpy as np

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "bench"


def compiled(path: Path, kernel: str | None):
    """The program at `path` compiled with TILEGEN_BF16_DOT=kernel (None: unset)."""
    import tilegen

    before = os.environ.pop("TILEGEN_BF16_DOT", None)
    if kernel is not None:
        os.environ["TILEGEN_BF16_DOT"] = kernel
    try:
        return tilegen.compile_file(path, jit=True)
    finally:
        os.environ.pop("TILEGEN_BF16_DOT", None)
        if before is not None:
            os.environ["TILEGEN_BF16_DOT"] = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widen", action="store_true")
    parser.add_argument("--amx", action="store_true")
    parser.add_argument("--2048", dest="big", action="store_true")
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("TILEGEN_NUM_THREADS", "1")
    modules = {"fp32": compiled(EXAMPLES / "matmul.kina", None),
               "dot": compiled(EXAMPLES / "matmul_bf16.kina", "1")}
    if args.widen:
        modules["widen"] = compiled(EXAMPLES / "matmul_bf16.kina", "0")
    if args.amx:
        modules["amx"] = compiled(EXAMPLES / "matmul_bf16.kina", "amx")
    shapes = [(1024, 1024, 1024), (333, 1000, 777)] + [(2048, 2048, 2048)] * args.big
    rng = np.random.default_rng(9)
    for m, k, n in shapes:
        label = f"{m}" if m == k == n else f"{m}x{k}x{n}"
        a = rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((k, n), np.float32).astype(ml_dtypes.bfloat16)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        bound = k * 2.0 ** -24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
        out = np.empty((m, n), np.float32)
        calls = {}
        for name, module in modules.items():
            if name == "fp32":
                calls[name] = (getattr(module, f"matmul_{label}"), a.astype(np.float32),
                               b.astype(np.float32))
            else:
                calls[name] = (getattr(module, f"matmul_bf16_{label}"), a, b)
        for name, (function, x, y) in calls.items():
            function(x, y, out=out)
            if np.any(np.abs(out - exact) > bound):
                raise SystemExit(f"{name} {label}: beyond f32 accumulation error")
        best = dict.fromkeys(calls, float("inf"))
        for _ in range(args.calls):
            for name, (function, x, y) in calls.items():
                start = time.process_time()
                function(x, y, out=out)
                best[name] = min(best[name], time.process_time() - start)
        flops = 2 * m * n * k
        print(f"{m}x{k}x{n}: " + "  ".join(
            f"{name} {seconds * 1e3:.2f} ms ({flops / seconds / 1e9:.0f} GF/s)"
            for name, seconds in best.items()) +
            f"  dot/fp32 speed {best['fp32'] / best['dot']:.2f}", flush=True)


if __name__ == "__main__":
    main()
