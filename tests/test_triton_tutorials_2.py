"""Triton tutorials 05 (layer norm backward with its atomic_cas lock), 06 (fused attention,
plain pointers), 07 (a libdevice function), 08 (grouped GEMM: pointers loaded from memory)
and 09 (persistent matmul), written as the tutorials write them, on the tilegen backend
against torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402

from tests.test_triton_tutorials import _layer_norm_fwd_fused  # noqa: E402

# ---- 05 layer norm backward -----------------------------------------------------------------

@triton.jit
def _layer_norm_bwd_dx_fused(DX, DY, DW, DB, X, W, Mean, Rstd, Lock, stride, N,
                             GROUP_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE_N)
    mask = cols < N
    X += row * stride
    DY += row * stride
    DX += row * stride
    lock_id = row % GROUP_SIZE_M
    Lock += lock_id
    Count = Lock + GROUP_SIZE_M
    DW = DW + lock_id * N + cols
    DB = DB + lock_id * N + cols
    x = tl.load(X + cols, mask=mask, other=0).to(tl.float32)
    dy = tl.load(DY + cols, mask=mask, other=0).to(tl.float32)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = (x - mean) * rstd
    wdy = w * dy
    xhat = tl.where(mask, xhat, 0.)
    wdy = tl.where(mask, wdy, 0.)
    c1 = tl.sum(xhat * wdy, axis=0) / N
    c2 = tl.sum(wdy, axis=0) / N
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(DX + cols, dx, mask=mask)
    partial_dw = (dy * xhat).to(w.dtype)
    partial_db = (dy).to(w.dtype)
    while tl.atomic_cas(Lock, 0, 1) == 1:
        pass
    count = tl.load(Count)
    if count == 0:
        tl.atomic_xchg(Count, 1)
    else:
        partial_dw += tl.load(DW, mask=mask)
        partial_db += tl.load(DB, mask=mask)
    tl.store(DW, partial_dw, mask=mask)
    tl.store(DB, partial_db, mask=mask)
    tl.debug_barrier()
    tl.atomic_xchg(Lock, 0)


@triton.jit
def _layer_norm_bwd_dwdb(DW, DB, FINAL_DW, FINAL_DB, M, N, BLOCK_SIZE_M: tl.constexpr,
                         BLOCK_SIZE_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    dw = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for i in range(0, M, BLOCK_SIZE_M):
        rows = i + tl.arange(0, BLOCK_SIZE_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        offs = rows[:, None] * N + cols[None, :]
        dw += tl.load(DW + offs, mask=mask, other=0.)
        db += tl.load(DB + offs, mask=mask, other=0.)
    sum_dw = tl.sum(dw, axis=0)
    sum_db = tl.sum(db, axis=0)
    tl.store(FINAL_DW + cols, sum_dw, mask=cols < N)
    tl.store(FINAL_DB + cols, sum_db, mask=cols < N)


class LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        y = torch.empty_like(x)
        x_arg = x.reshape(-1, x.shape[-1])
        M, N = x_arg.shape
        mean = torch.empty((M,), dtype=torch.float32)
        rstd = torch.empty((M,), dtype=torch.float32)
        MAX_FUSED_SIZE = 65536 // x.element_size()
        BLOCK_SIZE = min(MAX_FUSED_SIZE, triton.next_power_of_2(N))
        num_warps = min(max(BLOCK_SIZE // 256, 1), 8)
        _layer_norm_fwd_fused[(M,)](x_arg, y, weight, bias, mean, rstd, x_arg.stride(0), N,
                                    eps, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
                                    num_ctas=1)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.BLOCK_SIZE, ctx.num_warps, ctx.eps = BLOCK_SIZE, num_warps, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, m, v = ctx.saved_tensors
        N = w.shape[0]
        GROUP_SIZE_M = 64
        if N <= 8192:
            GROUP_SIZE_M = 96
        if N <= 4096:
            GROUP_SIZE_M = 128
        if N <= 1024:
            GROUP_SIZE_M = 256
        locks = torch.zeros(2 * GROUP_SIZE_M, dtype=torch.int32)
        _dw = torch.zeros((GROUP_SIZE_M, N), dtype=x.dtype)
        _db = torch.zeros((GROUP_SIZE_M, N), dtype=x.dtype)
        dw = torch.empty((N,), dtype=w.dtype)
        db = torch.empty((N,), dtype=w.dtype)
        dx = torch.empty_like(dy)
        x_arg = x.reshape(-1, x.shape[-1])
        M, N = x_arg.shape
        _layer_norm_bwd_dx_fused[(M,)](dx, dy, _dw, _db, x, w, m, v, locks, x_arg.stride(0),
                                       N, BLOCK_SIZE_N=ctx.BLOCK_SIZE,
                                       GROUP_SIZE_M=GROUP_SIZE_M, num_warps=ctx.num_warps)
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_SIZE_N"]),)  # noqa: E731
        _layer_norm_bwd_dwdb[grid](_dw, _db, dw, db, min(GROUP_SIZE_M, M), N,
                                   BLOCK_SIZE_M=32, BLOCK_SIZE_N=128, num_ctas=1)
        return dx, None, dw, db, None


@pytest.mark.parametrize("M,N", [(1151, 613), (300, 64)])
def test_layer_norm_backward(M, N):
    torch.manual_seed(0)
    weight = torch.rand(N, requires_grad=True)
    bias = torch.rand(N, requires_grad=True)
    x = (-2.3 + 0.5 * torch.randn(M, N)).requires_grad_(True)
    dy = 0.1 * torch.randn_like(x)
    y_tri = LayerNorm.apply(x, (N,), weight, bias, 1e-5)
    y_tri.backward(dy, retain_graph=True)
    dx_tri, dw_tri, db_tri = (t.grad.clone() for t in (x, weight, bias))
    x.grad = weight.grad = bias.grad = None
    y_ref = torch.nn.functional.layer_norm(x, (N,), weight, bias, 1e-5)
    y_ref.backward(dy, retain_graph=True)
    torch.testing.assert_close(y_tri, y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx_tri, x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw_tri, weight.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(db_tri, bias.grad, rtol=1e-3, atol=1e-3)


# ---- 06 fused attention (forward, plain pointers) -------------------------------------------

@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, K_block_ptr, V_block_ptr, stride_kn, stride_vn,
                    start_m, qk_scale, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_N: tl.constexpr, STAGE: tl.constexpr, offs_m: tl.constexpr,
                    offs_n: tl.constexpr, N_CTX: tl.constexpr):
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
    else:
        lo, hi = 0, N_CTX
    K_ptrs = K_block_ptr + lo * stride_kn
    V_ptrs = V_block_ptr + lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        k = tl.load(K_ptrs)
        qk = tl.dot(q, k)
        if STAGE == 2:
            mask = offs_m[:, None] >= (start_n + offs_n[None, :])
            qk = qk * qk_scale + tl.where(mask, 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        v = tl.load(V_ptrs)
        acc = tl.dot(p, v, acc)
        m_i = m_ij
        K_ptrs += BLOCK_N * stride_kn
        V_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, sm_scale, M, Out, stride_qz, stride_qh, stride_qm, stride_qk,
              stride_kz, stride_kh, stride_kn, stride_kk, stride_vz, stride_vh, stride_vk,
              stride_vn, stride_oz, stride_oh, stride_om, stride_on, Z, H,
              N_CTX: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    q_offset = off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    Q_ptrs = Q + q_offset + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    # K^T: a [HEAD_DIM, BLOCK_N] tile read through the strides
    K_ptrs = K + q_offset + offs_d[:, None] * stride_kk + offs_n[None, :] * stride_kn
    V_ptrs = V + q_offset + offs_n[:, None] * stride_vk + offs_d[None, :] * stride_vn
    O_ptrs = Out + q_offset + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale
    qk_scale *= 1.44269504  # 1/log(2)
    q = tl.load(Q_ptrs)
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn,
                                        stride_vk, start_m, qk_scale, BLOCK_M, HEAD_DIM,
                                        BLOCK_N, 4 - STAGE, offs_m, offs_n, N_CTX)
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_ptrs, V_ptrs, stride_kn,
                                        stride_vk, start_m, qk_scale, BLOCK_M, HEAD_DIM,
                                        BLOCK_N, 2, offs_m, offs_n, N_CTX)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    m_ptrs = M + off_hz * N_CTX + offs_m
    tl.store(m_ptrs, m_i)
    tl.store(O_ptrs, acc.to(Out.type.element_ty))


def attention(q, k, v, causal, sm_scale, BLOCK_M=32, BLOCK_N=16):
    HEAD_DIM = q.shape[-1]
    o = torch.empty_like(q)
    stage = 3 if causal else 1
    grid = (triton.cdiv(q.shape[2], BLOCK_M), q.shape[0] * q.shape[1], 1)
    M = torch.empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
    _attn_fwd[grid](q, k, v, sm_scale, M, o, *q.stride(), *k.stride(), *v.stride(),
                    *o.stride(), q.shape[0], q.shape[1], N_CTX=q.shape[2], HEAD_DIM=HEAD_DIM,
                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGE=stage, num_warps=4,
                    num_stages=3)
    return o


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_forward(causal):
    torch.manual_seed(20)
    Z, H, N_CTX, HEAD_DIM = 2, 3, 128, 32
    q, k, v = (torch.randn(Z, H, N_CTX, HEAD_DIM) * 0.5 for _ in range(3))
    sm_scale = 0.5
    out = attention(q, k, v, causal, sm_scale)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                 scale=sm_scale)
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)


# ---- 07 libdevice ---------------------------------------------------------------------------

@triton.jit
def asin_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    x = libdevice.asin(x)
    tl.store(y_ptr + offsets, x, mask=mask)


def test_libdevice_asin():
    torch.manual_seed(0)
    size = 98432
    x = torch.rand(size) * 2 - 1
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    asin_kernel[grid](x, output, n_elements, BLOCK_SIZE=1024)
    torch.testing.assert_close(output, torch.asin(x), rtol=1e-6, atol=1e-6)


# ---- 08 grouped GEMM ------------------------------------------------------------------------

@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32,
                            "NUM_SM": 4}),
             triton.Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16,
                            "NUM_SM": 7})],
    key=["group_size"])
@triton.jit
def grouped_matmul_kernel(group_a_ptrs, group_b_ptrs, group_c_ptrs, group_gemm_sizes, g_lds,
                          group_size, NUM_SM: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                          BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    tile_idx = tl.program_id(0)
    last_problem_end = 0
    for g in range(group_size):
        gm = tl.load(group_gemm_sizes + g * 3)
        gn = tl.load(group_gemm_sizes + g * 3 + 1)
        gk = tl.load(group_gemm_sizes + g * 3 + 2)
        num_m_tiles = tl.cdiv(gm, BLOCK_SIZE_M)
        num_n_tiles = tl.cdiv(gn, BLOCK_SIZE_N)
        num_tiles = num_m_tiles * num_n_tiles
        while (tile_idx >= last_problem_end and tile_idx < last_problem_end + num_tiles):
            k = gk
            lda = tl.load(g_lds + g * 3)
            ldb = tl.load(g_lds + g * 3 + 1)
            ldc = tl.load(g_lds + g * 3 + 2)
            a_ptr = tl.load(group_a_ptrs + g).to(tl.pointer_type(tl.float16))
            b_ptr = tl.load(group_b_ptrs + g).to(tl.pointer_type(tl.float16))
            c_ptr = tl.load(group_c_ptrs + g).to(tl.pointer_type(tl.float16))
            tile_idx_in_gemm = tile_idx - last_problem_end
            tile_m_idx = tile_idx_in_gemm // num_n_tiles
            tile_n_idx = tile_idx_in_gemm % num_n_tiles
            offs_am = tile_m_idx * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
            offs_bn = tile_n_idx * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            offs_k = tl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + offs_am[:, None] * lda + offs_k[None, :]
            b_ptrs = b_ptr + offs_k[:, None] * ldb + offs_bn[None, :]
            accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for kk in range(0, tl.cdiv(k, BLOCK_SIZE_K)):  # noqa: B007 (the tutorial's loop)
                tl.multiple_of(a_ptrs, [16, 16])
                tl.multiple_of(b_ptrs, [16, 16])
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
                accumulator += tl.dot(a, b)
                a_ptrs += BLOCK_SIZE_K
                b_ptrs += BLOCK_SIZE_K * ldb
            c = accumulator.to(tl.float16)
            offs_cm = tile_m_idx * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
            offs_cn = tile_n_idx * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            c_ptrs = c_ptr + ldc * offs_cm[:, None] + offs_cn[None, :]
            tl.store(c_ptrs, c)
            tile_idx += NUM_SM
        last_problem_end = last_problem_end + num_tiles


def _num_sms() -> int:
    """The tutorials' `num_sms()`: the device's multiprocessor count, the CPU threads here."""
    return triton.runtime.driver.active.utils.get_device_properties(0)["multiprocessor_count"]


# Tutorial 08's own autotune configs (the kernel above carries small ones, for the small
# shapes of test_grouped_gemm: the kernel has no masks). bench B7 runs these.
grouped_matmul_kernel_tutorial = triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k,
                            "NUM_SM": sms})
             for m, n, k, sms in [(128, 128, 32, 84), (128, 128, 32, 128), (64, 64, 32, 84),
                                  (64, 64, 32, 128), (128, 128, 64, _num_sms()),
                                  (64, 128, 64, _num_sms())]],
    key=["group_size"])(grouped_matmul_kernel.fn)


def group_gemm_fn(group_A, group_B, kernel=grouped_matmul_kernel):
    group_size = len(group_A)
    A_addrs, B_addrs, C_addrs, g_sizes, g_lds, group_C = [], [], [], [], [], []
    for A, B in zip(group_A, group_B, strict=True):
        M, K = A.shape
        K, N = B.shape
        C = torch.empty((M, N), dtype=A.dtype)
        group_C.append(C)
        A_addrs.append(A.data_ptr())
        B_addrs.append(B.data_ptr())
        C_addrs.append(C.data_ptr())
        g_sizes += [M, N, K]
        g_lds += [A.stride(0), B.stride(0), C.stride(0)]
    d_a_ptrs = torch.tensor(A_addrs)
    d_b_ptrs = torch.tensor(B_addrs)
    d_c_ptrs = torch.tensor(C_addrs)
    d_g_sizes = torch.tensor(g_sizes, dtype=torch.int32)
    d_g_lds = torch.tensor(g_lds, dtype=torch.int32)
    grid = lambda META: (META["NUM_SM"],)  # noqa: E731
    kernel[grid](d_a_ptrs, d_b_ptrs, d_c_ptrs, d_g_sizes, d_g_lds, group_size)
    return group_C


def test_grouped_gemm_with_the_tutorials_configs():
    """Sizes that are multiples of 128 (the kernel has no masks), as tutorial 08 runs it."""
    torch.manual_seed(0)
    shapes = [(256, 128, 384), (128, 256, 128)]
    group_A = [torch.rand((m, k), dtype=torch.float16) for m, n, k in shapes]
    group_B = [torch.rand((k, n), dtype=torch.float16) for m, n, k in shapes]
    outs = group_gemm_fn(group_A, group_B, kernel=grouped_matmul_kernel_tutorial)
    for a, b, c in zip(group_A, group_B, outs, strict=True):
        torch.testing.assert_close(c, (a.float() @ b.float()).half(), rtol=2e-3, atol=2e-1)


def test_grouped_gemm():
    torch.manual_seed(0)
    shapes = [(64, 96, 32), (32, 32, 64), (96, 64, 96), (128, 32, 32)]
    group_A = [torch.rand((m, k), dtype=torch.float16) for m, n, k in shapes]
    group_B = [torch.rand((k, n), dtype=torch.float16) for m, n, k in shapes]
    outs = group_gemm_fn(group_A, group_B)
    for a, b, c in zip(group_A, group_B, outs, strict=True):
        reference = (a.float() @ b.float()).half()
        torch.testing.assert_close(c, reference, rtol=2e-3, atol=2e-2)


# ---- 09 persistent matmul -------------------------------------------------------------------

@triton.jit
def _compute_pid(tile_id, num_pid_in_group, num_pid_m, GROUP_SIZE_M, NUM_SMS):
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def matmul_kernel_persistent(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                             stride_bn, stride_cm, stride_cn, BLOCK_SIZE_M: tl.constexpr,
                             BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                             GROUP_SIZE_M: tl.constexpr, NUM_SMS: tl.constexpr):
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    tile_id_c = start_pid - NUM_SMS
    offs_k_for_mask = tl.arange(0, BLOCK_SIZE_K)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _compute_pid(tile_id, num_pid_in_group, num_pid_m, GROUP_SIZE_M,
                                    NUM_SMS)
        start_m = pid_m * BLOCK_SIZE_M
        start_n = pid_n * BLOCK_SIZE_N
        offs_am = start_m + tl.arange(0, BLOCK_SIZE_M)
        offs_bn = start_n + tl.arange(0, BLOCK_SIZE_N)
        offs_am = tl.where(offs_am < M, offs_am, 0)
        offs_bn = tl.where(offs_bn < N, offs_bn, 0)
        offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_SIZE_M), BLOCK_SIZE_M)
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_SIZE_N), BLOCK_SIZE_N)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
            b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
            a = tl.load(a_ptrs, mask=offs_k_for_mask[None, :] < K - ki * BLOCK_SIZE_K,
                        other=0.0)
            b = tl.load(b_ptrs, mask=offs_k_for_mask[:, None] < K - ki * BLOCK_SIZE_K,
                        other=0.0)
            accumulator = tl.dot(a, b, accumulator)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _compute_pid(tile_id_c, num_pid_in_group, num_pid_m, GROUP_SIZE_M,
                                    NUM_SMS)
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        c = accumulator.to(tl.float16)
        tl.store(c_ptrs, c, mask=c_mask)


def matmul_persistent(a, b):
    M, K = a.shape
    K, N = b.shape
    c = torch.empty((M, N), dtype=a.dtype)
    NUM_SMS = 3
    grid = lambda META: (min(NUM_SMS, triton.cdiv(M, META["BLOCK_SIZE_M"]) *  # noqa: E731
                             triton.cdiv(N, META["BLOCK_SIZE_N"])),)
    matmul_kernel_persistent[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                   b.stride(1), c.stride(0), c.stride(1), BLOCK_SIZE_M=32,
                                   BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=8,
                                   NUM_SMS=NUM_SMS, num_stages=3, num_warps=8)
    return c


# Tutorial 09's autotune configs (its matmul_get_configs(): BLOCK_SIZE_M 128, N 128 or 256,
# K 64 or 128, GROUP_SIZE_M 8; its num_stages and num_warps do not change the CPU code, so
# one of each) and NUM_SMS from the device, as the tutorial launches it; bench B7 runs this.
matmul_kernel_persistent_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k,
                            "GROUP_SIZE_M": 8}, num_stages=3, num_warps=8)
             for n in (128, 256) for k in (64, 128)],
    key=["M", "N", "K"])(matmul_kernel_persistent)


def matmul_persistent_tuned(a, b):
    M, K = a.shape
    K, N = b.shape
    c = torch.empty((M, N), dtype=a.dtype)
    NUM_SMS = _num_sms()
    grid = lambda META: (min(NUM_SMS, triton.cdiv(M, META["BLOCK_SIZE_M"]) *  # noqa: E731
                             triton.cdiv(N, META["BLOCK_SIZE_N"])),)
    matmul_kernel_persistent_tuned[grid](a, b, c, M, N, K, a.stride(0), a.stride(1),
                                         b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                                         NUM_SMS=NUM_SMS)
    return c


def test_persistent_matmul_with_the_tutorials_configs():
    torch.manual_seed(0)
    a = torch.randn((301, 203), dtype=torch.float16)
    b = torch.randn((203, 265), dtype=torch.float16)
    torch.testing.assert_close(matmul_persistent_tuned(a, b).float(),
                               (a.float() @ b.float()).half().float(), rtol=2e-3, atol=2e-2)


def test_persistent_matmul():
    torch.manual_seed(0)
    a = torch.randn((157, 91), dtype=torch.float16)
    b = torch.randn((91, 133), dtype=torch.float16)
    torch.testing.assert_close(matmul_persistent(a, b).float(),
                               (a.float() @ b.float()).half().float(), rtol=2e-3, atol=2e-3)




# ---- 06 fused attention, with tensor descriptors made in the kernel -------------------------

@triton.jit
def _maybe_make_tensor_desc(desc_or_ptr, shape, strides, block_shape):
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape, strides, block_shape)


@triton.jit
def _attn_fwd_inner_desc(acc, l_i, m_i, q, desc_k, desc_v, offset_y, dtype: tl.constexpr,
                         start_m, qk_scale, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, STAGE: tl.constexpr, offs_m: tl.constexpr,
                         offs_n: tl.constexpr, N_CTX: tl.constexpr):
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
        lo = tl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, N_CTX
    offsetk_y = offset_y + lo
    offsetv_y = offset_y + lo
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([offsetk_y, 0]).T
        qk = tl.dot(q, k)
        if STAGE == 2:
            mask = offs_m[:, None] >= (start_n + offs_n[None, :])
            qk = qk * qk_scale + tl.where(mask, 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([offsetv_y, 0])
        p = p.to(dtype)
        acc = tl.dot(p, v, acc)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
        offsetk_y += BLOCK_N
        offsetv_y += BLOCK_N
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_desc(sm_scale, M, Z, H, desc_q, desc_k, desc_v, desc_o, N_CTX,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   STAGE: tl.constexpr):
    dtype = tl.float32
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    y_dim = Z * H * N_CTX
    desc_q = _maybe_make_tensor_desc(desc_q, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_M, HEAD_DIM])
    desc_v = _maybe_make_tensor_desc(desc_v, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_N, HEAD_DIM])
    desc_k = _maybe_make_tensor_desc(desc_k, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_N, HEAD_DIM])
    desc_o = _maybe_make_tensor_desc(desc_o, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_M, HEAD_DIM])
    offset_y = off_z * (N_CTX * H) + off_h * N_CTX
    qo_offset_y = offset_y + start_m * BLOCK_M
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale
    qk_scale *= 1.44269504
    q = desc_q.load([qo_offset_y, 0])
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner_desc(acc, l_i, m_i, q, desc_k, desc_v, offset_y, dtype,
                                             start_m, qk_scale, BLOCK_M, HEAD_DIM, BLOCK_N,
                                             4 - STAGE, offs_m, offs_n, N_CTX)
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner_desc(acc, l_i, m_i, q, desc_k, desc_v, offset_y, dtype,
                                             start_m, qk_scale, BLOCK_M, HEAD_DIM, BLOCK_N,
                                             2, offs_m, offs_n, N_CTX)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    m_ptrs = M + off_hz * N_CTX + offs_m
    tl.store(m_ptrs, m_i)
    desc_o.store([qo_offset_y, 0], acc.to(dtype))


@pytest.mark.parametrize("host_descriptors", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_with_tensor_descriptors(causal, host_descriptors):
    from triton.tools.tensor_descriptor import TensorDescriptor

    torch.manual_seed(21)
    Z, H, N_CTX, HEAD_DIM = 1, 2, 128, 32
    q, k, v = (torch.randn(Z, H, N_CTX, HEAD_DIM) * 0.5 for _ in range(3))
    o = torch.empty_like(q)
    M = torch.empty((Z, H, N_CTX), dtype=torch.float32)
    BLOCK_M, BLOCK_N = 32, 16
    args = [q, k, v, o]
    if host_descriptors:  # as the tutorial does where the target supports them
        y_dim = Z * H * N_CTX
        args = [TensorDescriptor(t, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                 block_shape=[block, HEAD_DIM])
                for t, block in zip(args, [BLOCK_M, BLOCK_N, BLOCK_N, BLOCK_M], strict=True)]
    grid = (triton.cdiv(N_CTX, BLOCK_M), Z * H, 1)
    _attn_fwd_desc[grid](0.4, M, Z, H, *args, N_CTX, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M,
                         BLOCK_N=BLOCK_N, STAGE=3 if causal else 1)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                 scale=0.4)
    torch.testing.assert_close(o, reference, rtol=1e-4, atol=1e-4)
