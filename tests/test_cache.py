"""Compile caches: in memory by default, on disk with TILEGEN_CACHE_DIR; keys cover the
CPU features; corrupted entries are rebuilt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tilegen import cache
from tilegen.api import compile_source

REPO = Path(__file__).resolve().parent.parent

SOURCE = """
fn f(x: Tensor[F32, [3, 40], @host], w: Tensor[F32, [40, 24], @host])
    -> Tensor[F32, [3, 24], @host] {
  return softmax(matmul(x, w), axis=1);
}
"""

SCRIPT = r"""
import json, sys, time, numpy as np
import kina_frontend
calls = []
original = kina_frontend.check_source
kina_frontend.check_source = lambda *a: calls.append(1) or original(*a)
from tilegen.api import compile_source
started = time.perf_counter()
module = compile_source(sys.argv[1], "cached.kina")
x = np.linspace(-1, 1, 120, dtype=np.float32).reshape(3, 40)
w = np.linspace(-2, 2, 960, dtype=np.float32).reshape(40, 24)
out = module.f(x, w)
print(json.dumps({"frontend_calls": len(calls), "sum": float(out.sum()),
                  "first": out[0].tolist()}))
"""


def _run(cache_dir):
    env = dict(os.environ, TILEGEN_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", SCRIPT, SOURCE], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    import json
    return json.loads(result.stdout)


def _reference():
    x = np.linspace(-1, 1, 120, dtype=np.float32).reshape(3, 40).astype(np.float64)
    w = np.linspace(-2, 2, 960, dtype=np.float32).reshape(40, 24).astype(np.float64)
    s = x @ w
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_memory_cache_returns_the_same_module(monkeypatch):
    monkeypatch.delenv("TILEGEN_CACHE_DIR", raising=False)
    first = compile_source(SOURCE, "memory.kina")
    assert compile_source(SOURCE, "memory.kina") is first
    assert compile_source(SOURCE, "other-name.kina") is not first
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "1")
    assert compile_source(SOURCE, "memory.kina") is not first


def test_memory_cache_keeps_at_most_its_bound(monkeypatch):
    """TILEGEN_MEMORY_CACHE bounds the modules kept (least recently used dropped first); 0
    keeps none. Compiling is lazy (LLVM runs on first call), so these compiles are cheap."""
    monkeypatch.delenv("TILEGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("TILEGEN_MEMORY_CACHE", "3")
    cache.MEMORY.clear()
    try:
        modules = [compile_source(SOURCE, f"bound{n}.kina") for n in range(5)]
        assert len(cache.MEMORY.entries) == 3
        assert compile_source(SOURCE, "bound4.kina") is modules[4]
        assert compile_source(SOURCE, "bound2.kina") is modules[2]
        assert compile_source(SOURCE, "bound0.kina") is not modules[0]  # dropped
        monkeypatch.setenv("TILEGEN_MEMORY_CACHE", "0")
        first = compile_source(SOURCE, "off.kina")
        assert compile_source(SOURCE, "off.kina") is not first
        assert len(cache.MEMORY.entries) == 0
    finally:
        cache.MEMORY.clear()
        cache.MEMORY.capacity = cache.MEMORY_CACHE_ENTRIES


def test_disk_cache_skips_the_frontend_in_a_new_process(tmp_path):
    cold = _run(tmp_path)
    warm = _run(tmp_path)
    assert cold["frontend_calls"] == 1 and warm["frontend_calls"] == 0
    assert cold["first"] == warm["first"]
    np.testing.assert_allclose(warm["first"], _reference()[0], rtol=1e-5, atol=1e-7)
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == []


def test_corrupted_entries_are_rebuilt(tmp_path):
    _run(tmp_path)
    for path in tmp_path.rglob("*"):
        if path.suffix == ".o":
            path.write_bytes(path.read_bytes()[:100])  # truncated object code
    rebuilt = _run(tmp_path)
    np.testing.assert_allclose(rebuilt["first"], _reference()[0], rtol=1e-5, atol=1e-7)
    for path in tmp_path.rglob("plans.pickle"):
        path.write_bytes(b"not a pickle")
    again = _run(tmp_path)
    assert again["frontend_calls"] == 1
    assert again["first"] == rebuilt["first"]


def test_key_covers_cpu_features_and_compiler_sources(monkeypatch):
    options = object()
    base = cache.cache_key("a.kina", SOURCE, options, True)
    assert cache.cache_key("a.kina", SOURCE, options, True) == base
    assert cache.cache_key("a.kina", SOURCE + " ", options, True) != base
    assert cache.cache_key("a.kina", SOURCE, options, False) != base
    cache.compiler_fingerprint.cache_clear()
    monkeypatch.setattr(cache, "compiler_identity",
                        lambda: "llvmlite=0.50.0;cpu=znver4;features=+avx2,-avx512f")
    try:
        assert cache.cache_key("a.kina", SOURCE, options, True) != base
    finally:
        cache.compiler_fingerprint.cache_clear()
