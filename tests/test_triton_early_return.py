"""Early `return` inside `if` in Triton kernels: TTIR's branches between blocks
(`cf.cond_br`, `cf.br` with block arguments, several `tt.return`s) rebuilt as nested
`scf.if` at import (structurize.py). Each kernel is checked against torch computed
element by element from the kernel's own logic, with every output the kernel must not
write left at its sentinel; a generated family of guard kernels; the structure the import
builds; and the errors for what it does not structurize."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend.structurize import structurize  # noqa: E402
from tilegen.triton_backend.tileir import (  # noqa: E402
    Block,
    Loc,
    Op,
    TileError,
    TileType,
    Value,
)

SENTINEL = -7.0


def _program_of(n: int, block: int) -> torch.Tensor:
    return torch.arange(n) // block


@triton.jit
def guard_on_program_id(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid * BLOCK >= n:
        return
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2.0 + 1.0, mask=mask)


@pytest.mark.parametrize("n,programs", [(37, 5), (64, 4), (1, 3), (100, 7)])
def test_guard_on_program_id(n, programs):
    """More programs than blocks: the extra ones return before touching memory (their
    offsets lie past the tensor, so a store would fail the bounds or clobber the tail)."""
    x = torch.randn(n + 64)
    y = torch.full_like(x, SENTINEL)
    guard_on_program_id[(programs,)](x, y, n, BLOCK=16)
    expected = torch.full_like(x, SENTINEL)
    covered = min(n, programs * 16)
    expected[:covered] = x[:covered] * 2.0 + 1.0
    assert torch.equal(y, expected)


def test_guard_keeps_the_body_whole():
    """The common guard copies nothing: one store, one `scf.if`, no branch left."""
    x = torch.randn(40)
    y = torch.empty_like(x)
    compiled = triton.jit(guard_on_program_id.fn)[(3,)](x, y, 40, BLOCK=16)
    text = compiled.asm["ttile"]
    assert not re.search(r"\bcf\.", text)
    assert text.count("tt.store") == 1 and text.count("scf.if") == 1
    assert text.count("tt.return") == 1
    torch.testing.assert_close(y, x * 2.0 + 1.0)


@triton.jit
def return_in_else(x_ptr, y_ptr, n, limit, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if pid < limit:
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.exp(x), mask=mask)
    else:
        return
    tl.store(y_ptr + offs, tl.load(y_ptr + offs, mask=mask) + 1.0, mask=mask)


@pytest.mark.parametrize("n,limit", [(45, 2), (45, 0), (45, 9), (16, 1)])
def test_return_in_else(n, limit):
    x = torch.randn(n)
    y = torch.full_like(x, SENTINEL)
    return_in_else[(triton.cdiv(n, 16),)](x, y, n, limit, BLOCK=16)
    ran = _program_of(n, 16) < limit
    expected = torch.where(ran, torch.exp(x) + 1.0, torch.full_like(x, SENTINEL))
    torch.testing.assert_close(y, expected)


@triton.jit
def several_returns(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if pid == 0:
        tl.store(y_ptr + offs, x + 10.0, mask=mask)
        return
    if pid % 3 == 1:
        tl.store(y_ptr + offs, -x, mask=mask)
        return
    if pid % 3 == 2:
        return
    tl.store(y_ptr + offs, x * x, mask=mask)


def test_several_returns():
    n = 16 * 9 - 5
    x = torch.randn(n)
    y = torch.full_like(x, SENTINEL)
    several_returns[(9,)](x, y, n, BLOCK=16)
    pid = _program_of(n, 16)
    expected = torch.where(pid % 3 == 0, x * x, torch.full_like(x, SENTINEL))
    expected = torch.where(pid % 3 == 1, -x, expected)
    expected = torch.where(pid == 0, x + 10.0, expected)
    torch.testing.assert_close(y, expected)


@triton.jit
def return_after_values(x_ptr, y_ptr, flag_ptr, threshold, BLOCK: tl.constexpr):
    """The condition is data: a reduction of the row loaded before the `if`."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * BLOCK + cols)
    peak = tl.max(x, axis=0)
    scaled = x / peak
    if peak > threshold:
        tl.store(y_ptr + row * BLOCK + cols, scaled)
        tl.store(flag_ptr + row, 1)
        return
    tl.store(y_ptr + row * BLOCK + cols, x - peak)
    tl.store(flag_ptr + row, 2)


