"""`tt.dot` on AMX tiles (tilegen/triton_backend/amx_dot.py): bf16 dots as they are, f32
dots of input_precision tf32/tf32x3/bf16x3 as bf16x3, f16 dots as an exact four-term split;
ieee, tiles under 32 x 32 and the knob off stay on the FMA kernel.

The references are float64 products of the kernel's inputs; each tolerance is the error
bound of the computation (amx_dot.py's docstring), times Σ_k |a_ik| |b_kj|:
- the f32 accumulation: at most one rounding (2^-24) per product term added;
- bf16x3: per product 3 x 2^-16 (the two lo roundings and the dropped lo x lo).
A dot that ran on bf16 hi parts alone (2^-8) or dropped a term fails them by far."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = triton.language

import tilegen.triton_backend  # noqa: E402
from tilegen.triton_backend import amx_dot  # noqa: E402

tilegen.triton_backend.register()

UNIT = 2.0 ** -24  # f32's unit roundoff


def amx_usable() -> bool:
    return amx_dot.available("auto")


needs_amx = pytest.mark.skipif(not amx_usable(), reason="no AMX-BF16, or Linux refused "
                               "this process tile data (gemm_bf16.amx_usable)")


@pytest.fixture
def always_compile(monkeypatch):
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)


@triton.jit
def kloop_matmul(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                 stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                 EPILOGUE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BLOCK_K),
                    other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < K - k * BLOCK_K) & (rn[None, :] < N),
                    other=0.0)
        if PRECISION == "default":
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if EPILOGUE:  # a bias row and leaky relu, fused after the loop
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
        acc = tl.where(acc >= 0, acc, 0.01 * acc)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=c_mask)


def run(a, b, blocks, precision="default", epilogue=False, kernel=kloop_matmul, bias=None):
    m, k = a.shape
    n = b.shape[1]
    block_m, block_n, block_k = blocks
    c = torch.full((m, n), float("nan"))
    bias = torch.zeros(n) if bias is None else bias
    handle = kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        a, b, bias, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, EPILOGUE=epilogue)
    return c, handle.asm


def reference(a, b, bias=None, epilogue=False):
    """(float64 a @ b with the epilogue, float64 |a| @ |b|)."""
    exact = a.double() @ b.double()
    if epilogue:
        exact = exact + bias.double()[None, :]
        exact = torch.where(exact >= 0, exact, 0.01 * exact)
    return exact, a.double().abs() @ b.double().abs()


def check_within(c, a, b, per_product: float, terms: int, bias=None, epilogue=False):
    k = a.shape[1]
    exact, magnitude = reference(a, b, bias, epilogue)
    # the bias add (one rounding of the sum) and the epilogue's scaling (0.01 x: one more)
    bound = (per_product + (terms * k + 2) * UNIT) * magnitude * 1.01
    if epilogue:
        bound = bound + 2 * UNIT * (exact.abs() + bias.double().abs()[None, :])
    error = (c.double() - exact).abs()
    assert torch.isfinite(c).all()
    worst = (error / bound).max().item()
    assert worst <= 1.0, f"error {worst:.3g} x the bound"
    return worst


SHAPES = [  # (m, n, k, (BLOCK_M, BLOCK_N, BLOCK_K)): masks on every edge
    (83, 97, 171, (32, 32, 32)),
    (45, 77, 203, (64, 64, 16)),   # a trip of 16 depths: flushes padded to 32
    (19, 13, 37, (32, 32, 32)),    # one block of C's tiles, ragged
    (130, 70, 300, (128, 64, 64)),
]


@needs_amx
@pytest.mark.parametrize("m,n,k,blocks", SHAPES)
@pytest.mark.parametrize("epilogue", [False, True])
def test_bf16_dot_has_exact_products(m, n, k, blocks, epilogue):
    generator = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(m, k, generator=generator).bfloat16()
    b = torch.randn(k, n, generator=generator).bfloat16()
    bias = torch.randn(n, generator=generator)
    c, asm = run(a, b, blocks, epilogue=epilogue, bias=bias)
    assert "tdpbf16ps" in asm["llir"]
    check_within(c, a, b, 0.0, 1, bias, epilogue)


@needs_amx
@pytest.mark.parametrize("m,n,k,blocks", SHAPES)
@pytest.mark.parametrize("precision", ["default", "tf32", "tf32x3", "bf16x3"])
def test_f32_dot_as_bf16x3(m, n, k, blocks, precision):
    generator = torch.Generator().manual_seed(m + n * k)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    c, asm = run(a, b, blocks, precision)
    assert "tdpbf16ps" in asm["llir"]
    check_within(c, a, b, 3 * 2.0 ** -16, 3)
    if precision == "default":  # tl.dot's default on f32 is tf32 (the backend allows it)
        assert "inputPrecision = tf32" in asm["ttir"]


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_infinities_and_nan_come_out_as_the_exact_products(dtype):
    """The split's correction terms must not turn Inf into NaN (Inf x a zero lo part):
    Inf, -Inf and NaN in either operand give the float64 product's Inf, -Inf and NaN, and
    every other element stays within its bound."""
    m, n, k = 83, 97, 171
    generator = torch.Generator().manual_seed(29)
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    b[40, :] = 1.0  # bf16-exact: lo parts 0, the case Triton's tf32x3 got wrong
    a[3, 40] = float("inf")
    a[7, 40] = -float("inf")
    a[11, 9] = float("nan")
    b[100, 5] = float("inf")
    b[60, 20] = -float("inf")
    a[3, 60] = 0.0  # row 3 meets b's -Inf at k = 60 with a zero: NaN in column 20
    c, asm = run(a, b, (32, 32, 32))
    assert "tdpbf16ps" in asm["llir"]
    exact = a.double() @ b.double()
    assert exact.isinf().any() and exact.isnan().any()
    assert torch.equal(c.isnan(), exact.isnan())
    assert torch.equal(c.isposinf(), exact.isposinf())
    assert torch.equal(c.isneginf(), exact.isneginf())
    rows, columns = a.isfinite().all(dim=1), b.isfinite().all(dim=0)
    assert rows.sum() == m - 3 and columns.sum() == n - 2
    inner_a, inner_b = a[rows], b[:, columns]
    per_product, terms = (3 * 2.0 ** -16, 3) if dtype == torch.float32 else (0.0, 4)
    check_within(c[rows][:, columns], inner_a, inner_b, per_product, terms)


@needs_amx
def test_f32_dot_epilogue_and_wide_range():
    """Operands over many binades (the split is relative) with the fused epilogue."""
    generator = torch.Generator().manual_seed(3)
    m, n, k = 70, 90, 150
    scale_a = torch.exp2(torch.randint(-20, 20, (m, k), generator=generator).float())
    scale_b = torch.exp2(torch.randint(-20, 20, (k, n), generator=generator).float())
    a = torch.randn(m, k, generator=generator) * scale_a
    b = torch.randn(k, n, generator=generator) * scale_b
    bias = torch.randn(n, generator=generator)
    c, asm = run(a, b, (32, 64, 32), epilogue=True, bias=bias)
    assert "tdpbf16ps" in asm["llir"]
    check_within(c, a, b, 3 * 2.0 ** -16, 3, bias, epilogue=True)


@needs_amx
@pytest.mark.parametrize("m,n,k,blocks", SHAPES[:3])
def test_f16_dot_split_exactly(m, n, k, blocks):
    generator = torch.Generator().manual_seed(k)
    a = torch.randn(m, k, generator=generator).half()
    b = torch.randn(k, n, generator=generator).half()
    c, asm = run(a, b, blocks)
    assert "tdpbf16ps" in asm["llir"]
    check_within(c, a, b, 0.0, 4, None)


@needs_amx
@pytest.mark.parametrize("blocks", [(32, 32, 32), (32, 64, 16)])
def test_f16_products_are_exact(blocks):
    """One product per output (b has one nonzero a column, at a random depth): the f32
    result is that product of two 11-bit significands, exact, so any term the split lost
    (lo x lo: at most 2^-16 of it) shows."""
    generator = torch.Generator().manual_seed(blocks[1])
    m, n, k = 45, 77, 53
    a = (torch.rand(m, k, generator=generator) * 2 + 1).half()  # full significands
    a = a * torch.where(torch.rand(m, k, generator=generator) < 0.5, -1, 1).half()
    b = torch.zeros(k, n, dtype=torch.float16)
    depths = torch.randint(0, k, (n,), generator=generator)
    b[depths, torch.arange(n)] = (torch.rand(n, generator=generator) * 2 + 1).half()
    c, asm = run(a, b, blocks)
    assert "tdpbf16ps" in asm["llir"]
    assert torch.equal(c.double(), a.double() @ b.double())


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("blocks", [(16, 32, 16), (64, 16, 32)])
def test_tiles_under_32_stay_on_the_fma_kernel(dtype, blocks):
    """Tiles of 16 rows or columns: slower on AMX (amx_dot.MIN_TILE), so not there."""
    generator = torch.Generator().manual_seed(8)
    a = torch.randn(40, 50, generator=generator).to(dtype)
    b = torch.randn(50, 60, generator=generator).to(dtype)
    c, asm = run(a, b, blocks)
    assert "tdpbf16ps" not in asm["llir"]
    check_within(c, a, b, 0.0, 1)


def test_every_f16_is_a_bf16_hi_plus_lo():
    """The split's arithmetic over all 65536 f16 values: hi = bf16(x), lo = bf16(x - hi)
    (x - hi computed in f32), and hi + lo == x exactly for every finite x."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = x[torch.isfinite(x)]
    assert x.numel() == 65536 - 2048  # all but the 2046 NaNs and the two infinities
    wide = x.float()
    hi = wide.bfloat16()
    rest = wide - hi.float()
    lo = rest.bfloat16()
    assert torch.equal(lo.float(), rest)  # the remainder is a bf16 already
    assert torch.equal(hi.double() + lo.double(), x.double())


