"""Heap temporaries start on a cache line whatever address malloc gives the workspace
(tilegen/codegen.py `_allocate_temporaries`, tilegen/frame.py): glibc returns large blocks
16 bytes past a page, which put every temporary 16 bytes past a line, so each 64-byte vector
access and each 64-byte row of an AMX tile there touched two lines.

The kernel keeps its workspace in slot 0 of its block table between calls and takes
whatever block it finds there, so the test hands it a block of its own at a chosen
misalignment, finds the temporary's values in it after the call, and checks their address.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen.api import compile_program
from tilegen.frame import ALIGN, plan_frame
from tilegen.runtime import program_of

ROWS, COLUMNS = 67, 301  # 80 668 bytes: past the 64 KiB a stack temporary may take
SOURCE = f"""
fn f(x: Tensor[F32, [{ROWS}, {COLUMNS}], @host]) -> Tensor[F32, [{COLUMNS}, {ROWS}], @host] {{
  let t = softmax(x, axis=1);
  return transpose(t, [1, 0]);
}}
"""
_LIBC = ctypes.CDLL(None)
_LIBC.malloc.restype = ctypes.c_void_p
_LIBC.malloc.argtypes = [ctypes.c_size_t]
_LIBC.free.argtypes = [ctypes.c_void_p]


@pytest.mark.parametrize("misalignment", [0, 8, 16, 48])
def test_heap_temporaries_start_on_a_cache_line(misalignment):
    module = compile_program(program_from_text(SOURCE))
    program = program_of(module)
    plan = program.plans["f"]
    frame = plan_frame(plan.kernel, 1 << 20)
    assert "t" in frame.offsets  # on the heap, not the stack
    x = np.random.default_rng(5).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    wide = np.exp(x.astype(np.float64))
    rows = wide / wide.sum(axis=1, keepdims=True)
    expected = rows.T
    np.testing.assert_allclose(module.f(x), expected, rtol=2e-6)  # caches a workspace
    slots = program._natives["f"].owner._slots
    cached = slots[0]
    assert cached  # the workspace the first call kept
    size = frame.heap_bytes + 2 * ALIGN
    raw = _LIBC.malloc(size + ALIGN)
    assert raw
    try:
        start = raw + (misalignment - raw) % ALIGN
        ctypes.memset(start, 0, size)
        slots[0] = start
        np.testing.assert_allclose(module.f(x), expected, rtol=2e-6)
        assert slots[0] == start  # put back where it was found
        block = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(start))
        # The temporary's first row (the kernel's softmax is within a few ulp).
        first = rows[0, :4]
        words = block[: size - size % 4].view(np.float32)
        hits = [i for i in range(len(words) - 4)
                if np.allclose(words[i:i + 4], first, rtol=2e-6, atol=0)]
        assert hits, "the temporary's values are not in the block handed to the kernel"
        assert all((start + 4 * i) % ALIGN == 0 for i in hits), \
            [(start + 4 * i) % ALIGN for i in hits]
    finally:
        slots[0] = cached
        _LIBC.free(raw)
