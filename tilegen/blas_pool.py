"""OpenBLAS runs its threaded work on libgomp's pool: one team for NumPy and tilegen.

With two pools in one process, each spins a while after its work (OpenBLAS 2^28 cycles,
libgomp 300 000 iterations) and takes a core from the other's next call: on two cores a
tilegen matmul right after a NumPy one ran 3.5x slower than alone, NumPy after tilegen
2.2x (docs/benchmarks.md, B10). PyTorch already shares tilegen's libgomp. OpenBLAS (0.3.27
on) lets a program run its threads instead: `openblas_set_threads_callback_function`
hands every threaded call's jobs to a callback. tilegen installs one, compiled here
through llvmlite, that runs the jobs as one libgomp region, so NumPy's, PyTorch's and
tilegen's parallel work all go to the same workers and nobody's idle spin is in the way.

The jobs of one OpenBLAS call wait for each other (the threaded gemm hands packed panels
between them), so they must all run at once: the callback asks libgomp for exactly that
many threads, and where it gets fewer (inside another OpenMP region, OMP_THREAD_LIMIT, or
a forked child whose pool is gone, tilegen/forksafe.py) it starts plain threads for the
call instead. Each job's thread number selects OpenBLAS's per-thread buffer: the callback
numbers its jobs from OpenBLAS's own thread count up, so they never share a buffer with
OpenBLAS's threads (a call in flight when the callback is installed), and one call at a
time holds those numbers (a lock; concurrent NumPy calls from several Python threads take
turns, as on OpenBLAS's own pool of the same size).

TILEGEN_SHARE_BLAS_THREADS=0 leaves OpenBLAS's threads alone. An OpenBLAS built with
OpenMP already uses an OpenMP pool and is left alone too. At exit the callbacks are
removed again, before LLVM frees the code they live in.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import threading
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from . import forksafe
from .target import LLVM_LOCK, host_target, new_target_machine

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_PTR = ir.PointerType()
_PARALLEL_PTHREADS = 1  # openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP
_SYMBOL_SPELLINGS = (("openblas_", ""), ("scipy_openblas_", "64_"), ("openblas_", "64_"),
                     ("scipy_openblas_", ""), ("openblas_", "_64"))
# A pthread_mutex_t is 40 bytes on x86-64 and 48 on aarch64 glibc; all zero is unlocked.
_MUTEX_BYTES = 64

_lock = threading.Lock()
_hooked: dict[str, SharedBlas] = {}  # by the library's path
_skipped: dict[str, str] = {}  # library path -> why it keeps its own threads


@dataclass
class SharedBlas:
    """One OpenBLAS whose threaded calls run on libgomp's pool."""

    path: str
    library: ctypes.CDLL
    set_callback: object  # the library's openblas_set_threads_callback_function
    engine: llvm.ExecutionEngine  # owns the callback's code: kept for the process
    mutex_address: int
    counters_address: int
    first_thread: int

    def counts(self) -> tuple[int, int]:
        """(threaded calls run, of which on plain threads), counted under the lock."""
        counters = (ctypes.c_int64 * 2).from_address(self.counters_address)
        return int(counters[0]), int(counters[1])


def status() -> dict[str, str]:
    """Each OpenBLAS seen in the process: `shared` or why it keeps its own threads."""
    with _lock:
        return {**{path: "shared" for path in _hooked}, **_skipped}


def shared_libraries() -> dict[str, SharedBlas]:
    """The OpenBLAS libraries whose threaded calls run on libgomp's pool, by path."""
    with _lock:
        return dict(_hooked)


def share_with_blas(enabled: bool = True) -> None:
    """Install the callback in every OpenBLAS loaded into the process that has none yet.
    Cheap to repeat (one read of /proc/self/maps), so a library loaded later (SciPy's
    own OpenBLAS) is picked up by the next compile."""
    if not enabled:
        return
    paths = _openblas_paths()
    with _lock:
        for path in paths:
            if path not in _hooked and path not in _skipped:
                reason = _hook(path)
                if reason is not None:
                    _skipped[path] = reason


