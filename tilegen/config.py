"""Every tilegen knob, read from the environment in one place.

TILEGEN_NUM_THREADS  threads for parallel loops (default: all cores; 1 disables)
TILEGEN_CACHE_DIR    opt-in on-disk cache of compiled object code (unset: memory only)
TILEGEN_PROFILE      1 (or `cycles`): count time-stamp-counter cycles per top-level loop nest;
                     `cpu`: count the process's CPU nanoseconds (all threads) per nest
                     instead, which a loaded machine's preemption does not inflate
                     (see tilegen.profile)
TILEGEN_AUTOTUNE     1: time matmul tile candidates once per shape and keep the fastest
                     (default 0: the deterministic default tiles, no timing at compile)
TILEGEN_MAX_INLINED_OPS  operations a function may have once its calls are inlined
                     (default 200 000; beyond it a K500 diagnostic at the call that crosses it)
TILEGEN_BF16_DOT     the kernel for products of BF16 operands (tilegen/gemm_bf16.py): unset
                     or `auto`: AMX (`tdpbf16ps`, tilegen/gemm_amx.py) where the CPU has it
                     and Linux grants tile data, else `vdpbf16ps` where it beats the f32
                     kernel, else the operands widened to f32; `amx`: as auto, but a warning
                     when AMX cannot be used; 1: `vdpbf16ps` wherever the CPU has
                     AVX512-BF16 (never AMX); 0: always widened to f32
TILEGEN_MEMORY_CACHE modules the in-memory compile cache keeps, least recently used
                     dropped first (default 32; 0 turns it off)
TILEGEN_TARGET       the CPU to generate code for: host (default), x86-64-v3,
                     skylake-avx512 or aarch64-linux-gnu (tilegen/target.py); JIT needs
                     one this machine can run
TILEGEN_GOMP_SPINCOUNT  how long libgomp's idle workers spin before they sleep, given to
                     libgomp as GOMP_SPINCOUNT when tilegen loads it (unset: libgomp's own
                     300 000; 10000 frees the cores for NumPy soon after a region, at a cost
                     to back-to-back parallel kernels: docs/benchmarks.md, B10). Ignored when
                     GOMP_SPINCOUNT or OMP_WAIT_POLICY is set, or libgomp is already loaded.
TILEGEN_SHARE_BLAS_THREADS  1 (default): OpenBLAS (NumPy's BLAS) runs its threaded calls on
                     libgomp's pool, the one tilegen and PyTorch use, instead of its own
                     spinning threads (tilegen/blas_pool.py); 0 leaves OpenBLAS's threads
                     alone. Read whenever tilegen loads code; an installed callback stays.
TILEGEN_VERIFY       1: run the tensor-IR verifier on each prepared function and the loop-IR
                     verifier after lowering and after every schedule pass (tilegen/stages.py;
                     the tests run them always)
TILEGEN_FUSED_ATTENTION  auto (default): softmax(q k^T ...) @ v runs as one blocked
                     online-softmax nest (tilegen/attention.py), and its reverseMode
                     gradient as one blocked backward (tilegen/attention_backward.py),
                     when a head's score matrix has at least 64 x 64 elements; always: at
                     any size; never: unfused
TILEGEN_TRITON_DISABLE  1: the Triton backend's driver reports itself inactive, so Triton
                     does not pick tilegen (docs/triton.md); read when Triton asks
TILEGEN_HUGEPAGES    1 (default): the Triton launcher asks for transparent huge pages
                     (MADV_HUGEPAGE) under the large tensors a kernel writes, where Linux
                     gives them only on request (tilegen/triton_backend/hugepages.py); 0:
                     never. Read once, at the first launch
TILEGEN_TRITON_AMX   the Triton backend's `tt.dot` on AMX tiles (`tdpbf16ps`,
                     triton_backend/amx_dot.py): unset or `auto`: where the CPU has
                     AMX-BF16 and Linux grants tile data, dots of tiles of at least 32 x 32
                     on bf16 operands, on f16 ones (an exact four-term split) and on f32
                     ones of input_precision tf32/tf32x3/bf16x3 (as bf16x3); 0 (off):
                     never, the FMA kernel for every dot. Read when Triton parses a
                     compile's options (a field of them, so part of Triton's cache key)
TILEGEN_PERF_MAP     1: name the JIT code for Linux `perf` in /tmp/perf-<pid>.map
                     (tilegen/perfmap.py; default 0). Read whenever an engine is loaded

Not a knob but part of every compile's options: `stack_bytes`, the stack a kernel's
temporaries may take, from this process's stack limits (tilegen/frame.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kina_frontend.transforms import MAX_INLINED_OPS

from .target import Target, host_target, named_target

MEMORY_CACHE_ENTRIES = 32


@dataclass(frozen=True)
class Config:
    num_threads: int
    cache_dir: str | None
    profile: str  # TILEGEN_PROFILE: "" (off), "cycles" or "cpu"
    autotune: bool
    stack_bytes: int = 1 << 20
    target: Target = field(default_factory=host_target)
    fused_attention: str = "auto"
    bf16_kernel: str = "auto"  # TILEGEN_BF16_DOT: auto, amx, dot (1) or widen (0)
    # Not part of what a compile produces, so kept out of repr (the cache key).
    memory_cache_entries: int = field(default=MEMORY_CACHE_ENTRIES, repr=False)
    max_inlined_ops: int = field(default=MAX_INLINED_OPS, repr=False)
    gomp_spincount: int | None = field(default=None, repr=False)  # None: libgomp's own
    share_blas_threads: bool = field(default=True, repr=False)
    verify: bool = field(default=False, repr=False)  # checks only: the code is the same


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _optional_int(name: str) -> int | None:
    if not os.environ.get(name, "").strip():
        return None
    return _int(name, 0, minimum=0)


def _profile_mode() -> str:
    raw = os.environ.get("TILEGEN_PROFILE", "").strip().lower()
    if raw in ("cycles", "cpu"):
        return raw
    return "cycles" if _flag("TILEGEN_PROFILE", False) else ""


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw not in ("0", "false", "no", "off")


def _choice(name: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip().lower() or choices[0]
    if raw not in choices:
        raise ValueError(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


def _bf16_kernel() -> str:
    """TILEGEN_BF16_DOT as one of auto, amx, dot, widen (1/0 and the other flag spellings
    mean dot and widen, as when the knob was on/off for `vdpbf16ps` alone)."""
    raw = os.environ.get("TILEGEN_BF16_DOT", "").strip().lower()
    if raw in ("", "auto", "amx", "dot", "widen"):
        return raw or "auto"
    return "dot" if _flag("TILEGEN_BF16_DOT", True) else "widen"


def load(target: str | None = None) -> Config:
    """The configuration from the current environment (read at each compile, so tests and
    users can change it between compiles); `target` names a target that overrides
    TILEGEN_TARGET (the CLI's --target, compile_file's target=)."""
    from .frame import stack_budget

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return Config(num_threads=_int("TILEGEN_NUM_THREADS", cores),
                  cache_dir=os.environ.get("TILEGEN_CACHE_DIR") or None,
                  profile=_profile_mode(),
                  autotune=_flag("TILEGEN_AUTOTUNE", False),
                  stack_bytes=stack_budget(),
                  bf16_kernel=_bf16_kernel(),
                  target=named_target(target or os.environ.get("TILEGEN_TARGET", "").strip()
                                      or "host"),
                  memory_cache_entries=_int("TILEGEN_MEMORY_CACHE", MEMORY_CACHE_ENTRIES,
                                            minimum=0),
                  max_inlined_ops=_int("TILEGEN_MAX_INLINED_OPS", MAX_INLINED_OPS),
                  gomp_spincount=_optional_int("TILEGEN_GOMP_SPINCOUNT"),
                  share_blas_threads=_flag("TILEGEN_SHARE_BLAS_THREADS", True),
                  verify=_flag("TILEGEN_VERIFY", False),
                  fused_attention=_choice("TILEGEN_FUSED_ATTENTION", ("auto", "always",
                                                                      "never")))


def hugepages_allowed() -> bool:
    """TILEGEN_HUGEPAGES: how the launcher treats memory, not a compile option."""
    return _flag("TILEGEN_HUGEPAGES", True)


def triton_amx() -> str:
    """TILEGEN_TRITON_AMX as `auto` or `off` (1/0 and the other flag spellings mean auto
    and off). Like TILEGEN_TRITON_DISABLE not part of `Config`: the Triton backend puts it
    in its compile options (triton_backend/compiler.py)."""
    return "auto" if _flag("TILEGEN_TRITON_AMX", True) else "off"


def perf_map() -> bool:
    """TILEGEN_PERF_MAP: a side effect of loading code (tilegen/perfmap.py), not a compile
    option: the code is the same either way."""
    return _flag("TILEGEN_PERF_MAP", False)


def triton_disabled() -> bool:
    """TILEGEN_TRITON_DISABLE: not a compile option (it decides whether Triton's driver
    is ours at all), so it is not part of `Config`."""
    return _flag("TILEGEN_TRITON_DISABLE", False)
