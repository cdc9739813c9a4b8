"""scripts/validate_train.py end to end, in subprocesses (part of the normal test run).

The --jit run is the Section 24 validation itself: every check must PASS. The other runs
check the failure path (exit 1 with FAIL rows), the optional outputs (--plot, --save) and
that Ctrl-C leaves no temporary folder or half-written file behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "validate_train.py"

EXPECTED_PASS_ROWS = (
    "(a) first step: weight updates match NumPy SGD",
    "(b) corpus NLL after 40 epochs < 0.5 and below init",
    "(b) NLL trajectory matches NumPy training",
    "(c) greedy from [1, 2, 3, 4] gives the locked cycle",
    "(c) greedy ids match the NumPy rollout",
    "(d) causal non-leak on the trained T=36 forward (compiled)",
    "(d) causal non-leak, same algebra in NumPy",
)
TORCH_ROWS = (
    "(a) first step: weight updates match PyTorch",
    "(d) causal non-leak, same algebra in PyTorch",
)


def run_script(*args: str, cwd: Path, env: dict | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def rows(stdout: str) -> dict[str, str]:
    """check label -> PASS | FAIL | SKIP from the final table."""
    table = {}
    for line in stdout.splitlines():
        match = re.match(r"^(PASS|FAIL|SKIP)\s{2,}(\(.\) .*?)\s{2,}", line)
        if match:
            table[match.group(2)] = match.group(1)
    return table


def test_jit_validation_passes_with_plot_and_save(tmp_path):
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    plot = tmp_path / "out" / "loss.png"
    saved = tmp_path / "trained"
    result = run_script("--jit", "--plot", str(plot), "--save", str(saved), cwd=work,
                        env=dict(os.environ, TMPDIR=str(temp)))
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result.stdout)
    for label in EXPECTED_PASS_ROWS:
        assert table.get(label) == "PASS", (label, result.stdout)
    torch_status = "PASS" if _torch_importable() else "SKIP"
    for label in TORCH_ROWS:
        assert table.get(label) == torch_status, (label, result.stdout)
    assert "FAIL" not in table.values()
    assert re.search(r"validate_train: PASS \(\d+ passed, 0 failed", result.stdout)
    init, final = map(float, re.search(r"corpus sum-NLL ([\d.]+) \(init\) -> ([\d.]+) "
                                       r"\(final\)", result.stdout).groups())
    assert init == pytest.approx(25.67, abs=0.01) and final < 0.5
    assert "train" in result.stderr  # the tqdm bar (or its plain fallback) is on stderr
    # --jit writes nothing but what was asked for: no .so, .o or temporary files.
    assert list(work.iterdir()) == []
    assert list(temp.iterdir()) == []
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in plot.parent.iterdir()) == ["loss.png"]
    from storylm import fixture

    checkpoint = fixture.load_checkpoint(saved)
    assert fixture.load_corpus(saved) == fixture.load_corpus()
    assert not np.array_equal(checkpoint.embed, fixture.load_checkpoint().embed)


def test_failed_checks_exit_1(tmp_path):
    # No training: the NLL stays at its initial value and greedy does not continue the cycle.
    result = run_script("--jit", "--epochs", "0", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table["(b) corpus NLL after 0 epochs < 0.5 and below init"] == "FAIL"
    assert table["(a) first step: weight updates match NumPy SGD"] == "PASS"
    assert "validate_train: FAIL" in result.stdout


def test_missing_matplotlib_is_a_clear_error(tmp_path):
    code = (f"import sys, runpy; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['validate_train.py', '--jit', '--plot', 'x.png']; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "--plot needs matplotlib" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_leaves_no_temporary_files(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    process = subprocess.Popen([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if any(p.name.startswith("validate-train-") for p in temp.iterdir()):
            break  # the .so folder exists: interrupt while compiling into it
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    assert list(temp.iterdir()) == []


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
