"""The `Target`: chosen once (TILEGEN_TARGET, --target, compile_file(target=)), read by
every stage that depends on the CPU, and nothing else reads the host CPU."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest

from kina_frontend import KinaError, program_from_text
from tilegen import config
from tilegen import loopir as L
from tilegen.api import compile_source
from tilegen.fission import fission_pass
from tilegen.loopir_parse import parse_kernel
from tilegen.pipeline import plan_program
from tilegen.runtime import program_of
from tilegen.target import host_target, named_target

ROOT = Path(__file__).resolve().parent.parent
HOST_HAS_AVX512 = host_target().has("avx512f") and host_target().has("avx512dq")
HOST_X86 = host_target().arch == "x86_64"

# Odd sizes: vector tails, a packed matmul (70 x 90 x 50) and the row passes of softmax.
SOURCE = """
fn f(a: Tensor[F32, [70, 90], @host], b: Tensor[F32, [90, 50], @host],
     x: Tensor[F64, [3, 37], @host])
    -> (Tensor[F32, [70, 50], @host], Tensor[F64, [3, 37], @host]) {
  return (softmax(matmul(a, b), 1), exp(x));
}
"""


def _reference(a, b, x):
    scores = a.astype(np.float64) @ b.astype(np.float64)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), np.exp(x)


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tilegen.compile", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def _widths(kernel: L.Kernel) -> set[int]:
    widths = set()
    for stmt in L.statements(kernel.body):
        if isinstance(stmt, L.For) and stmt.kind == "vector":
            widths.add(stmt.width)
    return widths


def test_named_targets_know_their_vectors():
    assert named_target("x86-64-v3").lanes(L.F32) == 8
    assert named_target("x86-64-v3").lanes(L.F64) == 4
    assert not named_target("x86-64-v3").has("avx512f")
    assert named_target("skylake-avx512").lanes(L.F32) == 16
    assert named_target("aarch64-linux-gnu").lanes(L.F32) == 4
    assert named_target("aarch64-linux-gnu").arch == "aarch64"
    assert named_target("host") is host_target()
    with pytest.raises(KinaError, match="unknown target 'pentium'.*x86-64-v3"):
        named_target("pentium")


def test_host_target_is_what_llvm_reports():
    host = host_target()
    assert host.cpu == llvm.get_host_cpu_name()
    assert host.triple == llvm.get_process_triple()
    assert host.runs_on_host and host.l1d_bytes > 0 and host.l2_bytes > host.l1d_bytes


def test_tilegen_target_and_the_keyword_choose_it(monkeypatch):
    monkeypatch.setenv("TILEGEN_TARGET", "x86-64-v3")
    assert config.load().target.name == "x86-64-v3"
    assert config.load("skylake-avx512").target.name == "skylake-avx512"
    monkeypatch.setenv("TILEGEN_TARGET", "nonsense")
    with pytest.raises(KinaError, match="unknown target 'nonsense'"):
        config.load()


def test_the_schedule_follows_the_target():
    program = program_from_text(SOURCE, "t.kina")
    for name, lanes in (("x86-64-v3", 8), ("skylake-avx512", 16), ("aarch64-linux-gnu", 4)):
        options = config.load(name)
        (plan,) = plan_program(program, None, options)
        assert plan.target.name == name
        widths = _widths(plan.kernel)
        assert widths and max(widths) == lanes, (name, widths)
        (gemm,) = [s for s in plan.kernel.body if isinstance(s, L.Gemm)]
        vectors = gemm.tiles.nr // lanes
        assert gemm.tiles.nr % lanes == 0
        # the accumulators fit in the target's registers, with room for B and A
        assert gemm.tiles.mr * vectors <= options.target.vector_registers * 3 // 4


@pytest.mark.skipif(not HOST_X86, reason="x86-64 targets run only on an x86-64 host")
@pytest.mark.parametrize("name", ["x86-64-v3", "host"] +
                         (["skylake-avx512"] if HOST_HAS_AVX512 else []) +
                         (["znver4"] if named_target("znver4").runs_on_host else []))
def test_jit_code_for_each_runnable_target_is_right(name, monkeypatch):
    monkeypatch.delenv("TILEGEN_CACHE_DIR", raising=False)
    module = compile_source(SOURCE, f"target_{name}.kina", target=name)
    assert program_of(module).plans["f"].target.name == name
    rng = np.random.default_rng(1)
    a = rng.standard_normal((70, 90)).astype(np.float32)
    b = rng.standard_normal((90, 50)).astype(np.float32)
    x = rng.standard_normal((3, 37))
    got_p, got_e = module.f(a, b, x)
    want_p, want_e = _reference(a, b, x)
    np.testing.assert_allclose(got_p, want_p, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(got_e, want_e, rtol=1e-14)


def test_jit_for_a_target_this_machine_cannot_run_is_an_error():
    foreign = "aarch64-linux-gnu" if HOST_X86 else "x86-64-v3"
    with pytest.raises(KinaError, match=f"target '{foreign}'.*cannot run on this machine"):
        compile_source(SOURCE, "foreign.kina", target=foreign)


@pytest.mark.skipif(not HOST_X86, reason="checks x86 registers")
def test_avx2_asm_uses_ymm_and_never_zmm():
    result = _cli("storylm0_forward.kina", "--target", "x86-64-v3", "--emit", "asm")
    assert result.returncode == 0, result.stderr
    assert "ymm" in result.stdout
    assert "zmm" not in result.stdout
    avx512 = _cli("storylm0_forward.kina", "--target", "skylake-avx512", "--emit", "asm")
    assert avx512.returncode == 0, avx512.stderr
    assert "zmm" in avx512.stdout


def test_aarch64_asm_is_neon_code():
    # Retargeting used to abort the process inside LLVM: vecmath asked the *host* for
    # AVX-512 and emitted llvm.x86.avx512 intrinsics into an aarch64 module.
    result = _cli("storylm0_forward.kina", "--target", "aarch64-linux-gnu", "--emit", "asm")
    assert result.returncode == 0, result.stderr
    assert re.search(r"\bfmla\s+v\d+\.4s", result.stdout), "no NEON f32x4 FMA"
    assert "ymm" not in result.stdout and "%rsp" not in result.stdout
    llvm_ir = _cli("storylm0_forward.kina", "--target", "aarch64-linux-gnu", "--emit", "llvm")
    assert llvm_ir.returncode == 0, llvm_ir.stderr
    assert "llvm.x86" not in llvm_ir.stdout and "aarch64" in llvm_ir.stdout


def test_cli_run_and_library_for_a_foreign_target_are_clear_errors(tmp_path):
    foreign = "aarch64-linux-gnu" if HOST_X86 else "x86-64-v3"
    run = _cli("storylm0_forward.kina", "--target", foreign, "--run")
    assert run.returncode == 1
    assert f"target '{foreign}'" in run.stderr and "cannot run on this machine" in run.stderr
    assert "Traceback" not in run.stderr
    default = _cli("storylm0_forward.kina", "--target", foreign)
    assert default.returncode == 1 and "cannot run on this machine" in default.stderr
    library = _cli("storylm0_forward.kina", "--target", foreign, "-o", str(tmp_path / "x.so"))
    assert library.returncode == 1 and "cross compiler" in library.stderr
    unknown = _cli("storylm0_forward.kina", "--target", "vax", "--emit", "loops")
    assert unknown.returncode == 1 and "unknown target 'vax'" in unknown.stderr


def test_fission_budget_is_half_the_targets_l2():
    """A row nest splits into row passes only while its buffers fit in half of L2: the
    same nest (x, t and out0: 1.5 KB) splits for a roomy L2 and stays fused for a tiny one."""
    from tests.test_fission import _ROW_PRIVATE

    kernel = parse_kernel(_ROW_PRIVATE)
    host = config.load().target
    assert len(fission_pass(kernel, replace(host, l2_bytes=2 << 20)).body) == 2
    assert fission_pass(kernel, replace(host, l2_bytes=2 << 10)) == kernel


# Stages that depend on the CPU get it from the Target they are handed; only target.py asks
# LLVM about the host, and only the modules that load code into this process (the loaders,
# the Triton backend's in-process JIT, OpenBLAS's callback) or choose the default (config)
# name host_target.
CPU_READERS = {"get_host_cpu_name", "get_host_cpu_features", "host_cpu"}
MAY_NAME_HOST = {"tilegen/target.py", "tilegen/config.py", "tilegen/library.py",
                 "tilegen/blas_pool.py"}


def test_no_module_reads_the_host_cpu_on_its_own():
    offenders = []
    for path in sorted((ROOT / "tilegen").rglob("*.py")) + \
            sorted((ROOT / "kina_frontend").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        names = {node.attr if isinstance(node, ast.Attribute) else node.id
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, (ast.Attribute, ast.Name))}
        if relative != "tilegen/target.py" and names & CPU_READERS:
            offenders.append(f"{relative}: {sorted(names & CPU_READERS)}")
        if relative not in MAY_NAME_HOST and not relative.startswith(
                "tilegen/triton_backend/") and "host_target" in names:
            offenders.append(f"{relative}: host_target")
    assert not offenders, offenders


def test_each_target_gets_its_own_module(monkeypatch):
    monkeypatch.delenv("TILEGEN_CACHE_DIR", raising=False)
    if not HOST_X86:
        pytest.skip("x86-64-v3 runs only on x86-64")
    host = compile_source(SOURCE, "same.kina", target="host")
    avx2 = compile_source(SOURCE, "same.kina", target="x86-64-v3")
    assert host is not avx2
    assert program_of(avx2).plans["f"].target.name == "x86-64-v3"
    assert program_of(host).plans["f"].target.name == "host"
    default = compile_source(SOURCE, "same.kina")  # TILEGEN_TARGET, else the host
    assert program_of(default).plans["f"].target == config.load().target
