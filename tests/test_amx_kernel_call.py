"""The AMX micro-kernel (tilegen/amx_kernel.py) called on its own through ctypes, with
packed A slabs and B panels laid out by hand here: over the depth steps of a call in
several runs the accumulators of each register block wait in its compact slot of `kept`
(not in C, whose rows a power-of-two stride apart alias in the caches), C is read at most
once (by the first run of a call that adds to it) and written once (by the last);
ragged blocks are staged through their slot under row and column masks, and C outside
the block's rows and columns is left alone. Against NumPy float64 on the bf16 values."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

from tilegen import amx_kernel
from tilegen.gemm_bf16 import amx_usable
from tilegen.target import host_target, new_target_machine

BF16 = ml_dtypes.bfloat16
HOST_AMX, NO_AMX_REASON = amx_usable(host_target())
pytestmark = pytest.mark.skipif(not HOST_AMX, reason=f"no AMX-BF16 here: {NO_AMX_REASON}")
MR = NR = 32
P = ctypes.c_void_p
I64 = ctypes.c_int64


def _kernel(run_steps, monkeypatch):
    """The packed-A 32 x 32 kernel with runs of `run_steps`, made external, JIT-compiled:
    (engine, ctypes function)."""
    monkeypatch.setattr(amx_kernel, "RUN_STEPS", run_steps)
    module = ir.Module("amx_kernel_call")
    target = host_target()
    module.triple = target.triple
    function = amx_kernel.amx_micro_kernel(module, MR, NR)
    function.linkage = "external"
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    engine = llvm.create_mcjit_compiler(parsed, new_target_machine(target))
    engine.finalize_object()
    signature = ctypes.CFUNCTYPE(None, P, P, I64, P, I64, I64, I64, ctypes.c_bool, I64, I64,
                                 I64, I64, P, P, I64, I64, P)
    return engine, signature(engine.get_function_address(function.name))


def _aligned(shape, dtype):
    """A zeroed array of `shape` starting on a 64-byte boundary."""
    count = int(np.prod(shape))
    raw = np.zeros(count * np.dtype(dtype).itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


def _panels(a, b, blocks, steps):
    """A in slabs (Ap[s][row][32 depths]) and B as one panel of depth pairs interleaved per
    column (Bp[pair][column][2]), zero past the operands."""
    packed_a = _aligned((steps, blocks * MR, 32), BF16)
    rows, depth = a.shape
    for s in range(steps):
        part = a[:, 32 * s:32 * s + 32]
        packed_a[s, :rows, :part.shape[1]] = part
    packed_b = _aligned((steps * 16, NR, 2), BF16)
    padded = np.zeros((steps * 32, NR), BF16)
    padded[:b.shape[0], :b.shape[1]] = b
    packed_b[:] = padded.reshape(steps * 16, 2, NR).transpose(0, 2, 1)
    return packed_a, packed_b


def _call(kernel, packed_a, packed_b, steps, c, rows, cols, first, blocks, kept):
    kernel(packed_a.ctypes.data, packed_b.ctypes.data, steps, c.ctypes.data, c.shape[1],
           rows, cols, first, blocks, 64, blocks * MR * 64, steps, packed_a.ctypes.data,
           packed_b.ctypes.data, 0, 0, kept.ctypes.data)


def _exact(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("run_steps", [2, 3])
def test_whole_blocks_keep_their_accumulators_in_the_slots_between_runs(run_steps,
                                                                          monkeypatch):
    # 2 blocks x 32 columns of a C of 2048 columns (rows 8 KB apart), 5 depth steps (157
    # depths, a zero-padded tail) in runs of 2, 2, 1 (RUN_STEPS 2) or 3, 2 (RUN_STEPS 3).
    engine, kernel = _kernel(run_steps, monkeypatch)
    rng = np.random.default_rng(run_steps)
    steps, depth, blocks = 5, 157, 2
    a = rng.standard_normal((blocks * MR, depth)).astype(BF16)
    b = rng.standard_normal((depth, NR)).astype(BF16)
    packed_a, packed_b = _panels(a, b, blocks, steps)
    c = _aligned((blocks * MR, 2048), np.float32)
    c[:] = np.nan  # the first depth block never reads C
    kept = _aligned((blocks, MR, NR), np.float32)
    _call(kernel, packed_a, packed_b, steps, c, blocks * MR, NR, True, blocks, kept)
    exact = _exact(a, b)
    np.testing.assert_allclose(c[:, :NR], exact, rtol=0, atol=1e-4 * np.abs(exact).max())
    assert np.isnan(c[:, NR:]).all()
    # The slots hold each block's sum before the last run (runs as amx_kernel evens them).
    runs = -(-steps // run_steps)
    run = -(-steps // runs)
    before_last = 32 * run * (runs - 1)
    partial = _exact(a[:, :before_last], b[:before_last])
    np.testing.assert_allclose(kept.reshape(blocks * MR, NR), partial, rtol=0,
                               atol=1e-4 * np.abs(partial).max())
    del engine


def test_ragged_blocks_after_the_first_depth_block_add_under_masks(monkeypatch):
    # 45 of 64 rows and 20 of 32 columns; C holds earlier depth blocks' sums.
    engine, kernel = _kernel(2, monkeypatch)
    rng = np.random.default_rng(45)
    steps, depth, blocks, rows, cols = 4, 111, 2, 45, 20
    a = rng.standard_normal((rows, depth)).astype(BF16)
    b = rng.standard_normal((depth, cols)).astype(BF16)
    packed_a, packed_b = _panels(a, b, blocks, steps)
    c = _aligned((blocks * MR, 40), np.float32)
    c[:] = rng.standard_normal(c.shape).astype(np.float32)
    before = c.copy()
    kept = _aligned((blocks, MR, NR), np.float32)
    kept[:] = np.nan  # stale scratch must not leak into C
    _call(kernel, packed_a, packed_b, steps, c, rows, cols, False, blocks, kept)
    expected = before.astype(np.float64)
    expected[:rows, :cols] += _exact(a, b)
    np.testing.assert_allclose(c, expected, rtol=0, atol=1e-4 * np.abs(expected).max())
    del engine
