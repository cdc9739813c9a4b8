"""B6: compile time of each example program, source to callables.

- `tilegen-cold`: a fresh interpreter (bench/compile_probe.py) imports tilegen, then times
  `tilegen.compile_file(path)` plus turning every function into machine code; the import time
  is reported separately (extra_info `import_s`). The benchmark's statistics are the compile
  times the probe reports (a clock that advances by them), not the subprocess wall time.
- `tilegen-same-process`: the same compile repeated in this process (warm imports, and any
  in-memory cache tilegen keeps).
- For storylm0_forward.kina the peers' first-call compile of the same forward in a fresh
  interpreter (`torch.compile-cold` with an empty TorchInductor cache folder, `jax-cold`,
  `numba-cold`), full runs only.

The guard: the probe and the in-process compile must produce every function of the program.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import pytest

from bench.common import (
    BENCH_EXAMPLES,
    EXAMPLES,
    JAX_COLD,
    NUMBA_COLD,
    REPO,
    TILEGEN_COLD,
    TILEGEN_SAME_PROCESS,
    TORCH_COMPILE_COLD,
    describe,
    need,
)

PROBE = REPO / "bench" / "compile_probe.py"
# minilm_l6.kina is left out: its functions include a whole BERT's backward pass, and the
# compile of one of its (B, T) shapes is B8's own row.
PROGRAMS = [program for program in sorted(EXAMPLES.glob("*.kina"))
            if program.name != "minilm_l6.kina"] + sorted(BENCH_EXAMPLES.glob("*.kina"))
PEER_PROGRAM = EXAMPLES / "storylm0_forward.kina"
COLD_ROUNDS = 5
PEER_ROUNDS = 3
PEERS = {TORCH_COMPILE_COLD: ("torch.compile", "torch"), JAX_COLD: ("jax", "jax"),
         NUMBA_COLD: ("numba", "numba")}

_reported = [0.0]


def reported_clock() -> float:
    """The benchmark clock of the cold probes: advances only by the compile time each probe
    reports, so the statistics are compile times and exclude interpreter start-up."""
    return _reported[0]


def _group(program) -> str:
    return f"B6 compile {program.relative_to(EXAMPLES).as_posix()}"


def _program_id(program) -> str:
    return program.relative_to(EXAMPLES).as_posix()


def _expected_functions(program) -> int:
    from kina_frontend import check_source, load_source, specialize
    return len(specialize(check_source(load_source(program))).functions)




def _run_probe(arguments: list[str], program, env: dict[str, str] | None = None) -> dict:
    environment = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep +
                       os.environ.get("PYTHONPATH", ""), **(env or {}))
    result = subprocess.run([sys.executable, str(PROBE), *arguments], cwd=REPO,
                            env=environment, capture_output=True, text=True, timeout=600,
                            check=False)
    if result.returncode != 0:
        raise AssertionError(f"compile probe {arguments} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _record_probes(benchmark, probes: list[dict]) -> None:
    for key in ("import_s", "frontend_s", "machine_code_s"):
        values = [probe[key] for probe in probes if key in probe]
        if values:
            benchmark.extra_info[key] = statistics.median(values)


@pytest.mark.benchmark(timer=reported_clock)
@pytest.mark.parametrize("program", PROGRAMS, ids=_program_id)
def test_b6_compile_cold(benchmark, program):
    expected = _expected_functions(program)
    probes: list[dict] = []

    def compile_cold() -> None:
        probe = _run_probe(["tilegen", str(program)], program)
        if probe["functions"] != expected:  # the guard
            raise AssertionError(f"{program.name}: the probe compiled {probe['functions']} "
                                 f"functions, the program has {expected}")
        probes.append(probe)
        _reported[0] += probe["compile_s"]

    describe(benchmark, _group(program), TILEGEN_COLD, threads=1, units=1, unit="compile",
             cache_dir=os.environ.get("TILEGEN_CACHE_DIR"))
    benchmark.pedantic(compile_cold, rounds=COLD_ROUNDS, iterations=1)
    _record_probes(benchmark, probes)


@pytest.mark.parametrize("program", PROGRAMS, ids=_program_id)
def test_b6_compile_same_process(benchmark, program):
    import tilegen
    expected = _expected_functions(program)

    def compile_here() -> int:
        return len(tilegen.program_of(tilegen.compile_file(program, jit=True)).functions)

    compiled = compile_here()  # first compile: the guard, and warms this process
    if compiled != expected:
        raise AssertionError(f"{program.name}: compiled {compiled} of {expected} functions")
    describe(benchmark, _group(program), TILEGEN_SAME_PROCESS, threads=1, units=1,
             unit="compile")
    benchmark(compile_here)


@pytest.mark.benchmark(timer=reported_clock)
@pytest.mark.parametrize("provider", list(PEERS))
def test_b6_compile_peer_cold(benchmark, provider, full_run_only):
    peer, module = PEERS[provider]
    full_run_only(f"{peer}'s cold compile takes seconds per fresh interpreter")
    need(module)
    probes: list[dict] = []

    def compile_cold() -> None:
        env = {}
        cache = None
        if peer == "torch.compile":  # a cold TorchInductor on-disk cache each time
            cache = tempfile.mkdtemp(prefix="bench-inductor-")
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            probe = _run_probe([peer], PEER_PROGRAM, env)
        finally:
            if cache is not None:
                shutil.rmtree(cache, ignore_errors=True)
        probes.append(probe)
        _reported[0] += probe["compile_s"]

    describe(benchmark, _group(PEER_PROGRAM), provider, threads="default", units=1,
             unit="compile")
    benchmark.pedantic(compile_cold, rounds=PEER_ROUNDS, iterations=1)
    _record_probes(benchmark, probes)
