"""TILEGEN_AUTOTUNE=1 times tile candidates once per shape, remembers the winner (in memory
and in TILEGEN_CACHE_DIR/autotune.json) and the result is still exact."""

from __future__ import annotations

import json

import numpy as np

from tilegen import autotune, config
from tilegen.api import compile_source
from tilegen.gemm_tiles import default_tiles
from tilegen.loopir import Gemm
from tilegen.runtime import program_of

HOST = config.load().target  # what compile_source compiles for (TILEGEN_TARGET or host)

SOURCE = """
fn mm(a: Tensor[F32, [70, 90], @host], b: Tensor[F32, [90, 50], @host])
    -> Tensor[F32, [70, 50], @host] {
  return matmul(a, b);
}
"""


def test_candidates_include_the_default_and_respect_lanes():
    options = autotune.candidates("f32", 70, 50, 90, HOST)
    assert default_tiles("f32", 70, 50, 90, HOST) in options
    assert all(t.nr % HOST.lanes("f32") == 0 and t.mc % t.mr == 0 and t.kc <= 90 for t in options)


def test_autotuned_tiles_are_remembered_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEN_AUTOTUNE", "1")
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    module = compile_source(SOURCE, "tune.kina")
    (gemm,) = [s for s in program_of(module).plans["mm"].kernel.body if isinstance(s, Gemm)]
    table = json.loads((tmp_path / "autotune.json").read_text())
    assert list(table.values()) == [list(gemm.tiles.__dict__.values())]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((70, 90)).astype(np.float32)
    b = rng.standard_normal((90, 50)).astype(np.float32)
    np.testing.assert_allclose(module.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    # A new process (empty memory) reads the table instead of measuring again.
    monkeypatch.setattr(autotune, "_memory", {})
    def measure(*args):
        raise AssertionError("measured again")

    again = autotune.choose("f32", (), 70, 50, 90, gemm.threads, str(tmp_path), HOST, measure)
    assert again == gemm.tiles


def test_autotune_off_is_deterministic(monkeypatch):
    monkeypatch.delenv("TILEGEN_AUTOTUNE", raising=False)
    module = compile_source(SOURCE, "default.kina")
    (gemm,) = [s for s in program_of(module).plans["mm"].kernel.body if isinstance(s, Gemm)]
    assert gemm.tiles == default_tiles("f32", 70, 50, 90, HOST)


def test_every_candidate_has_whole_panels():
    # A B panel narrower than a whole number of micro-panels overflowed the packing buffer.
    for n in (50, 256, 4096, 333):
        for tiles in autotune.candidates("f32", 256, n, 512, HOST):
            assert tiles.nc % tiles.nr == 0 and tiles.mc % tiles.mr == 0, tiles


def test_choose_keeps_the_candidate_the_measure_calls_fastest(monkeypatch):
    """autotune measures only through the callback it is handed (the driver's)."""
    monkeypatch.setattr(autotune, "_memory", {})
    options = autotune.candidates("f32", 70, 50, 90, HOST)
    fastest = options[-1]
    timed = []

    def measure(dtype, batch, m, n, k, tiles):
        timed.append(tiles)
        return 1.0 if tiles == fastest else 2.0

    assert autotune.choose("f32", (), 70, 50, 90, 1, None, HOST, measure) == fastest
    assert sorted(timed, key=str) == sorted(options, key=str)
