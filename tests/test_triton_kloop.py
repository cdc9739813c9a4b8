"""K loops on the tilegen backend (kloop.py): pointer tiles advanced by a uniform step are
kept as their initial tile plus a scalar offset, and a dot accumulating across the loop
runs on the micro-kernel over a packed depth of several trips. Checked against torch at
odd sizes (trip counts that are not a multiple of a packed group, masked K edges), and
that the tutorial matmul takes both paths."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tests.test_triton_tutorials import matmul_kernel  # noqa: E402
from tilegen.triton_backend import kloop  # noqa: E402


@triton.jit
def k_loop_matmul(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                  stride_bn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  BIAS: tl.constexpr, OUT_F64: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if BIAS:
        acc = tl.load(bias_ptr + rm[:, None] * N + rn[None, :], mask=c_mask, other=0.0)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    if OUT_F64:
        acc = acc.to(tl.float64)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        if OUT_F64:
            acc = tl.dot(a.to(tl.float64), b.to(tl.float64), acc)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float32), mask=c_mask)


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 700),
       block_k=st.sampled_from([16, 32, 64]), block_n=st.sampled_from([16, 32, 64]),
       dtype=st.sampled_from(["f32", "f16", "bf16", "f64"]), bias=st.booleans(),
       transposed_a=st.booleans())
def test_generated_k_loops(m, n, k, block_k, block_n, dtype, bias, transposed_a):
    torch_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                   "f64": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(m * 10000 + n * 1000 + k)
    a = torch.randn(k, m, generator=generator).t() if transposed_a else \
        torch.randn(m, k, generator=generator)
    a = a.to(torch_dtype)
    b = torch.randn(k, n, generator=generator).to(torch_dtype)
    c_bias = torch.randn(m, n, generator=generator)
    out = torch.full((m, n), 7.0)
    block_m = 16
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    k_loop_matmul[grid](a, b, out, c_bias, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                        b.stride(1), BM=block_m, BN=block_n, BK=block_k, BIAS=bias,
                        OUT_F64=dtype == "f64")
    expected = a.double() @ b.double() + (c_bias.double() if bias else 0)
    # f64 accumulates exactly enough that only the final rounding to f32 remains
    tolerance = 1e-6 if dtype == "f64" else 1e-4 * (1 + k ** 0.5)
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


@triton.jit
def advancing_rows(x_ptr, out_ptr, steps, stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ptrs = x_ptr + cols
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for _ in range(steps):
        total += tl.load(ptrs)
        ptrs += stride
    tl.store(out_ptr + cols, total)
    tl.store(out_ptr + BLOCK + cols, tl.load(ptrs))  # the pointer tile after the loop


@pytest.mark.parametrize("steps,stride", [(0, 16), (1, 16), (5, 48), (9, -16)])
def test_advancing_pointer_tile_inside_and_after_the_loop(steps, stride):
    rows = 20
    x = torch.randn(rows, 16)
    start = 11 if stride < 0 else 0  # a negative step walks up from the last row
    base = x[start:]
    out = torch.empty(32)
    advancing_rows[(1,)](base, out, steps, stride, BLOCK=16)
    flat = x.reshape(-1)
    offsets = [start * 16 + step * stride for step in range(steps + 1)]
    expected_sum = sum((flat[o:o + 16] for o in offsets[:-1]), torch.zeros(16))
    torch.testing.assert_close(out[:16], expected_sum)
    torch.testing.assert_close(out[16:], flat[offsets[-1]:offsets[-1] + 16])


def test_tutorial_matmul_takes_the_k_loop_paths(monkeypatch):
    """The tutorial's loop advances both pointer tiles uniformly, its dot is deferred over
    128-deep packed groups (4 trips of BLOCK_SIZE_K = 32) in 6 x 64 register blocks, and its
    loads fill the packs."""
    seen = {"advancing": [], "deferred": [], "packed loads": []}
    advancing, deferrable = kloop.advancing_pointers, kloop.deferrable_dots
    packed_loads = kloop._packed_loads

    def spy_packed_loads(e, loop, op):
        found = packed_loads(e, loop, op)
        seen["packed loads"].append(len(found))
        return found

    def spy_advancing(e, loop):
        found = advancing(e, loop)
        seen["advancing"].append(sorted(found))
        return found

    def spy_deferrable(e, loop):
        found = deferrable(e, loop)
        seen["deferred"].append(len(found))
        return found

    monkeypatch.setattr(kloop, "advancing_pointers", spy_advancing)
    monkeypatch.setattr(kloop, "deferrable_dots", spy_deferrable)
    monkeypatch.setattr(kloop, "_packed_loads", spy_packed_loads)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    # the f32 FMA kernel's packs (its tf32 dot runs on AMX where the host has it:
    # tests/test_triton_amx_dot.py)
    monkeypatch.setenv("TILEGEN_TRITON_AMX", "0")
    a, b = torch.randn(300, 200), torch.randn(200, 130)
    c = torch.empty((300, 130), dtype=torch.float16)
    config = matmul_kernel.configs[0].kwargs
    grid = (triton.cdiv(300, config["BLOCK_SIZE_M"]) * triton.cdiv(130, config["BLOCK_SIZE_N"]),)
    kernel = triton.jit(matmul_kernel.fn.fn)  # compiled anew: the knob is read at compiles
    compiled = kernel[grid](a, b, c, 300, 130, 200, a.stride(0), a.stride(1), b.stride(0),
                            b.stride(1), c.stride(0), c.stride(1), ACTIVATION="", **config)
    torch.testing.assert_close(c.float(), (a @ b).half().float(), rtol=2e-3, atol=2e-3)
    assert seen["advancing"] == [[0, 1]] and seen["deferred"] == [1]
    assert seen["packed loads"] == [2]  # a and b are loaded straight into the packs
    assert "tilegen.gemm.f32.6x64.s128" in compiled.asm["llir"]


@pytest.mark.parametrize("m,n,k,block_m,block_n,block_k,dtype", [
    (130, 200, 333, 128, 128, 32, "f32"),  # 21 six-row blocks and 2 rows left, 3 programs
    (45, 77, 129, 16, 64, 16, "f16"),  # 6 + 6 + 4 rows; 9 trips: 2 groups and 1 trip
    (37, 129, 97, 32, 128, 64, "bf16"),  # 2 trips in one group: flushed after the loop
    (50, 70, 61, 64, 64, 32, "f64"),  # f64: 6 x 32, 8 lanes a vector
    (7, 300, 700, 8, 256, 16, "f32"),  # four 64-wide panels, 44 trips: 11 groups
])
def test_four_vector_register_blocks(monkeypatch, m, n, k, block_m, block_n, block_k,
                                     dtype):
    """A deferred dot whose tile spans four vectors runs 6 x 4-vector register blocks over
    a depth that keeps a B panel at 32 KB (128 for f32, 128 for f64's 32 columns), the rows
    past the last whole 6-row block in one block of their own; masks on every edge. (The
    FMA kernel's blocks: bf16 and tf32 dots run on AMX where the host has it,
    tests/test_triton_amx_dot.py.)"""
    monkeypatch.setenv("TILEGEN_TRITON_AMX", "0")
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    torch_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                   "f64": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    a = torch.randn(m, k, generator=generator).to(torch_dtype)
    b = torch.randn(k, n, generator=generator).to(torch_dtype)
    bias = torch.randn(m, n, generator=generator)
    out = torch.full((m, n), 7.0)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    kernel = triton.jit(k_loop_matmul.fn)  # compiled anew: the knob is read at compiles
    compiled = kernel[grid](a, b, out, bias, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                            b.stride(1), BM=block_m, BN=block_n, BK=block_k, BIAS=True,
                            OUT_F64=dtype == "f64")
    expected = a.double() @ b.double() + bias.double()
    tolerance = 1e-6 if dtype == "f64" else 1e-4 * (1 + k ** 0.5)
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)
    rows, columns = min(block_m, 6), 32 if dtype == "f64" else 64
    assert f"tilegen.gemm.{'f64' if dtype == 'f64' else 'f32'}.{rows}x{columns}.s" \
        f"{max(128, block_k)}" in compiled.asm["llir"]


@pytest.mark.parametrize("amx", ["0", "auto"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_loads_converted_into_the_packs(monkeypatch, dtype, amx):
    """f16 and bf16 loads read only by a deferred dot are converted as they are stored
    into the packs (no tile of their own): to f32 for the FMA kernel, to bf16 parts for
    AMX where the host has it (amx_dot.py); odd sizes, masks on every edge."""
    from tilegen.triton_backend import amx_dot

    monkeypatch.setenv("TILEGEN_TRITON_AMX", amx)
    seen = []
    packed_loads = kloop._packed_loads

    def spy(e, loop, op):
        found = packed_loads(e, loop, op)
        seen.append(sorted(value.type.elem for value in found))
        return found

    monkeypatch.setattr(kloop, "_packed_loads", spy)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    m, n, k = 45, 131, 203
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    out = torch.full((m, n), 7.0)
    grid = (triton.cdiv(m, 32), triton.cdiv(n, 64))
    kernel = triton.jit(k_loop_matmul.fn)  # compiled anew: the knob is read at compiles
    compiled = kernel[grid](a, b, out, out, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                            b.stride(1), BM=32, BN=64, BK=32, BIAS=False, OUT_F64=False)
    expected = a.double() @ b.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=2e-3)
    name = "f16" if dtype == torch.float16 else "bf16"
    assert seen == [[name, name]]
    on_amx = amx == "auto" and amx_dot.available("auto")
    assert ("tdpbf16ps" in compiled.asm["llir"]) is on_amx


@triton.jit
def carried_tiles(x_ptr, out_ptr, steps, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(x_ptr + r)
    b = tl.load(x_ptr + BLOCK + r)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for _ in range(steps):
        total += a * b  # reads other slots, writes its own: computed in place
        a, b = b * 0.5, a + b  # each reads the other's old value: not in place
    tl.store(out_ptr + r, a)
    tl.store(out_ptr + BLOCK + r, b)
    tl.store(out_ptr + 2 * BLOCK + r, total)


def test_carried_tiles_updated_in_place_only_when_safe():
    x = torch.randn(64)
    out = torch.empty(96)
    carried_tiles[(1,)](x, out, 5, BLOCK=32)
    a, b, total = x[:32].clone(), x[32:].clone(), torch.zeros(32)
    for _ in range(5):
        total += a * b
        a, b = b * 0.5, a + b
    torch.testing.assert_close(out, torch.cat([a, b, total]))


@triton.jit
def rescaled_accumulation(a_ptr, b_ptr, s_ptr, out_ptr, seen_ptr, M, N, K,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          ORDER: tl.constexpr):
    """acc = dot(a, b, acc * s[:, None] + 0.25) per K block, as attention rescales its
    accumulator; ORDER 1 (2) also reads the old acc before (after) the dot."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32) + 1.0
    seen = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        ks = k * BK + rk
        a = tl.load(a_ptr + rm[:, None] * K + ks[None, :],
                    mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + rn[None, :],
                    mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        s = tl.load(s_ptr + k * M + rm, mask=rm < M, other=0.0)
        if ORDER == 1:
            seen += acc
        new = tl.dot(a, b, acc * s[:, None] + 0.25)
        if ORDER == 2:
            seen += acc * 2.0
        acc = new
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc, mask=mask)
    tl.store(seen_ptr + rm[:, None] * N + rn[None, :], seen, mask=mask)


@pytest.mark.parametrize("order", [0, 1, 2])
@pytest.mark.parametrize("m,n,k,block_n,half", [(37, 45, 83, 32, False), (16, 64, 16, 64, True),
                                                  (5, 70, 50, 64, True)])
def test_rescaled_accumulator_in_its_slot(monkeypatch, m, n, k, block_n, half, order):
    """A dot whose accumulator is an elementwise expression of the carried tile computes it
    into the carried slot only when nothing else reads the carried tile (an old value read
    before or after the dot must see the old value)."""
    seen_plans = []
    rescaled = kloop.rescaled_accumulators

    def spy(e, loop):
        found = rescaled(e, loop)
        seen_plans.append(len(found))
        return found
    monkeypatch.setattr(kloop, "rescaled_accumulators", spy)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    dtype = torch.float16 if half else torch.float32
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    block_m, block_k = 16, 16
    trips = triton.cdiv(k, block_k)
    scales = torch.rand(trips, m, generator=generator) + 0.5
    out, seen = torch.full((m, n), 7.0), torch.full((m, n), 7.0)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    rescaled_accumulation[grid](a, b, scales, out, seen, m, n, k, BM=block_m, BN=block_n,
                                BK=block_k, ORDER=order)
    acc = torch.ones(m, n, dtype=torch.float64)
    expected_seen = torch.zeros(m, n, dtype=torch.float64)
    for trip in range(trips):
        part = slice(trip * block_k, (trip + 1) * block_k)
        expected_seen += acc * (2.0 if order == 2 else 1.0) if order else 0.0
        acc = a[:, part].double() @ b[part].double() + acc * scales[trip, :, None].double() \
            + 0.25
    torch.testing.assert_close(out.double(), acc, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(seen.double(), expected_seen, rtol=1e-5, atol=1e-5)
    assert seen_plans == [1 if order == 0 else 0]


@triton.jit
def shared_panel_matmul(a_ptr, b_ptr, out_ptr, counter_ptr, M, N, K, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, LOWER_FROM_PID: tl.constexpr,
                        MASK_FROM_PID: tl.constexpr, ATOMIC: tl.constexpr):
    """Every program reads the same b through the same pointer tiles (the case
    panel_cache.py keeps b's packed panels for); LOWER_FROM_PID and MASK_FROM_PID make
    the loop's bounds or b's mask depend on the program, ATOMIC adds an atomic."""
    pid = tl.program_id(0)
    rm = pid * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * N + (rn[None, :] % N)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    lower = pid % 2 if LOWER_FROM_PID else 0
    limit = K - pid if MASK_FROM_PID else K
    for k in range(lower, tl.cdiv(K, BK)):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BK), other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < limit - k * BK, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK * N
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))
    if ATOMIC:
        tl.atomic_add(counter_ptr, 1)


