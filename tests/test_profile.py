"""TILEGEN_PROFILE: per top-level nest counters, in cycles (rdtsc) or in nanoseconds of the
process's CPU time (`cpu`), and the report that names them."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tilegen.profile
from tilegen import config
from tilegen.api import compile_source

# Two outputs, two top-level nests of very different cost: a 257 x 301 x 263 product and an
# exp of 37 values.
SOURCE = """
fn f(a: Tensor[F32, [257, 301], @host], b: Tensor[F32, [301, 263], @host],
     x: Tensor[F64, [37], @host])
    -> (Tensor[F32, [257, 263], @host], Tensor[F64, [37], @host]) {
  return (matmul(a, b), exp(x));
}
"""


def _inputs():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((257, 301), dtype=np.float32),
            rng.standard_normal((301, 263), dtype=np.float32), rng.standard_normal(37))


@pytest.mark.parametrize(("raw", "mode"), [("", ""), ("0", ""), ("1", "cycles"),
                                            ("cycles", "cycles"), ("CPU", "cpu"),
                                            ("off", "")])
def test_mode_from_the_environment(monkeypatch, raw, mode):
    monkeypatch.setenv("TILEGEN_PROFILE", raw)
    assert config.load().profile == mode


def test_cpu_mode_counts_the_process_cpu_time(monkeypatch):
    monkeypatch.setenv("TILEGEN_PROFILE", "cpu")
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "1")
    f = compile_source(SOURCE, "profile_cpu.kina").f
    a, b, x = _inputs()
    product, exps = f(a, b, x)  # warm: first-call work stays out of the counted calls
    np.testing.assert_allclose(product, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(exps, np.exp(x), rtol=1e-12)
    tilegen.profile.reset(f)
    started = time.process_time_ns()
    for _ in range(20):
        f(a, b, x)
    spent = time.process_time_ns() - started
    counts = tilegen.profile.counters(f)
    assert len(counts) >= 2 and min(counts) >= 0
    # The product is the call: its nest holds most of the CPU time Python saw, and the
    # counters never exceed it (cycles would: the clock runs at several per nanosecond).
    assert sum(counts) <= spent
    assert max(counts) >= 0.5 * spent
    assert "ns of CPU time" in tilegen.profile.report(f).splitlines()[0]


def test_cycle_mode_names_cycles_and_resets(monkeypatch):
    monkeypatch.setenv("TILEGEN_PROFILE", "1")
    f = compile_source(SOURCE, "profile_cycles.kina").f
    a, b, x = _inputs()
    f(a, b, x)
    assert max(tilegen.profile.counters(f)) > 0
    assert " cycles over all calls" in tilegen.profile.report(f).splitlines()[0]
    tilegen.profile.reset(f)
    assert tilegen.profile.counters(f) == [0] * len(tilegen.profile.counters(f))


def test_unprofiled_code_says_how_to_profile(monkeypatch):
    monkeypatch.delenv("TILEGEN_PROFILE", raising=False)
    f = compile_source(SOURCE, "profile_off.kina").f
    with pytest.raises(RuntimeError, match="TILEGEN_PROFILE"):
        tilegen.profile.counters(f)


def test_a_shared_library_keeps_its_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEGEN_PROFILE", "cpu")
    f = compile_source(SOURCE, "profile_aot.kina", jit=False,
                       output=str(tmp_path / "profile_aot.so")).f
    f(*_inputs())
    assert max(tilegen.profile.counters(f)) > 0
    assert "ns of CPU time" in tilegen.profile.report(f).splitlines()[0]
