"""The compile target, and the LLVM side of it: initialisation, target machines, the O3
pipeline, and the one lock every llvmlite binding call in tilegen goes through.

A `Target` is chosen once per compile (`TILEGEN_TARGET`, `--target NAME`,
`compile_file(..., target=NAME)`; default: this machine) and travels with the options to
every stage that depends on the CPU: the vector widths of the schedule, the gemm register
and cache blocks, fission's cache budget, vecmath's instruction choices and the target
machine. Nothing else reads the host CPU.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm

from kina_frontend.diagnostics import KinaError

from . import loopir as L

# llvmlite's binding layer is not documented as thread-safe; compiles from several threads
# serialise here (calls into finished native code do not take it).
LLVM_LOCK = threading.RLock()


@dataclass(frozen=True)
class Target:
    """What code generation needs to know about the CPU it generates code for."""

    name: str  # as chosen: "host", "x86-64-v3", ...
    triple: str
    cpu: str  # LLVM CPU name
    features: str  # LLVM feature string, "+avx2,+fma,-avx512f,..."
    vector_bits: int  # the widest vector register
    vector_registers: int
    l1d_bytes: int  # per core
    l2_bytes: int  # per core
    parallel_runtime: str = "libgomp"

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    def lanes(self, dtype: str) -> int:
        """Elements of `dtype` (a loop-IR dtype) in one vector register."""
        return self.vector_bits // (8 * L.ELEMENT_BYTES[dtype])

    def has(self, feature: str) -> bool:
        """Whether the feature string enables `feature` ("avx512f", "neon", ...)."""
        return feature in _enabled(self.features)

    @property
    def runs_on_host(self) -> bool:
        """Whether this machine can execute code for this target (same architecture, every
        feature the code may use present here)."""
        host = host_target()
        return self.arch == host.arch and _enabled(self.features) <= _enabled(host.features)

    def check_runs_on_host(self, what: str) -> None:
        if not self.runs_on_host:
            host = host_target()
            missing = sorted(_enabled(self.features) - _enabled(host.features))
            why = f"needs {', '.join(missing[:8])}" if self.arch == host.arch else \
                f"is {self.arch}"
            raise KinaError("unsupported", f"{what}: target '{self.name}' ({self.cpu}) cannot "
                            f"run on this machine ({host.cpu}, {host.arch}): it {why}", None,
                            ("--emit llvm or --emit asm show the code for any target; "
                             "running needs a target this machine can execute",))


def _enabled(features: str) -> frozenset[str]:
    return frozenset(f[1:] for f in features.split(",") if f.startswith("+"))


_X86_64_V3 = "+64bit,+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+sahf,+avx," \
    "+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe,+xsave,+cmov,+cx8,+fxsr,+mmx"
_SKYLAKE_AVX512 = _X86_64_V3 + ",+avx512f,+avx512vl,+avx512dq,+avx512bw,+avx512cd"
# AMD Zen 4: AVX-512 with AVX512-BF16 (vdpbf16ps), no AMX: its bf16 products run
# gemm_bf16's vdpbf16ps kernel.
_ZNVER4 = _SKYLAKE_AVX512 + ",+avx512vnni,+avx512bf16,+avx512ifma,+avx512vbmi," \
    "+avx512vbmi2,+avx512bitalg,+avx512vpopcntdq,+gfni,+vaes,+vpclmulqdq,+prfchw"

# Targets by name besides "host". Cache sizes are those of the CPUs the names stand for
# (x86-64-v3: Haswell's); they steer blocking, never correctness.
NAMED_TARGETS = {
    "x86-64-v3": Target("x86-64-v3", "x86_64-unknown-linux-gnu", "x86-64-v3",
                        _X86_64_V3 + ",-avx512f", 256, 16, 32 << 10, 256 << 10),
    "skylake-avx512": Target("skylake-avx512", "x86_64-unknown-linux-gnu", "skylake-avx512",
                             _SKYLAKE_AVX512, 512, 32, 32 << 10, 1 << 20),
    "znver4": Target("znver4", "x86_64-unknown-linux-gnu", "znver4", _ZNVER4, 512, 32,
                     32 << 10, 1 << 20),
    "aarch64-linux-gnu": Target("aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "generic",
                                "+neon,+fp-armv8", 128, 32, 64 << 10, 1 << 20),
}


def named_target(name: str) -> Target:
    """The target called `name`: "host" (this machine) or one of NAMED_TARGETS."""
    if name == "host":
        return host_target()
    if name not in NAMED_TARGETS:
        raise KinaError("unsupported", f"unknown target '{name}' (known: host, "
                        f"{', '.join(NAMED_TARGETS)})", None)
    return NAMED_TARGETS[name]


@functools.cache
def host_target() -> Target:
    """This machine: LLVM's host CPU name and features, caches from sysfs."""
    _initialise()
    features = llvm.get_host_cpu_features().flatten()
    arch = llvm.get_process_triple().split("-", 1)[0]
    if arch == "x86_64":
        bits = 512 if "avx512f" in _enabled(features) else \
            256 if "avx" in _enabled(features) else 128
        registers = 32 if bits == 512 else 16
    else:  # aarch64 NEON (SVE is not used)
        bits, registers = 128, 32
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), features,
                  bits, registers, _cache_bytes(1, 32 << 10), _cache_bytes(2, 1 << 20))


