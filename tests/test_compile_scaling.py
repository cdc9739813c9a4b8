"""Compile time a program cannot blow up: linear where the program is linear, and a size
diagnostic where inlining would explode.

Timing tests compare the same work at N and 4N (the best of three runs each, in CPU time
with the garbage collector off, so a busy machine slows both alike): a linear stage gives
a ratio near 4, a quadratic one near 16; the bound of 10 sits between (nearer the
quadratic side: caches shared with other loaded work stretch the larger run more).
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import tilegen
from kina_frontend import KinaError, Source, check_source, specialize
from kina_frontend.transforms import inline_calls, inlined_sizes
from tilegen.api import compile_source
from tilegen.pipeline import plan_program

T = "Tensor[F32, [4, 8], @host]"
LINEAR_RATIO = 10  # time(4N) / time(N): ~4 when linear, ~16 when quadratic


def rebinding(count: int, tail: str = "return x;") -> str:
    """One function rebinding one name `count` times (`let x = tanh(x);`)."""
    return "\n".join([f"fn f(x: {T}) -> {T} {{", *["  let x = tanh(x);"] * count,
                      f"  {tail}", "}"]) + "\n"


def chain(count: int) -> str:
    """`count` functions, each calling the one before it."""
    lines = [f"fn g0(x: {T}) -> {T} {{ return tanh(x); }}"]
    lines += [f"fn g{k}(x: {T}) -> {T} {{ return g{k - 1}(x) * 0.5; }}"
              for k in range(1, count)]
    return "\n".join(lines) + "\n"


def doubling(levels: int) -> str:
    """`levels` + 1 functions, each calling the one before it twice: 2^levels operations
    once inlined, from `levels` + 1 lines."""
    lines = [f"fn d0(x: {T}) -> {T} {{ return tanh(x); }}"]
    lines += [f"fn d{k}(x: {T}) -> {T} {{ let a = d{k - 1}(x); return d{k - 1}(a); }}"
              for k in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def best_time(work, repeats: int = 3) -> float:
    """The least CPU time of this process over `repeats` runs, with the garbage collector
    off while timing: other processes' load and the size of the heap earlier tests left
    (which sets what a full collection costs) then change little."""
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.process_time()
            work()
            best = min(best, time.process_time() - started)
    finally:
        gc.enable()
    return best


def ratio(work, small: int) -> float:
    return best_time(lambda: work(4 * small)) / best_time(lambda: work(small))


def test_rebinding_one_name_is_linear_in_the_checker():
    """Each fresh name searched `x.1`, `x.2`, ... from 1: 8 000 rebindings took 5.5 s."""
    texts = {n: rebinding(n) for n in (2000, 8000)}
    assert ratio(lambda n: check_source(Source("rebind.kina", texts[n])), 2000) < LINEAR_RATIO


def test_a_large_source_reaches_its_error_in_linear_time():
    """A long function ending in an unknown name: the diagnostic after one linear pass."""
    texts = {n: rebinding(n, "return nope(x);") for n in (2000, 8000)}

    def diagnose(n):
        with pytest.raises(KinaError, match="unknown op or function 'nope'") as error:
            check_source(Source("big.kina", texts[n]))
        assert error.value.line == n + 2

    assert ratio(diagnose, 2000) < LINEAR_RATIO


def test_a_chain_of_calls_compiles_in_linear_time(monkeypatch):
    """Planning every function of a chain cost the sum of their inlined sizes (400: 4.6 s,
    2 000: > 15 s); a JIT module now plans a function on its first call."""
    monkeypatch.setenv("TILEGEN_MEMORY_CACHE", "0")
    texts = {n: chain(n) for n in (300, 1200)}
    assert ratio(lambda n: compile_source(texts[n], f"chain{n}.kina"), 300) < LINEAR_RATIO
    module = compile_source(texts[1200], "chain1200.kina")
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    assert np.allclose(module.g1199(x), 0.0) and np.allclose(module.g3(x), np.tanh(x) / 8)
    # Nothing else was planned.
    assert sorted(tilegen.program_of(module).plans.planned) == ["g1199", "g3"]


def test_inlining_a_chain_is_linear():
    """Each call looked its callee up with a scan of the program's functions."""
    programs = {n: specialize(check_source(Source("chain.kina", chain(n))))
                for n in (1000, 4000)}

    def inline(n):
        program = programs[n]
        return inline_calls(program, program.function(f"g{n - 1}"))

    assert len(inline(1000).body) == 1000 + 999
    assert ratio(inline, 1000) < LINEAR_RATIO


def test_calls_that_double_per_level_get_a_size_diagnostic_quickly():
    """21 lines that inline to 2^20 operations compiled for minutes with no diagnostic."""
    text = doubling(20)
    program = specialize(check_source(Source("doubling.kina", text)))
    assert inlined_sizes(program)["d20"] == 2 ** 20
    started = time.perf_counter()
    with pytest.raises(KinaError) as caught:
        compile_source(text, "doubling.kina")
    assert time.perf_counter() - started < 5  # no function was planned first
    error = caught.value
    assert error.code == "K500"
    # The first function over the limit is d18, at its second call of d17.
    assert error.message == ("inlining every call in 'd18' would give 262144 operations, "
                             "over the limit of 200000")
    assert (error.line, text.splitlines()[error.line - 1][error.column - 1:].split("(")[0]) \
        == (19, "d17")
    assert any("'d17' (131072 operations" in note for note in error.notes)
    assert any("TILEGEN_MAX_INLINED_OPS" in note for note in error.notes)


def test_the_inlined_size_limit_is_a_knob(monkeypatch):
    text = doubling(8)  # d8: 256 operations
    program = specialize(check_source(Source("doubling.kina", text)))
    monkeypatch.setenv("TILEGEN_MAX_INLINED_OPS", "255")
    with pytest.raises(KinaError, match="over the limit of 255"):
        plan_program(program, ("d8",))
    monkeypatch.setenv("TILEGEN_MAX_INLINED_OPS", "256")
    (plan,) = plan_program(program, ("d8",))
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    module = compile_source(text, "doubling8.kina")
    want = x.astype(np.float64)
    for _ in range(256):
        want = np.tanh(want)
    np.testing.assert_allclose(module.d8(x), want, rtol=1e-5, atol=1e-6)
