#!/usr/bin/env python3
"""Time MiniLM's one-sentence call in this process (ad hoc; docs/models.md "Where the time
goes"). Not a benchmark: the B8 group is that.

    TILEGEN_NUM_THREADS=1 python scripts/minilm_one_sentence.py     # CPU time of the thread
    TILEGEN_NUM_THREADS=2 python scripts/minilm_one_sentence.py     # wall time
    TILEGEN_PROFILE=1 python scripts/minilm_one_sentence.py --profile

With one thread the call runs on the calling thread, so its CPU time (time.thread_time)
leaves out the time other jobs on a shared machine take from it; with more, only wall time
means anything. Prints the minimum and median over --calls calls after one warm-up call,
and with --profile the cycles of each group of statements (TILEGEN_PROFILE=1 needed).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from kina_models.minilm import SentenceEncoder


def _groups(function, calls: int) -> list[str]:
    from tilegen import profile
    from tilegen.loopir import Attention, Gemm

    body = profile._compiled(function).plan.kernel.body
    totals: dict[str, list[float]] = {}
    for stmt, cycles in zip(body, profile.counters(function), strict=True):
        if isinstance(stmt, Gemm):
            name = f"gemm {stmt.m} x {stmt.k_extent} x {stmt.n}"
        else:
            name = "attention" if isinstance(stmt, Attention) else "other statements"
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += cycles / calls
    every = sum(cycles for _, cycles in totals.values())
    return [f"  {name:26s} x{count:3d}  {cycles / 1e3:9.0f} kcycles a call  "
            f"{100 * cycles / every:5.1f} %"
            for name, (count, cycles) in sorted(totals.items(), key=lambda kv: -kv[1][1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentence", default="a short sentence")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    threads = os.environ.get("TILEGEN_NUM_THREADS", "default")
    clock = time.thread_time if threads == "1" else time.perf_counter
    encoder = SentenceEncoder()
    encoder.encode([args.sentence])
    function = encoder.function(*encoder.batches([args.sentence], 1)[0].ids.shape)
    if args.profile:
        from tilegen import profile
        profile.reset(function)
    times = []
    for _ in range(args.calls):
        start = clock()
        encoder.encode([args.sentence])
        times.append(clock() - start)
    kind = "CPU" if clock is time.thread_time else "wall"
    print(f"threads {threads}: {kind} min {min(times) * 1e3:.2f} ms, median "
          f"{np.median(times) * 1e3:.2f} ms over {args.calls} calls")
    if args.profile:
        print("\n".join(_groups(function, args.calls)))


if __name__ == "__main__":
    main()
