"""Fewer and faster sweeps over a program's rows: reductions of the same rows run in one
sweep (sibling_reductions.py), against torch, with the cases where they must not join;
loads that cannot be fused stored by the reduction's sweep that reads them
(shared_fills.py); row-long accesses prefetch ahead (prefetch.py)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend import shared_fills, sibling_reductions  # noqa: E402


@contextlib.contextmanager
def counting_joins():
    """How many later reductions each first reduction took into its sweep. Launch
    `fresh(kernel)` inside: a new JITFunction, compiled (not from the disk cache)."""
    found: list[int] = []
    joined = sibling_reductions.SiblingReductions.joined

    def spy(self, e, first, shape):
        later = joined(self, e, first, shape)
        found.append(len(later[0]))
        return later
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sibling_reductions.SiblingReductions, "joined", spy)
        patch.setattr(triton.knobs.compilation, "always_compile", True)
        yield found


def fresh(kernel):
    return triton.jit(kernel.fn)


@triton.jit
def two_row_reductions(x_ptr, y_ptr, a_ptr, b_ptr, n, stride, CASE: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0)
    a = tl.sum(x * y, axis=0)
    if CASE == 0:  # another combine (max) right after: joined
        b = tl.max(tl.where(mask, y, float("-inf")), axis=0) + a * 0.0
    elif CASE == 1:  # a two-operand reduction (argmax) and a scalar op between: joined
        scaled = a / n
        b = tl.argmax(tl.where(mask, x, float("-inf")), axis=0).to(tl.float32) + scaled
    elif CASE == 2:  # a store between that overwrites the row the second one loads
        tl.store(y_ptr + row * stride + cols, x * 3.0, mask=mask)
        b = tl.sum(tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0), axis=0)
    elif CASE == 3:  # reads the first one's result: not joined
        b = tl.sum(tl.where(mask, x - a, 0.0), axis=0)
    else:  # y read again after a store to it: the sum of the old y, not joined
        tl.store(y_ptr + row * stride + cols, x, mask=mask)
        b = tl.sum(y * 2.0, axis=0)
    tl.store(a_ptr + row, a)
    tl.store(b_ptr + row, b)


def _two_reference(x, y, case):
    x, y = x.double(), y.double()
    a = (x * y).sum(1)
    n = x.shape[1]
    if case == 0:
        return a, y.max(1).values
    if case == 1:
        return a, x.argmax(1).double() + a / n
    if case == 2:
        return a, (x * 3.0).sum(1)
    if case == 3:
        return a, (x - a[:, None]).sum(1)
    return a, (y * 2.0).sum(1)


@settings(max_examples=12, deadline=None)
@given(case=st.integers(0, 4), n=st.sampled_from([1, 3, 37, 200, 1000, 1024]),
       rows=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_reductions_of_one_row_share_its_sweep(case, n, rows, seed):
    g = torch.Generator().manual_seed(seed)
    block = max(16, triton.next_power_of_2(n))
    x, y = torch.randn(rows, n + 5, generator=g), torch.randn(rows, n + 5, generator=g)
    x_in, y_in = x[:, :n].clone(), y[:, :n].clone()
    a, b = torch.empty(rows), torch.empty(rows)
    with counting_joins() as joins:
        fresh(two_row_reductions)[(rows,)](x, y, a, b, n, x.stride(0), CASE=case, BLOCK=block)
    expected_a, expected_b = _two_reference(x_in, y_in, case)
    if case == 3:  # sum(x - a): a's f32 rounding counts n times, so subtract the kernel's a
        expected_b = (x_in.double() - a.double()[:, None]).sum(1)
    torch.testing.assert_close(a.double(), expected_a, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.double(), expected_b, rtol=1e-5, atol=1e-4)
    assert joins[0] == (1 if case in (0, 1) else 0)


@triton.jit
def row_statistics_2d(x_ptr, sum_ptr, max_ptr, arg_ptr, m, n, BM: tl.constexpr,
                      BN: tl.constexpr):
    """Three reductions of a 2-D tile along its rows, the last with an integer sum."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    x = tl.load(x_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(x, axis=1)
    biggest = tl.max(tl.where(mask, x, float("-inf")), axis=1)
    positive = tl.sum((x > 0).to(tl.int32), axis=1)
    tl.store(sum_ptr + rows, total, mask=rows < m)
    tl.store(max_ptr + rows, biggest, mask=rows < m)
    tl.store(arg_ptr + rows, positive, mask=rows < m)