def _openblas_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            names = {line.split(None, 5)[-1].strip() for line in maps if "openblas" in line}
    except OSError:
        return []
    return sorted(name for name in names
                  if "/" in name and re.search(r"openblas[^/]*\.so", os.path.basename(name)))


def _symbol(library: ctypes.CDLL, name: str):
    for prefix, suffix in _SYMBOL_SPELLINGS:
        function = getattr(library, f"{prefix}{name}{suffix}", None)
        if function is not None:
            return function
    return None


def _hook(path: str) -> str | None:
    try:  # RTLD_NOLOAD: a handle on the copy already mapped, never a second load
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    except OSError as error:
        return f"not loadable again: {error}"
    set_callback = _symbol(library, "set_threads_callback_function")
    get_parallel = _symbol(library, "get_parallel")
    get_threads = _symbol(library, "get_num_threads")
    get_config = _symbol(library, "get_config")
    if None in (set_callback, get_parallel, get_threads, get_config):
        return "no openblas_set_threads_callback_function (OpenBLAS before 0.3.27)"
    if get_parallel() != _PARALLEL_PTHREADS:
        return "not built with its own pthreads pool (serial or OpenMP)"
    get_config.restype = ctypes.c_char_p
    match = re.search(rb"MAX_THREADS=(\d+)", get_config() or b"")
    if match is None:
        return "its build does not say MAX_THREADS, the size of its per-thread buffers"
    first_thread, slots = int(get_threads()), int(match.group(1))
    if 2 * first_thread > slots:
        return f"{first_thread} threads leave no spare buffer numbers below {slots}"
    engine = _compile_callback(first_thread, slots)
    address = engine.get_function_address("tilegen_blas_threads")
    set_callback.argtypes = [ctypes.c_void_p]
    set_callback.restype = None
    set_callback(address)
    _hooked[path] = SharedBlas(path, library, set_callback, engine,
                               engine.get_global_value_address("tilegen_blas_lock"),
                               engine.get_global_value_address("tilegen_blas_counters"),
                               first_thread)
    return None


def _compile_callback(first_thread: int, slots: int) -> llvm.ExecutionEngine:
    target = host_target()
    parsed = llvm.parse_assembly(str(callback_module(first_thread, slots,
                                                     ctypes.addressof(forksafe.STATE))))
    parsed.verify()
    with LLVM_LOCK:
        engine = llvm.create_mcjit_compiler(parsed, new_target_machine(target))
        engine.finalize_object()
    return engine


