"""B5: kernels written as small Kina programs (examples/bench/*.kina) against the same work in
each peer: fp32 matmul at five shapes, the row softmax of [4096, 1024], and one causal
attention head block softmax(q @ k^T * scale + mask) @ v with T = 256, Dh = 64.

Threads: NumPy (OpenBLAS) and PyTorch (MKL) run with their default thread count (all cores
here), and again pinned to one thread (`numpy-1t`, `torch-1t`); JAX with XLA's default pool;
numba single-threaded. tilegen runs with its own default (all cores), and `tilegen-1t` is the
same program compiled with TILEGEN_NUM_THREADS=1.
Outputs go to preallocated buffers where the API allows (`out=`), so no provider pays for
page-faulting a fresh result. Every result is checked against float64 NumPy before timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from bench.common import (
    BENCH_EXAMPLES,
    JAX,
    NUMBA,
    NUMPY,
    NUMPY_1T,
    TILEGEN,
    TILEGEN_1T,
    TORCH,
    TORCH_1T,
    TORCH_COMPILE,
    TORCH_SDPA,
    Case,
    check_close,
    measure,
    need,
    numpy_single_thread,
    numpy_threads,
    tilegen_threads,
    timed_first_call,
    torch_threads,
    xla_threads,
)
from bench.peers import kernels


@dataclass(frozen=True)
class MatmulShape:
    m: int
    k: int
    n: int
    function: str  # in examples/bench/matmul.kina
    slow: bool = False  # skipped in the short mode

    @property
    def label(self) -> str:
        if self.m == self.k == self.n:
            return f"{self.m}^3"
        return f"{self.m}x{self.k}x{self.n}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


MATMULS = (
    MatmulShape(256, 256, 256, "matmul_256"),
    MatmulShape(1024, 1024, 1024, "matmul_1024"),
    MatmulShape(2048, 2048, 2048, "matmul_2048", slow=True),
    MatmulShape(333, 1000, 777, "matmul_333x1000x777"),
    MatmulShape(36, 4, 4, "matmul_36x4x4"),
)
MATMUL_PROVIDERS = (TILEGEN, TILEGEN_1T, NUMPY, NUMPY_1T, TORCH, TORCH_1T, JAX)

SOFTMAX_SHAPE = (4096, 1024)
SOFTMAX_GROUP = "B5 row softmax [4096, 1024]"
SOFTMAX_PROVIDERS = (TILEGEN, TILEGEN_1T, NUMPY, TORCH, TORCH_1T, JAX, NUMBA)

ATTENTION_T, ATTENTION_DH = 256, 64
ATTENTION_GROUP = f"B5 attention head T={ATTENTION_T} Dh={ATTENTION_DH}"
ATTENTION_PROVIDERS = (TILEGEN, TILEGEN_1T, NUMPY, TORCH, TORCH_SDPA, TORCH_COMPILE, JAX)


def _random(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _torch_case(call, check, threads: int | None, torch) -> Case:
    """A PyTorch case at `threads` intra-op threads (None: the default)."""
    count = threads or torch.get_num_threads()
    return Case(call, check, count, context=lambda: torch_threads(threads))


# --------------------------------------------------------------------------- matmul


@pytest.fixture(scope="module")
def matmul_data():
    """Per shape: (a, b, float64 reference), built on first use."""
    cache = {}

    def get(shape: MatmulShape):
        if shape not in cache:
            a = _random(1, shape.m, shape.k)
            b = _random(2, shape.k, shape.n)
            cache[shape] = (a, b, a.astype(np.float64) @ b.astype(np.float64))
        return cache[shape]

    return get


def _matmul_case(provider: str, shape: MatmulShape, data, kina_function) -> Case:
    a, b, expected = data
    out = np.empty((shape.m, shape.n), np.float32)
    what = f"matmul {shape.label}"

    def check(c):
        check_close(what, np.asarray(c), expected, rtol=1e-5)

    if provider in (TILEGEN, TILEGEN_1T):
        threads = 1 if provider == TILEGEN_1T else None
        function = kina_function(BENCH_EXAMPLES / "matmul.kina", shape.function, threads=threads)
        return Case(lambda: function(a, b, out=out), check, threads or tilegen_threads())
    if provider in (NUMPY, NUMPY_1T):
        def call():
            return np.matmul(a, b, out=out)
        if provider == NUMPY:
            return Case(call, check, numpy_threads())
        return Case(call, check, 1, context=numpy_single_thread)
    if provider in (TORCH, TORCH_1T):
        torch = need("torch")
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        return _torch_case(lambda: torch.matmul(ta, tb, out=tout), lambda c: check(c.numpy()),
                           1 if provider == TORCH_1T else None, torch)
    if provider == JAX:
        jax = need("jax")
        matmul = jax.jit(lambda x, y: x @ y)
        ja, jb = jax.device_put(a), jax.device_put(b)
        _, compile_s = timed_first_call(lambda: matmul(ja, jb).block_until_ready())
        return Case(lambda: matmul(ja, jb).block_until_ready(), check, xla_threads(),
                    extra={"compile_s": compile_s})
    raise AssertionError(provider)


@pytest.mark.benchmark(min_rounds=10)
@pytest.mark.parametrize("provider", MATMUL_PROVIDERS)
@pytest.mark.parametrize("shape", MATMULS, ids=lambda s: s.label)
def test_b5_matmul(benchmark, shape, provider, matmul_data, kina_function, full_run_only):
    if shape.slow:
        full_run_only(f"matmul {shape.label}: 17 GFLOP per provider call, plus its float64 "
                      "reference")
    case = _matmul_case(provider, shape, matmul_data(shape), kina_function)
    measure(benchmark, f"B5 matmul {shape.label}", provider, case, units=1, unit="call",
            flops=shape.flops)


# --------------------------------------------------------------------------- softmax


@pytest.fixture(scope="module")
def softmax_data():
    x = _random(3, *SOFTMAX_SHAPE) * 4
    return x, kernels.softmax_numpy(x.astype(np.float64))


def _softmax_case(provider: str, x, expected, kina_function) -> Case:
    out = np.empty_like(x)

    def check(y):
        check_close("row softmax", np.asarray(y), expected, rtol=1e-5)

    if provider in (TILEGEN, TILEGEN_1T):
        threads = 1 if provider == TILEGEN_1T else None
        function = kina_function(BENCH_EXAMPLES / "softmax.kina", "softmax_rows",
                                 threads=threads)
        return Case(lambda: function(x, out=out), check, threads or tilegen_threads())
    if provider == NUMPY:
        return Case(lambda: kernels.softmax_numpy(x), check, 1)  # NumPy ufuncs: one thread
    if provider in (TORCH, TORCH_1T):
        torch = need("torch")
        tx, tout = torch.from_numpy(x), torch.from_numpy(out)
        return _torch_case(lambda: torch.softmax(tx, dim=1, out=tout),
                           lambda y: check(y.numpy()), 1 if provider == TORCH_1T else None,
                           torch)
    if provider == JAX:
        jax = need("jax")
        softmax = jax.jit(lambda y: jax.nn.softmax(y, axis=1))
        jx = jax.device_put(x)
        _, compile_s = timed_first_call(lambda: softmax(jx).block_until_ready())
        return Case(lambda: softmax(jx).block_until_ready(), check, xla_threads(),
                    extra={"compile_s": compile_s})
    if provider == NUMBA:
        need("numba")
        softmax_into = kernels.make_softmax_numba()

        def call():
            softmax_into(x, out)
            return out

        _, compile_s = timed_first_call(call)
        return Case(call, check, 1, extra={"compile_s": compile_s})
    raise AssertionError(provider)


@pytest.mark.parametrize("provider", SOFTMAX_PROVIDERS)
def test_b5_softmax(benchmark, provider, softmax_data, kina_function):
    case = _softmax_case(provider, *softmax_data, kina_function)
    measure(benchmark, SOFTMAX_GROUP, provider, case, units=1, unit="call")


# --------------------------------------------------------------------------- attention


@pytest.fixture(scope="module")
def attention_data():
    q, k, v = (_random(seed, ATTENTION_T, ATTENTION_DH) for seed in (4, 5, 6))
    rows = np.arange(ATTENTION_T)
    mask = np.where(rows[None, :] <= rows[:, None], 0.0, -1e9).astype(np.float32)
    scale = np.full((1, 1), 1 / np.sqrt(ATTENTION_DH), np.float32)
    inputs = (q, k, v, mask, scale)
    expected = kernels.attention_numpy(*(x.astype(np.float64) for x in inputs))
    return inputs, expected


def _attention_case(provider: str, inputs, expected, kina_function) -> Case:
    out = np.empty((ATTENTION_T, ATTENTION_DH), np.float32)

    def check(y):
        check_close("attention head", np.asarray(y), expected, rtol=1e-5)

    if provider in (TILEGEN, TILEGEN_1T):
        threads = 1 if provider == TILEGEN_1T else None
        function = kina_function(BENCH_EXAMPLES / "attention.kina", "attention_head",
                                 threads=threads)
        return Case(lambda: function(*inputs, out=out), check, threads or tilegen_threads())
    if provider == NUMPY:
        return Case(lambda: kernels.attention_numpy(*inputs), check, numpy_threads())
    if provider in (TORCH, TORCH_SDPA, TORCH_COMPILE):
        torch = need("torch")
        tensors = tuple(torch.from_numpy(x) for x in inputs)
        if provider == TORCH_SDPA:
            scale = float(inputs[4][0, 0])
            q, k, v, mask = tensors[:4]
            return _torch_case(lambda: kernels.attention_torch_sdpa(q, k, v, mask, scale),
                               lambda y: check(y.numpy()), None, torch)
        if provider == TORCH:
            return _torch_case(lambda: kernels.attention_torch(*tensors),
                               lambda y: check(y.numpy()), None, torch)
        from bench.peers import torch_storylm
        attention = torch_storylm.compiled(kernels.attention_torch)
        _, compile_s = timed_first_call(lambda: attention(*tensors))
        case = _torch_case(lambda: attention(*tensors), lambda y: check(y.numpy()), None, torch)
        case.extra["compile_s"] = compile_s
        return case
    if provider == JAX:
        jax = need("jax")
        attention = jax.jit(kernels.attention_jax)
        arrays = tuple(jax.device_put(x) for x in inputs)
        _, compile_s = timed_first_call(lambda: attention(*arrays).block_until_ready())
        return Case(lambda: attention(*arrays).block_until_ready(), check, xla_threads(),
                    extra={"compile_s": compile_s})
    raise AssertionError(provider)


@pytest.mark.parametrize("provider", ATTENTION_PROVIDERS)
def test_b5_attention(benchmark, provider, attention_data, kina_function, full_run_only):
    if provider == TORCH_COMPILE:
        full_run_only("torch.compile's first compile costs 10-30 s")
    case = _attention_case(provider, *attention_data, kina_function)
    measure(benchmark, ATTENTION_GROUP, provider, case, units=1, unit="call")