@needs_amx
@pytest.mark.parametrize("side", ["a", "b"])
def test_the_kernels_f16_split_is_exact_for_every_f16(side):
    """The kernel's own split: all finite f16 values against an identity, so each output is
    hi + lo of one input (hi x 1 + lo x 1 + hi x 0 + lo x 0), which must be the input."""
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    values = values.view(torch.float16).reshape(256, 256)
    values = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
    identity = torch.eye(256, dtype=torch.float16)
    a, b = (values, identity) if side == "a" else (identity, values)
    c, asm = run(a, b, (64, 64, 32))
    assert "tdpbf16ps" in asm["llir"]
    assert torch.equal(c, values.float())


@needs_amx
@pytest.mark.parametrize("side", ["a", "b"])
def test_the_kernels_f32_split_is_hi_plus_lo(side):
    """bf16x3 against an identity gives hi + lo of each input: the split as torch computes
    it (round to nearest even), for f32 values over a wide range of binades."""
    generator = torch.Generator().manual_seed(11)
    values = torch.randn(96, 96, generator=generator) * torch.exp2(
        torch.randint(-60, 60, (96, 96), generator=generator).float())
    hi = values.bfloat16().float()
    split = hi + (values - hi).bfloat16().float()
    identity = torch.eye(96)
    a, b = (values, identity) if side == "a" else (identity, values)
    c, asm = run(a, b, (32, 32, 32))
    assert "tdpbf16ps" in asm["llir"]
    assert torch.equal(c, split)
    assert not torch.equal(c, values)  # a split that kept all of f32 would be another path


