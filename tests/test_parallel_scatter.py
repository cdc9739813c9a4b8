"""Parallel loops only where iterations are independent (issue 17 item 0).

scatter_add adds each position's row into `out[ids[p], :]`; two positions may name one
row, so its loop over positions must never be split across threads (it was, and two
threads lost each other's additions). The dependence test (tilegen/dependence.py) is
checked on hand-written loop IR; the scatter's parallel form (its columns split across
threads, each thread walking every position in order) against NumPy's np.add.at, bit for
bit against one thread, and through the gradient of an embedding table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilegen
from kina_frontend import program_from_text
from tilegen import loopir as L
from tilegen.api import compile_program
from tilegen.dependence import independent
from tilegen.loopir_parse import parse_kernel


def _nest(body: str, buffers: str = "  temp   out: f32[64x64]\n  input  ids: i64[64]\n"
          "  input  x: f32[4096]\n  input  y: f32[64]\n") -> L.Stmt:
    return parse_kernel(f"kernel @k\n{buffers}{{\n{body}\n}}").body[0]


@pytest.mark.parametrize("body,var,expected", [
    # Each (i, j) its own element.
    ("for i in 0..64 { for j in 0..64 { out[i, j] = x[i] } }", "i", True),
    ("for i in 0..64 { for j in 0..64 { out[i, j] = x[i] } }", "j", True),
    # A flattened index: 64 * i + j with j < 64 never reaches the next row.
    ("for i in 0..64 { for j in 0..64 { x[((i * 64) + j)] = 1.0:f32 } }", "i", True),
    ("for i in 0..63 { for j in 0..65 { x[((i * 64) + j)] = 1.0:f32 } }", "i", False),
    # A row named by a loaded id: two positions may hold the same id.
    ("for p in 0..64 { let row: i64 = ids[p]\n for j in 0..64 { out[row, j] = "
     "(out[row, j] + x[p]) } }", "p", False),
    ("for p in 0..64 { let row: i64 = ids[p]\n for j in 0..64 { out[row, j] = "
     "(out[row, j] + x[p]) } }", "j", True),
    # Iteration i reads what iteration i + 1 writes.
    ("for i in 0..63 { x[(i + 1)] = x[i] }", "i", False),
    # Every iteration writes one accumulator.
    ("for i in 0..64 { x[0] = (x[0] + x[(i + 1)]) }", "i", False),
    # Disjoint ranges: writes below 64, reads from 64 on.
    ("for i in 0..64 { x[i] = x[(i + 64)] }", "i", True),
    # A row written whole and then reduced within the same iteration.
    ("for i in 0..64 { for j in 0..64 { out[i, j] = y[j] }\n let s: f32 = "
     "sum[r < 64](out[i, r])\n x[i] = s }", "i", True),
    # A reduction reading the rows other iterations write.
    ("for i in 0..64 { for j in 0..64 { out[i, j] = y[j] }\n let s: f32 = "
     "sum[r < 64](out[r, i])\n x[i] = s }", "i", False),
])
def test_dependence_test(body, var, expected):
    assert independent(_nest(body), var) is expected


def test_enclosing_loops_bound_the_index_ranges():
    """An inner loop whose stores are apart only through the range of an enclosing loop's
    variable: parts of a split stored at 32 q + r and at 32 q + r + 768, with q < 12."""
    body = ("for q in 0..12 { for r in 0..32 { x[((q * 32) + r)] = 1.0:f32\n "
            "x[(((q * 32) + r) + 768)] = 2.0:f32 } }")
    inner = _nest(body).body[0]
    assert independent(inner, "r") is False  # q's range unknown: 32 q + r' + 768 may meet
    assert independent(inner, "r", {"q": 12}) is True
    assert independent(inner, "r", {"q": 30}) is False  # 32 * 29 reaches past 768


def _scatter_source(positions: int, width: int, rows: int) -> str:
    return (f"fn f(u: Tensor[F32, [{positions}, {width}], @host], "
            f"ids: Tensor[I64, [{positions}], @host]) -> Tensor[F32, [{rows}, {width}], @host] "
            f"{{ return scatter_add(log(add(mul(u, u), 1.0)), ids, {rows}); }}")


def _loops(stmts):
    for stmt in L.statements(stmts):
        if isinstance(stmt, L.For):
            yield stmt


def _threaded(loop: L.For) -> bool:
    return loop.kind == "parallel" or loop.threads > 1


def _unsplit_indirect_stores(kernel: L.Kernel) -> list[str]:
    """Stores inside a threaded loop whose index is read from memory and does not contain
    the threaded loop's own variable as a plain component: two threads may hit one
    element. An oracle independent of tilegen/dependence.py."""
    found = []
    for loop in _loops(kernel.body):
        if not _threaded(loop):
            continue
        lets = {s.var.name: s.value for s in L.statements(loop.body) if isinstance(s, L.Let)}
        for stmt in L.statements(loop.body):
            if not isinstance(stmt, L.Store):
                continue
            index = [L.substitute(e, lets) for e in stmt.index]
            if any(L.contains(e, (L.Load,)) for e in index) and loop.var not in index:
                found.append(f"{loop.var} threads {stmt.buffer}[{', '.join(map(str, index))}]")
    return found


def _compile(source: str, monkeypatch, threads: int = 2):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    return compile_program(program_from_text(source, "scatter.kina"))


def test_positions_of_a_scatter_are_never_split_across_threads(monkeypatch):
    """The issue's program: the loop over positions stays serial; the columns are what the
    threads split, in whole vector tiles."""
    module = _compile(_scatter_source(8192, 64, 7), monkeypatch)
    kernel = tilegen.program_of(module).plans["f"].kernel
    threaded = [loop for loop in _loops(kernel.body) if _threaded(loop)]
    assert threaded, L.format_kernel(kernel)
    for loop in threaded:
        # A threaded loop may contain the position loop, but must not be it: every loop
        # whose own iterations store through a loaded id runs on one thread.
        positions = [inner for inner in _loops((loop,)) if inner.var.name.startswith("p")]
        assert loop not in positions, L.format_kernel(kernel)
        assert loop.kind == "vector" and loop.var.name == "j", L.format_kernel(kernel)
    assert not _unsplit_indirect_stores(kernel)


def _scatter_reference(updates: np.ndarray, ids: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, updates.shape[-1]))
    np.add.at(out, ids.reshape(-1), updates.reshape(-1, updates.shape[-1]).astype(np.float64))
    return out


@pytest.mark.parametrize("positions,width,rows", [(8192, 64, 7), (20000, 50, 3),
                                                  (6001, 129, 1000)])
def test_parallel_scatter_add_matches_add_at_on_every_call(monkeypatch, positions, width,
                                                           rows):
    """Many calls with two threads, ids crowded on few rows (every pair of threads
    collides): each call equals np.add.at and is bit-identical to one thread's result."""
    source = _scatter_source(positions, width, rows)
    parallel = _compile(source, monkeypatch, threads=2)
    serial = _compile(source, monkeypatch, threads=1)
    kernel = tilegen.program_of(parallel).plans["f"].kernel
    assert any(_threaded(loop) for loop in _loops(kernel.body))
    assert not _unsplit_indirect_stores(kernel), L.format_kernel(kernel)
    rng = np.random.default_rng(positions + width)
    u = rng.standard_normal((positions, width)).astype(np.float32)
    ids = rng.integers(0, rows, positions).astype(np.int64)
    want = _scatter_reference(np.log(u.astype(np.float64) ** 2 + 1), ids, rows)
    one_thread = serial.f(u, ids)
    np.testing.assert_allclose(one_thread, want, rtol=1e-4, atol=1e-3)
    for _ in range(40):
        np.testing.assert_array_equal(parallel.f(u, ids), one_thread)


