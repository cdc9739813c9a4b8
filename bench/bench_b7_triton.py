"""B7: Triton tutorial kernels on the CPU through the tilegen backend, side by side with
torch eager on the same work (run once as tests by default; `--benchmark-only` times)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

from tests.test_triton_tutorials import (  # noqa: E402
    add,
    matmul,
    softmax_kernel_simple,
)


@pytest.mark.benchmark(group="B7 vector add 2^24")
@pytest.mark.parametrize("provider", ["tilegen-triton", "torch"])
def test_b7_vector_add(benchmark, provider):
    x, y = torch.rand(1 << 24), torch.rand(1 << 24)
    fn = (lambda: add(x, y)) if provider == "tilegen-triton" else (lambda: x + y)
    assert torch.equal(fn(), x + y)
    benchmark(fn)


def _softmax(x):
    y = torch.empty_like(x)
    softmax_kernel_simple[(x.shape[0],)](y, x, x.stride(0), y.stride(0), x.shape[1],
                                         BLOCK_SIZE=triton.next_power_of_2(x.shape[1]))
    return y


@pytest.mark.benchmark(group="B7 fused softmax [4096, 1024]")
@pytest.mark.parametrize("provider", ["tilegen-triton", "torch"])
def test_b7_softmax(benchmark, provider):
    x = torch.randn(4096, 1024)
    fn = (lambda: _softmax(x)) if provider == "tilegen-triton" else \
        (lambda: torch.softmax(x, dim=1))
    torch.testing.assert_close(fn(), torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)
    benchmark(fn)


@pytest.mark.benchmark(group="B7 matmul 512^3 fp16 in, fp32 acc")
@pytest.mark.parametrize("provider", ["tilegen-triton", "torch"])
def test_b7_matmul(benchmark, provider):
    a = torch.randn(512, 512, dtype=torch.float16)
    b = torch.randn(512, 512, dtype=torch.float16)
    fn = (lambda: matmul(a, b)) if provider == "tilegen-triton" else (lambda: a @ b)
    torch.testing.assert_close(fn().float(), (a.float() @ b.float()).half().float(),
                               rtol=2e-2, atol=2e-2)
    benchmark(fn)
