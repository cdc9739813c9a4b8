"""Fixtures shared by the benchmark groups, and the machine facts saved with every run."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import pytest

from bench import storylm_data
from bench.common import SHORT_MODE_NOTE, compile_kina
from kina_frontend import KinaError

# Versions recorded with each run (distribution names; absent ones are recorded as absent).
LIBRARIES = ("tilegen", "llvmlite", "numpy", "torch", "jax", "jaxlib", "numba",
             "pytest-benchmark", "threadpoolctl")
# Environment knobs that change what the peers or tilegen run.
ENV_KNOBS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TILEGEN_NUM_THREADS", "TILEGEN_CACHE_DIR",
             "TILEGEN_AUTOTUNE", "TILEGEN_BF16_DOT", "XLA_FLAGS")


# The machine's load when the suite was collected: the cores may be shared (other jobs skew
# multi-threaded peers the most), so the report shows it next to the numbers.
LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, busy CPU seconds of the whole machine, CPU seconds of this process and its
    finished children), to tell how much of the cores other processes took during the run."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = sum(getattr(resource.getrusage(who), field)
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for field in ("ru_utime", "ru_stime"))
    return time.monotonic(), busy, own


CPU_AT_START = _cpu_seconds()


def others_cpu_share() -> float | None:
    """Fraction of all cores' time since collection that other processes used."""
    end = _cpu_seconds()
    if CPU_AT_START is None or end is None:
        return None
    wall = end[0] - CPU_AT_START[0]
    others = (end[1] - CPU_AT_START[1]) - (end[2] - CPU_AT_START[2])
    cores = os.cpu_count() or 1
    return max(0.0, others / (wall * cores)) if wall > 0 else None


@pytest.fixture(scope="session", autouse=True)
def cold_torchinductor_cache():
    """torch.compile's first-call times (`compile_s`) are cold: TorchInductor's on-disk cache
    points at an empty folder for this session (unless TORCHINDUCTOR_CACHE_DIR is set), so a
    previous run's compiled graphs are not reused."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def short_mode(request) -> bool:
    """True under --benchmark-disable (CI): each benchmark body runs once."""
    return bool(request.config.getoption("benchmark_disable"))


@pytest.fixture
def full_run_only(short_mode):
    """Skip a benchmark that is too slow for the short mode, with a visible reason."""

    def skip_if_short(why: str) -> None:
        if short_mode:
            pytest.skip(f"{SHORT_MODE_NOTE}: {why}; runs under --benchmark-only")

    return skip_if_short


@contextmanager
def _tilegen_threads(threads: int | None):
    if threads is None:
        yield
        return
    before = os.environ.get("TILEGEN_NUM_THREADS")
    os.environ["TILEGEN_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if before is None:
            del os.environ["TILEGEN_NUM_THREADS"]
        else:
            os.environ["TILEGEN_NUM_THREADS"] = before


@pytest.fixture(scope="session")
def kina_function():
    """`get(path, name)`: a tilegen-compiled function; each program is compiled once per
    session and each function turned into machine code on first use (tilegen's JIT is lazy
    per function). A compile error fails the benchmark."""
    modules = {}
    functions = {}

    def get(path, name: str, threads: int | None = None):
        key = (path, name, threads)
        if key not in functions:
            try:
                with _tilegen_threads(threads):
                    if (path, threads) not in modules:
                        modules[path, threads] = compile_kina(path)
                    functions[key] = getattr(modules[path, threads], name)
            except KinaError as error:
                functions[key] = error
        compiled = functions[key]
        if isinstance(compiled, KinaError):
            raise compiled  # a compile error fails the benchmark (and the short-mode test)
        return compiled

    return get


@pytest.fixture(scope="session")
def storylm0_t36():
    return storylm_data.storylm0(storylm_data.ROLLOUT_T)


@pytest.fixture(scope="session")
def storylm0_t4():
    return storylm_data.storylm0(4)


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_facts() -> dict:
    """CPU, BLAS kernel and threads, library versions and knobs (also used by report.py when a
    saved run predates them)."""
    import llvmlite.binding as llvm
    from threadpoolctl import threadpool_info

    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    pools = []
    for info in threadpool_info():
        pool = {key: info.get(key) for key in ("user_api", "internal_api", "prefix", "version",
                                               "num_threads", "architecture",
                                               "threading_layer")}
        # whose copy it is: numpy.libs, scipy.libs (loaded by JAX), torch/lib, ...
        pool["package"] = Path(info.get("filepath") or "").parent.name
        if pool["package"] == "lib":
            pool["package"] = Path(info["filepath"]).parent.parent.name
        pools.append(pool)
    torch = sys.modules.get("torch")
    torch_facts = None
    if torch is not None:
        torch_facts = {"num_threads": torch.get_num_threads(),
                       "mkl": bool(torch.backends.mkl.is_available()),
                       "mkldnn": bool(torch.backends.mkldnn.is_available())}
    return {
        "cpu_model_name": _cpu_model_name(),
        "llvm_host_cpu": llvm.get_host_cpu_name(),
        "llvm_version": ".".join(map(str, llvm.llvm_version_info)),
        "cpu_count": os.cpu_count(),
        "cpu_features": llvm.get_host_cpu_features().flatten(),
        "load_average_start": LOAD_AT_START,
        "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "others_cpu_share": others_cpu_share(),
        "threadpools": pools,
        "torch": torch_facts,
        "environment": {name: os.environ.get(name) for name in ENV_KNOBS},
        "versions": versions,
    }


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["tilegen_bench"] = machine_facts()