def _shared_panel_expected(a, b, block_m, block_k, lower_from_pid, mask_from_pid):
    """The kernel's loop emulated in float64: trip j of program p reads a's and b's block
    j under the masks of k = lower + j."""
    m, k_extent = a.shape
    n = b.shape[1]
    out = torch.zeros(m, n, dtype=torch.float64)
    a_padded = torch.zeros(m, k_extent + block_k, dtype=torch.float64)
    a_padded[:, :k_extent] = a.double()
    b_padded = torch.zeros(k_extent + block_k, n, dtype=torch.float64)
    b_padded[:k_extent] = b.double()
    steps = torch.arange(block_k)
    for program in range(triton.cdiv(m, block_m)):
        rows = slice(program * block_m, min(m, (program + 1) * block_m))
        lower = program % 2 if lower_from_pid else 0
        limit = k_extent - program if mask_from_pid else k_extent
        for trip, k in enumerate(range(lower, triton.cdiv(k_extent, block_k))):
            part = slice(trip * block_k, (trip + 1) * block_k)
            a_block = a_padded[rows, part] * (steps < k_extent - k * block_k).double()
            b_block = b_padded[part] * (steps < limit - k * block_k).double()[:, None]
            out[rows] += a_block @ b_block
    return out


@pytest.mark.parametrize("lower_from_pid,mask_from_pid,atomic,capacity,half,cached", [
    (False, False, False, None, False, True), (True, False, False, None, False, True),
    (False, True, False, None, False, True), (False, False, True, None, False, False),
    (False, False, False, 1, False, True),  # (its own block_m: another specialisation)
    (False, False, False, None, True, True)])  # f16 b: packed from its tile, not its load