# Linux's arch_prctl numbers for AMX tile data (asm/prctl.h, uapi/asm/prctl.h); the AMX
# kernel's own request (tilegen/gemm_amx.py) uses them too.
SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


@functools.cache
def amx_tile_permission() -> tuple[bool, str]:
    """Whether this process may execute AMX tile instructions, and why not if it may not.

    The CPU's flags are not enough: Linux (5.16 on) keeps the 8 KB tile state out of every
    thread's signal frame until the process asks for it, and a tile instruction before that
    dies with SIGILL. So the first AMX compile asks once (ARCH_REQ_XCOMP_PERM for
    XFEATURE_XTILEDATA, granted to the whole process, threads created later included) and
    checks the answer with ARCH_GET_XCOMP_PERM."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux") or host_target().arch != "x86_64":
        return False, "AMX tile data needs Linux on x86-64"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as error:
        return False, f"no C library to call arch_prctl through ({error})"
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_ulong]
    granted = ctypes.c_ulong(0)

    def has_tile_data() -> bool:
        status = syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.addressof(granted))
        return status == 0 and bool(granted.value >> XFEATURE_XTILEDATA & 1)

    if has_tile_data():
        return True, ""
    if syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        return False, (f"the kernel refused ARCH_REQ_XCOMP_PERM for tile data "
                       f"({os.strerror(ctypes.get_errno())})")
    if not has_tile_data():
        return False, "ARCH_GET_XCOMP_PERM does not list tile data after the request"
    return True, ""


def _cache_bytes(level: int, default: int) -> int:
    """The size of this CPU's level-`level` data cache, from sysfs (Linux)."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(root)):
            path = os.path.join(root, index)
            if not index.startswith("index"):
                continue
            with open(os.path.join(path, "level")) as f:
                found = int(f.read())
            with open(os.path.join(path, "type")) as f:
                kind = f.read().strip()
            if found == level and kind in ("Data", "Unified"):
                with open(os.path.join(path, "size")) as f:
                    text = f.read().strip()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
                return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


@functools.cache
def _initialise() -> None:
    # llvmlite 0.50 initialises LLVM itself; `llvm.initialize()` would raise.
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_all_targets()  # cross targets, for --emit asm
    llvm.initialize_all_asmprinters()


@functools.cache
def target_machine(target: Target, pic: bool = False) -> llvm.TargetMachine:
    """The shared target machine for `target` (for optimising and emitting code). Never
    hand it to an execution engine: an MCJIT engine takes ownership and frees it with
    itself."""
    return new_target_machine(target, pic)


def new_target_machine(target: Target, pic: bool = False) -> llvm.TargetMachine:
    _initialise()
    machine = llvm.Target.from_triple(target.triple)
    return machine.create_target_machine(cpu=target.cpu, features=target.features, opt=3,
                                         reloc="pic" if pic else "default",
                                         codemodel="jitdefault" if not pic else "default")


def optimize(module: llvm.ModuleRef, machine: llvm.TargetMachine) -> None:
    """The new pass manager's O3 pipeline with SLP vectorisation.

    Codegen vectorises loops itself (explicit tiles), so LLVM's loop vectoriser is off: it
    found nothing to gain in the benchmarks and cost ~7 ms per cold compile. SLP still
    packs the short scalar nests (a few % on the T = 36 forward)."""
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = False
    tuning.slp_vectorization = True
    tuning.loop_unrolling = False  # small static loops are unrolled by codegen instead
    builder = llvm.create_pass_builder(machine, tuning)
    passes = builder.getModulePassManager()
    try:
        passes.run(module, builder)
    finally:
        _dispose_pass_manager(passes)
        builder.close()
        tuning.close()


def _dispose_pass_manager(passes: llvm.ModulePassManager) -> None:
    """Free a pass manager, which llvmlite 0.50 never does itself: `ModulePassManager`
    lists `ObjectRef` before `NewPassManager` among its bases, so its `_dispose` is the
    no-op one and every O3 pipeline built (~30 KB of passes) leaked, ~57 KB per compile
    with what the passes held (measured with heaptrack and mallinfo2; docs/errors.md).

    The pass builder stays one per compile: llvmlite registers each run's instrumentation
    callbacks on the builder and never removes them, so a shared builder would call the
    callbacks of runs already finished. Its callback registry (~1.5 KB) is the one piece
    llvmlite still leaks per compile."""
    if not passes.closed:
        llvm.ffi.lib.LLVMPY_DisposeNewModulePassManger(passes)
        passes.detach()


def compiler_identity() -> str:
    """The toolchain's versions (for cache keys; the target is part of the options)."""
    version = ".".join(str(v) for v in llvm.llvm_version_info)
    return f"llvmlite={llvmlite.__version__};llvm={version}"