@pytest.mark.parametrize("m,n,bm,bn", [(7, 37, 4, 64), (33, 200, 8, 256), (5, 16, 8, 16)])
def test_2d_reductions_along_rows_share_one_sweep(m, n, bm, bn):
    g = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, n, generator=g)
    sums, maxima, positive = torch.empty(m), torch.empty(m), torch.empty(m, dtype=torch.int32)
    with counting_joins() as joins:
        fresh(row_statistics_2d)[(triton.cdiv(m, bm),)](x, sums, maxima, positive, m, n,
                                                        BM=bm, BN=bn)
    torch.testing.assert_close(sums.double(), x.double().sum(1), rtol=1e-5, atol=1e-4)
    assert torch.equal(maxima, x.max(1).values)
    assert torch.equal(positive, (x > 0).sum(1).to(torch.int32))
    assert joins[0] == 2


def test_tutorial_layer_norm_backward_sums_in_one_sweep():
    """c1 = sum(xhat * wdy) and c2 = sum(wdy): one sweep of the row for both, which also
    reads dy from memory and stores it (read by `w * dy`, `dy * xhat` and both branches of
    the lock section, it is not copied to the frame in a sweep of its own)."""
    from tests.test_triton_tutorials_2 import _layer_norm_bwd_dx_fused
    rows, n, group = 5, 300, 2
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(rows, n, generator=g), torch.randn(rows, n, generator=g)
    w = torch.rand(n, generator=g)
    mean, var = x.mean(1), x.var(1, unbiased=False)
    rstd = 1 / torch.sqrt(var + 1e-5)
    dx, locks = torch.empty_like(x), torch.zeros(2 * group, dtype=torch.int32)
    partial_dw, partial_db = torch.zeros(group, n), torch.zeros(group, n)
    with counting_joins() as joins, counting_load_fills() as fills:
        fresh(_layer_norm_bwd_dx_fused)[(rows,)](dx, dy, partial_dw, partial_db, x, w, mean,
                                                 rstd, locks, x.stride(0), n,
                                                 BLOCK_SIZE_N=512, GROUP_SIZE_M=group)
    xhat = (x - mean[:, None]) * rstd[:, None]
    wdy = w * dy
    c1, c2 = (xhat * wdy).mean(1, keepdim=True), wdy.mean(1, keepdim=True)
    torch.testing.assert_close(dx, (wdy - (xhat * c1 + c2)) * rstd[:, None], rtol=1e-4,
                               atol=1e-4)
    torch.testing.assert_close(partial_dw.sum(0), (dy * xhat).sum(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(partial_db.sum(0), dy.sum(0), rtol=1e-4, atol=1e-4)
    assert joins == [1]
    assert (fills["deferred"], fills["filled"]) == (1, 1)


# ---- loads stored by the sweep of the reduction that reads them (shared_fills.py) -----------

@contextlib.contextmanager
def counting_load_fills():
    """Per compile inside: how many loads were left to a reduction's sweep, and how many of
    those the sweep filled."""
    found = {"deferred": 0, "filled": 0, "filled values": 0}
    defer_load, end = shared_fills.SharedFills.defer_load, shared_fills.SharedFills.end

    def spy_defer(self, e, op, lazy):
        taken = defer_load(self, e, op, lazy)
        found["deferred"] += taken
        return taken

    def spy_end(self, e, op):
        before = len(self.filled)
        end(self, e, op)
        kinds = [lazy.kind for lazy, _ in list(self.filled.values())[before:]]
        found["filled"] += kinds.count("load")
        found["filled values"] += len(kinds) - kinds.count("load")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shared_fills.SharedFills, "defer_load", spy_defer)
        patch.setattr(shared_fills.SharedFills, "end", spy_end)
        patch.setattr(triton.knobs.compilation, "always_compile", True)
        yield found


@triton.jit
def row_read_by_sum_and_branches(x_ptr, w_ptr, out_ptr, dst_ptr, flag_ptr, n, stride,
                                 CASE: tl.constexpr, BLOCK: tl.constexpr):
    """x has five readers, two of them in the branches (a yield): it cannot be fused."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    if CASE == 1:  # a store between overwrites the row: everything reads the old x
        tl.store(x_ptr + row * stride + cols, tl.full([BLOCK], -7.0, tl.float32), mask=mask)
    if CASE == 2:  # the sum reads x through a tile stored before it: x is not filled there
        t = tl.exp(tl.exp(tl.exp(tl.exp(x * 0.01) * 0.1) * 0.1) * 0.1)
        s = tl.sum(t * w, axis=0)
    else:
        s = tl.sum(x * w, axis=0)
    tl.store(out_ptr + row * stride + cols, x * s, mask=mask)
    if tl.load(flag_ptr + row) == 0:
        y = x
    else:
        y = x + tl.load(dst_ptr + row * stride + cols, mask=mask, other=0.0)
    tl.store(dst_ptr + row * stride + cols, y, mask=mask)


@pytest.mark.parametrize("case,filled", [(0, 1), (1, 0), (2, 0)])
@pytest.mark.parametrize("n", [1, 45, 300, 1531])
def test_load_stored_by_the_sweep_of_its_reduction(case, filled, n):
    rows = 7
    g = torch.Generator().manual_seed(n + case)
    block = max(16, triton.next_power_of_2(n))
    x = torch.randn(rows, n + 3, generator=g)
    w = torch.rand(n, generator=g)
    dst = torch.randn(rows, n + 3, generator=g)
    out = torch.full_like(x, float("nan"))
    flags = torch.tensor([0, 1, 1, 0, 1, 0, 1], dtype=torch.int32)
    x_in, dst_in = x.clone(), dst.clone()
    with counting_load_fills() as fills:
        fresh(row_read_by_sum_and_branches)[(rows,)](x, w, out, dst, flags, n, x.stride(0),
                                                     CASE=case, BLOCK=block)
    xs = x_in[:, :n].double()
    t = torch.exp(torch.exp(torch.exp(torch.exp(xs * 0.01) * 0.1) * 0.1) * 0.1) \
        if case == 2 else xs
    s = (t * w.double()).sum(1, keepdim=True)
    torch.testing.assert_close(out[:, :n].double(), xs * s, rtol=1e-5, atol=1e-4)
    assert out[:, n:].isnan().all()  # masked-off lanes untouched
    expected = torch.where(flags[:, None].bool(), xs + dst_in[:, :n].double(), xs)
    torch.testing.assert_close(dst[:, :n].double(), expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(dst[:, n:], dst_in[:, n:])
    if case == 1:
        assert (x[:, :n] == -7.0).all() and torch.equal(x[:, n:], x_in[:, n:])
    assert (fills["deferred"], fills["filled"]) == (1, filled)


@triton.jit
def value_read_in_branch_and_loop(x_ptr, y_ptr, flag_ptr, n, stride, trips,
                                  BLOCK: tl.constexpr):
    """`num` (too costly to recompute) is filled by its sum's sweep and read after it in a
    branch and in a loop."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=float("-inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    total = tl.sum(num, axis=0)
    if tl.load(flag_ptr + row) != 0:
        y = num / total
    else:
        y = num * 2.0
    for _ in range(trips):
        y += num
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


@pytest.mark.parametrize("n,trips", [(1, 0), (45, 2), (700, 3)])
def test_value_filled_by_its_sweep_read_in_a_branch_and_a_loop(n, trips):
    rows = 5
    g = torch.Generator().manual_seed(n)
    x = torch.randn(rows, n + 2, generator=g)
    y = torch.full_like(x, float("nan"))
    flags = torch.tensor([1, 0, 0, 1, 1], dtype=torch.int32)
    with counting_load_fills() as fills:
        fresh(value_read_in_branch_and_loop)[(rows,)](x, y, flags, n, x.stride(0), trips,
                                                      BLOCK=max(16, triton.next_power_of_2(n)))
    xs = x[:, :n].double()
    num = torch.exp(xs - xs.max(1, keepdim=True).values)
    expected = torch.where(flags[:, None].bool(), num / num.sum(1, keepdim=True), num * 2)
    torch.testing.assert_close(y[:, :n].double(), expected + trips * num, rtol=1e-5,
                               atol=1e-6)
    assert y[:, n:].isnan().all()
    assert fills["filled values"] == 1


# ---- prefetch ahead of row-long accesses (prefetch.py) --------------------------------------

@triton.jit
def scaled_rows(x_ptr, y_ptr, n, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0)
    total = tl.sum(x, axis=0)
    tl.store(y_ptr + row * stride + cols, x * 2.0 + total, mask=cols < n)


def _prefetches(llir: str) -> list[str]:
    """The read/write flag of each prefetch call in the kernel's LLVM IR."""
    calls = [line for line in llir.splitlines() if "call void @\"llvm.prefetch" in line]
    return [call.split("i32")[1].strip(" ,") for call in calls]


@pytest.mark.parametrize("n,block,rows", [(1000, 1024, 3), (613, 1024, 5), (2049, 4096, 2)])
def test_row_long_accesses_prefetch_ahead_without_faults(n, block, rows):
    """Rows of 4 KB and more: the load and the store prefetch ahead (read and write); the
    last row's prefetches run past the tensor's end, which must neither fault nor trip the
    bounds checks (debug=True), and the results stay exact."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(rows, n, generator=g)
    y = torch.empty_like(x)
    compiled = fresh(scaled_rows)[(rows,)](x, y, n, n, BLOCK=block, debug=True)
    torch.testing.assert_close(y, x * 2.0 + x.sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    flags = _prefetches(compiled.asm["llir"])
    assert "0" in flags and "1" in flags


def test_short_rows_do_not_prefetch():
    """Rows of 512 bytes (matmul- and attention-sized tiles) are left to the hardware."""
    x = torch.randn(4, 100)
    y = torch.empty_like(x)
    compiled = fresh(scaled_rows)[(4,)](x, y, 100, 100, BLOCK=128)
    torch.testing.assert_close(y, x * 2.0 + x.sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    assert _prefetches(compiled.asm["llir"]) == []


# ---- stores of a branch's results emitted in the branches (branch_stores.py) ----------------

@contextlib.contextmanager
def counting_sunk_stores():
    """How many stores each `scf.if` sank into its branches (launch `fresh(kernel)`)."""
    from tilegen.triton_backend import branch_stores
    found: list[int] = []
    plan = branch_stores.plan

    def spy(e, op):
        sunk = plan(e, op)
        found.append(len(sunk))
        return sunk
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(branch_stores, "plan", spy)
        patch.setattr(triton.knobs.compilation, "always_compile", True)
        yield found


@triton.jit
def update_in_branches(p_ptr, q_ptr, x_ptr, flag_ptr, n, stride, shift, q_stride,
                       BLOCK: tl.constexpr):
    """Both branches yield two tiles, stored right after the `if` to P and to Q (Q may be P
    shifted by `shift` elements in the same buffer); the else branch reads P and Q first."""
    pid = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + pid * n + offsets, mask=mask, other=0.0)
    p = p_ptr + pid * stride + offsets
    q = q_ptr + pid * q_stride + shift + offsets
    if tl.load(flag_ptr + pid) == 0:
        a = x * 2.0
        b = x + 1.0
    else:
        a = x + tl.load(p, mask=mask, other=0.0)
        b = x * 3.0 + tl.load(q, mask=mask, other=0.0)
    tl.store(p, a, mask=mask)
    tl.store(q, b, mask=mask)


def _update_reference(buffer, q_buffer, x, flags, n, stride, base, shift, q_stride, q_base):
    """Program by program (their regions are apart), in program order: both loads before
    either store, then P, then Q."""
    for pid in range(x.shape[0]):
        p_at = slice(base + pid * stride, base + pid * stride + n)
        q_start = q_base + pid * q_stride + shift
        q_at = slice(q_start, q_start + n)
        if flags[pid] == 0:
            a, b = x[pid] * 2.0, x[pid] + 1.0
        else:
            a, b = x[pid] + buffer[p_at], x[pid] * 3.0 + q_buffer[q_at]
        buffer[p_at] = a
        q_buffer[q_at] = b


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("shift", [0, 5, -5, -200, None])
@pytest.mark.parametrize("n,block", [(37, 64), (1000, 1024)])
def test_branch_results_stored_in_the_branches(monkeypatch, threads, shift, n, block):
    """Q the same addresses as P (shift 0: the else branch's load of Q must see P before
    the store to P), overlapping it either way, apart in the same buffer (-200, farther
    than n for n = 37; overlapping for n = 1000), or another tensor (None)."""
    monkeypatch.setenv("TILEGEN_NUM_THREADS", threads)
    rows, pad = 5, 256
    stride = n + 2 * pad  # each program's region, shifts included, is apart from the others
    g = torch.Generator().manual_seed(n + (shift or 0))
    x = torch.randn(rows, n, generator=g)
    flags = torch.tensor([1, 0, 1, 1, 0], dtype=torch.int32)
    buffer = torch.randn(rows * stride + 2 * pad, generator=g)
    p_view = buffer[pad:]
    if shift is None:
        q_buffer = torch.randn(rows * n, generator=g)
        q_view, q_shift, q_stride, q_base = q_buffer, 0, n, 0
    else:
        q_buffer, q_view, q_shift, q_stride, q_base = buffer, p_view, shift, stride, pad
    expected = buffer.clone()
    expected_q = q_buffer.clone() if shift is None else expected
    _update_reference(expected, expected_q, x, flags, n, stride, pad, q_shift, q_stride,
                      q_base)
    with counting_sunk_stores() as sunk:
        fresh(update_in_branches)[(rows,)](p_view, q_view, x, flags, n, stride, q_shift,
                                           q_stride, BLOCK=block)
    torch.testing.assert_close(buffer, expected, rtol=1e-6, atol=1e-6)
    if shift is None:
        torch.testing.assert_close(q_buffer, expected_q, rtol=1e-6, atol=1e-6)
    assert sunk == [2]


@triton.jit
def branch_result_read_twice(p_ptr, x_ptr, n, BLOCK: tl.constexpr):
    """A result read by a store and by a later op (or stored after another store): kept in
    its slot."""
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    if n > 8:
        a = x * 2.0
    else:
        a = x - 1.0
    tl.store(p_ptr + offsets, a, mask=mask)
    tl.store(p_ptr + n + offsets, a + 1.0, mask=mask)


def test_branch_result_with_other_readers_keeps_its_slot():
    x = torch.randn(37)
    out = torch.zeros(74)
    with counting_sunk_stores() as sunk:
        fresh(branch_result_read_twice)[(1,)](out, x, 37, BLOCK=64)
    torch.testing.assert_close(out, torch.cat([x * 2.0, x * 2.0 + 1.0]))
    assert sunk == [0]


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_tutorial_layer_norm_backward_lock_stores_in_its_branches(monkeypatch, threads):
    """The tutorial's dW/dB partial sums under its `atomic_cas` lock, with more rows than
    groups so that programs on different threads meet at one lock: exact partial sums,
    both stores of each branch sunk."""
    from tests.test_triton_tutorials_2 import _layer_norm_bwd_dx_fused
    monkeypatch.setenv("TILEGEN_NUM_THREADS", threads)
    rows, n, group = 61, 613, 3
    g = torch.Generator().manual_seed(int(threads))
    x, dy = torch.randn(rows, n, generator=g), torch.randn(rows, n, generator=g)
    w = torch.rand(n, generator=g)
    mean = x.mean(1)
    rstd = 1 / torch.sqrt(x.var(1, unbiased=False) + 1e-5)
    dx, locks = torch.empty_like(x), torch.zeros(2 * group, dtype=torch.int32)
    partial_dw, partial_db = torch.full((group, n), 7.0), torch.full((group, n), 7.0)
    with counting_sunk_stores() as sunk:
        fresh(_layer_norm_bwd_dx_fused)[(rows,)](dx, dy, partial_dw, partial_db, x, w, mean,
                                                 rstd, locks, x.stride(0), n,
                                                 BLOCK_SIZE_N=1024, GROUP_SIZE_M=group)
    xhat = (x - mean[:, None]) * rstd[:, None]
    by_group = torch.arange(rows) % group
    for lock in range(group):
        rows_of = by_group == lock
        torch.testing.assert_close(partial_dw[lock], (dy * xhat)[rows_of].sum(0),
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(partial_db[lock], dy[rows_of].sum(0), rtol=1e-4,
                                   atol=1e-4)
    assert torch.equal(locks[:group], torch.zeros(group, dtype=torch.int32))
    assert torch.equal(locks[group:], torch.ones(group, dtype=torch.int32))
    assert sunk == [2]


@triton.jit
def looped_rows(x_ptr, y_ptr, rows, n, CASE: tl.constexpr, BLOCK: tl.constexpr):
    """y = 2 x over rows of n: along each row in BLOCK steps (CASE 0), rows visited with
    the number of programs as the step (1, the persistent softmax's order), or through a
    carried pointer (2)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    if CASE == 0:
        for off in range(0, n, BLOCK):
            x = tl.load(x_ptr + pid * n + off + cols, mask=off + cols < n, other=0.0)
            tl.store(y_ptr + pid * n + off + cols, x * 2.0, mask=off + cols < n)
    elif CASE == 1:
        for row in tl.range(pid, rows, tl.num_programs(0)):
            x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
            tl.store(y_ptr + row * n + cols, x * 2.0, mask=cols < n)
    else:
        p = x_ptr + pid * n + cols
        q = y_ptr + pid * n + cols
        for off in range(0, n, BLOCK):
            x = tl.load(p, mask=off + cols < n, other=0.0)
            tl.store(q, x * 2.0, mask=off + cols < n)
            p += BLOCK
            q += BLOCK


@pytest.mark.parametrize("case,prefetches", [(0, True), (1, True), (2, False)])
def test_loop_accesses_prefetch_only_the_next_trips_bytes(case, prefetches):
    """In a loop, ahead is the next trip: prefetched when the address advances by the
    tile's bytes per trip (a constant step) or, for rows a runtime step apart, the next
    trip's row (tests/test_triton_persistent_prefetch.py); not for a carried pointer.
    Rows of 2500 (several trips, the last one masked), 1000 for a row per trip."""
    rows, n, block = 5, 1000 if case == 1 else 2500, 1024
    grid = 2 if case == 1 else rows
    x = torch.randn(rows, n)
    y = torch.empty_like(x)
    compiled = fresh(looped_rows)[(grid,)](x, y, rows, n, CASE=case, BLOCK=block)
    torch.testing.assert_close(y, x * 2.0)
    assert bool(_prefetches(compiled.asm["llir"])) == prefetches
