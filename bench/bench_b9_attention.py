"""B9 (attention): causal attention [1, 8, T, 64] at T = 512, 1024, 2048 and 4096, forward
and backward.

tilegen runs `examples/bench/causal_attention.kina` (a `where` mask computed from positions),
which it compiles to one fused, blocked online-softmax nest with causal key-block skipping
(docs/attention.md). The peers: PyTorch's fused `F.scaled_dot_product_attention(...,
is_causal=True)` (`torch-sdpa`), and the unfused formula softmax(q kᵀ / 8 + mask) v in
PyTorch and in NumPy, which store the [8, T, T] scores (512 MB at T = 4096).
The backward side by side: tilegen runs `examples/bench/causal_attention_backward.kina`
(reverseMode of the same forward against an output cotangent, fused: the forward saves the
row statistics, the backward recomputes the scores per block); the peers are SDPA's
forward and autograd backward (`torch-sdpa`, `is_causal=True`) and the unfused formula's
autograd in PyTorch. Both sides compute the forward too (a gradient needs it).
Every result is checked against float64 SDPA (and its autograd) before timing. The short
(test) mode runs T = 512 and 1024; the longer ones only under --benchmark-only.
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


# ---- backward --------------------------------------------------------------------------------

BACKWARD_PROVIDERS = (TILEGEN, TILEGEN_1T, TORCH_SDPA, TORCH)


def backward_group(length: int) -> str:
    return f"B9 causal attention backward [1, {HEADS}, {length}, {WIDTH}]"


def backward_flops(length: int) -> int:
    """The useful work over the unmasked half: the forward's two products and the
    backward's five (q kᵀ again, dO vᵀ, dV, dQ, dK)."""
    return 7 * 2 * HEADS * WIDTH * length * (length + 1) // 2


@pytest.fixture(scope="module")
def backward_data():
    cache = {}

    def get(length: int):
        if length not in cache:
            torch = need("torch")
            rng = np.random.default_rng(length + 1)
            inputs = [rng.standard_normal((1, HEADS, length, WIDTH)).astype(np.float32)
                      for _ in range(4)]
            wide = [torch.from_numpy(x).double().requires_grad_() for x in inputs[:3]]
            out = torch.nn.functional.scaled_dot_product_attention(*wide, is_causal=True)
            expected = torch.autograd.grad(out, wide, torch.from_numpy(inputs[3]).double())
            cache[length] = (inputs, [g.numpy() for g in expected])
        return cache[length]
    return get


def _backward_case(provider: str, length: int, inputs, expected, kina_function) -> Case:
    def check(gradients):
        for name, mine, reference in zip(("dq", "dk", "dv"), gradients, expected, strict=True):
            check_close(f"{backward_group(length)} {name}", np.asarray(mine), reference,
                        rtol=1e-4)

    if provider in (TILEGEN, TILEGEN_1T):
        threads = 1 if provider == TILEGEN_1T else None
        function = kina_function(BENCH_EXAMPLES / "causal_attention_backward.kina",
                                 f"causal_attention_backward_{length}", threads=threads)
        return Case(lambda: function(*inputs), check, threads or tilegen_threads())
    torch = need("torch")
    q, k, v, dout = (torch.from_numpy(x) for x in inputs)
    functional = torch.nn.functional
    rows = torch.arange(length)
    bias = torch.where(rows[None, :] <= rows[:, None], 0.0, -1e9).float()

    def call():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        if provider == TORCH_SDPA:
            out = functional.scaled_dot_product_attention(*leaves, is_causal=True)
        else:
            scores = leaves[0] @ leaves[1].transpose(2, 3) * SCALE + bias
            out = torch.softmax(scores, dim=3) @ leaves[2]
        return torch.autograd.grad(out, leaves, dout)
    return Case(call, lambda gradients: check([g.numpy() for g in gradients]),
                torch.get_num_threads(), context=lambda: torch_threads(None))


@pytest.mark.parametrize("provider", BACKWARD_PROVIDERS)
@pytest.mark.parametrize("length", LENGTHS)
def test_b9_causal_attention_backward(benchmark, provider, length, backward_data,
                                      kina_function, short_mode):
    if short_mode and length not in SHORT_LENGTHS:
        pytest.skip(f"T = {length} runs under --benchmark-only")
    inputs, expected = backward_data(length)
    case = _backward_case(provider, length, inputs, expected, kina_function)
    measure(benchmark, backward_group(length), provider, case, flops=backward_flops(length))
