"""scripts/perf_threads.py: its reading of `perf script` lines, and (where `perf` is
installed and may attach) a run as users run it, which must name the JIT code and show
both threads of a parallel product."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "perf_threads.py"


def _script():
    spec = importlib.util.spec_from_file_location("perf_threads", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_samples_are_counted_per_thread_and_symbol():
    lines = "\n".join([
        "  101 7f00aa10 tilegen.gemm.amx.32x32.in_place (/tmp/perf-100.map)",
        "  101 7f00aa14 tilegen.gemm.amx.32x32.in_place (/tmp/perf-100.map)",
        "  101 1f7da [unknown] (/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0)",
        "  102 7f00ab00 kina.f.par1 (/tmp/perf-100.map)",
        "  102 4a1b2 PyObject_RichCompare (/usr/lib/libpython3.11.so.1.0)",
        "  102 ffffffff81000130 [unknown] ([kernel.kallsyms])",
        "",
    ])
    counts = _script().shares(lines)
    assert counts["101"] == {"tilegen.gemm.amx.32x32.in_place": 2, "[libgomp.so.1.0.0]": 1}
    assert counts["102"] == {"kina.f.par1": 1, "PyObject_RichCompare": 1,
                             "[[kernel.kallsyms]]": 1}


def _perf_can_attach() -> bool:
    perf = shutil.which("perf")
    if perf is None:
        return False
    probe = subprocess.run([perf, "record", "-q", "-o", "/dev/null", "--", "true"],
                           capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _perf_can_attach(), reason="no perf that may record here")
def test_a_run_names_the_kernel_on_both_threads(tmp_path):
    source = tmp_path / "mm.kina"
    source.write_text("fn mm(a: Tensor[F32, [400, 300], @host], b: Tensor[F32, [300, 500], "
                      "@host]) -> Tensor[F32, [400, 500], @host] { return matmul(a, b); }\n")
    result = subprocess.run([sys.executable, str(SCRIPT), str(source), "mm", "--seconds",
                             "1.5"], capture_output=True, text=True, timeout=120, check=False,
                            env={"TILEGEN_NUM_THREADS": "2", "PATH": "/usr/bin:/bin",
                                 "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    threads = [line for line in result.stdout.splitlines() if line.startswith("thread ")]
    assert len(threads) >= 2, result.stdout
    # Most samples fall in the product's micro-kernel; the kernel's own functions may be
    # too small to make the top of the list.
    assert re.search(r"%  (kina\.mm|tilegen\.gemm\.)", result.stdout), result.stdout
