"""The tilegen backend against Triton's own interpreter (TRITON_INTERPRET=1, NumPy) on the
tutorial kernels: the interpreter runs in a subprocess (the variable must be set before
triton is imported), on the same inputs; dropout's Philox stream must match bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

ROOT = Path(__file__).resolve().parents[1]

# Runs the same kernels on the same inputs in whichever mode the process is in.
RUNNER = r'''
import sys
if __name__ == "__main__":  # in the child; exec'd in pytest, the repository is on the path
    # before triton: importing it imports the backends its entry points name (ours too)
    sys.path.insert(0, sys.argv[2])
import torch, triton
import tests.test_triton_tutorials as T
import tests.test_triton_tutorials_2 as T2
import tests.test_triton_ops as T3

def run_all():
    g = torch.Generator().manual_seed(7)
    results = {}
    x, y = torch.rand(3001, generator=g), torch.rand(3001, generator=g)
    out = torch.empty_like(x)
    T.add_kernel[(3,)](x, y, out, 3001, BLOCK_SIZE=1024)
    results["add"] = out
    s = torch.randn(37, 181, generator=g)
    o = torch.empty_like(s)
    T.softmax_kernel_simple[(37,)](o, s, s.stride(0), o.stride(0), 181, BLOCK_SIZE=256)
    results["softmax"] = o
    d = torch.empty_like(x)
    T._seeded_dropout[(triton.cdiv(3001, 256),)](x, d, 3001, 0.3, 1234, BLOCK_SIZE=256)
    results["dropout"] = d
    a = torch.randn(40, 24, generator=g).half()
    b = torch.randn(24, 56, generator=g).half()
    c = torch.empty(40, 56, dtype=torch.float16)
    kernel = getattr(T.matmul_kernel, "fn", T.matmul_kernel)
    kernel[(triton.cdiv(40, 16) * triton.cdiv(56, 32),)](
        a, b, c, 40, 56, 24, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=16, GROUP_SIZE_M=2,
        ACTIVATION="leaky_relu")
    results["matmul"] = c
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    results["attention"] = T2.attention(q, k, v, True, 0.3)
    surface = torch.empty(10, 16)
    T3.surface_kernel[(1,)](torch.randn(16, generator=g), surface, 4242, N=16)
    results["surface"] = surface
    results["mode"] = type(T.add_kernel).__name__
    return results

if __name__ == "__main__":
    torch.save(run_all(), sys.argv[1])
'''


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interpreter")
    script = folder / "runner.py"
    script.write_text(RUNNER)
    results = folder / "results.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(script), str(results), str(ROOT)], check=True, env=env,
                   cwd=ROOT, timeout=600)
    return torch.load(results), script


def test_tilegen_matches_the_interpreter(interpreted):
    reference, script = interpreted
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)  # noqa: S102
    ours = namespace["run_all"]()
    assert reference["mode"] == "InterpretedFunction" and ours["mode"] == "JITFunction"
    # Philox, bit for bit: the same lanes dropped; the kept ones are x / (1 - p), a
    # division by a scalar, within 1.5 ulp (docs/triton.md) of the interpreter's IEEE one
    assert torch.equal(ours["dropout"] == 0, reference["dropout"] == 0)
    torch.testing.assert_close(ours["dropout"], reference["dropout"], rtol=1.8e-7, atol=0)
    assert torch.equal(ours["add"], reference["add"])
    for name in ("softmax", "matmul", "attention", "surface"):
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-3, atol=1e-3)
    assert torch.equal(ours["surface"][6], reference["surface"][6])  # randint, bit for bit