def test_return_with_values_computed_before():
    torch.manual_seed(1)
    x = torch.randn(11, 32)
    y = torch.full_like(x, SENTINEL)
    flag = torch.zeros(11, dtype=torch.int32)
    return_after_values[(11,)](x, y, flag, 2.0, BLOCK=32)
    peak = x.max(dim=1, keepdim=True).values
    high = peak > 2.0
    torch.testing.assert_close(y, torch.where(high, x / peak, x - peak))
    assert torch.equal(flag, torch.where(high[:, 0], 1, 2).int())
    assert 0 < int(high.sum()) < 11  # both paths ran


@triton.jit
def _bump(v, c):
    if c > 3:
        return v * 2.0
    return v + 1.0


@triton.jit
def nested_returns(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """Returns two `if`s deep, values carried to the joins, and a helper with two returns
    inlined: the canonicalizer shares one join between the two source `if`s."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x_ptr + offs, mask=mask)
    if pid > 2:
        acc = acc * 3.0
        if pid == 5:
            tl.store(y_ptr + offs, acc, mask=mask)
            return
        acc = acc + 1.0
    else:
        acc = _bump(acc, pid)
    for _ in range(3):
        acc += 1.0
    tl.store(y_ptr + offs, acc, mask=mask)


def test_nested_if_with_return():
    n = 16 * 7 - 3
    x = torch.randn(n)
    y = torch.full_like(x, SENTINEL)
    nested_returns[(7,)](x, y, n, BLOCK=16)
    pid = _program_of(n, 16)
    low = torch.where(pid > 3, x * 2.0, x + 1.0) + 3.0
    high = torch.where(pid == 5, x * 3.0, x * 3.0 + 1.0 + 3.0)
    torch.testing.assert_close(y, torch.where(pid > 2, high, low))


@triton.jit
def guard_before_loop(x_ptr, y_ptr, M, N, stride, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    if pid * BLOCK_M >= M:
        return
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(x * x, axis=1)
    tl.store(y_ptr + rows, tl.sqrt(acc), mask=rows < M)


@pytest.mark.parametrize("M,N", [(37, 53), (8, 8), (1, 100)])
def test_early_return_before_a_loop(M, N):
    torch.manual_seed(2)
    x = torch.randn(M, N)
    y = torch.full((M + 8,), SENTINEL)
    guard_before_loop[(triton.cdiv(M, 8) + 2,)](x, y, M, N, x.stride(0),
                                                BLOCK_M=8, BLOCK_N=16)
    torch.testing.assert_close(y[:M], x.norm(dim=1), rtol=1e-5, atol=1e-5)
    assert torch.equal(y[M:], torch.full((8,), SENTINEL))


@triton.jit
def guard_2d(x_ptr, y_ptr, M, N, stride, skip_m, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= M or pid_n * BLOCK_N >= N:
        return
    if pid_m == skip_m:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * stride + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.abs(x) + pid_n, mask=mask)


@pytest.mark.parametrize("M,N,skip_m", [(37, 53, 1), (16, 32, -1), (5, 70, 0)])
def test_2d_grid_guards(M, N, skip_m):
    x = torch.randn(M, N)
    y = torch.full_like(x, SENTINEL)
    grid = (triton.cdiv(M, 16) + 1, triton.cdiv(N, 32) + 2)
    guard_2d[grid](x, y, M, N, x.stride(0), skip_m, BLOCK_M=16, BLOCK_N=32)
    pid_m = (torch.arange(M) // 16)[:, None]
    pid_n = (torch.arange(N) // 32)[None, :]
    expected = torch.where(pid_m == skip_m, torch.full_like(x, SENTINEL),
                           x.abs() + pid_n.float())
    torch.testing.assert_close(y, expected)


@triton.jit
def guard_family(x_ptr, y_ptr, n, t, t2, PRED: tl.constexpr, RETURN_IN_THEN: tl.constexpr,
                 NESTED: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x_ptr + offs, mask=mask)
    if PRED == 0:
        cond = pid < t
    elif PRED == 1:
        cond = pid >= t
    elif PRED == 2:
        cond = pid == t
    else:
        cond = pid != t
    if cond:
        acc = acc * 2.0
        if RETURN_IN_THEN:
            tl.store(y_ptr + offs, acc, mask=mask)
            return
    else:
        acc = acc + 1.0
        if not RETURN_IN_THEN:
            return
    if NESTED:  # noqa: SIM102 (a constexpr `if`: `and` would make it a runtime one)
        if pid % 2 == 1:
            acc = acc - 3.0
            if pid > t2:
                return
    tl.store(y_ptr + offs, acc * acc, mask=mask)


def _guard_family_reference(x, block, t, t2, pred, return_in_then, nested):
    """What each program of guard_family stores, program by program."""
    y = torch.full_like(x, SENTINEL)
    for pid in range(triton.cdiv(x.numel(), block)):
        part = slice(pid * block, (pid + 1) * block)
        acc = x[part].clone()
        cond = (pid < t, pid >= t, pid == t, pid != t)[pred]
        if cond:
            acc = acc * 2.0
            if return_in_then:
                y[part] = acc
                continue
        else:
            acc = acc + 1.0
            if not return_in_then:
                continue
        if nested and pid % 2 == 1:
            acc = acc - 3.0
            if pid > t2:
                continue
        y[part] = acc * acc
    return y


@settings(max_examples=24, deadline=None)
@given(n=st.integers(1, 130), block=st.sampled_from([16, 32]), t=st.integers(-1, 8),
       t2=st.integers(-1, 8), pred=st.integers(0, 3), return_in_then=st.booleans(),
       nested=st.booleans())
@example(n=97, block=16, t=3, t2=4, pred=0, return_in_then=True, nested=True)
@example(n=97, block=16, t=3, t2=2, pred=3, return_in_then=False, nested=True)
def test_generated_guard_kernels(n, block, t, t2, pred, return_in_then, nested):
    x = torch.randn(n)
    y = torch.full_like(x, SENTINEL)
    guard_family[(triton.cdiv(n, block),)](x, y, n, t, t2, PRED=pred,
                                           RETURN_IN_THEN=return_in_then, NESTED=nested,
                                           BLOCK=block)
    expected = _guard_family_reference(x, block, t, t2, pred, return_in_then, nested)
    torch.testing.assert_close(y, expected)


@triton.jit
def rejoined_returns(x_ptr, y_ptr, DEPTH: tl.constexpr, BLOCK: tl.constexpr):
    """At each level a path that passed a `return` rejoins: the code after it is copied
    into both arms, so it doubles per level."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs)
    for i in tl.static_range(DEPTH):
        if pid > i:
            if pid == 2 * i + 1:
                return
            acc += 1.0
        acc = acc * 2.0
    tl.store(y_ptr + offs, acc)


def test_rejoined_returns_copied_within_the_limit():
    x = torch.randn(8 * 16)
    y = torch.full_like(x, SENTINEL)
    rejoined_returns[(8,)](x, y, DEPTH=4, BLOCK=16)
    expected = torch.full_like(x, SENTINEL)
    for pid in range(8):
        acc = x[pid * 16:(pid + 1) * 16].clone()
        for i in range(4):
            if pid > i:
                if pid == 2 * i + 1:
                    break
                acc += 1.0
            acc = acc * 2.0
        else:
            expected[pid * 16:(pid + 1) * 16] = acc
    torch.testing.assert_close(y, expected)


def test_too_many_copies_is_a_tile_error_naming_the_line():
    x = torch.randn(16)
    with pytest.raises(TileError, match=r"cf\.cond_br` in kernel `rejoined_returns` at "
                                        r".*test_triton_early_return\.py:\d+:\d+: "
                                        r"structurizing the early returns would copy"):
        rejoined_returns[(1,)](x, x, DEPTH=10, BLOCK=16)


@triton.jit
def _bump_in_loop(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs)
    for i in range(3):
        acc = _bump(acc, i)
    tl.store(x_ptr + offs, acc)


def test_helper_with_early_return_in_a_loop_is_a_tile_error_naming_the_call():
    """Triton refuses a `return` inside a loop, but not a call, inside one, of a function
    with an early return; MLIR's inliner leaves that call (a loop body is one block)."""
    with pytest.raises(TileError, match=r"kernel `_bump_in_loop` at .*test_triton_early_"
                                        r"return\.py:\d+:\d+: the call of `_bump` is not "
                                        r"inlined: it returns from inside an `if`"):
        _bump_in_loop[(1,)](torch.zeros(16), BLOCK=16)


def _branch(name, operands, attrs, line):
    return Op(name, (), operands, attrs, (), Loc("kernel.py", line, 5))


def test_a_loop_of_branches_is_a_tile_error_naming_the_branch():
    """The frontend builds loops from scf ops, so no kernel makes one: a CFG by hand."""
    i32, i1 = TileType("i32"), TileType("i1")
    start, counter, step, more = (Value(0, i32), Value(1, i32), Value(2, i32),
                                  Value(3, i1))
    entry = Block((start,), (_branch("cf.br", (start,), (("dest", 1),), 3),))
    header = Block((counter,), (
        Op("arith.addi", (step,), (counter, counter), (), (), Loc("kernel.py", 4, 9)),
        Op("arith.cmpi", (more,), (step, start), (("predicate", "slt"),), (),
           Loc("kernel.py", 5, 9)),
        _branch("cf.cond_br", (more, step), (("true_dest", 1), ("false_dest", 2),
                                             ("true_count", 1)), 5)))
    done = Block((), (Op("tt.return", (), ()),))
    with pytest.raises(TileError, match=r"`cf\.cond_br` in kernel `spin` at kernel\.py:5:5: "
                                        r"the branch back to \^bb1 makes a loop"):
        structurize("spin", [entry, header, done])


def test_structurize_builds_a_join_with_results():
    """A diamond whose join takes an argument: one scf.if yielding it, in SSA."""
    i32, i1 = TileType("i32"), TileType("i1")
    a, cond, b, c, joined, d = (Value(0, i32), Value(1, i1), Value(2, i32), Value(3, i32),
                                Value(4, i32), Value(5, i32))
    loc = Loc("kernel.py", 2, 5)
    entry = Block((a,), (Op("arith.cmpi", (cond,), (a, a), (("predicate", "eq"),)),
                         _branch("cf.cond_br", (cond,), (("true_dest", 1),
                                                         ("false_dest", 2),
                                                         ("true_count", 0)), 2)))
    then = Block((), (Op("arith.addi", (b,), (a, a)), _branch("cf.br", (b,),
                                                              (("dest", 3),), 3)))
    other = Block((), (Op("arith.muli", (c,), (a, a)), _branch("cf.br", (c,),
                                                               (("dest", 3),), 4)))
    join = Block((joined,), (Op("arith.subi", (d,), (joined, a)), Op("tt.return", (), ())))
    body = structurize("diamond", [entry, then, other, join])
    assert [op.name for op in body.ops] == ["arith.cmpi", "scf.if", "arith.subi",
                                            "tt.return"]
    branch = body.ops[1]
    assert branch.loc == loc and [r.type for r in branch.results] == [i32]
    assert [op.operands for op in (branch.regions[0].ops[-1], branch.regions[1].ops[-1])] \
        == [(b,), (c,)]
    assert body.ops[2].operands == (branch.results[0], a)


def test_a_block_reached_after_a_return_is_copied_as_new_ops():
    """Both arms reach the store block (one through a branch that may return): it is
    copied, and the copy is a new op even with the same operands (the lowering keys its
    plans by op identity)."""
    i32, i1 = TileType("i32"), TileType("i1")
    a, cond, b = Value(0, i32), Value(1, i1), Value(2, i32)
    entry = Block((a,), (Op("arith.cmpi", (cond,), (a, a), (("predicate", "eq"),)),
                         _branch("cf.cond_br", (cond,), (("true_dest", 1), ("false_dest", 2),
                                                         ("true_count", 0)), 2)))
    maybe = Block((), (_branch("cf.cond_br", (cond,), (("true_dest", 3), ("false_dest", 2),
                                                       ("true_count", 0)), 3),))
    store = Block((), (Op("arith.addi", (b,), (a, a)), Op("tt.store", (), (a, a)),
                       Op("tt.return", (), ())))
    done = Block((), (Op("tt.return", (), ()),))
    body = structurize("copies", [entry, maybe, store, done])
    outer = body.ops[1]
    inner = outer.regions[0].ops[0]
    first, second = inner.regions[1].ops, outer.regions[1].ops
    assert [op.name for op in first] == [op.name for op in second] == \
        ["arith.addi", "tt.store", "scf.yield"]
    assert first[1] is not second[1]
    assert first[0].result != second[0].result  # a fresh id for the copy
    assert first[1].operands == second[1].operands == (a, a)


@triton.jit
def guarded_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A K loop of `tt.dot` behind a guard: the loop the gemm path takes sits inside the
    guard's `scf.if`."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= M:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :],
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@pytest.mark.parametrize("M,N,K", [(45, 40, 70), (32, 32, 32)])
def test_guard_before_a_dot_loop(M, N, K):
    torch.manual_seed(4)
    a, b = torch.randn(M, K), torch.randn(K, N)
    c = torch.full((M, N), SENTINEL)
    grid = (triton.cdiv(M, 16) + 2, triton.cdiv(N, 32))
    guarded_matmul[grid](a, b, c, M, N, K, BLOCK_M=16, BLOCK_N=32, BLOCK_K=16)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