_LM_LOSS = """
fn nll(table: Tensor[F32, [V, D], @host], ids: Tensor[I64, [T], @host],
       w: Tensor[F32, [D, C], @host], targets: Tensor[I64, [T], @host])
    -> Tensor[F32, [], @host] {
  let logits = matmul(gather(table, ids), w);
  let picked = mul(log_softmax(logits, axis=1), one_hot(targets, C));
  return neg(sum(sum(picked, axis=1), axis=0));
}
fn grad(table: Tensor[F32, [V, D], @host], ids: Tensor[I64, [T], @host],
        w: Tensor[F32, [D, C], @host], targets: Tensor[I64, [T], @host])
    -> (Tensor[F32, [], @host], Tensor[F32, [V, D], @host]) {
  let (loss, d_table) = reverseMode(nll, wrt=[table])(table, ids, w, targets);
  return (loss, d_table);
}
"""


def _lm_gradient_reference(table, ids, w, targets) -> np.ndarray:
    """d nll / d table by hand: softmax minus one-hot, back through w, added into rows."""
    x = table.astype(np.float64)[ids]
    logits = x @ w.astype(np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(ids)), targets] -= 1.0
    d_table = np.zeros(table.shape)
    np.add.at(d_table, ids, p @ w.astype(np.float64).T)
    return d_table


