"""A/B of one lowering switch of the Triton backend, inside one process (for direction only).

Each tutorial kernel is compiled twice, once with the switch off and once on (two JITFunction
objects from the same source; run with TRITON_ALWAYS_COMPILE=1 so that the second compile
does not come from the disk cache the first one wrote), and the two are timed interleaved,
in alternating order, on the same inputs: the same memory placement and the same load on a
shared machine for both, which separate processes do not give. CPU time of the calling
thread with TILEGEN_NUM_THREADS=1 (so a descheduled thread costs nothing).

    TRITON_ALWAYS_COMPILE=1 TILEGEN_NUM_THREADS=1 python scripts/triton_switch_ab.py partials

Switches: fills (shared_fills.py), partials (partials.py), chains (tiles.REDUCTION_CHAINS),
siblings (sibling_reductions.py), prefetch (prefetch.py), prefetch-stores (its stores only),
branch-stores (branch_stores.py), inline (the program called by the grid's worker, not
inlined into it: emit.INLINE_PROGRAM; "off" is the program inlined), noalias (the frame
parameter noalias, emit.FRAME_NOALIAS), load-fills (loads filled by a reduction's sweep,
shared_fills.SharedFills.defer_load), nested-panels (packed b kept across the K loops of
a persistent kernel, panel_cache.py; off: top-level loops only), all. Prints, per
kernel, the minimum with the switch off and on and their ratio (> 1: the switch helps), and
the ratio of the medians. Cases: the layer norm, softmax and vector add kernels, attention
(T = 1024, D = 64, 4 heads), the tutorial matmul 1024^3 (128 x 128 x 32) and tutorial 09's
persistent matmul 1024^3 fp16 (128 x 128 x 64, one program); CASES=a,b picks.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import triton

import tilegen.triton_backend
from tilegen.triton_backend import (
    branch_stores,
    emit,
    panel_cache,
    partials,
    prefetch,
    shared_fills,
    sibling_reductions,
    tiles,
)

tilegen.triton_backend.register()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.test_triton_tutorials import (  # noqa: E402
    _layer_norm_fwd_fused,
    add_kernel,
    matmul_kernel,
    softmax_kernel,
    softmax_kernel_simple,
)
from tests.test_triton_tutorials_2 import (  # noqa: E402
    _attn_fwd,
    _layer_norm_bwd_dwdb,
    _layer_norm_bwd_dx_fused,
    matmul_kernel_persistent,
)

_ORIGINAL = (shared_fills.SharedFills.defer, partials.plan, tiles.REDUCTION_CHAINS,
             sibling_reductions.SiblingReductions.joined, prefetch.DISTANCE,
             branch_stores.plan, shared_fills.SharedFills.defer_load,
             panel_cache.static_conditions)


def _top_level_panels(e, loop, dot, advancing):
    """panel_cache.static_conditions as before nested K loops were allowed."""
    if not any(op is loop for op in e.program.body.ops):
        return None
    return _ORIGINAL[7](e, loop, dot, advancing)


def _set(switch: str, on: bool) -> None:
    off = not on
    shared_fills.SharedFills.defer = (lambda *args: False) if off and switch in (
        "fills", "all") else _ORIGINAL[0]
    partials.plan = (lambda e, loop: {}) if off and switch in ("partials", "all") \
        else _ORIGINAL[1]
    tiles.REDUCTION_CHAINS = 1 if off and switch in ("chains", "all") else _ORIGINAL[2]
    sibling_reductions.SiblingReductions.joined = (lambda *args: ([], [])) if off and \
        switch in ("siblings", "all") else _ORIGINAL[3]
    prefetch.DISTANCE = 0 if off and switch in ("prefetch", "all") else _ORIGINAL[4]
    prefetch.STORES = not (off and switch == "prefetch-stores")
    branch_stores.plan = (lambda e, op: []) if off and switch in ("branch-stores", "all") \
        else _ORIGINAL[5]
    emit.INLINE_PROGRAM = off and switch in ("inline", "all")
    emit.FRAME_NOALIAS = not (off and switch in ("noalias", "all"))
    shared_fills.SharedFills.defer_load = (lambda *args: False) if off and switch in (
        "load-fills", "all") else _ORIGINAL[6]
    panel_cache.static_conditions = _top_level_panels if off and switch in (
        "nested-panels", "all") else _ORIGINAL[7]


def _cases():
    rows, cols, group = 4096, 1024, 256
    x, dy = torch.randn(rows, cols), torch.randn(rows, cols)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    w, b = torch.rand(cols), torch.rand(cols)
    # the backward reads the forward's statistics: real ones (garbage may be denormal)
    mean, rstd = x.mean(1), 1 / torch.sqrt(x.var(1, unbiased=False) + 1e-5)
    locks = torch.zeros(2 * group, dtype=torch.int32)
    partial_dw, partial_db = torch.zeros(group, cols), torch.zeros(group, cols)
    final_dw, final_db = torch.empty(cols), torch.empty(cols)
    wide, wide_out = torch.randn(4096, 4096), torch.empty(4096, 4096)
    wide_w, wide_b = torch.rand(4096), torch.rand(4096)
    a, c, out = torch.rand(1 << 24), torch.rand(1 << 24), torch.empty(1 << 24)
    q, k, v = (torch.randn(1, 4, 1024, 64) * 0.5 for _ in range(3))
    attention_out, attention_m = torch.empty_like(q), torch.empty(1, 4, 1024)
    ma, mb, mc = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.empty(1024, 1024)
    ha, hb = ma.half(), mb.half()
    hc = torch.empty(1024, 1024, dtype=torch.float16)

    def attention(kernel):
        kernel[(1024 // 128, 4, 1)](q, k, v, 0.125, attention_m, attention_out, *q.stride(),
                                    *k.stride(), *v.stride(), *attention_out.stride(), 1, 4,
                                    N_CTX=1024, HEAD_DIM=64, BLOCK_M=128, BLOCK_N=64, STAGE=1)

    def matmul(kernel):
        kernel[(64,)](ma, mb, mc, 1024, 1024, 1024, *ma.stride(), *mb.stride(), *mc.stride(),
                      BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=32, GROUP_SIZE_M=8,
                      ACTIVATION="")

    def backward_dx(kernel):
        locks.zero_()
        kernel[(rows,)](dx, dy, partial_dw, partial_db, x, w, mean, rstd, locks, x.stride(0),
                        cols, BLOCK_SIZE_N=cols, GROUP_SIZE_M=group)
    return {
        "softmax": (softmax_kernel_simple, lambda k: k[(rows,)](
            y, x, x.stride(0), y.stride(0), cols, BLOCK_SIZE=1024)),
        "softmax-persistent": (softmax_kernel, lambda k: k[(8, 1, 1)](
            y, x, x.stride(0), y.stride(0), rows, cols, BLOCK_SIZE=1024, num_stages=2)),
        "layernorm-fwd-1024": (_layer_norm_fwd_fused, lambda k: k[(rows,)](
            x, y, w, b, mean, rstd, x.stride(0), cols, 1e-5, BLOCK_SIZE=cols)),
        "layernorm-fwd-4096": (_layer_norm_fwd_fused, lambda k: k[(4096,)](
            wide, wide_out, wide_w, wide_b, mean, rstd, 4096, 4096, 1e-5, BLOCK_SIZE=4096)),
        "layernorm-bwd-dx": (_layer_norm_bwd_dx_fused, backward_dx),
        "layernorm-bwd-dwdb": (_layer_norm_bwd_dwdb, lambda k: k[(cols // 128,)](
            partial_dw, partial_db, final_dw, final_db, group, cols, BLOCK_SIZE_M=32,
            BLOCK_SIZE_N=128)),
        "attention": (_attn_fwd, attention),
        "matmul": (matmul_kernel.fn, matmul),
        "persistent-matmul": (matmul_kernel_persistent, lambda k: k[(1,)](
            ha, hb, hc, 1024, 1024, 1024, *ha.stride(), *hb.stride(), *hc.stride(),
            BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, NUM_SMS=1)),
        "vector-add": (add_kernel, lambda k: k[((1 << 24) // 1024,)](
            a, c, out, 1 << 24, BLOCK_SIZE=1024)),
    }


def main() -> None:
    switch = sys.argv[1] if len(sys.argv) > 1 else "all"
    reps = int(os.environ.get("REPS", "30"))
    cases = _cases()
    chosen = os.environ.get("CASES", ",".join(cases)).split(",")
    compiled = {}
    for name in chosen:
        kernel, call = cases[name]
        pair = (triton.jit(kernel.fn), triton.jit(kernel.fn))
        for on, jitted in enumerate(pair):
            _set(switch, bool(on))
            call(jitted)
        compiled[name] = pair
    _set(switch, True)
    times = {(name, on): [] for name in chosen for on in (0, 1)}
    for rep in range(reps):
        for name in chosen:
            for on in ((0, 1) if rep % 2 else (1, 0)):
                start = time.thread_time()
                cases[name][1](compiled[name][on])
                times[(name, on)].append(time.thread_time() - start)
    for name in chosen:
        off, on = times[(name, 0)], times[(name, 1)]
        print(f"{switch:8s} {name:20s} off {min(off) * 1e3:8.3f} ms  on {min(on) * 1e3:8.3f} ms"
              f"  min {min(off) / min(on):.2f}x  median "
              f"{statistics.median(off) / statistics.median(on):.2f}x")


if __name__ == "__main__":
    main()