def test_packed_b_panels_kept_across_programs(monkeypatch, lower_from_pid, mask_from_pid,
                                              atomic, capacity, half, cached):
    """Programs that read the same b share its packed panels only when they would load
    the same values: the loop's bounds are part of the key, and so is a value from before
    the loop that b's mask reads (`limit`, which differs between programs); an atomic turns
    the reuse off, a loop longer than the panels hold reloads, and a second launch after b
    changed in place reads the new b."""
    from tilegen.triton_backend import panel_cache

    found = []
    conditions = panel_cache.static_conditions

    def spy(e, loop, dot, advancing):
        result = conditions(e, loop, dot, advancing)
        found.append(result is not None)
        return result
    monkeypatch.setattr(panel_cache, "static_conditions", spy)
    if capacity is not None:  # one flush group: 700 deep is more than the panels hold
        monkeypatch.setattr(panel_cache, "CACHE_BYTES", capacity)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    m, n, k, block_k = 150, 45, 700, 16
    block_m = 16 if capacity is None else 32
    generator = torch.Generator().manual_seed(31)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    if half:
        a, b = a.half(), b.half()
    counter = torch.zeros(1, dtype=torch.int32)
    for _launch in range(2):
        out = torch.full((m, n), 7.0)
        shared_panel_matmul[(triton.cdiv(m, block_m),)](
            a, b, out, counter, m, n, k, BM=block_m, BN=64, BK=block_k,
            LOWER_FROM_PID=lower_from_pid, MASK_FROM_PID=mask_from_pid, ATOMIC=atomic)
        expected = _shared_panel_expected(a, b, block_m, block_k, lower_from_pid,
                                          mask_from_pid)
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-3)
        b.mul_(-0.5)  # the same addresses, other values: the next launch must reload
    assert found == [cached]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_four_vector_wide_blocks(causal):
    """Tutorial 06 at HEAD_DIM = BLOCK_N = 64: both dots of each K/V block take b unpacked
    in 6-row blocks (tiles.dot) and the rescaled accumulator is computed into its slot."""
    from tests.test_triton_tutorials_2 import attention

    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 192, 64, generator=generator) * 0.5 for _ in range(3))
    out = attention(q, k, v, causal, 0.125, BLOCK_M=64, BLOCK_N=64)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                scale=0.125)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
