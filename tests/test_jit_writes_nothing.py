"""`jit=True` compiles and runs without writing any file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import numpy as np, tilegen
m = tilegen.compile_file(EXAMPLE, jit=True)
ids = np.array([[1, 4, 2, 6]], dtype=np.int64)
rng = np.random.default_rng(0)
w = lambda *s: rng.standard_normal(s).astype(np.float32)
mask = np.triu(np.full((4, 4), -1e9, np.float32), 1).reshape(1, 1, 4, 4)
out = m.storylm0_forward(ids, w(8, 4), mask, w(1, 1, 1, 1), w(4, 4), w(4, 4), w(4, 4),
                         w(4, 4), w(4, 8))
assert out.shape == (1, 4, 8) and np.isfinite(out).all()
print("ok")
"""


def test_jit_leaves_cwd_and_tmpdir_empty(tmp_path):
    cwd = tmp_path / "cwd"
    tmp = tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    example = str(REPO / "examples" / "storylm0_forward.kina")
    result = subprocess.run([sys.executable, "-c", SCRIPT.replace("EXAMPLE", repr(example))],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert list(cwd.iterdir()) == []
    assert list(tmp.iterdir()) == []