@pytest.mark.parametrize("blocks", [(32, 32, 32), (64, 64, 16)])
def test_ieee_is_the_fma_kernel(monkeypatch, always_compile, blocks):
    """input_precision="ieee" compiles to the code of the knob off, bit for bit the same
    results, with no tile instruction."""
    generator = torch.Generator().manual_seed(2)
    a = torch.randn(83, 171, generator=generator)
    b = torch.randn(171, 97, generator=generator)
    c, asm = run(a, b, blocks, "ieee")
    assert "tdpbf16ps" not in asm["llir"] and "x86_amx" not in asm["llir"]
    monkeypatch.setenv("TILEGEN_TRITON_AMX", "0")
    off, _ = run(a, b, blocks, "ieee", kernel=triton.jit(kloop_matmul.fn))
    assert torch.equal(c, off)
    check_within(c, a, b, 0.0, 1)


@pytest.mark.parametrize("raw", ["0", "off"])
def test_knob_off_keeps_every_dot_on_the_fma_kernel(monkeypatch, always_compile, raw):
    monkeypatch.setenv("TILEGEN_TRITON_AMX", raw)
    generator = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.randn(45, 77, generator=generator).to(dtype)
        b = torch.randn(77, 50, generator=generator).to(dtype)
        c, asm = run(a, b, (32, 32, 32), kernel=triton.jit(kloop_matmul.fn))
        assert "tdpbf16ps" not in asm["llir"]
        check_within(c, a, b, 0.0, 1)


