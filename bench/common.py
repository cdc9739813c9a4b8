"""Shared helpers of the benchmark groups: paths, provider names, metadata, guards, skips.

Every benchmark records what report.py needs in `benchmark.extra_info`:
`provider` (one of PROVIDERS), `threads` (what the provider ran with), and where they apply
`units`/`unit` (work items per timed call, for per-step and per-token figures), `flops` (for
GF/s) and `compile_s` (a provider's one-off compile time, shown as its own row).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BENCH_EXAMPLES = EXAMPLES / "bench"

# Provider names, in the order the report lists them.
TILEGEN = "tilegen"
TILEGEN_1T = "tilegen-1t"  # compiled with TILEGEN_NUM_THREADS=1, against the -1t peers
TILEGEN_ATTRIBUTE = "tilegen-attribute"  # called as `module.fn(...)`, not through a bound name
TILEGEN_BF16 = "tilegen-bf16"  # B9: BF16 operands (or weights), tilegen's default kernel choice
TILEGEN_BF16X3 = "tilegen-bf16x3"  # B8: F32 products as three bf16 products
TILEGEN_F32 = "tilegen-f32"  # B8: the F32 program for every batch (`tilegen` picks per shape)
TILEGEN_BF16_DOT = "tilegen-bf16-dot"  # B9: the vdpbf16ps kernel forced (TILEGEN_BF16_DOT=1)
NUMPY = "numpy"
NUMPY_1T = "numpy-1t"
TORCH = "torch"
TORCH_1T = "torch-1t"
TORCH_BF16 = "torch-bf16"
TORCH_SDPA = "torch-sdpa"
TORCH_COMPILE = "torch.compile"
JAX = "jax"
JAX_FORI = "jax-fori"
NUMBA = "numba"
SENTENCE_TRANSFORMERS = "sentence-transformers"
ONNXRUNTIME = "onnxruntime"
# B6 compile time: tilegen in a fresh interpreter, and again in the same process; the peers'
# first-call compile of the same StoryLM-0 forward in a fresh interpreter.
TILEGEN_COLD = "tilegen-cold"
TILEGEN_SAME_PROCESS = "tilegen-same-process"
TORCH_COMPILE_COLD = "torch.compile-cold"
JAX_COLD = "jax-cold"
NUMBA_COLD = "numba-cold"
PROVIDERS = (TILEGEN, TILEGEN_1T, TILEGEN_ATTRIBUTE, TILEGEN_BF16, TILEGEN_BF16_DOT,
             TILEGEN_BF16X3, TILEGEN_F32, NUMPY,
             NUMPY_1T, TORCH, TORCH_1T, TORCH_BF16, TORCH_SDPA,
             TORCH_COMPILE, JAX, JAX_FORI, NUMBA, SENTENCE_TRANSFORMERS, ONNXRUNTIME,
             TILEGEN_COLD, TILEGEN_SAME_PROCESS, TORCH_COMPILE_COLD, JAX_COLD, NUMBA_COLD)

SHORT_MODE_NOTE = "short mode (--benchmark-disable)"


def describe(benchmark, group: str, provider: str, *, threads: int | str,
             units: int | None = None, unit: str | None = None, flops: float | None = None,
             **extra: Any) -> None:
    """Put a benchmark in its group and record the provider's metadata for report.py."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}")
    benchmark.group = group
    info: dict[str, Any] = {"provider": provider, "threads": threads}
    if units is not None:
        info["units"] = units
        info["unit"] = unit
    if flops is not None:
        info["flops"] = float(flops)
    info.update(extra)
    benchmark.extra_info.update(info)


# --------------------------------------------------------------------------- providers


def need(module: str):
    """Import a peer, or skip the benchmark with the reason (a missing peer is never faked)."""
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -e "
                               f"'.[bench]' installs the peers that install cleanly)")


def numpy_threads() -> int:
    """OpenBLAS's current thread count, as threadpoolctl reports it."""
    from threadpoolctl import threadpool_info
    counts = [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]
    return counts[0] if counts else 1


def tilegen_threads() -> int | str:
    """tilegen's thread count for parallel loops (its config: TILEGEN_NUM_THREADS, default
    all cores; tiny kernels stay single-threaded whatever this says)."""
    try:
        from tilegen import config
    except ImportError:  # a tilegen without the config module
        return os.environ.get("TILEGEN_NUM_THREADS", "default")
    return config.load().num_threads


def xla_threads() -> int:
    """XLA:CPU runs its thread pool on every core unless told otherwise."""
    return os.cpu_count() or 1


@contextmanager
def numpy_single_thread() -> Iterator[None]:
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@contextmanager
def torch_threads(count: int | None) -> Iterator[int]:
    """Run with `count` intra-op threads (None: the default), restoring the setting after."""
    import torch
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


# PyTorch on StoryLM-0 (B1-B3) runs with one intra-op thread, as the peer figures
# were taken: at these sizes its OpenMP team only adds barrier cost (and, on a loaded machine,
# spin-wait stalls of milliseconds). Larger work runs with torch's default thread count.
TINY_TORCH_THREADS = 1


def tiny_torch_threads() -> AbstractContextManager:
    return torch_threads(TINY_TORCH_THREADS)


def timed_first_call(function: Callable[[], Any]) -> tuple[Any, float]:
    """Run `function` once and return its result and wall time (a JIT's compile + first run)."""
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- guards


