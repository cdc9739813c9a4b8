"""What a cold compile does besides lowering (docs/triton.md, "Compile time"): the program
is called by the grid's worker, not inlined into it, vector constants are written short,
and the Python stages pause the cyclic collector; the kernels stay correct either way."""

from __future__ import annotations

import gc
import re
import sys

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend import stages  # noqa: E402

_STAGES = ("ttir_to_tile", "tile_to_llvm")


@triton.jit
def _scaled_rows(X, Y, N, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * N + cols, mask=cols < N, other=0.0)
    tl.store(Y + row * N + cols, x * scale - tl.sum(x, axis=0) / N, mask=cols < N)


def _launch(rows: int = 37, n: int = 45):
    x = torch.randn(rows, n)
    y = torch.full_like(x, float("nan"))
    kernel = triton.jit(_scaled_rows.fn)  # a fresh JITFunction: compiled, not cached
    compiled = kernel[(rows,)](x, y, n, 1.5, BLOCK=64)
    torch.testing.assert_close(y, x * 1.5 - x.mean(1, keepdim=True), rtol=1e-5, atol=1e-5)
    return compiled


def test_program_called_not_inlined(monkeypatch):
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    compiled = _launch()
    header = next(line for line in compiled.asm["llir"].splitlines()
                  if line.startswith("define") and ".program\"" in line)
    assert "noinline" in header, header
    # the frame (the launcher's scratch block, the 8th parameter) aliases no tensor
    assert header.split("(", 1)[1].split(", ")[7].startswith("ptr noalias"), header


def test_vector_constants_written_short(monkeypatch):
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    program = _launch().asm["llir"].split("define void")[0]  # the program, not the launcher
    assert "splat (" in program
    # no constant vector of 16 equal elements written out element by element (but for
    # shufflevector's masks, which llvmlite checks element by element)
    program = "\n".join(line for line in program.splitlines() if "shufflevector" not in line)
    assert not re.search(r"<(i1|i32|i64|float) ([^,<>]+), (\1 \2, ){14}\1 \2>", program)


def _inside_stage(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name in _STAGES and frame.f_code.co_filename == stages.__file__:
            return True
        frame = frame.f_back
    return False


def test_stages_pause_the_collector(monkeypatch):
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    inside: list[int] = []

    def watch(phase, info):
        if phase == "start" and _inside_stage(sys._getframe(1)):
            inside.append(info["generation"])
    threshold = gc.get_threshold()
    gc.set_threshold(5, 2, 2)  # collections every few allocations: many would run inside
    gc.callbacks.append(watch)
    try:
        _launch()
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*threshold)
    assert inside == [], f"collections of generations {sorted(set(inside))} ran inside a stage"
    assert gc.isenabled()


def test_stages_leave_a_disabled_collector_disabled(monkeypatch):
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    gc.disable()
    try:
        _launch(5, 64)
        assert not gc.isenabled()
    finally:
        gc.enable()
