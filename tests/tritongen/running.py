"""Running saved kernels: importing a generated module, launching it, comparing two
runs."""

from __future__ import annotations

import importlib.util
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from tests.tritongen.values import GeneratedKernel

# ----------------------------------------------------------------------------- running


def import_kernel(path: Path, module_name: str):
    """The module at path (triton.jit reads the kernel's source through inspect, so it
    must come from a real file)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def launch(kernel, gk: GeneratedKernel) -> dict[str, np.ndarray]:
    """Runs the jitted `kernel` on fresh copies of gk's tensors; returns every output's
    whole storage (offset prefix included: nothing may write there either)."""
    import torch

    storages = {n: torch.from_numpy(t.data.copy()) for n, t in gk.tensors.items()}
    # positional up to the first constexpr, by keyword from there on
    positional, keywords = [], {}
    for name, kind, value in gk.args:
        if kind == "tensor":
            spec = gk.tensors[value]
            value = storages[spec.view_of or value][spec.offset:]
        if kind == "constexpr" or keywords:
            keywords[name] = value
        else:
            positional.append(value)
    if "tensor_descriptor" in gk.features:  # descriptors made in the kernel need one
        import triton

        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    kernel[gk.grid](*positional, **keywords)
    return {n: storages[n].numpy() for n, t in gk.tensors.items() if t.output}


def compare(gk: GeneratedKernel, ours: dict, reference: dict) -> list[str]:
    """The mismatches between two runs' outputs, described (empty: they agree)."""
    problems = []
    for name, spec in gk.tensors.items():
        if not spec.output:
            continue
        a, b = ours[name], reference[name]
        if spec.exact:  # (infinities stored on purpose compare equal; NaN never should)
            bad = a != b
        elif not np.all(np.isfinite(b)):
            problems.append(f"{name}: the interpreter's output is not finite (generator bug)")
            continue
        else:
            b64 = b.astype(np.float64)
            bad = ~(np.abs(a.astype(np.float64) - b64) <= spec.atol + spec.rtol * np.abs(b64))
        if np.any(bad):
            where = np.flatnonzero(bad)
            first = where[0]
            problems.append(
                f"{name} ({spec.what}; {'exact' if spec.exact else f'atol {spec.atol:.3g}'})"
                f": {where.size} of {a.size} differ, first at storage index {first}: "
                f"ours {a[first]!r} vs reference {b[first]!r}")
    return problems


def run_cases(folder: Path, cases: list[str], mode: str) -> None:
    """Runs each saved case in this process, writing `<case>/<mode>.npz` or
    `<case>/<mode>_error.txt`."""
    for case in cases:
        case_dir = folder / case
        try:
            gk = GeneratedKernel.load(case_dir)
            module = import_kernel(case_dir / "kernel.py", f"tritongen_{mode}_{case}")
            # the run is the one it says it is (TRITON_INTERPRET read when triton was imported)
            expected = "InterpretedFunction" if mode == "interpreter" else "JITFunction"
            assert type(module.kernel).__name__ == expected, type(module.kernel)
            started = time.perf_counter()
            outputs = launch(module.kernel, gk)
            np.savez(case_dir / f"{mode}.npz", **outputs)
            # (the campaign looks for slow kernels: the test's budget is a minute)
            (case_dir / f"{mode}_seconds.txt").write_text(f"{time.perf_counter() - started}")
        except Exception:  # one case's failure is that case's result, not the run's
            (case_dir / f"{mode}_error.txt").write_text(traceback.format_exc())
