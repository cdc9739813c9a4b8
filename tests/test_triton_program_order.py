"""The grid's program order (grid.py, program_order.py): kernels whose atomics repeat with
`program_id(0) % P` run the ids that agree mod P on one thread, in runs dealt to the
threads in turn; every other kernel keeps one contiguous run per thread."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tests.test_triton_tutorials import matmul_kernel, softmax_kernel_simple  # noqa: E402
from tests.test_triton_tutorials_2 import _layer_norm_bwd_dx_fused  # noqa: E402
from tilegen.triton_backend import driver  # noqa: E402


@pytest.fixture
def threads(monkeypatch, request):
    def use(count: int) -> None:
        monkeypatch.setenv("TILEGEN_NUM_THREADS", str(count))
        driver.num_threads.cache_clear()  # read once per process otherwise
        assert driver.num_threads() == count
    request.addfinalizer(driver.num_threads.cache_clear)
    return use


@triton.jit
def residue_counts(counts_ptr, lock_ptr, G: tl.constexpr):
    """Counts programs per `pid % G` with a plain load and store: exact only when no two
    programs of one residue run at the same time (the atomic gives the kernel its period)."""
    residue = tl.program_id(0) % G
    tl.atomic_add(lock_ptr + residue, 1)
    count = tl.load(counts_ptr + residue)
    tl.store(counts_ptr + residue, count + 1)


@pytest.mark.parametrize("programs,group,count", [(4096, 16, 2), (3001, 24, 3), (999, 8, 2)])
def test_ids_that_agree_mod_the_period_share_a_thread(programs, group, count, threads):
    threads(count)
    assert driver.run_length(group, programs, programs, count) > 0
    counts = torch.zeros(group, dtype=torch.int32)
    locks = torch.zeros(group, dtype=torch.int32)
    for _ in range(3):
        residue_counts[(programs,)](counts, locks, G=group)
    expected = 3 * torch.bincount(torch.arange(programs) % group, minlength=group).int()
    assert torch.equal(locks, expected)
    assert torch.equal(counts, expected)  # no update lost to another thread


@triton.jit
def ids_with_periodic_atomic(out_ptr, lock_ptr, G: tl.constexpr):
    x, y, z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    nx, ny = tl.num_programs(0), tl.num_programs(1)
    tl.atomic_add(lock_ptr + x % G, 1)
    tl.store(out_ptr + (z * ny + y) * nx + x, x * 100 + y * 10 + z + 1)


@pytest.mark.parametrize("count", [2, 3, 4])
@pytest.mark.parametrize("grid", [(24, 3, 2), (36, 1, 1), (25, 3, 1), (12, 1, 7), (997, 1, 1)])
def test_every_program_once_in_runs(grid, count, threads):
    """Each id once, whatever the runs' length and where they start in rows and planes."""
    threads(count)
    nx, ny, nz = grid
    out = torch.zeros(nx * ny * nz, dtype=torch.int32)
    locks = torch.zeros(12, dtype=torch.int32)
    compiled = ids_with_periodic_atomic[grid](out, locks, G=12)
    assert compiled.metadata.tilegen_program_period == 12
    z, y, x = torch.meshgrid(torch.arange(nz), torch.arange(ny), torch.arange(nx),
                             indexing="ij")
    assert torch.equal(out, (x * 100 + y * 10 + z + 1).flatten().int())
    assert torch.equal(locks, ny * nz * torch.bincount(torch.arange(nx) % 12,
                                                       minlength=12).int())


def test_run_length():
    for period, total, count in [(256, 4096, 2), (96, 4096, 2), (64, 1151, 2), (12, 144, 3),
                                 (256, 4096, 4), (7, 7000, 7)]:
        run = driver.run_length(period, total, total, count)
        assert run > 0 and period % (count * run) == 0, (period, total, count)
        assert run * driver.RUNS_PER_THREAD * count <= total
    assert driver.run_length(256, 4096, 4096, 2) == 128  # the longest that fits
    assert driver.run_length(0, 4096, 4096, 2) == 0  # no period: contiguous halves
    assert driver.run_length(256, 4096, 4096, 1) == 0
    assert driver.run_length(9, 4096, 4096, 2) == 0  # a period the threads do not divide
    assert driver.run_length(16, 20, 20, 2) == 0  # too few programs for 16 runs each
    assert driver.run_length(16, 24, 24 * 5, 2) == 0  # x extent not a multiple of 16
    assert driver.run_length(16, 32, 32 * 5, 2) == 4


@triton.jit
def atomics_by_address(out_ptr, G: tl.constexpr, FORM: tl.constexpr):
    pid = tl.program_id(0)
    if FORM == 0:
        tl.atomic_add(out_ptr + (pid * 3 + 1) % G, 1)
    elif FORM == 1:
        tl.atomic_add(out_ptr + pid // 4, 1)  # runs of 4 ids share an address
    elif FORM == 2:
        tl.atomic_add(out_ptr + pid % 4, 1)
        tl.atomic_max(out_ptr + 8 + pid % 6, pid)
    elif FORM == 3:
        tl.atomic_add(out_ptr + pid % G + pid, 1)
    elif FORM == 4:
        tl.atomic_add(out_ptr, 1)  # one address for every program
    else:
        for i in range(0, pid % 3):  # the address a loop carries
            tl.atomic_add(out_ptr + (pid + i) % G, 1)


@pytest.mark.parametrize("form,period", [(0, 12), (1, 0), (2, 12), (3, 0), (4, 0), (5, 0)])
def test_program_period_of_atomic_addresses(form, period):
    out = torch.zeros(64, dtype=torch.int32)
    compiled = atomics_by_address[(24,)](out, G=12, FORM=form)
    assert compiled.metadata.tilegen_program_period == period


def test_tutorial_kernels_periods():
    """05's backward repeats with GROUP_SIZE_M; kernels without atomics keep halves."""
    rows, cols, group = 64, 48, 8
    x, dy, dx = torch.randn(rows, cols), torch.randn(rows, cols), torch.empty(rows, cols)
    w, mean, rstd = torch.rand(cols), x.mean(1), torch.ones(rows)
    locks = torch.zeros(2 * group, dtype=torch.int32)
    partial_dw, partial_db = torch.zeros(group, cols), torch.zeros(group, cols)
    compiled = _layer_norm_bwd_dx_fused[(rows,)](
        dx, dy, partial_dw, partial_db, x, w, mean, rstd, locks, x.stride(0), cols,
        BLOCK_SIZE_N=64, GROUP_SIZE_M=group)
    assert compiled.metadata.tilegen_program_period == group
    y = torch.empty_like(x)
    compiled = softmax_kernel_simple[(rows,)](y, x, x.stride(0), y.stride(0), cols,
                                              BLOCK_SIZE=64)
    assert compiled.metadata.tilegen_program_period == 0
    a, b, c = torch.randn(32, 32), torch.randn(32, 32), torch.empty(32, 32,
                                                                     dtype=torch.float16)
    compiled = matmul_kernel.fn[(4,)](a, b, c, 32, 32, 32, *a.stride(), *b.stride(),
                                      *c.stride(), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16,
                                      BLOCK_SIZE_K=16, GROUP_SIZE_M=2, ACTIVATION="")
    assert compiled.metadata.tilegen_program_period == 0