def callback_module(first_thread: int, slots: int, fork_state: int) -> ir.Module:
    """`void tilegen_blas_threads(int sync, dojob, int numjobs, size_t jobdata_elsize,
    void *jobdata, int dojob_data)`, OpenBLAS's openblas_threads_callback, which runs
    `dojob(thread, jobdata + i * elsize, dojob_data)` for every job i at once."""
    module = ir.Module("tilegen_blas_pool")
    dojob_type = ir.FunctionType(ir.VoidType(), [_I32, _PTR, _I32])
    # context: dojob, jobdata, elsize, numjobs, dojob_data, first thread, team too small
    context_type = ir.LiteralStructType([_PTR, _PTR, _I64, _I32, _I32, _I32, _I32])

    def declare(name, result, *arguments):
        return ir.Function(module, ir.FunctionType(result, list(arguments)), name)

    gomp_parallel = declare("GOMP_parallel", ir.VoidType(), _PTR, _PTR, _I32, _I32)
    team_size = declare("omp_get_num_threads", _I32)
    thread_number = declare("omp_get_thread_num", _I32)
    mutex_lock = declare("pthread_mutex_lock", _I32, _PTR)
    mutex_unlock = declare("pthread_mutex_unlock", _I32, _PTR)
    thread_create = declare("pthread_create", _I32, _PTR, _PTR, _PTR, _PTR)
    thread_join = declare("pthread_join", _I32, _I64, _PTR)
    mutex = ir.GlobalVariable(module, ir.ArrayType(ir.IntType(8), _MUTEX_BYTES),
                              "tilegen_blas_lock")
    mutex.initializer = ir.Constant(ir.ArrayType(ir.IntType(8), _MUTEX_BYTES), None)
    mutex.align = 16
    # [calls, calls that ran on plain threads]: what status() and the tests read
    counters = ir.GlobalVariable(module, ir.ArrayType(_I64, 2), "tilegen_blas_counters")
    counters.initializer = ir.Constant(ir.ArrayType(_I64, 2), None)

    def field(builder, context, index):
        return _gep(builder, context, context_type, [_I32(0), _I32(index)])

    def load_field(builder, context, index):
        # The job function loads as a typed pointer: llvmlite's call takes the signature
        # from the callee's type (LLVM reads `void (i32, ptr, i32)*` as the opaque `ptr`).
        loaded = ir.PointerType(dojob_type) if index == 0 else context_type.elements[index]
        return builder.load(field(builder, context, index), typ=loaded)

    def run_job(builder, context, job):
        """dojob(first + job, jobdata + job * elsize, dojob_data)"""
        dojob = load_field(builder, context, 0)
        jobdata = load_field(builder, context, 1)
        elsize = load_field(builder, context, 2)
        data = builder.gep(jobdata, [builder.mul(builder.sext(job, _I64), elsize)],
                           source_etype=ir.IntType(8))
        first = load_field(builder, context, 5)
        builder.call(dojob, [builder.add(first, job), data,
                                                  load_field(builder, context, 4)])

    # The libgomp region: each team member runs the job of its number.
    region = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR]), "tilegen_blas_region")
    region.linkage = "internal"
    builder = ir.IRBuilder(region.append_basic_block("entry"))
    context = region.args[0]
    jobs = load_field(builder, context, 3)
    too_small = builder.icmp_signed("<", builder.call(team_size, []), jobs)
    with builder.if_else(too_small) as (small, enough):
        with small:  # every member sees the same size, so all of them skip; the caller
            # (number 0) says so, and reads it itself after the region
            master = builder.icmp_signed("==", builder.call(thread_number, []), _I32(0))
            with builder.if_then(master):
                builder.store(_I32(1), field(builder, context, 6))
        with enough:
            run_job(builder, context, builder.call(thread_number, []))
    builder.ret_void()

    # A plain thread for one job, where libgomp cannot give the whole team.
    job_type = ir.LiteralStructType([_PTR, _I32])
    trampoline = ir.Function(module, ir.FunctionType(_PTR, [_PTR]), "tilegen_blas_thread")
    trampoline.linkage = "internal"
    builder = ir.IRBuilder(trampoline.append_basic_block("entry"))
    job_context = builder.load(_gep(builder, trampoline.args[0], job_type,
                                    [_I32(0), _I32(0)]), typ=_PTR)
    job_index = builder.load(_gep(builder, trampoline.args[0], job_type,
                                  [_I32(0), _I32(1)]), typ=_I32)
    run_job(builder, job_context, job_index)
    builder.ret(ir.Constant(_PTR, None))

    callback = ir.Function(module, ir.FunctionType(
        ir.VoidType(), [_I32, _PTR, _I32, _I64, _PTR, _I32]), "tilegen_blas_threads")
    _sync, dojob, numjobs, elsize, jobdata, dojob_data = callback.args
    entry = callback.append_basic_block("entry")
    builder = ir.IRBuilder(entry)
    with builder.if_then(builder.icmp_signed(">", numjobs, _I32(0))):
        context = builder.alloca(context_type)
        # Job numbers from OpenBLAS's thread count up, unless that runs past its buffers.
        fits = builder.icmp_signed("<=", builder.add(numjobs, _I32(first_thread)),
                                   _I32(slots))
        first = builder.select(fits, _I32(first_thread), _I32(0))
        for index, value in enumerate((dojob, jobdata, elsize, numjobs, dojob_data, first,
                                       _I32(0))):
            builder.store(value, field(builder, context, index))
        builder.call(mutex_lock, [mutex])
        count_call = builder.gep(counters, [_I32(0), _I32(0)], inbounds=True)
        builder.store(builder.add(builder.load(count_call), _I64(1)), count_call)
        state = ir.Constant(_I64, fork_state).inttoptr(_PTR)
        thread_cap = builder.load(state, typ=_I64)
        pool_usable = builder.icmp_signed(">=", thread_cap, builder.sext(numjobs, _I64))
        one_job = builder.icmp_signed("==", numjobs, _I32(1))
        with builder.if_else(one_job) as (single, several):
            with single:
                run_job(builder, context, _I32(0))
            with several:
                with builder.if_then(pool_usable):
                    builder.call(gomp_parallel, [region, context, numjobs, _I32(0)])
                    # a pool now exists: a forked child must not use it (forksafe)
                    builder.store(_I64(1), _gep(builder, state, _I64, [_I64(1)]))
                skipped = load_field(builder, context, 6)
                threads = builder.select(pool_usable, skipped, _I32(1))
                with builder.if_then(builder.icmp_signed("!=", threads, _I32(0))):
                    count_plain = builder.gep(counters, [_I32(0), _I32(1)], inbounds=True)
                    builder.store(builder.add(builder.load(count_plain), _I64(1)), count_plain)
                    _run_on_plain_threads(builder, context, numjobs, job_type, trampoline,
                                          thread_create, thread_join, run_job)
        builder.call(mutex_unlock, [mutex])
    builder.ret_void()
    return module


