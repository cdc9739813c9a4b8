"""The host target: LLVM initialisation, the target machine, the O3 pipeline, and the one
lock every llvmlite binding call in tilegen goes through."""

from __future__ import annotations

import functools
import threading

import llvmlite
import llvmlite.binding as llvm

# llvmlite's binding layer is not documented as thread-safe; compiles from several threads
# serialise here (calls into finished native code do not take it).
LLVM_LOCK = threading.RLock()


@functools.cache
def _initialise() -> None:
    # llvmlite 0.50 initialises LLVM itself; `llvm.initialize()` would raise.
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def host_cpu() -> tuple[str, str]:
    """(CPU name, feature string) of this machine, e.g. ('znver4', '+avx512f,...')."""
    _initialise()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


@functools.cache
def target_machine(pic: bool = False) -> llvm.TargetMachine:
    """The shared host target machine (for optimising and emitting code). Never hand it
    to an execution engine: an MCJIT engine takes ownership and frees it with itself."""
    return new_target_machine(pic)


def new_target_machine(pic: bool = False) -> llvm.TargetMachine:
    _initialise()
    cpu, features = host_cpu()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=cpu, features=features, opt=3,
                                        reloc="pic" if pic else "default",
                                        codemodel="jitdefault" if not pic else "default")


def triple() -> str:
    return llvm.get_process_triple()


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
    """Everything about the toolchain that changes the generated bits (for cache keys)."""
    cpu, features = host_cpu()
    version = ".".join(str(v) for v in llvm.llvm_version_info)
    return f"llvmlite={llvmlite.__version__};llvm={version};triple={triple()};cpu={cpu};" \
           f"features={features}"
