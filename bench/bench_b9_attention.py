"""B9 (attention): causal attention [1, 8, T, 64] at T = 512, 1024, 2048 and 4096.

tilegen runs `examples/bench/causal_attention.kina` (a `where` mask computed from positions),
which it compiles to one fused, blocked online-softmax nest with causal key-block skipping
(docs/attention.md). The peers: PyTorch's fused `F.scaled_dot_product_attention(...,
is_causal=True)` (`torch-sdpa`), and the unfused formula softmax(q kᵀ / 8 + mask) v in
PyTorch and in NumPy, which store the [8, T, T] scores (512 MB at T = 4096).
Every result is checked against float64 SDPA before timing. The short (test) mode runs
T = 512 and 1024; the longer ones only under --benchmark-only.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.common import (
    BENCH_EXAMPLES,
    NUMPY,
    TILEGEN,
    TILEGEN_1T,
    TORCH,
    TORCH_SDPA,
    Case,
    check_close,
    measure,
    need,
    numpy_threads,
    tilegen_threads,
    torch_threads,
)

HEADS, WIDTH = 8, 64
LENGTHS = (512, 1024, 2048, 4096)
SHORT_LENGTHS = (512, 1024)
PROVIDERS = (TILEGEN, TILEGEN_1T, TORCH_SDPA, TORCH, NUMPY)
SCALE = 1 / np.sqrt(WIDTH)


def group(length: int) -> str:
    return f"B9 causal attention [1, {HEADS}, {length}, {WIDTH}]"


def flops(length: int) -> int:
    """The useful work: q kᵀ and p v over the unmasked half (with the diagonal)."""
    return 2 * 2 * HEADS * WIDTH * length * (length + 1) // 2


@pytest.fixture(scope="module")
def attention_data():
    cache = {}

    def get(length: int):
        if length not in cache:
            torch = need("torch")
            rng = np.random.default_rng(length)
            q, k, v = (rng.standard_normal((1, HEADS, length, WIDTH)).astype(np.float32)
                       for _ in range(3))
            wide = [torch.from_numpy(x).double() for x in (q, k, v)]
            expected = torch.nn.functional.scaled_dot_product_attention(
                *wide, is_causal=True).numpy()
            cache[length] = ((q, k, v), expected)
        return cache[length]
    return get


def _numpy_attention(q, k, v, mask):
    scores = q @ np.swapaxes(k, 2, 3) * np.float32(SCALE) + mask
    scores = np.exp(scores - scores.max(axis=3, keepdims=True))
    return (scores / scores.sum(axis=3, keepdims=True)) @ v


def _case(provider: str, length: int, inputs, expected, kina_function) -> Case:
    def check(y):
        check_close(group(length), np.asarray(y), expected, rtol=1e-5)

    if provider in (TILEGEN, TILEGEN_1T):
        threads = 1 if provider == TILEGEN_1T else None
        function = kina_function(BENCH_EXAMPLES / "causal_attention.kina",
                                 f"causal_attention_{length}", threads=threads)
        out = np.empty_like(inputs[0])
        return Case(lambda: function(*inputs, out=out), check, threads or tilegen_threads())
    rows = np.arange(length)
    mask = np.where(rows[None, :] <= rows[:, None], 0.0, -1e9).astype(np.float32)
    if provider == NUMPY:
        return Case(lambda: _numpy_attention(*inputs, mask), check, numpy_threads())
    torch = need("torch")
    q, k, v = (torch.from_numpy(x) for x in inputs)
    functional = torch.nn.functional
    if provider == TORCH_SDPA:
        def call():
            return functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        bias = torch.from_numpy(mask)

        def call():
            return torch.softmax(q @ k.transpose(2, 3) * SCALE + bias, dim=3) @ v
    return Case(call, lambda y: check(y.numpy()), torch.get_num_threads(),
                context=lambda: torch_threads(None))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("length", LENGTHS)
def test_b9_causal_attention(benchmark, provider, length, attention_data, kina_function,
                             short_mode):
    if short_mode and length not in SHORT_LENGTHS:
        pytest.skip(f"T = {length} runs under --benchmark-only")
    inputs, expected = attention_data(length)
    case = _case(provider, length, inputs, expected, kina_function)
    measure(benchmark, group(length), provider, case, flops=flops(length))