def _run_on_plain_threads(builder, context, numjobs, job_type, trampoline, thread_create,
                          thread_join, run_job) -> None:
    """Jobs 1.. on fresh threads, job 0 on the caller, then join them all."""
    handles = builder.alloca(_I64, numjobs)
    jobs = builder.alloca(job_type, numjobs)

    def counted_loop(name, body):
        start = builder.block
        header = builder.append_basic_block(f"{name}.header")
        step = builder.append_basic_block(f"{name}.body")
        done = builder.append_basic_block(f"{name}.done")
        builder.branch(header)
        builder.position_at_end(header)
        index = builder.phi(_I32)
        index.add_incoming(_I32(1), start)
        builder.cbranch(builder.icmp_signed("<", index, numjobs), step, done)
        builder.position_at_end(step)
        body(index)
        index.add_incoming(builder.add(index, _I32(1)), builder.block)
        builder.branch(header)
        builder.position_at_end(done)

    def start_one(index):
        job = builder.gep(jobs, [index])
        builder.store(context, builder.bitcast(builder.gep(job, [_I32(0), _I32(0)]),
                                               ir.PointerType(context.type)))
        builder.store(index, builder.gep(job, [_I32(0), _I32(1)]))
        builder.call(thread_create, [builder.gep(handles, [index]),
                                     ir.Constant(_PTR, None), trampoline, job])

    def join_one(index):
        handle = builder.load(builder.gep(handles, [index]))
        builder.call(thread_join, [handle, ir.Constant(_PTR, None)])

    counted_loop("start", start_one)
    run_job(builder, context, _I32(0))
    counted_loop("join", join_one)


def _gep(builder: ir.IRBuilder, pointer: ir.Value, element: ir.Type, indices) -> ir.Value:
    """A field's address through an opaque pointer (an argument) or a typed one (llvmlite's
    alloca, on which `gep` checks types itself and ignores `source_etype`)."""
    if pointer.type.is_opaque:
        return builder.gep(pointer, indices, inbounds=True, source_etype=element)
    return builder.gep(pointer, indices, inbounds=True)


def _reset_locks_in_child() -> None:
    # A fork while another thread held a lock leaves it held forever in the child.
    for shared in _hooked.values():
        ctypes.memset(shared.mutex_address, 0, _MUTEX_BYTES)


def _unhook_at_exit() -> None:
    with _lock:
        for shared in _hooked.values():
            shared.set_callback(None)


os.register_at_fork(after_in_child=_reset_locks_in_child)
atexit.register(_unhook_at_exit)
