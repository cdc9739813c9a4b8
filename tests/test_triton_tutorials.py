"""Triton tutorial kernels, written as the tutorials write them, run on the CPU through the
tilegen backend and checked against PyTorch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

# ---- 01 vector add --------------------------------------------------------------------------

@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    output = x + y
    tl.store(output_ptr + offsets, output, mask=mask)


def add(x, y):
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output


@pytest.mark.parametrize("size", [98432, 1, 1023, 4097])
def test_vector_add(size):
    torch.manual_seed(0)
    x, y = torch.rand(size), torch.rand(size)
    assert torch.equal(add(x, y), x + y)


# ---- 02 fused softmax -----------------------------------------------------------------------

@triton.jit
def softmax_kernel_simple(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols,
                          BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start_ptr = input_ptr + row_idx * input_row_stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    input_ptrs = row_start_ptr + col_offsets
    row = tl.load(input_ptrs, mask=col_offsets < n_cols, other=-float("inf"))
    row_minus_max = row - tl.max(row, axis=0)
    numerator = tl.exp(row_minus_max)
    denominator = tl.sum(numerator, axis=0)
    softmax_output = numerator / denominator
    output_row_start_ptr = output_ptr + row_idx * output_row_stride
    output_ptrs = output_row_start_ptr + col_offsets
    tl.store(output_ptrs, softmax_output, mask=col_offsets < n_cols)


@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        input_ptrs = row_start_ptr + col_offsets
        mask = col_offsets < n_cols
        row = tl.load(input_ptrs, mask=mask, other=-float("inf"))
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        output_ptrs = output_row_start_ptr + col_offsets
        tl.store(output_ptrs, softmax_output, mask=mask)


@pytest.mark.parametrize("shape", [(1823, 781), (4, 1024), (37, 5)])
def test_fused_softmax_simple(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    y = torch.empty_like(x)
    n_rows, n_cols = x.shape
    softmax_kernel_simple[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols,
                                     BLOCK_SIZE=triton.next_power_of_2(n_cols))
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1823, 781), (7, 33)])
def test_fused_softmax_persistent(shape):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    y = torch.empty_like(x)
    n_rows, n_cols = x.shape
    num_programs = min(4, n_rows)
    softmax_kernel[(num_programs, 1, 1)](y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                                         BLOCK_SIZE=triton.next_power_of_2(n_cols),
                                         num_stages=2, num_warps=8)
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)


# ---- 03 matmul with autotune, GROUP_SIZE_M swizzle and leaky-relu epilogue -------------------

def get_cpu_autotune_config():
    return [
        triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32,
                       "GROUP_SIZE_M": 8}, num_stages=3, num_warps=8),
        triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32,
                       "GROUP_SIZE_M": 8}, num_stages=3, num_warps=8),
        triton.Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16,
                       "GROUP_SIZE_M": 4}, num_stages=4, num_warps=4),
    ]


@triton.autotune(configs=get_cpu_autotune_config(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                  BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                  ACTIVATION: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    tl.assume(pid_m >= 0)
    tl.assume(pid_n >= 0)
    tl.assume(stride_am > 0)
    tl.assume(stride_ak > 0)
    tl.assume(stride_bn > 0)
    tl.assume(stride_bk > 0)
    tl.assume(stride_cm > 0)
    tl.assume(stride_cn > 0)
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if ACTIVATION == "leaky_relu":
        accumulator = leaky_relu(accumulator)
    c = accumulator.to(tl.float16)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, 0.01 * x)


def matmul(a, b, activation=""):
    assert a.shape[1] == b.shape[0], "Incompatible dimensions"
    M, K = a.shape
    K, N = b.shape
    c = torch.empty((M, N), dtype=torch.float16)
    grid = lambda META: (  # noqa: E731
        triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"]),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), ACTIVATION=activation)
    return c


@pytest.mark.parametrize("activation", ["", "leaky_relu"])
def test_matmul_autotuned(activation):
    torch.manual_seed(0)
    a = torch.randn((83, 71), dtype=torch.float16)
    b = torch.randn((71, 97), dtype=torch.float16)
    out = matmul(a, b, activation)
    reference = a.float() @ b.float()
    if activation:
        reference = torch.where(reference >= 0, reference, 0.01 * reference)
    torch.testing.assert_close(out.float(), reference.half().float(), rtol=2e-3, atol=2e-3)


def test_matmul_fp32_transposed_operand():
    torch.manual_seed(2)
    a = torch.randn((45, 64))
    b = torch.randn((77, 64)).t()  # strided along the last axis: gathered loads
    c = torch.empty((45, 77), dtype=torch.float16)
    grid = lambda META: (  # noqa: E731
        triton.cdiv(45, META["BLOCK_SIZE_M"]) * triton.cdiv(77, META["BLOCK_SIZE_N"]),)
    matmul_kernel[grid](a, b, c, 45, 77, 64, a.stride(0), a.stride(1), b.stride(0),
                        b.stride(1), c.stride(0), c.stride(1), ACTIVATION="")
    torch.testing.assert_close(c.float(), (a @ b).half().float(), rtol=2e-3, atol=2e-3)


# ---- 05 layer norm forward ------------------------------------------------------------------

@triton.jit
def _layer_norm_fwd_fused(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    mean = 0
    _mean = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        a = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        _mean += a
    mean = tl.sum(_mean, axis=0) / N
    _var = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.)
        _var += x * x
    var = tl.sum(_var, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.).to(tl.float32)
        x_hat = (x - mean) * rstd
        y = x_hat * w + b
        tl.store(Y + cols, y, mask=mask)


@pytest.mark.parametrize("shape,block", [((151, 1531), 256), ((8, 64), 64)])
def test_layer_norm_forward(shape, block):
    torch.manual_seed(0)
    M, N = shape
    x = torch.randn(M, N) * 2 + 0.5
    w, b = torch.rand(N), torch.randn(N)
    y = torch.empty_like(x)
    mean, rstd = torch.empty(M), torch.empty(M)
    _layer_norm_fwd_fused[(M,)](x, y, w, b, mean, rstd, x.stride(0), N, 1e-5,
                                BLOCK_SIZE=block, num_warps=8)
    reference = torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)
    torch.testing.assert_close(y, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mean, x.mean(1), rtol=1e-5, atol=1e-5)


# ---- 04 low-memory dropout (tl.rand: Philox) ------------------------------------------------

@triton.jit
def _seeded_dropout(x_ptr, output_ptr, n_elements, p, seed, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    random = tl.rand(seed, offsets)
    x_keep = random > p
    output = tl.where(x_keep, x / (1 - p), 0.0)
    tl.store(output_ptr + offsets, output, mask=mask)


def _philox_uniform_reference(seed: int, offsets: np.ndarray) -> np.ndarray:
    """Philox-4x32-10 as triton.language.random defines it (independent NumPy code)."""
    mask32 = np.uint64(0xFFFFFFFF)
    c0 = offsets.astype(np.uint64) & mask32
    c1 = c2 = c3 = np.zeros_like(c0)
    k0 = np.full_like(c0, seed & 0xFFFFFFFF)
    k1 = np.full_like(c0, (seed >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        prod0 = c0 * np.uint64(0xD2511F53)
        prod1 = c2 * np.uint64(0xCD9E8D57)
        hi0, lo0 = prod0 >> np.uint64(32), prod0 & mask32
        hi1, lo1 = prod1 >> np.uint64(32), prod1 & mask32
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & mask32, lo1, (hi0 ^ c3 ^ k1) & mask32, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & mask32
        k1 = (k1 + np.uint64(0xBB67AE85)) & mask32
    as_int = c0.astype(np.uint32).view(np.int32).astype(np.int64)
    as_int = np.where(as_int < 0, -as_int - 1, as_int)
    return (as_int.astype(np.float32) * np.float32(4.6566127342e-10)).astype(np.float32)


def test_seeded_dropout_matches_philox():
    torch.manual_seed(0)
    n = 1000
    x = torch.randn(n)
    out = torch.empty_like(x)
    seed, p = 123, 0.5
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)  # noqa: E731
    _seeded_dropout[grid](x, out, n, p, seed, BLOCK_SIZE=128)
    uniform = _philox_uniform_reference(seed, np.arange(n))
    keep = uniform > p
    expected = np.where(keep, x.numpy() / (1 - p), 0.0).astype(np.float32)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    assert 0.3 < keep.mean() < 0.7


import numpy as np  # noqa: E402
