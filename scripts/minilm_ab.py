#!/usr/bin/env python3
"""Interleaved A/B of MiniLM's one-sentence call under different settings of the small-M
product (ad hoc; docs/models.md "Where the time goes"). Not a benchmark: the B8 group is.

    TILEGEN_NUM_THREADS=1 python scripts/minilm_ab.py "" "DEPTH_BLOCK=16 PREFETCH_LOCALITY=3"

Each argument is a variant: NAME=VALUE settings of `tilegen.gemm_small`'s module constants
(empty: as they are), applied while that variant's encoder function is compiled. All
variants are compiled in this one process and their calls interleaved in rounds, so a
shared machine's load falls on each alike. With one thread the call runs on the calling
thread and its CPU time is timed (time.thread_time); with more, wall time. Prints each
variant's minimum, 10th percentile and median, and the largest difference of its
embedding from the first variant's.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("TILEGEN_MEMORY_CACHE", "0")  # each variant compiled anew

from kina_models.minilm import SentenceEncoder  # noqa: E402
from tilegen import gemm_small  # noqa: E402


def _settings(spec: str) -> dict[str, int]:
    settings = {}
    for item in spec.split():
        name, _, value = item.partition("=")
        if not hasattr(gemm_small, name) or not name.isupper():
            raise SystemExit(f"tilegen.gemm_small has no constant {name!r}")
        settings[name] = int(value)
    return settings


def _compiled(encoder: SentenceEncoder, settings: dict[str, int]):
    saved = {name: getattr(gemm_small, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(gemm_small, name, value)
        module = encoder.compile(1, encoder.length_step)
        return module.minilm_encode
    finally:
        for name, value in saved.items():
            setattr(gemm_small, name, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--sentence", default="a short sentence")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=5, help="calls per variant per round")
    args = parser.parse_args()
    one = os.environ.get("TILEGEN_NUM_THREADS") == "1"
    clock = time.thread_time if one else time.perf_counter
    encoder = SentenceEncoder()
    (batch,) = encoder.batches([args.sentence], 1)
    inputs = (batch.ids, batch.type_ids, batch.mask, *encoder.weights_for(*batch.ids.shape))
    functions = [_compiled(encoder, _settings(spec)) for spec in args.variants]
    first = functions[0](*inputs)
    differences = [float(np.abs(f(*inputs) - first).max()) for f in functions]
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(args.rounds):
        for function, samples in zip(functions, times, strict=True):
            for _ in range(args.calls):
                start = clock()
                function(*inputs)
                samples.append(clock() - start)
    kind = "CPU" if one else "wall"
    for spec, samples, difference in zip(args.variants, times, differences, strict=True):
        ms = np.array(samples) * 1e3
        print(f"[{spec or 'as is'}] {kind} min {ms.min():.2f} p10 {np.percentile(ms, 10):.2f} "
              f"median {np.median(ms):.2f} ms; max |embedding - first| {difference:.1e}")


if __name__ == "__main__":
    main()
