"""Loading libgomp, the parallel runtime, so that it is a good neighbour.

Parallel loops call `GOMP_parallel`; MCJIT resolves it from the libgomp this module loads
into the process. After a region libgomp's idle workers spin before they sleep, 300 000
iterations by default: milliseconds of a core after every call, which the next NumPy
(OpenBLAS) call in the same program then lacks. libgomp reads `GOMP_SPINCOUNT` once, when
it is loaded, so with `TILEGEN_GOMP_SPINCOUNT` set tilegen gives it that value for that
moment only and restores the environment. It is opt-in: a short spin cost back-to-back
parallel kernels 5-15 % in B5 (docs/benchmarks.md, "Sharing the cores"). What a user set
for OpenMP themselves (`GOMP_SPINCOUNT`, `OMP_WAIT_POLICY`) wins, and a libgomp already in
the process (PyTorch's shares the soname) is used as it is: one libgomp, one worker pool.
OpenBLAS (NumPy's) then runs its threaded calls on that pool too (tilegen/blas_pool.py).

libgomp is opened with RTLD_NODELETE before LLVM loads it: at exit LLVM's static
destructors dlclose every library `load_library_permanently` opened, and a worker still
spinning in an unmapped libgomp crashed the process (SIGSEGV after a script's last
parallel call, whenever the spin outlasted Python's shutdown).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import llvmlite.binding as llvm

from kina_frontend.diagnostics import KinaError

from . import blas_pool, config

_USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
_lock = threading.Lock()
_loaded = False
_libgomp: ctypes.CDLL | None = None  # held, never closed
_loaded_spincount: int | None = None  # what tilegen gave libgomp; None: it did not choose


def libgomp_in_process() -> bool:
    """Whether some libgomp is mapped into this process already."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:  # no /proc: assume not, the environment then merely goes unused
        return False


def load_openmp_runtime() -> None:
    """Make libgomp's symbols visible to MCJIT, once per process, and give OpenBLAS's
    threaded work to its pool (tilegen/blas_pool.py; repeated, for a BLAS loaded since)."""
    _load_libgomp()
    blas_pool.share_with_blas(config.load().share_blas_threads)


def _load_libgomp() -> None:
    global _loaded, _loaded_spincount
    if _loaded:
        return
    path = ctypes.util.find_library("gomp")
    if path is None:
        raise KinaError("io", "libgomp (the GNU OpenMP runtime) is needed for parallel loops; "
                        "install gcc/libgomp1 or set TILEGEN_NUM_THREADS=1", None)
    with _lock:
        if _loaded:
            return
        # Only a libgomp loaded here, with no OpenMP settings of the user's, takes ours.
        theirs = any(name in os.environ for name in _USER_SETTINGS) or libgomp_in_process()
        spincount = None if theirs else config.load().gomp_spincount
        if spincount is None:
            _open(path)
        else:
            os.environ["GOMP_SPINCOUNT"] = str(spincount)
            try:
                _open(path)
            finally:
                del os.environ["GOMP_SPINCOUNT"]
        _loaded, _loaded_spincount = True, spincount


def _open(path: str) -> None:
    global _libgomp
    _libgomp = ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW | os.RTLD_NODELETE)
    llvm.load_library_permanently(path)


def chosen_spincount() -> int | None:
    """The spin count tilegen gave libgomp when it loaded it, or None when libgomp came
    with its own settings (the user's, or another library's load)."""
    return _loaded_spincount
