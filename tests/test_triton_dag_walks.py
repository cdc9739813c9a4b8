"""Kernels whose values form deep DAGs with shared operands compile in time linear in the
DAG: the backend's analyses (fused_loads, shared_fills, tiles, panel_cache) once walked
every path from a value down to a load, 2^depth of them when each step reads the previous
value twice. A generated kernel around tl.sort (a bitonic network; the second case here)
compiled for over 15 minutes without finishing. Each case runs in a child process with a
generous time limit, so a regression fails the test instead of hanging the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
# Before the change DEPTH = 24 took minutes and each step doubled it; 60 steps would take
# longer than the universe has existed. After it, the whole child takes a few seconds.
LIMIT_SECONDS = 240

PRELUDE = """
import numpy as np
import torch
import triton
import triton.language as tl

import tilegen.triton_backend

tilegen.triton_backend.register()
"""

SHARED_CHAIN = """
@triton.jit
def kernel(w_ptr, x_ptr, sum_ptr, z_ptr, BLOCK: tl.constexpr, DEPTH: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    w = tl.load(w_ptr + offs)  # four readers before the reduction: not fused, swept
    z = (w + 1.0) * (w - 2.0) + w * w
    x = tl.load(x_ptr + offs)
    y = x
    for _ in tl.static_range(DEPTH):
        y = y * 0.5 + y  # y read twice: 2^DEPTH paths from the sum down to x
    tl.store(sum_ptr, tl.sum(y, axis=0))
    tl.store(z_ptr + offs, z + w)


w = torch.linspace(-1, 1, 16)
x = torch.linspace(0, 1, 16) / 1.5 ** 60
s, z = torch.zeros(1), torch.zeros(16)
kernel[(1,)](w, x, s, z, BLOCK=16, DEPTH=60)
wide_w, wide_x = w.double(), x.double()
assert abs(s.item() - float(wide_x.sum()) * 1.5 ** 60) <= 1e-4 * abs(s.item()), s.item()
expected_z = (wide_w + 1) * (wide_w - 2) + wide_w * wide_w + wide_w
assert torch.allclose(z.double(), expected_z, rtol=1e-6, atol=1e-6)
print("ok")
"""

SORT = """
@triton.jit
def sort_rows(w_ptr, x_ptr, out_ptr, z_ptr, N: tl.constexpr, DESCENDING: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    w = tl.load(w_ptr + row * N + offs)  # four readers before the sort's reductions
    z = (w + 1.0) * (w - 2.0) + w * w
    x = tl.load(x_ptr + row * N + offs)
    y = tl.sort(x * 2.0 + 1.0, descending=DESCENDING)  # a bitonic network of shared DAGs
    tl.store(out_ptr + row * N + offs, y - tl.max(y, axis=0))
    tl.store(z_ptr + row * N + offs, z + w)  # and one after


for n in (32, 64):
    for descending in (False, True):
        generator = torch.Generator().manual_seed(n)
        w, x = torch.randn(5, n, generator=generator), torch.randn(5, n, generator=generator)
        out, z = torch.empty_like(x), torch.empty_like(x)
        sort_rows[(5,)](w, x, out, z, N=n, DESCENDING=descending)
        y = torch.sort(x * 2 + 1, dim=1, descending=descending).values
        assert torch.equal(out, y - y.max(dim=1, keepdim=True).values), (n, descending)
        wide = w.double()
        assert torch.allclose(z.double(), (wide + 1) * (wide - 2) + wide * wide + wide,
                              rtol=1e-6, atol=1e-6)
print("ok")
"""


@pytest.mark.parametrize("case", [SHARED_CHAIN, SORT], ids=["shared-chain-60", "tl.sort"])
def test_deep_shared_dags_compile(case, tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(case))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=LIMIT_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