def test_no_amx_where_the_host_may_not(monkeypatch, always_compile):
    """Without tile data (or AMX-BF16) the knob's default takes the FMA kernel, silently:
    the code must run on this machine."""
    from tilegen import gemm_bf16
    monkeypatch.setattr(gemm_bf16, "amx_usable", lambda target: (False, "refused"))
    generator = torch.Generator().manual_seed(6)
    a = torch.randn(45, 77, generator=generator)
    b = torch.randn(77, 50, generator=generator)
    c, asm = run(a, b, (32, 32, 32), kernel=triton.jit(kloop_matmul.fn))
    assert "tdpbf16ps" not in asm["llir"]
    check_within(c, a, b, 0.0, 1)


def test_the_knob_is_an_option_of_the_compile(monkeypatch):
    """TILEGEN_TRITON_AMX, `off` where the host may not use AMX, goes into the compile
    options, so Triton's cache key covers it (a kernel compiled where tile data was refused
    is not the one a process that has it finds)."""
    from triton.backends.compiler import GPUTarget

    from tilegen import config
    from tilegen.triton_backend.compiler import TilegenBackend

    backend = TilegenBackend(GPUTarget("tilegen", "host", 1))
    hashes = set()
    for raw, mode in (("", "auto"), ("1", "auto"), ("auto", "auto"), ("0", "off"),
                      ("no", "off")):
        monkeypatch.setenv("TILEGEN_TRITON_AMX", raw)
        assert config.triton_amx() == mode
        options = backend.parse_options({})
        assert options.amx_dot == (mode if amx_usable() else "off")
        hashes.add(options.hash())
    assert len(hashes) == (2 if amx_usable() else 1)
    monkeypatch.setenv("TILEGEN_TRITON_AMX", "")
    from tilegen import gemm_bf16
    monkeypatch.setattr(gemm_bf16, "amx_usable", lambda target: (False, "refused"))
    assert backend.parse_options({}).amx_dot == "off"
    with pytest.raises(ValueError, match="TILEGEN_TRITON_AMX"):
        amx_dot.available("sometimes")


@needs_amx
def test_tutorial_matmul_fp32_on_amx():
    """Tutorial 03 (autotuned, GROUP_SIZE_M order: b's panels kept across programs) on f32
    inputs, its fp16 output within the bf16x3 bound plus the fp16 rounding."""
    from tests.test_triton_tutorials import matmul

    generator = torch.Generator().manual_seed(9)
    a = torch.randn(300, 171, generator=generator)
    b = torch.randn(171, 333, generator=generator)
    for activation in ("", "leaky_relu"):
        out = matmul(a, b, activation).double()
        exact, magnitude = reference(a, b)
        if activation:
            exact = torch.where(exact >= 0, exact, 0.01 * exact)
        bound = (3 * 2.0 ** -16 + (3 * 171 + 2) * UNIT) * magnitude * 1.01 + \
            2.0 ** -11 * exact.abs() * 1.01 + 2.0 ** -24  # fp16's rounding of the result
        assert ((out - exact).abs() <= bound).all()


