"""B7: Triton tutorial kernels on the CPU through the tilegen backend, side by side with
torch eager on the tutorials' shapes (run once as tests by default; `--benchmark-only`
times them), plus the compile time of a tutorial kernel cold and from Triton's cache.

The grid runs over TILEGEN_NUM_THREADS threads (default: all cores); torch uses its own
default thread count."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from tests.test_triton_tutorials import (  # noqa: E402
    _layer_norm_fwd_fused,
    add,
    matmul,
    softmax_kernel_simple,
)
from tests.test_triton_tutorials_2 import attention  # noqa: E402

PROVIDERS = ["tilegen-triton", "torch"]


def _pick(provider, ours, theirs):
    return ours if provider == "tilegen-triton" else theirs


@pytest.mark.benchmark(group="B7 vector add 2^24 fp32")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_b7_vector_add(benchmark, provider):
    x, y = torch.rand(1 << 24), torch.rand(1 << 24)
    fn = _pick(provider, lambda: add(x, y), lambda: x + y)
    assert torch.equal(fn(), x + y)
    benchmark(fn)


def _softmax(x):
    y = torch.empty_like(x)
    softmax_kernel_simple[(x.shape[0],)](y, x, x.stride(0), y.stride(0), x.shape[1],
                                         BLOCK_SIZE=triton.next_power_of_2(x.shape[1]))
    return y


@pytest.mark.benchmark(group="B7 fused softmax [4096, 1024]")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_b7_softmax(benchmark, provider):
    x = torch.randn(4096, 1024)
    fn = _pick(provider, lambda: _softmax(x), lambda: torch.softmax(x, dim=1))
    torch.testing.assert_close(fn(), torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)
    benchmark(fn)


@pytest.mark.benchmark(group="B7 matmul 1024^3 fp32 in, fp16 out (tutorial 03, autotuned)")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_b7_matmul(benchmark, provider):
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    fn = _pick(provider, lambda: matmul(a, b), lambda: (a @ b).half())
    torch.testing.assert_close(fn().float(), (a @ b).half().float(), rtol=1e-2, atol=1e-2)
    benchmark(fn)


def _layer_norm(x, w, b):
    M, N = x.shape
    y = torch.empty_like(x)
    mean, rstd = torch.empty(M), torch.empty(M)
    _layer_norm_fwd_fused[(M,)](x, y, w, b, mean, rstd, x.stride(0), N, 1e-5,
                                BLOCK_SIZE=min(16384, triton.next_power_of_2(N)))
    return y


@pytest.mark.benchmark(group="B7 layer norm forward [4096, 4096]")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_b7_layer_norm(benchmark, provider):
    x, w, b = torch.randn(4096, 4096), torch.rand(4096), torch.randn(4096)
    reference = torch.nn.functional.layer_norm(x, (4096,), w, b, 1e-5)
    fn = _pick(provider, lambda: _layer_norm(x, w, b),
               lambda: torch.nn.functional.layer_norm(x, (4096,), w, b, 1e-5))
    torch.testing.assert_close(fn(), reference, rtol=1e-4, atol=1e-4)
    benchmark(fn)


@pytest.mark.benchmark(group="B7 fused attention T=1024 D=64 (4 heads)")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_b7_attention(benchmark, provider):
    q, k, v = (torch.randn(1, 4, 1024, 64) * 0.5 for _ in range(3))
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
    fn = _pick(provider, lambda: attention(q, k, v, False, 0.125, BLOCK_M=128, BLOCK_N=64),
               lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125))
    torch.testing.assert_close(fn(), reference, rtol=1e-4, atol=1e-4)
    benchmark(fn)


@pytest.mark.benchmark(group="B7 compile the softmax kernel")
@pytest.mark.parametrize("mode", ["cold", "from Triton's cache"])
def test_b7_compile(benchmark, mode, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    source = ASTSource(softmax_kernel_simple,
                       {"output_ptr": "*fp32", "input_ptr": "*fp32", "input_row_stride": "i32",
                        "output_row_stride": "i32", "n_cols": "i32",
                        "BLOCK_SIZE": "constexpr"},
                       constexprs={(5,): 1024})
    target = driver.active.get_current_target()
    triton.compile(source, target=target)  # warm the cache (and Triton's own imports)
    if mode == "cold":
        monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    compiled = benchmark(lambda: triton.compile(source, target=target))
    assert compiled.asm["obj"]