@pytest.mark.parametrize("tokens", [512, 2048, 8192])
def test_embedding_gradient_with_two_threads(monkeypatch, tokens):
    """The gradient of an LM loss w.r.t. the embedding table goes through scatter_add; with
    two threads it must equal NumPy's (np.add.at) on every call, and one thread's bit for
    bit (each row still receives its additions in position order)."""
    vocab, width, classes = 37, 200, 19
    source = f"const V = {vocab};\nconst D = {width};\nconst C = {classes};\n" \
        f"const T = {tokens};\n{_LM_LOSS}"
    module = _compile(source, monkeypatch, threads=2)
    assert any(_threaded(loop) and loop.var.name.startswith("j")
               for loop in _loops(tilegen.program_of(module).plans["grad"].kernel.body)), \
        "the scatter of the gradient should run on two threads"
    assert not _unsplit_indirect_stores(tilegen.program_of(module).plans["grad"].kernel)
    rng = np.random.default_rng(tokens)
    table = rng.standard_normal((vocab, width)).astype(np.float32)
    w = (rng.standard_normal((width, classes)) / np.sqrt(width)).astype(np.float32)
    ids = rng.integers(0, vocab, tokens).astype(np.int64)
    targets = rng.integers(0, classes, tokens).astype(np.int64)
    want = _lm_gradient_reference(table, ids, w, targets)
    _, one_thread = _compile(source, monkeypatch, threads=1).grad(table, ids, w, targets)
    for _ in range(10):
        _, d_table = module.grad(table, ids, w, targets)
        np.testing.assert_allclose(d_table, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
        np.testing.assert_array_equal(d_table, one_thread)


# Elementwise steps for generated programs: (Kina of x, NumPy of x, NumPy derivative).
_STEPS = {
    "tanh": ("tanh({})", np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    "square": ("mul({0}, {0})", lambda x: x * x, lambda x: 2 * x),
    "scale": ("mul({}, 0.5)", lambda x: 0.5 * x, lambda x: np.full_like(x, 0.5)),
    # Bounded (exp of a chain of squares would overflow float32 where float64 does not).
    "exp": ("exp(tanh({}))", lambda x: np.exp(np.tanh(x)),
            lambda x: np.exp(np.tanh(x)) * (1 - np.tanh(x) ** 2)),
    "shift": ("add({}, 1.5)", lambda x: x + 1.5, lambda x: np.ones_like(x)),
}


@st.composite
def _scatter_programs(draw):
    positions = draw(st.integers(4100, 12000))
    width = draw(st.sampled_from([33, 48, 64, 100, 129]))
    rows = draw(st.sampled_from([1, 3, 7, 50, 333]))
    steps = draw(st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=3))
    through_gradient = draw(st.booleans())
    return positions, width, rows, steps, through_gradient


def _chain(steps, x: str) -> str:
    for step in steps:
        x = _STEPS[step][0].format(x)
    return x


def _chain_value_and_derivative(steps, x: np.ndarray):
    derivative = np.ones_like(x)
    for step in steps:
        _, value, slope = _STEPS[step]
        derivative = derivative * slope(x)
        x = value(x)
    return x, derivative


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_scatter_programs(), seed=st.integers(0, 2**16))
def test_generated_scatter_programs_with_two_threads(case, seed):
    """Random elementwise chains into scatter_add, or a gather whose gradient is one,
    at sizes that go parallel; against NumPy, and twice bit for bit."""
    positions, width, rows, steps, through_gradient = case
    u_type = f"Tensor[F32, [{positions}, {width}], @host]"
    t_type = f"Tensor[F32, [{rows}, {width}], @host]"
    i_type = f"Tensor[I64, [{positions}], @host]"
    if through_gradient:
        source = (f"fn loss(t: {t_type}, ids: {i_type}, c: {u_type}) -> Tensor[F32, [], @host] "
                  f"{{ return sum(sum(mul({_chain(steps, 'gather(t, ids)')}, c), axis=1), "
                  f"axis=0); }}\n"
                  f"fn f(t: {t_type}, ids: {i_type}, c: {u_type}) -> {t_type} "
                  f"{{ let (v, g) = reverseMode(loss, wrt=[t])(t, ids, c); return g; }}")
    else:
        source = (f"fn f(u: {u_type}, ids: {i_type}) -> {t_type} "
                  f"{{ return scatter_add({_chain(steps, 'u')}, ids, {rows}); }}")
    with pytest.MonkeyPatch.context() as patch:
        module = _compile(source, patch, threads=2)
    assert not _unsplit_indirect_stores(tilegen.program_of(module).plans["f"].kernel)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, rows, positions).astype(np.int64)
    if through_gradient:
        t = rng.standard_normal((rows, width)).astype(np.float32)
        c = rng.standard_normal((positions, width)).astype(np.float32)
        _, slope = _chain_value_and_derivative(steps, t.astype(np.float64)[ids])
        want = _scatter_reference(slope * c, ids, rows)
        args = (t, ids, c)
    else:
        u = rng.standard_normal((positions, width)).astype(np.float32)
        value, _ = _chain_value_and_derivative(steps, u.astype(np.float64))
        want = _scatter_reference(value, ids, rows)
        args = (u, ids)
    got = module.f(*args)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale,
                               err_msg=f"{steps} {through_gradient}")
    np.testing.assert_array_equal(module.f(*args), got)
