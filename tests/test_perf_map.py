"""TILEGEN_PERF_MAP (tilegen/perfmap.py): the functions of every loaded engine in perf's
map of JIT symbols, sizes from the object code's symbol table checked against binutils'
`nm`, addresses against the engine's own entry points; results unchanged; an unwritable
map a warning, not a failed compile; nothing written with the knob off."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen import perfmap
from tilegen.api import compile_program

SOURCE = """
fn f(x: Tensor[F32, [67, 45], @host], w: Tensor[F32, [45, 300], @host])
    -> Tensor[F32, [67, 300], @host] {
  return exp(matmul(x, w) * 0.01);
}
"""


def _inputs():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((67, 45)).astype(np.float32),
            rng.standard_normal((45, 300)).astype(np.float32))


def _expected(x, w):
    return np.exp((x.astype(np.float64) @ w.astype(np.float64)) * 0.01)


def _lines(path):
    entries = []
    for line in path.read_text().splitlines():
        start, size, name = line.split(" ", 2)
        entries.append((int(start, 16), int(size, 16), name))
    return entries


@pytest.fixture(autouse=True)
def _fresh_compiles(monkeypatch):
    """Every test loads its own engines (the in-memory cache would hand out the first
    test's module)."""
    monkeypatch.setenv("TILEGEN_MEMORY_CACHE", "0")


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """The knob on, the map in tmp_path, and each (engine, object code) recorded."""
    path = tmp_path / "perf.map"
    monkeypatch.setenv("TILEGEN_PERF_MAP", "1")
    monkeypatch.setattr(perfmap, "map_path", lambda: str(path))
    loads = []
    original = perfmap.record

    def spy(engine, data):
        loads.append((engine, data))
        original(engine, data)
    monkeypatch.setattr(perfmap, "record", spy)
    return path, loads


def test_the_map_names_every_function_of_the_kernel(recorded):
    path, loads = recorded
    module = compile_program(program_from_text(SOURCE))
    x, w = _inputs()
    np.testing.assert_allclose(module.f(x, w), _expected(x, w), rtol=2e-6)
    entries = _lines(path)
    names = {name for _, _, name in entries}
    assert {"kina.f", "kina.f.entry", "kina.f.call", "kina.f.packed"} <= names
    (engine, _), = loads
    for start, size, name in entries:
        assert size > 0 and start == engine.get_function_address(name)
    spans = sorted((start, start + size) for start, size, _ in entries)
    assert all(end <= following
               for (_, end), (following, _) in zip(spans, spans[1:], strict=False))


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not installed")
def test_sizes_are_the_symbol_tables(recorded, tmp_path):
    _, loads = recorded
    compile_program(program_from_text(SOURCE)).f(*_inputs())
    (_, data), = loads
    obj = tmp_path / "kernel.o"
    obj.write_bytes(data)
    listing = subprocess.run(["nm", "-S", "--defined-only", str(obj)], check=True,
                             capture_output=True, text=True).stdout
    expected = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "tT" and int(fields[1], 16):
            expected[fields[3]] = int(fields[1], 16)
    assert expected and perfmap.function_sizes(data) == expected


def test_an_unwritable_map_warns_and_the_code_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEGEN_PERF_MAP", "1")
    monkeypatch.setattr(perfmap, "map_path", lambda: str(tmp_path / "missing" / "perf.map"))
    monkeypatch.setattr(perfmap, "_warned", False)
    x, w = _inputs()
    with pytest.warns(RuntimeWarning, match="TILEGEN_PERF_MAP: cannot write"):
        got = compile_program(program_from_text(SOURCE)).f(x, w)
    np.testing.assert_allclose(got, _expected(x, w), rtol=2e-6)


def test_unreadable_symbols_warn_and_record_nothing(monkeypatch, tmp_path):
    path = tmp_path / "perf.map"
    monkeypatch.setattr(perfmap, "map_path", lambda: str(path))
    monkeypatch.setattr(perfmap, "_warned", False)
    truncated = b"\x7fELF\x02\x01" + bytes(20)  # an ELF64 header cut short
    with pytest.warns(RuntimeWarning, match="cannot read the object code's symbols"):
        perfmap.record(None, truncated)
    assert not path.exists()


def test_nothing_is_recorded_with_the_knob_off(monkeypatch):
    monkeypatch.delenv("TILEGEN_PERF_MAP", raising=False)
    calls = []
    monkeypatch.setattr(perfmap, "record", lambda engine, data: calls.append(engine))
    compile_program(program_from_text(SOURCE)).f(*_inputs())
    assert calls == []


def test_other_object_formats_have_no_functions():
    assert perfmap.function_sizes(b"\xcf\xfa\xed\xfe" + bytes(60)) == {}


def test_triton_kernels_are_named(recorded):
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    import tilegen.triton_backend

    tilegen.triton_backend.register()
    import triton.language as tl

    @triton.jit
    def perf_map_scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3.0 - 0.5,
                 mask=mask)

    x = torch.randn(100)
    y = torch.empty_like(x)
    perf_map_scale[(4,)](x, y, 100, BLOCK=32)
    torch.testing.assert_close(y, x * 3.0 - 0.5)
    path, _ = recorded
    assert any(name == "perf_map_scale.launch" for _, _, name in _lines(path))
