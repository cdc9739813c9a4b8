"""The CLI's code-generation stages: --emit loops/llvm/asm, -o OUT.so, --run."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tilegen.compile", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_emit_llvm_has_vector_ops_in_hot_loops():
    result = _cli("storylm0_forward.kina", "--emit", "llvm")
    assert result.returncode == 0, result.stderr
    vector_ops = re.findall(r"= (?:fmul|fadd|call|load)[^\n]*<(?:16|8) x float>", result.stdout)
    assert len(vector_ops) > 10


def test_emit_loops_and_asm():
    loops = _cli("storylm0_rollout.kina", "--emit", "loops", "--function", "storylm0_rollout")
    assert loops.returncode == 0, loops.stderr
    assert "kernel @storylm0_rollout" in loops.stdout and "vector<16>" in loops.stdout
    asm = _cli("storylm0_forward.kina", "--emit", "asm", "--function", "storylm0_forward")
    assert asm.returncode == 0, asm.stderr
    assert "zmm" in asm.stdout or "ymm" in asm.stdout


def test_output_shared_library(tmp_path):
    target = tmp_path / "forward.so"
    result = _cli("storylm0_forward.kina", "-o", str(target))
    assert result.returncode == 0, result.stderr
    library = ctypes.CDLL(str(target))
    assert library.kina_storylm0_forward
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward.so"]


def test_run_main_is_deterministic():
    first = _cli("storylm0_rollout.kina", "--run")
    second = _cli("storylm0_rollout.kina", "--run")
    assert first.returncode == 0, first.stderr
    checksums = [line for line in first.stdout.splitlines() if "crc32=" in line]
    assert [line.split("crc32=")[1] for line in checksums] == \
        [line.split("crc32=")[1] for line in second.stdout.splitlines() if "crc32=" in line]
    assert any(line.strip().startswith("logits: f32[1, 36, 8]") for line in checksums)


def test_unknown_function_is_a_diagnostic():
    result = _cli("storylm0_forward.kina", "--emit", "loops", "--function", "nope")
    assert result.returncode == 1
    assert "no function 'nope'" in result.stderr and "Traceback" not in result.stderr