def check_close(what: str, actual, expected, *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """The correctness guard: a provider's result against the float64 reference.

    Tolerances are relative to the reference's largest magnitude, so one check fits logits of
    any scale; the failure message names the work and the worst element."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape}, reference {expected.shape}")
    if not np.isfinite(actual).all():
        raise AssertionError(f"{what}: result has non-finite values")
    error = np.abs(actual - expected)
    bound = atol + rtol * float(np.abs(expected).max(initial=0.0))
    worst = float(error.max(initial=0.0))
    if worst > bound:
        index = np.unravel_index(int(error.argmax()), error.shape)
        raise AssertionError(f"{what}: max |error| {worst:.3g} > {bound:.3g} at {index} "
                             f"(got {actual[index]!r}, reference {expected[index]!r})")


def check_equal(what: str, actual, expected) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape or not np.array_equal(actual, expected):
        raise AssertionError(f"{what}: got {actual.tolist()}, reference {expected.tolist()}")


# --------------------------------------------------------------------------- tilegen


def compile_kina(path: Path):
    """Compile a Kina program with tilegen's in-process JIT."""
    import tilegen
    return tilegen.compile_file(path, jit=True)


# --------------------------------------------------------------------------- the harness


@dataclass
class Case:
    """One provider's way of doing a group's work.

    `call` does the work once and returns its result; `check` is the correctness guard on the
    result of `guard_call` (by default `call` itself; B4's step guards the same compiled
    function on other input values); `context` is entered around the guard and the timing
    (e.g. a thread limit); `extra` goes into extra_info (e.g. compile_s); `before_each` runs,
    untimed, before every timed call (B7: a neighbour library's work)."""

    call: Callable[[], Any]
    check: Callable[[Any], None]
    threads: int | str
    context: Callable[[], AbstractContextManager] = nullcontext
    extra: dict[str, Any] = field(default_factory=dict)
    guard_call: Callable[[], Any] | None = None
    before_each: Callable[[], Any] | None = None  # untimed work before every timed call


def measure(benchmark, group: str, provider: str, case: Case, *, units: int | None = None,
            unit: str | None = None, flops: float | None = None) -> None:
    """Guard once, then time: the provider's result is compared with the reference before any
    timed round (pytest-benchmark then calibrates, warms up if asked, and takes the rounds)."""
    with case.context():
        case.check((case.guard_call or case.call)())
        describe(benchmark, group, provider, threads=case.threads, units=units, unit=unit,
                 flops=flops, **case.extra)
        if case.before_each is None:
            benchmark(case.call)
        else:  # one call per round, right after the neighbour's work
            def setup() -> None:
                case.before_each()

            benchmark.pedantic(case.call, setup=setup, rounds=60, warmup_rounds=3)


# --------------------------------------------------------------------------- paired rounds

PAIRED = "paired"  # extra_info key of an alternating-rounds benchmark (measure_paired)
PAIRED_SECONDS = 2.0  # timed rounds' length per paired benchmark, about


def paired_ratio(ours: list[float], peer: list[float], resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(median, 2.5th and 97.5th percentile of a bootstrap of the median) of the per-round
    ratios peer / ours: how many times faster ours is, with its 95% interval."""
    ratios = np.asarray(peer, np.float64) / np.asarray(ours, np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ratios), size=(resamples, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


def measure_paired(benchmark, group: str, ours: tuple[str, Case], peer: tuple[str, Case], *,
                   flops: float | None = None, min_rounds: int = 20,
                   max_rounds: int = 400) -> None:
    """Time two providers in alternating rounds: each round calls both once, in turns of
    ours-then-peer and peer-then-ours, each call timed on its own, so a change of the
    machine's speed over the run (another VM on the cores, frequency) meets both alike and
    the per-round ratio peer / ours cancels it; separate benchmarks, seconds apart, do not
    share it. Both are guarded first. extra_info gets each side's median and the median
    ratio with its bootstrap 95% interval (paired_ratio); the benchmark's own statistics
    are those of a round (both calls)."""
    (ours_name, ours_case), (peer_name, peer_case) = ours, peer
    for name in (ours_name, peer_name):
        if name not in PROVIDERS:
            raise ValueError(f"unknown provider {name!r}")
    with ours_case.context(), peer_case.context():
        ours_case.check((ours_case.guard_call or ours_case.call)())
        peer_case.check((peer_case.guard_call or peer_case.call)())
        started = time.perf_counter()
        ours_case.call()
        peer_case.call()
        rounds = int(min(max_rounds, max(min_rounds, PAIRED_SECONDS /
                                         max(time.perf_counter() - started, 1e-9))))
        times: dict[str, list[float]] = {ours_name: [], peer_name: []}
        turn = [0]

        def one_round() -> None:
            order = ((ours_name, ours_case), (peer_name, peer_case))
            for name, case in order if turn[0] % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                case.call()
                times[name].append(time.perf_counter() - start)
            turn[0] += 1

        benchmark.group = group
        benchmark.pedantic(one_round, rounds=rounds, warmup_rounds=2, iterations=1)
    # The warm-up rounds ran one_round too; only the timed rounds count (in the short
    # mode, pytest-benchmark's --benchmark-disable, one untimed round ran).
    warmup = 0 if getattr(benchmark, "disabled", False) else 2
    ours_times, peer_times = (times[name][warmup:] for name in (ours_name, peer_name))
    ratio, low, high = paired_ratio(ours_times, peer_times)
    benchmark.extra_info.update({
        "provider": f"{ours_name} vs {peer_name}", PAIRED: True, "ours": ours_name,
        "peer": peer_name, "threads": f"{ours_case.threads} / {peer_case.threads}",
        "ours_median": float(np.median(ours_times)),
        "peer_median": float(np.median(peer_times)), "ratio": ratio, "ratio_low": low,
        "ratio_high": high, **({"flops": float(flops)} if flops else {})})
