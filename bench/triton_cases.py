"""The B7 work: each Triton tutorial kernel (as tests/test_triton_tutorials*.py write them)
on its tutorial's shapes, and a small form of each for TRITON_INTERPRET=1, with the torch
computation it is compared with. Imported by bench_b7_triton.py and, in a child process
under TRITON_INTERPRET=1, by triton_interpret_peer.py, so both run the same inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class Work:
    kernel: Callable[[], torch.Tensor]  # the Triton kernel's run, returning its output
    torch: Callable[[], torch.Tensor]   # torch eager on the same inputs
    rtol: float
    atol: float
    flops: float | None = None
    nbytes: float | None = None


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(14)


def vector_add(n: int) -> Work:
    from tests.test_triton_tutorials import add
    g = _generator()
    x, y = torch.rand(n, generator=g), torch.rand(n, generator=g)
    return Work(lambda: add(x, y), lambda: x + y, 0, 0, nbytes=12 * n)


def softmax(rows: int, cols: int, persistent: bool = False) -> Work:
    from tests.test_triton_tutorials import softmax_kernel, softmax_kernel_simple
    x = torch.randn(rows, cols, generator=_generator())
    block = triton.next_power_of_2(cols)

    def run():
        y = torch.empty_like(x)
        if persistent:
            programs = min(rows, 2 * 4)
            softmax_kernel[(programs, 1, 1)](y, x, x.stride(0), y.stride(0), rows, cols,
                                             BLOCK_SIZE=block, num_stages=2)
        else:
            softmax_kernel_simple[(rows,)](y, x, x.stride(0), y.stride(0), cols,
                                           BLOCK_SIZE=block)
        return y
    return Work(run, lambda: torch.softmax(x, dim=1), 1e-5, 1e-6, nbytes=8 * rows * cols)


def matmul(m: int, n: int, k: int, dtype=torch.float32, autotuned: bool = True) -> Work:
    from tests.test_triton_tutorials import matmul as tutorial_matmul
    from tests.test_triton_tutorials import matmul_kernel
    g = _generator()
    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)

    def fixed():  # the interpreter cannot autotune: the tutorial's smallest config
        c = torch.empty((m, n), dtype=torch.float16)
        config = matmul_kernel.configs[-1].kwargs
        grid = (triton.cdiv(m, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
        getattr(matmul_kernel, "fn", matmul_kernel)[grid](
            a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), ACTIVATION="", **config)
        return c
    run = (lambda: tutorial_matmul(a, b)) if autotuned else fixed
    return Work(run, lambda: (a.float() @ b.float()).half(), 1e-2, 1e-2, flops=2.0 * m * n * k)


def dropout(n: int) -> Work:
    from tests.test_triton_tutorials import _seeded_dropout
    x = torch.randn(n, generator=_generator())

    def run():
        out = torch.empty_like(x)
        _seeded_dropout[(triton.cdiv(n, 1024),)](x, out, n, 0.5, 123, BLOCK_SIZE=1024)
        return out
    # the peer: torch's own dropout (another random stream, so no equality guard)
    return Work(run, lambda: torch.nn.functional.dropout(x, 0.5), float("inf"), float("inf"),
                nbytes=8 * n)


def layer_norm(rows: int, cols: int) -> Work:
    from tests.test_triton_tutorials import _layer_norm_fwd_fused
    g = _generator()
    x, w, b = torch.randn(rows, cols, generator=g), torch.rand(cols, generator=g), \
        torch.randn(cols, generator=g)

    def run():
        y = torch.empty_like(x)
        mean, rstd = torch.empty(rows), torch.empty(rows)
        _layer_norm_fwd_fused[(rows,)](x, y, w, b, mean, rstd, x.stride(0), cols, 1e-5,
                                       BLOCK_SIZE=min(16384, triton.next_power_of_2(cols)))
        return y
    return Work(run, lambda: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5), 1e-4,
                1e-4, nbytes=8 * rows * cols)


def layer_norm_backward(rows: int, cols: int) -> Work:
    from tests.test_triton_tutorials_2 import LayerNorm
    g = _generator()
    w = torch.rand(cols, generator=g).requires_grad_(True)
    b = torch.rand(cols, generator=g).requires_grad_(True)
    x = (-2.3 + 0.5 * torch.randn(rows, cols, generator=g)).requires_grad_(True)
    dy = 0.1 * torch.randn(rows, cols, generator=g)

    def gradients(forward):
        y = forward()
        dx, _dw, _db = torch.autograd.grad(y, (x, w, b), dy)
        return dx
    return Work(lambda: gradients(lambda: LayerNorm.apply(x, (cols,), w, b, 1e-5)),
                lambda: gradients(lambda: torch.nn.functional.layer_norm(x, (cols,), w, b,
                                                                         1e-5)),
                1e-4, 1e-4)


def attention(heads: int, tokens: int, dim: int, block_m: int = 128, block_n: int = 64) -> Work:
    from tests.test_triton_tutorials_2 import attention as tutorial_attention
    g = _generator()
    q, k, v = (torch.randn(1, heads, tokens, dim, generator=g) * 0.5 for _ in range(3))
    scale = dim ** -0.5
    return Work(lambda: tutorial_attention(q, k, v, False, scale, BLOCK_M=block_m,
                                           BLOCK_N=block_n),
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale),
                1e-4, 1e-4, flops=4.0 * heads * tokens * tokens * dim)


def libdevice_asin(n: int) -> Work:
    from tests.test_triton_tutorials_2 import asin_kernel
    x = torch.rand(n, generator=_generator()) * 2 - 1

    def run():
        out = torch.empty_like(x)
        asin_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK_SIZE=1024)
        return out
    return Work(run, lambda: torch.asin(x), 1e-6, 1e-6, nbytes=8 * n)


def grouped_gemm(size: int, count: int = 4) -> Work:
    from tests.test_triton_tutorials_2 import group_gemm_fn, grouped_matmul_kernel_tutorial
    g = _generator()
    a = [torch.rand(size, size, generator=g).half() for _ in range(count)]
    b = [torch.rand(size, size, generator=g).half() for _ in range(count)]
    # the tutorial's own autotune configs (multiples of 128: the kernel has no masks)
    return Work(lambda: torch.cat(group_gemm_fn(a, b, kernel=grouped_matmul_kernel_tutorial)),
                lambda: torch.cat([(x.float() @ y.float()).half() for x, y in
                                   zip(a, b, strict=True)]),
                2e-3, 2e-1, flops=2.0 * count * size ** 3)


def persistent_matmul(m: int, n: int, k: int) -> Work:
    from tests.test_triton_tutorials_2 import matmul_persistent_tuned
    g = _generator()
    a, b = torch.randn(m, k, generator=g).half(), torch.randn(k, n, generator=g).half()
    # the tutorial's autotune configs and NUM_SMS (the tests' matmul_persistent uses small
    # blocks and NUM_SMS = 3 to check uneven tile counts)
    return Work(lambda: matmul_persistent_tuned(a, b), lambda: (a.float() @ b.float()).half(),
                2e-2, 2e-2, flops=2.0 * m * n * k)


# The tutorials' shapes (vs torch), and small ones the interpreter runs in seconds.
FULL = {
    "01 vector add 2^24": lambda: vector_add(1 << 24),
    "02 fused softmax [4096, 1024]": lambda: softmax(4096, 1024),
    "02 fused softmax persistent [4096, 1024]": lambda: softmax(4096, 1024, persistent=True),
    "03 matmul 1024^3 fp32 in fp16 out (autotuned)": lambda: matmul(1024, 1024, 1024),
    "04 dropout 2^24": lambda: dropout(1 << 24),
    "05 layer norm forward [4096, 4096]": lambda: layer_norm(4096, 4096),
    "05 layer norm backward [4096, 1024]": lambda: layer_norm_backward(4096, 1024),
    "06 fused attention T=1024 D=64 (4 heads)": lambda: attention(4, 1024, 64),
    "07 libdevice asin 98432": lambda: libdevice_asin(98432),
    "08 grouped gemm 4 x 512^3 fp16": lambda: grouped_gemm(512),
    "09 persistent matmul 1024^3 fp16": lambda: persistent_matmul(1024, 1024, 1024),
}
SMALL = {
    "01 vector add 4096": lambda: vector_add(4096),
    "02 fused softmax [64, 256]": lambda: softmax(64, 256),
    "03 matmul 64^3 fp16": lambda: matmul(64, 64, 64, torch.float16, autotuned=False),
    "04 dropout 4096": lambda: dropout(4096),
    "05 layer norm forward [64, 256]": lambda: layer_norm(64, 256),
    "06 fused attention T=64 D=16 (2 heads)": lambda: attention(2, 64, 16, 32, 16),
}  # (07's libdevice.asin is a CUDA libdevice call the interpreter cannot run)
