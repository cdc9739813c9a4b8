"""The driver's benchmarker: what `triton.autotune` times each config with
(`driver.active.get_benchmarker()`), with `triton.testing.do_bench`'s signature.

Triton's own `do_bench` is built for a GPU: before each timed call it zeroes a 64 MB buffer
to flush the device's L2, and it takes as many calls as fit in `rep` ms. On a CPU that
buffer is zeroed by the same cores that then run the kernel, in the same caches: each call
started cold, with the zeroing's dirty lines still being written back, unlike the calls the
tuned kernel then serves, and a 1024^3 matmul got about eight timed calls in 100 ms. And the
cores are shared with every other process: a burst of load lengthens a few calls by tens of
percent, which in eight calls moves the median that the autotuner compares (tutorial 03's
128 x 128 and 32 x 64 configs, ~15 % apart, swapped places from one process to the next).

Here the calls are timed warm (no flush: the kernel's inputs stay where its previous call
left them, as when it serves a loop), at least MIN_GROUPS groups of GROUP_CALLS calls in a
row after the warm-up, and each group counts as its fastest call: load from elsewhere only
adds time, and a burst rarely covers a whole group. The statistics asked for (`quantiles`,
or `return_mode`) are those of the groups' times, in milliseconds, with `do_bench`'s meaning
(quantiles interpolated linearly between the sorted times).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

GROUP_CALLS = 3
MIN_GROUPS = 10


def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
    if return_mode not in ("min", "max", "mean", "median", "all"):
        raise ValueError(f"do_bench: return_mode {return_mode!r} is not one of min, max, "
                         "mean, median, all")
    fn()  # compiles on a first call
    calls = 0
    warm_until = time.perf_counter() + warmup / 1000.0
    while calls < 2 or time.perf_counter() < warm_until:
        fn()
        calls += 1
    groups: list[float] = []
    start = time.perf_counter()
    while len(groups) < MIN_GROUPS or time.perf_counter() - start < rep / 1000.0:
        fastest = float("inf")
        for _ in range(GROUP_CALLS):
            if grad_to_none is not None:
                for tensor in grad_to_none:
                    tensor.grad = None
            began = time.perf_counter()
            fn()
            fastest = min(fastest, time.perf_counter() - began)
        groups.append(fastest * 1000.0)
    return summarize(groups, quantiles, return_mode)


def summarize(times: list[float], quantiles, return_mode: str):
    """`do_bench`'s result: the quantiles asked for (one float for one), else the times
    (`"all"`) or one statistic of them."""
    if quantiles is not None:
        if not all(0 <= q <= 1 for q in quantiles):
            raise ValueError(f"do_bench: quantiles {quantiles!r} must lie in [0, 1]")
        values = [float(v) for v in np.quantile(times, quantiles)]
        return values[0] if len(values) == 1 else values
    if return_mode == "all":
        return times
    return {"min": min, "max": max, "mean": statistics.mean,
            "median": statistics.median}[return_mode](times)
