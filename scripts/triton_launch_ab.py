"""Ad-hoc checks of how the Triton backend launches and tunes kernels (direction only; two
threads, wall clock, everything in one process, variants interleaved).

    python scripts/triton_launch_ab.py order     # program order: contiguous halves vs runs
    python scripts/triton_launch_ab.py picks     # autotune picks: Triton's do_bench vs ours

`order`: tutorial 05's backward at [4096, 1024] (GROUP_SIZE_M = 256, fresh buffers per call
as the tutorial's `backward` allocates them), the dx kernel alone and the whole
`LayerNorm.apply` forward + backward against torch's, with the launcher's run length forced
to 0 (one contiguous half per thread) and as `driver.run_length` chooses it. REPS rounds.
With OMP_WAIT_POLICY=passive the CPU times leave out libgomp's spinning between calls.

`picks`: tutorial 03's three CPU configs at 1024³, each "autotune" a choice among them by
the lowest median of `do_bench(..., quantiles=(0.5, 0.2, 0.8))`, with Triton's `do_bench`
and with the driver's benchmarker alternating (TRIALS each), then the configs interleaved
REPS times for the truth.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time

import torch
import triton

import tilegen.triton_backend

tilegen.triton_backend.register()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.test_triton_tutorials import matmul_kernel  # noqa: E402
from tests.test_triton_tutorials_2 import LayerNorm, _layer_norm_bwd_dx_fused  # noqa: E402
from tilegen.triton_backend import benchmarker, driver  # noqa: E402

REPS = int(os.environ.get("REPS", "100"))


def _timed(calls: dict, reps: int) -> tuple[dict, dict]:
    """Wall-clock times and CPU times of the process (every thread's, spinning included;
    not the time another process held a core) of each call."""
    times = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    for rep in range(reps):
        for name in (list(calls) if rep % 2 else list(calls)[::-1]):
            start, start_cpu = time.perf_counter(), time.process_time()
            calls[name]()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return times, cpu


def _report(measured: tuple[dict, dict]) -> None:
    times, cpu = measured
    for name, values in times.items():
        ordered = sorted(values)
        tenth = ordered[len(ordered) // 10]
        print(f"{name:20s} wall min {ordered[0] * 1e3:7.3f}  p10 {tenth * 1e3:7.3f}"
              f"  median {statistics.median(values) * 1e3:7.3f} ms;  CPU median "
              f"{statistics.median(cpu[name]) * 1e3:7.3f} ms")


def order() -> None:
    rows, cols, group = 4096, 1024, 256
    g = torch.Generator().manual_seed(14)
    x = torch.randn(rows, cols, generator=g)
    dy = 0.1 * torch.randn(rows, cols, generator=g)
    w, b = torch.rand(cols, generator=g), torch.rand(cols, generator=g)
    mean, rstd = x.mean(1), 1 / torch.sqrt(x.var(1, unbiased=False) + 1e-5)
    chosen = driver.run_length

    def dx_kernel():
        locks = torch.zeros(2 * group, dtype=torch.int32)
        partial_dw, partial_db = torch.zeros(group, cols), torch.zeros(group, cols)
        _layer_norm_bwd_dx_fused[(rows,)](torch.empty_like(dy), dy, partial_dw, partial_db, x,
                                          w, mean, rstd, locks, x.stride(0), cols,
                                          BLOCK_SIZE_N=cols, GROUP_SIZE_M=group)

    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]

    def gradients(forward):
        return lambda: torch.autograd.grad(forward(), leaves, dy)

    whole = gradients(lambda: LayerNorm.apply(leaves[0], (cols,), leaves[1], leaves[2], 1e-5))

    def forced(call, run):
        def run_with():
            driver.run_length = chosen if run is None else (lambda *args: run)
            call()
        return run_with
    calls = {"dx halves": forced(dx_kernel, 0), "dx runs": forced(dx_kernel, None),
             "backward halves": forced(whole, 0), "backward runs": forced(whole, None),
             "backward torch": gradients(lambda: torch.nn.functional.layer_norm(
                 leaves[0], (cols,), leaves[1], leaves[2], 1e-5))}
    for call in calls.values():
        call()
    print(f"run length chosen: {chosen(group, rows, rows, driver.num_threads())}")
    _report(_timed(calls, REPS))
    driver.run_length = chosen


def picks() -> None:
    g = torch.Generator().manual_seed(14)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    configs = [config.kwargs for config in matmul_kernel.configs]

    def launch(config):
        def call():
            c = torch.empty((1024, 1024), dtype=torch.float16)
            grid = (1024 // config["BLOCK_SIZE_M"]) * (1024 // config["BLOCK_SIZE_N"])
            matmul_kernel.fn[(grid,)](a, b, c, 1024, 1024, 1024, *a.stride(), *b.stride(),
                                      *c.stride(), ACTIVATION="", **config)
        call()
        return call
    calls = {f"{c['BLOCK_SIZE_M']}x{c['BLOCK_SIZE_N']}x{c['BLOCK_SIZE_K']}": launch(c)
             for c in configs}
    benches = {"triton": triton.testing.do_bench, "ours": benchmarker.do_bench}
    chosen = {name: collections.Counter() for name in benches}
    for trial in range(int(os.environ.get("TRIALS", "6"))):
        for name in (list(benches) if trial % 2 else list(benches)[::-1]):
            medians = {config: benches[name](call, quantiles=(0.5, 0.2, 0.8))[0]
                       for config, call in calls.items()}
            chosen[name][min(medians, key=medians.get)] += 1
            print(trial, name, {k: round(v, 2) for k, v in medians.items()}, flush=True)
    for name, counter in chosen.items():
        print(f"{name} picked {dict(counter)}")
    _report(_timed(calls, REPS))


if __name__ == "__main__":
    torch.set_num_threads(2)
    {"order": order, "picks": picks}[sys.argv[1] if len(sys.argv) > 1 else "order"]()
