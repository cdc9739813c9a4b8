"""Random Triton kernels (tests/tritongen/) on the tilegen backend against Triton's own
interpreter: the interpreter runs every kernel in one child process (TRITON_INTERPRET=1
must be set before triton is imported), on the same inputs saved to files, while this
process runs them on tilegen; every output is compared whole, sentinel included (a store
outside its mask shows), bit for bit where the generator knows both must agree exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

from tests import tritongen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEEDS = range(24)  # the kernels of these seeds; the fuzzing campaign runs many more


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The kernels saved to a folder, and a child process running them on the interpreter
    (started now: it runs while this process compiles the same kernels for tilegen)."""
    folder = tmp_path_factory.mktemp("tritongen")
    cases = []
    for seed in SEEDS:
        kernel = tritongen.generate_kernel(np.random.default_rng(seed))
        kernel.save(folder / f"seed{seed}")
        cases.append(f"seed{seed}")
    env = dict(os.environ, TRITON_INTERPRET="1")
    child = subprocess.Popen([sys.executable, "-m", "tests.tritongen",
                              str(folder), *cases], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    yield folder, child
    if child.poll() is None:
        child.kill()
        child.wait()


def _interpreter_outputs(folder: Path, child: subprocess.Popen, case: str) -> dict:
    """The interpreter's outputs of one case (waiting for the child if it is still
    running)."""
    if child.poll() is None:
        output, _ = child.communicate(timeout=600)
        assert child.returncode == 0, output.decode(errors="replace")
    error = folder / case / "interpreter_error.txt"
    # the interpreter refusing a kernel is the generator's bug: every kernel must be valid
    assert not error.exists(), error.read_text()
    with np.load(folder / case / "interpreter.npz") as data:
        return dict(data)


def test_generated_kernels_match_the_interpreter(generated):
    folder, child = generated
    failures = []
    for seed in SEEDS:
        case = f"seed{seed}"
        kernel = tritongen.GeneratedKernel.load(folder / case)
        module = tritongen.import_kernel(folder / case / "kernel.py", f"tritongen_test_{case}")
        assert type(module.kernel).__name__ == "JITFunction"  # compiled, not interpreted
        ours = tritongen.launch(module.kernel, kernel)
        reference = _interpreter_outputs(folder, child, case)
        failures += [f"seed {seed} ({kernel.family}): {problem}"
                     for problem in tritongen.compare(kernel, ours, reference)]
    assert not failures, "\n".join(failures)


def test_comparison_catches_a_wrong_element(generated):
    """The check has teeth: one element of an output moved past its tolerance, or a
    sentinel overwritten, is reported."""
    folder, child = generated
    case = "seed0"
    kernel = tritongen.GeneratedKernel.load(folder / case)
    reference = _interpreter_outputs(folder, child, case)
    assert tritongen.compare(kernel, reference, reference) == []
    for name, spec in kernel.tensors.items():
        if not spec.output:
            continue
        written = np.flatnonzero(reference[name] != spec.data)
        for index in (written[0] if written.size else 0, -1):  # a value; the storage's end
            wrong = {n: a.copy() for n, a in reference.items()}
            old = float(wrong[name][index])
            wrong[name][index] = old + 1 + 2 * spec.atol + 1e-3 * abs(old)
            assert tritongen.compare(kernel, wrong, reference), (name, index)