@triton.jit
def kloop_operand_expressions(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                              stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              CAST: tl.constexpr):
    """Operands that are not plain loads: scaled (read twice: not loaded into the packs)
    or cast to bf16; b's pointers from a transposed tensor (strides swapped)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        if CAST:
            acc = tl.dot(a.to(tl.bfloat16), (b * 0.5).to(tl.bfloat16), acc)
        else:
            acc = tl.dot(a * 2.0, b + b, acc)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@needs_amx
@pytest.mark.parametrize("cast", [False, True])
@pytest.mark.parametrize("transposed_b", [False, True])
def test_operand_expressions_and_transposed_b(cast, transposed_b):
    generator = torch.Generator().manual_seed(21)
    m, n, k = 77, 45, 133
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(n, k, generator=generator).t() if transposed_b else \
        torch.randn(k, n, generator=generator)
    c = torch.full((m, n), float("nan"))
    handle = kloop_operand_expressions[(triton.cdiv(m, 32), triton.cdiv(n, 32))](
        a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=32, BLOCK_N=32,
        BLOCK_K=32, CAST=cast)
    assert "tdpbf16ps" in handle.asm["llir"]
    if cast:  # bf16 operands: the products exact
        check_within(c, a.bfloat16(), (b * 0.5).bfloat16(), 0.0, 1)
    else:
        check_within(c, a * 2, b + b, 3 * 2.0 ** -16, 3)


@needs_amx
def test_persistent_f32_matmul_keeps_amx_panels(monkeypatch):
    """Tutorial 09's persistent loop on f32 inputs: b's packed AMX panels kept across a
    program's tiles (panel_cache.py), b changed between launches."""
    from tests.test_triton_tutorials_2 import matmul_kernel_persistent
    from tilegen.triton_backend import panel_cache

    found = []
    conditions = panel_cache.static_conditions

    def spy(e, loop, dot, advancing):
        found.append(conditions(e, loop, dot, advancing))
        return found[-1]
    monkeypatch.setattr(panel_cache, "static_conditions", spy)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    generator = torch.Generator().manual_seed(5)
    m, n, k = 130, 97, 203
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    for _launch in range(2):
        c = torch.full((m, n), 3.0, dtype=torch.float16)
        handle = matmul_kernel_persistent[(2,)](
            a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_SIZE_M=32,
            BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=4, NUM_SMS=2)
        exact, magnitude = reference(a, b)
        bound = (3 * 2.0 ** -16 + (3 * k + 2) * UNIT) * magnitude * 1.01 + \
            2.0 ** -11 * exact.abs() * 1.01 + 2.0 ** -24
        assert ((c.double() - exact).abs() <= bound).all()
        b.mul_(-0.5)  # the same addresses, other values: the next launch must reload
    assert "tdpbf16ps" in handle.asm["llir"]
    assert found and all(reuse is not None for reuse in found)


@triton.jit
def single_dot(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """One dot over the whole depth (no K loop): with a loaded accumulator or none, and a
    fused scale and cast-back epilogue."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :],
                mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :],
                mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if ACC:
        c = tl.dot(a, b, tl.load(c_ptr + rm[:, None] * N + rn[None, :], mask=c_mask,
                                 other=0.0))
    else:
        c = tl.dot(a, b) * 2.0
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c, mask=c_mask)


@needs_amx
@pytest.mark.parametrize("dtype,per_product,terms", [
    (torch.bfloat16, 0.0, 1), (torch.float16, 0.0, 4), (torch.float32, 3 * 2.0 ** -16, 3)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_a_dot_outside_a_k_loop(dtype, per_product, terms, accumulate):
    generator = torch.Generator().manual_seed(17)
    m, n, k = 45, 77, 53
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    c = torch.randn(m, n, generator=generator)
    start = c.clone()
    handle = single_dot[(triton.cdiv(m, 32), triton.cdiv(n, 64))](
        a, b, c, m, n, k, BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, ACC=accumulate)
    assert "tdpbf16ps" in handle.asm["llir"]
    exact, magnitude = reference(a, b)
    bound = (per_product + (terms * k + 2) * UNIT) * magnitude * 1.01
    if accumulate:
        exact, bound = exact + start.double(), bound + 2 * UNIT * start.double().abs()
    else:
        exact, bound = 2 * exact, 2 * bound
    assert ((c.double() - exact).abs() <= bound).all()
