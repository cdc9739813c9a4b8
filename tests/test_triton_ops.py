"""Generated and per-op Triton kernels on the tilegen backend: masks on every edge of odd
sizes, 2- and 3-D grids, reductions, scans and atomics under the parallel grid."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend.tileir import TileError  # noqa: E402


@triton.jit
def tile_2d(x_ptr, y_ptr, M, N, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0)
    y = tl.exp(x) * 2.0 - tl.sqrt(tl.abs(x)) + tl.maximum(x, 0.5)
    tl.store(y_ptr + rows[:, None] * stride_m + cols[None, :], y, mask=mask)


@pytest.mark.parametrize("M,N", [(37, 53), (1, 1), (64, 17)])
def test_2d_grid_masks_on_every_edge(M, N):
    torch.manual_seed(0)
    x = torch.randn(M, N)
    y = torch.full_like(x, 7.0)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 32))
    tile_2d[grid](x, y, M, N, x.stride(0), BLOCK_M=16, BLOCK_N=32)
    expected = torch.exp(x) * 2 - torch.sqrt(x.abs()) + torch.maximum(x, torch.tensor(0.5))
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


@triton.jit
def grid_3d(out_ptr):
    x, y, z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    nx, ny = tl.num_programs(0), tl.num_programs(1)
    tl.store(out_ptr + (z * ny + y) * nx + x, x * 100 + y * 10 + z)


@pytest.mark.parametrize("threads", ["1", "2", "4", "5"])
@pytest.mark.parametrize("grid", [(3, 5, 2), (7, 3, 2), (1, 4, 9), (11, 1, 1)])
def test_3d_grid_and_num_programs(grid, threads, monkeypatch, request):
    """Every program id once, however the threads' runs start inside rows and planes (the
    worker divides the first id out and steps x, y, z from there)."""
    from tilegen.triton_backend import driver

    monkeypatch.setenv("TILEGEN_NUM_THREADS", threads)
    driver.num_threads.cache_clear()  # read once per process otherwise
    request.addfinalizer(driver.num_threads.cache_clear)
    assert driver.num_threads() == int(threads)
    nx, ny, nz = grid
    out = torch.full((nx * ny * nz,), -1, dtype=torch.int32)
    grid_3d[grid](out)
    z, y, x = torch.meshgrid(torch.arange(nz), torch.arange(ny), torch.arange(nx),
                             indexing="ij")
    assert torch.equal(out, (x * 100 + y * 10 + z).flatten().int())


@triton.jit
def reductions(x_ptr, sum_ptr, max_ptr, arg_ptr, cum_ptr, N: tl.constexpr):
    rows = tl.arange(0, 8)
    cols = tl.arange(0, N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :])
    tl.store(sum_ptr + cols, tl.sum(x, axis=0))
    tl.store(max_ptr + rows, tl.max(x, axis=1))
    tl.store(arg_ptr + rows, tl.argmax(x, axis=1))
    tl.store(cum_ptr + rows[:, None] * N + cols[None, :], tl.cumsum(x, axis=1))


def test_reductions_and_scan():
    torch.manual_seed(3)
    x = torch.randn(8, 32)
    sums, maxima = torch.empty(32), torch.empty(8)
    args, cums = torch.empty(8, dtype=torch.int32), torch.empty(8, 32)
    reductions[(1,)](x, sums, maxima, args, cums, N=32)
    torch.testing.assert_close(sums, x.sum(0), rtol=1e-5, atol=1e-5)
    assert torch.equal(maxima, x.max(1).values)
    assert torch.equal(args.long(), x.argmax(1))
    torch.testing.assert_close(cums, x.cumsum(1), rtol=1e-5, atol=1e-5)


@triton.jit
def histogram_by_atomics(x_ptr, counts_ptr, max_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0)
    tl.atomic_add(counts_ptr + x, 1, mask=mask)
    tl.atomic_max(max_ptr, tl.max(tl.where(mask, x, -1), axis=0))


def test_atomics_under_parallel_grid():
    torch.manual_seed(4)
    n = 100_003
    x = torch.randint(0, 10, (n,), dtype=torch.int32)
    counts = torch.zeros(10, dtype=torch.int32)
    top = torch.full((1,), -5, dtype=torch.int32)
    histogram_by_atomics[(triton.cdiv(n, 64),)](x, counts, top, n, BLOCK=64)
    assert torch.equal(counts, torch.bincount(x, minlength=10).int())
    assert top.item() == x.max().item()


@triton.jit
def locked_accumulate(lock_ptr, total_ptr):
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    value = tl.load(total_ptr)  # a plain read-modify-write, safe only under the lock
    tl.store(total_ptr, value + 1)
    tl.atomic_xchg(lock_ptr, 0)


def test_atomic_cas_spin_lock():
    lock = torch.zeros(1, dtype=torch.int32)
    total = torch.zeros(1, dtype=torch.int32)
    locked_accumulate[(5000,)](lock, total)
    assert total.item() == 5000 and lock.item() == 0


@triton.jit
def uses_inline_asm(x_ptr, out_ptr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    y = tl.inline_asm_elementwise("mov $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True,
                                  pack=1)
    tl.store(out_ptr + tl.arange(0, 16), y)


def test_unsupported_op_names_op_and_line():
    x = torch.zeros(16, dtype=torch.int32)
    with pytest.raises(TileError, match=r"tt.elementwise_inline_asm.*uses_inline_asm.*"
                                        r"test_triton_ops.py:\d+"):
        uses_inline_asm[(1,)](x, x)


@triton.jit
def gathers(x_ptr, idx_ptr, out_ptr):
    rows = tl.arange(0, 16)
    x = tl.load(x_ptr + rows[:, None] * 8 + tl.arange(0, 8)[None, :])
    idx = tl.load(idx_ptr + rows[:, None] * 4 + tl.arange(0, 4)[None, :])
    tl.store(out_ptr + rows[:, None] * 4 + tl.arange(0, 4)[None, :], tl.gather(x, idx, 1))


def test_gather_along_an_axis():
    torch.manual_seed(8)
    x = torch.randn(16, 8)
    idx = torch.randint(0, 8, (16, 4), dtype=torch.int32)
    out = torch.empty(16, 4)
    gathers[(1,)](x, idx, out)
    assert torch.equal(out, torch.gather(x, 1, idx.long()))


@triton.jit
def prints(x_ptr, n_ptr):
    r = tl.arange(0, 4)
    tl.device_print("x = ", tl.load(x_ptr + r), r)
    tl.device_print("n", tl.load(n_ptr), hex=True)


def test_device_print(capfd):
    prints[(2,)](torch.tensor([0.5, -1.0, 2.0, 8.0]), torch.tensor([255], dtype=torch.int32))
    lines = capfd.readouterr().out.splitlines()
    assert "pid (1, 0, 0) idx (3) x =: 8 3" in lines  # Triton appends ": " to the prefix
    assert "pid (0, 0, 0) idx (1) x =: -1 1" in lines
    assert lines.count("pid (0, 0, 0) n: 0xff") == 1 and len(lines) == 10


@triton.jit
def unmasked_copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets))


@triton.jit
def gathered_read(x_ptr, y_ptr, stride, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets * stride))


def test_debug_bounds_check_names_kernel_op_and_address(monkeypatch):
    from tilegen.triton_backend.driver import KernelBoundsError

    x, y = torch.arange(100, dtype=torch.float32), torch.zeros(128)
    unmasked_copy[(1,)](x[:64].clone(), y, BLOCK=64, debug=True)  # in bounds: no error
    expected = r"unmasked_copy.*tt.load.*test_triton_ops.*element 100\) from `x_ptr`"
    with pytest.raises(KernelBoundsError, match=expected):
        unmasked_copy[(2,)](x, y, BLOCK=64, debug=True)  # reads x[100:128]
    with pytest.raises(KernelBoundsError, match=r"gathered_read.*tt.load"):
        gathered_read[(1,)](x, y, 7, BLOCK=16, debug=True)  # x[105] is outside
    z = torch.zeros(16)
    gathered_read[(1,)](x, z, 6, BLOCK=16, debug=True)  # x[90] is the last: fine
    assert torch.equal(z, x[::6][:16])


@triton.jit
def exp2_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.math.exp2(tl.load(x_ptr + offsets, mask=mask)), mask=mask)


def test_exp2_within_one_ulp_over_the_float_range():
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-160, 130, 200_000), rng.uniform(-1, 1, 50_000),
                        [0.0, -0.0, 1.0, 127.9, 128.0, -149.0, -150.5, np.inf, -np.inf, np.nan,
                         -126.0, -127.3]]).astype(np.float32)
    y = torch.empty(x.size)
    exp2_kernel[(triton.cdiv(x.size, 1024),)](torch.from_numpy(x), y, x.size, BLOCK=1024)
    exact = np.exp2(x.astype(np.float64))
    got = y.numpy().astype(np.float64)
    finite = np.isfinite(exact) & (exact < np.finfo(np.float32).max)
    ulp = np.spacing(exact[finite].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[finite] - exact[finite]) / ulp) <= 1.0  # vecmath's exp2
    assert np.isnan(got[np.isnan(x)]).all()
    assert (got[x == np.inf] == np.inf).all() and (got[x == -np.inf] == 0).all()


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               ACC_IN: tl.constexpr, PRECISION: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = tl.load(c_ptr + rm[:, None] * N + rn[None, :]) if ACC_IN else \
        tl.zeros((M, N), dtype=tl.float32)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :],
             tl.dot(a, b, acc, input_precision=PRECISION))


@settings(max_examples=16, deadline=None)
@given(m=st.sampled_from([1, 2, 4, 16, 32]), n=st.sampled_from([1, 8, 16, 64, 128]),
       k=st.sampled_from([1, 4, 16, 32]), half=st.booleans(), acc_in=st.booleans(),
       precision=st.sampled_from(["ieee", "tf32"]))
def test_generated_dot_shapes(m, n, k, half, acc_in, precision):
    """f16 products and ieee f32 ones are exact (sums in f32); tf32 on f32 is at least as
    fine as bf16x3, which it is on AMX tiles (amx_dot.py): 3 x 2^-16 of |a||b| a product,
    one f32 rounding per term added."""
    dtype = torch.float16 if half else torch.float32
    generator = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    c = torch.randn(m, n, generator=generator)
    start = c.double()
    expected = a.double() @ b.double() + (start if acc_in else 0)
    dot_kernel[(1,)](a, b, c, M=m, N=n, K=k, ACC_IN=acc_in, PRECISION=precision)
    if half or precision == "ieee":
        torch.testing.assert_close(c.double(), expected, rtol=1e-5, atol=1e-5)
        return
    unit = 2.0 ** -24
    bound = (3 * 2.0 ** -16 + (3 * k + 2) * unit) * (a.double().abs() @ b.double().abs()) \
        * 1.01 + 2 * unit * start.abs()
    assert ((c.double() - expected).abs() <= bound).all()


@triton.jit
def generated_elementwise(x_ptr, y_ptr, out_ptr, M, N, stride_xm, stride_xn, C: tl.constexpr,
                          OP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask,
                other=1.0)
    y = tl.load(y_ptr + cols, mask=cols < N, other=0.0)
    if OP == 0:
        z = x * y[None, :] + C
    elif OP == 1:
        z = tl.where(x > y[None, :], x - C, tl.exp(y)[None, :])
    elif OP == 2:
        z = tl.maximum(x, C) / (tl.abs(y)[None, :] + 1.0)
    else:
        z = tl.sum(x, axis=1)[:, None] + y[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], z, mask=mask)


def _generated_reference(x, y, c, op, block_n):
    if op == 0:
        return x * y[None, :] + c
    if op == 1:
        return torch.where(x > y[None, :], x - c, torch.exp(y)[None, :])
    if op == 2:
        return torch.clamp(x, min=c) / (y.abs()[None, :] + 1.0)
    padding = block_n - x.shape[1]  # masked-off lanes of the row read other=1.0
    return x.sum(1, keepdim=True) + padding + y[None, :]


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 70), op=st.integers(0, 3),
       block_m=st.sampled_from([1, 4, 16]), block_n=st.sampled_from([8, 16, 64]),
       transposed=st.booleans(), c=st.sampled_from([0.5, -2.0]))
def test_generated_masked_kernels_at_odd_sizes(m, n, op, block_m, block_n, transposed, c):
    generator = torch.Generator().manual_seed(m * 100 + n)
    x = torch.randn(n, m, generator=generator).t() if transposed else \
        torch.randn(m, n, generator=generator)
    y = torch.randn(n, generator=generator)
    out = torch.full((m, n), 123.0)
    if op == 3:  # the row sum must see the whole row in one program
        block_n = triton.next_power_of_2(n)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    generated_elementwise[grid](x, y, out, m, n, x.stride(0), x.stride(1), C=c, OP=op,
                                BLOCK_M=block_m, BLOCK_N=block_n)
    expected = _generated_reference(x, y, c, op, block_n)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@triton.jit
def shape_ops(x_ptr, y_ptr, joined_ptr, parts_ptr, cat_ptr, hist_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    y = tl.load(y_ptr + r)
    joined = tl.join(x, y)
    tl.store(joined_ptr + r[:, None] * 2 + tl.arange(0, 2)[None, :], joined)
    first, second = tl.split(tl.join(y, x * 2.0))
    tl.store(parts_ptr + r, first - second)
    tl.store(cat_ptr + tl.arange(0, 2 * N), tl.cat(x, y, can_reorder=False))
    tl.store(hist_ptr + tl.arange(0, 8), tl.histogram(r % 11, 8))


def test_join_split_cat_histogram():
    torch.manual_seed(5)
    n = 32
    x, y = torch.randn(n), torch.randn(n)
    joined, parts = torch.empty(n, 2), torch.empty(n)
    cat, hist = torch.empty(2 * n), torch.empty(8, dtype=torch.int32)
    shape_ops[(1,)](x, y, joined, parts, cat, hist, N=n)
    assert torch.equal(joined, torch.stack([x, y], dim=1))
    assert torch.equal(parts, y - 2 * x)
    assert torch.equal(cat, torch.cat([x, y]))
    assert torch.equal(hist.long(), torch.bincount(torch.arange(n) % 11, minlength=11)[:8])


@triton.jit
def asserting(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=1.0)
    tl.device_assert(x > 0, "x must be positive")


def test_device_assert_raises_in_debug_mode():
    from tilegen.triton_backend.driver import KernelAssertionError

    x = torch.ones(20)
    asserting[(1,)](x, 20, BLOCK=32, debug=True)
    x[13] = -1.0
    with pytest.raises(KernelAssertionError, match=r"x must be positive.*element 13"):
        asserting[(1,)](x, 20, BLOCK=32, debug=True)


@triton.jit
def surface_kernel(x_ptr, out_ptr, seed, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    row = 0
    tl.store(out_ptr + row * N + r, tl.clamp(x, -0.5, 0.5))
    row += 1
    tl.store(out_ptr + row * N + r, tl.sqrt_rn(tl.abs(x)) + tl.div_rn(x, 3.0))
    row += 1
    tl.store(out_ptr + row * N + r, tl.cumprod(x, axis=0))
    row += 1
    tl.store(out_ptr + row * N + r, tl.cumsum(x, axis=0, reverse=True))
    row += 1
    tl.store(out_ptr + row * N + r, tl.zeros([N], tl.float32) + tl.argmin(x, axis=0))
    row += 1
    tl.store(out_ptr + row * N + r, tl.randn(seed, r))
    row += 1
    tl.store(out_ptr + row * N + r, (tl.randint(seed, r) & 0xFF).to(tl.float32))
    row += 1
    acc = tl.zeros([N], tl.float32)
    for i in tl.static_range(3):
        acc += x * i
    tl.store(out_ptr + row * N + r, acc)
    row += 1
    tl.store(out_ptr + row * N + r, tl.umulhi(r.to(tl.uint32) * 123456789, r.to(tl.uint32) + 7)
             .to(tl.float32))
    row += 1
    tl.store(out_ptr + row * N + r, tl.math.erf(x) + tl.math.log2(tl.abs(x) + 1.0))


def test_language_surface_against_torch():
    import numpy as np

    torch.manual_seed(9)
    n = 16
    x = torch.randn(n)
    out = torch.empty(10, n)
    seed = 77
    surface_kernel[(1,)](x, out, seed, N=n)
    assert torch.equal(out[0], x.clamp(-0.5, 0.5))
    torch.testing.assert_close(out[1], x.abs().sqrt() + x / 3.0)
    torch.testing.assert_close(out[2], torch.cumprod(x, 0))
    torch.testing.assert_close(out[3], x.flip(0).cumsum(0).flip(0))
    assert torch.equal(out[4], torch.full((n,), float(x.argmin())))
    # randn and randint: the same Philox stream as the interpreter; here the statistics and
    # the independent NumPy Philox of tutorial 04's test for randint's low byte
    from tests.test_triton_tutorials import _philox_uniform_reference  # noqa: F401
    assert out[5].abs().max() < 6 and out[5].std() > 0.3
    assert ((out[6] >= 0) & (out[6] < 256)).all() and out[6].unique().numel() > 8
    torch.testing.assert_close(out[7], 3 * x)
    r = np.arange(n, dtype=np.uint64)
    hi = ((((r * 123456789) & 0xFFFFFFFF) * (r + 7)) >> 32).astype(np.float32)
    assert np.array_equal(out[8].numpy(), hi)
    torch.testing.assert_close(out[9], torch.erf(x) + torch.log2(x.abs() + 1))


@triton.jit
def strided_reads(x_ptr, out_ptr, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.arange(0, 8)
    cols = tl.arange(0, BLOCK)
    # last-axis strides the analysis proves: STRIDE elements, then 0 (a row broadcast)
    strided = tl.load(x_ptr + rows[:, None] * BLOCK + cols[None, :] * STRIDE)
    repeated = tl.load(x_ptr + rows[:, None] + cols[None, :] * 0)
    tl.store(out_ptr + rows[:, None] * BLOCK + cols[None, :], strided + repeated * 1000.0)


def test_loads_with_constant_strides():
    x = torch.arange(8 * 16 * 3, dtype=torch.float32)
    out = torch.empty(8, 16)
    strided_reads[(1,)](x, out, STRIDE=3, BLOCK=16)
    rows, cols = torch.arange(8)[:, None], torch.arange(16)[None, :]
    assert torch.equal(out, x[rows * 16 + cols * 3] + x[rows + 0 * cols] * 1000.0)


@triton.jit
def transposed_tile(x_ptr, out_ptr, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    # x is column-major: the tile is contiguous down its columns
    tile = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask,
                   other=-7.0)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], tile * 2.0, mask=mask)


@pytest.mark.parametrize("M,N,block_m,block_n", [(37, 45, 16, 32), (64, 64, 32, 16),
                                                 (5, 70, 4, 64)])
def test_column_contiguous_loads(M, N, block_m, block_n):
    torch.manual_seed(6)
    x = torch.randn(N, M).t()  # strides (1, M)
    out = torch.full((M, N), 99.0)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    transposed_tile[grid](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=block_m,
                          BLOCK_N=block_n)
    assert torch.equal(out, x * 2.0)


def test_driver_yields_to_an_active_gpu_backend(monkeypatch):
    import triton.backends as backends

    from tilegen.triton_backend.driver import TilegenDriver

    class ActiveGpuDriver:
        @staticmethod
        def is_active():
            return True

    monkeypatch.delenv("TRITON_DEFAULT_BACKEND", raising=False)
    assert TilegenDriver.is_active()
    monkeypatch.setitem(backends.backends, "fakegpu",
                        backends.Backend(compiler=object, driver=ActiveGpuDriver))
    assert not TilegenDriver.is_active()  # the GPU stays the default
    monkeypatch.setenv("TRITON_DEFAULT_BACKEND", "tilegen")
    assert TilegenDriver.is_active()  # unless tilegen is asked for
    monkeypatch.setenv("TILEGEN_TRITON_DISABLE", "1")
    assert not TilegenDriver.is_active()


@triton.jit
def reduce_3d(x_ptr, out_ptr, cum_ptr, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr,
              AXIS: tl.constexpr, OP: tl.constexpr):
    a = tl.arange(0, A)[:, None, None]
    b = tl.arange(0, B)[None, :, None]
    c = tl.arange(0, C)[None, None, :]
    x = tl.load(x_ptr + a * B * C + b * C + c)
    if OP == 0:
        r = tl.sum(x, axis=AXIS)
    elif OP == 1:
        r = tl.max(x, axis=AXIS)
    elif OP == 2:
        r = tl.min(x, axis=AXIS)
    else:
        r = tl.argmax(x, axis=AXIS).to(tl.float32)
    if AXIS == 0:
        tl.store(out_ptr + tl.arange(0, B)[:, None] * C + tl.arange(0, C)[None, :], r)
    elif AXIS == 1:
        tl.store(out_ptr + tl.arange(0, A)[:, None] * C + tl.arange(0, C)[None, :], r)
    else:
        tl.store(out_ptr + tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :], r)
    tl.store(cum_ptr + a * B * C + b * C + c, tl.cumsum(x, axis=AXIS))


@settings(max_examples=20, deadline=None)
@given(a=st.sampled_from([1, 2, 8]), b=st.sampled_from([1, 4, 16]), c=st.sampled_from([1, 2, 32]),
       axis=st.integers(0, 2), op=st.integers(0, 3))
@example(a=2, b=4, c=1, axis=0, op=3)  # lazy index tile read across rows of width 1
def test_generated_reductions_and_scans_over_any_axis(a, b, c, axis, op):
    generator = torch.Generator().manual_seed(a * 100 + b * 10 + c)
    x = torch.randn(a, b, c, generator=generator)
    shape = [a, b, c]
    del shape[axis]
    out, cum = torch.empty(*shape), torch.empty(a, b, c)
    reduce_3d[(1,)](x, out, cum, A=a, B=b, C=c, AXIS=axis, OP=op)
    expected = [x.sum(axis), x.amax(axis), x.amin(axis), x.argmax(axis).float()][op]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cum, x.cumsum(axis), rtol=1e-5, atol=1e-5)


def test_tile_ir_verifier_rejects_malformed_programs():
    from tilegen.triton_backend.tileir import Block, Op, Param, Program, TileType, Value
    from tilegen.triton_backend.verify import verify_program

    f32x4 = TileType("f32", (4,))
    x, y = Value(0, f32x4), Value(1, f32x4)
    ok = Program("k", (Param("x", x),), Block((x,), (
        Op("arith.addf", (y,), (x, x)), Op("tt.return", (), ()))))
    verify_program(ok)
    undefined = Program("k", (Param("x", x),), Block((x,), (
        Op("arith.addf", (y,), (x, Value(7, f32x4))),)))
    with pytest.raises(TileError, match="used before it is defined"):
        verify_program(undefined)
    twice = Program("k", (Param("x", x),), Block((x,), (Op("arith.addf", (x,), (x, x)),)))
    with pytest.raises(TileError, match="defined twice"):
        verify_program(twice)
    misshaped = Program("k", (Param("x", x),), Block((x,), (
        Op("arith.addf", (Value(2, TileType("f32", (8,))),), (x, x)),)))
    with pytest.raises(TileError, match="shape differs"):
        verify_program(misshaped)


@triton.jit
def wide_dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                    ACC_IN: tl.constexpr, F64: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    if F64:
        a, b = a.to(tl.float64), b.to(tl.float64)
    acc = tl.load(c_ptr + rm[:, None] * N + rn[None, :]) if ACC_IN else \
        tl.zeros((M, N), dtype=tl.float64 if F64 else tl.float32)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b, acc))


@pytest.mark.parametrize("m,k", [(8, 16), (16, 64), (128, 32)])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
def test_four_vector_wide_dots(monkeypatch, m, k, dtype):
    """b four vectors wide (64 f32 or 32 f64 lanes on AVX-512) runs unpacked in 6-row
    register blocks: every tile height here leaves a remainder block of 2 or 4 rows. (The
    FMA kernel's blocks: TILEGEN_TRITON_AMX=0, a fresh kernel.)"""
    from tilegen.target import host_target

    monkeypatch.setenv("TILEGEN_TRITON_AMX", "0")
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    kernel = triton.jit(wide_dot_kernel.fn)
    n = 4 * host_target().lanes("f64" if dtype == "f64" else "f32")
    torch_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                   "f64": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(m + k)
    a = torch.randn(m, k, generator=generator).to(torch_dtype)
    b = torch.randn(k, n, generator=generator).to(torch_dtype)
    for acc_in in (False, True):
        c = torch.randn(m, n, generator=generator, dtype=torch.float64 if dtype == "f64"
                        else torch.float32)
        expected = a.double() @ b.double() + (c.double() if acc_in else 0)
        kernel[(1,)](a, b, c, M=m, N=n, K=k, ACC_IN=acc_in, F64=dtype == "f64")
        tolerance = 1e-12 if dtype == "f64" else 1e-5
        torch.testing.assert_close(c.double(), expected, rtol=tolerance, atol=tolerance)
