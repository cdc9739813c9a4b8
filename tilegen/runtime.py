"""Compiled modules and their Python callables.

A `CompiledModule` owns the native code (an MCJIT engine, or a loaded shared library)
for as long as any of its functions is alive. Each `CompiledFunction` validates its
arguments (dtype, shape, contiguity), allocates or checks its outputs, calls the
native entry point and turns a failed id check into a Python exception.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import inspect
import keyword
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np

from kina_frontend.diagnostics import KinaError

from . import forksafe
from .codegen import BLOCK_COUNT_SUFFIX, BLOCKS_SUFFIX
from .fastcall import TABLE_SYMBOL, fill_runtime_table, layout_is_supported, make_builtin
from .parallel import THREADS_SUFFIX
from .pipeline import KernelPlan, codegen, jit_object_code, object_code, to_llvm
from .target import LLVM_LOCK, new_target_machine


class IdOutOfRangeError(IndexError):
    """A gather/one_hot id outside its table reached compiled code (which then stopped
    before reading anything out of bounds)."""


class ArgumentError(TypeError):
    """A call's arguments do not match the Kina signature."""


class _ErrorRecord(threading.local):
    def __init__(self) -> None:
        self.array = np.zeros(3, dtype=np.int64)
        self.pointer = self.array.ctypes.data


class CompiledFunction:
    def __init__(self, module: CompiledModule, plan: KernelPlan, address: int):
        self._module = module  # keeps the native code alive
        self.name = plan.function.name
        self.plan = plan
        self.params = tuple((p.name, p.type.dtype.numpy, p.type.concrete_shape)
                            for p in plan.function.params)
        self.results = tuple((v.type.dtype.numpy, v.type.concrete_shape)
                             for v in plan.function.results)
        arity = len(self.params) + len(self.results) + 1
        self._native = ctypes.CFUNCTYPE(ctypes.c_int64, *([ctypes.c_void_p] * arity))(address)
        self._errors = _ErrorRecord()
        self.__doc__ = f"{self.name}({', '.join(p[0] for p in self.params)})"

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {d.name}{list(s)}" for n, d, s in self.params)
        return f"<tilegen function {self.name}({params})>"

    def __call__(self, *args: np.ndarray, out: np.ndarray | Sequence[np.ndarray] | None = None):
        if len(args) != len(self.params):
            raise ArgumentError(f"{self.name}() takes {len(self.params)} argument(s) "
                                f"({', '.join(p[0] for p in self.params)}), got {len(args)}")
        inputs = [self._argument(position, arg) for position, arg in enumerate(args)]
        outputs = self._outputs(out, inputs)
        pointers = [a.ctypes.data for a in inputs] + [o.ctypes.data for o in outputs]
        status = self._native(*pointers, self._errors.pointer)
        if status != 0:
            self._raise(status)
        if len(outputs) == 1:
            return outputs[0]
        return tuple(outputs)

    def _argument(self, position: int, arg) -> np.ndarray:
        name, dtype, shape = self.params[position]
        if not isinstance(arg, np.ndarray):
            try:
                arg = np.asarray(arg)
            except Exception as error:  # noqa: BLE001 -- any conversion failure is the user's
                raise ArgumentError(f"{self.name}(): argument '{name}' is not an array: "
                                    f"{error}") from None
        if arg.dtype != dtype:
            if arg.dtype.newbyteorder("=") == dtype:
                # The right element type in the other byte order: converted once, like a
                # non-contiguous view is.
                arg = arg.astype(dtype)
            else:
                raise ArgumentError(f"{self.name}(): argument '{name}' must have dtype "
                                    f"{dtype.name}, got {_dtype_text(arg.dtype)}")
        if arg.shape != shape:
            raise ArgumentError(f"{self.name}(): argument '{name}' must have shape "
                                f"{list(shape)}, got {list(arg.shape)}")
        if not arg.flags.c_contiguous or not arg.flags.aligned:
            # Compiled code reads row-major contiguous memory; a view is copied once.
            arg = np.ascontiguousarray(arg)
        return arg

    def _outputs(self, out, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if out is None:
            return [np.empty(shape, dtype) for dtype, shape in self.results]
        if isinstance(out, np.ndarray):
            given = [out]
        elif isinstance(out, (tuple, list)):
            given = list(out)
        else:
            raise ArgumentError(f"{self.name}(): out= must be an array or a tuple of arrays, got "
                                f"{type(out).__name__}")
        if len(given) != len(self.results):
            raise ArgumentError(f"{self.name}(): out= needs {len(self.results)} array(s), got "
                                f"{len(given)}")
        for position, (array, (dtype, shape)) in enumerate(zip(given, self.results, strict=True)):
            what = f"{self.name}(): out[{position}]"
            if not isinstance(array, np.ndarray):
                raise ArgumentError(f"{what} must be a numpy array")
            if array.dtype != dtype or array.shape != shape:
                raise ArgumentError(f"{what} must be {dtype.name}{list(shape)}, got "
                                    f"{_dtype_text(array.dtype)}{list(array.shape)}")
            if not array.flags.c_contiguous:
                raise ArgumentError(f"{what} must be C-contiguous")
            if not array.flags.writeable:
                raise ArgumentError(f"{what} is read-only")
            for other in inputs + given[:position]:
                if np.may_share_memory(array, other):
                    raise ArgumentError(f"{what} overlaps another argument; outputs must not "
                                        "alias inputs or each other")
        return given

    def _raise(self, status: int):
        if status < 0:
            raise MemoryError(f"{self.name}(): could not allocate temporary buffers")
        site_index, value, position = (int(x) for x in self._errors.array)
        site = self.plan.kernel.check_sites[site_index]
        shape = site.ids_shape
        index = list(np.unravel_index(position, shape)) if shape else []
        index = [int(i) for i in index]
        where = f"argument '{site.ids_argument}'" if site.ids_argument else \
            "a computed ids tensor"
        error = IdOutOfRangeError(
            f"{self.name}(): {site.op} at {site.location}: id {value} at position {index} of "
            f"{where} is out of range [0, {site.limit})")
        # For callers that report it at the op's source (the CLI's --run).
        error.site, error.value, error.position = site, value, tuple(index)
        raise error


def _dtype_text(dtype: np.dtype) -> str:
    """A dtype's name, with its byte order when that is what differs (`>f4 (big-endian)`)."""
    if dtype.byteorder == ">":
        return f"{dtype.str} (big-endian)"
    return dtype.name


def _out_lines(params: list[str], count: int) -> list[str]:
    """The generated wrapper's out= fast path: the given arrays passed straight through (no
    tuple building or star-unpacking on the hot path of a host loop)."""
    prefix = ", ".join(params) + (", " if params else "")
    if count == 1:
        return ["    if type(out) is _ndarray:",
                f"        if _entry({prefix}out) is None:",
                "            return out"]
    if count == 0:
        return []
    items = ", ".join(f"out[{i}]" for i in range(count))
    return [f"    if (type(out) is tuple or type(out) is list) and len(out) == {count}:",
            f"        if _entry({prefix}{items}) is None:",
            "            return tuple(out)"]


def _text_signature(wrapper) -> str:
    """The docstring form from which CPython derives a builtin's __text_signature__ (so
    inspect.signature and help() show the Kina parameters), then the wrapper's doc."""
    slow = wrapper.slow_path
    params = "\n".join(f"    {n}: {d.name}{list(s)}" for n, d, s in slow.params)
    results = "\n".join(f"    {d.name}{list(s)}" for d, s in slow.results)
    return (f"{wrapper.__name__}{inspect.signature(wrapper)}\n--\n\n"
            f"Compiled Kina function.\n\nParameters:\n{params}\nReturns:\n{results}\n"
            f"out= takes preallocated result arrays (one array, or a tuple for several).")


def _fast_wrapper(slow: CompiledFunction, entry, keepalive):
    """A plain Python function with the Kina signature that calls the native entry and
    falls back to `slow` (which validates and raises) when the entry declines."""
    # Parameters carry the Kina names, so Python's own arity errors name them.
    params = [name if name.isidentifier() and not keyword.iskeyword(name) and
              not name.startswith("_") and name != "out" else f"arg{i}"
              for i, (name, _, _) in enumerate(slow.params)]
    outs = [f"o{i}" for i in range(len(slow.results))]
    args = ", ".join(params)
    returned = outs[0] if len(outs) == 1 else "(" + "".join(o + ", " for o in outs) + ")"
    lines = [f"def {slow.name}({args}{', ' if args else ''}*, out=None):",
             "    if out is None:"]
    lines += [f"        o{i} = _empty(_shape{i}, _dtype{i})" for i in range(len(outs))]
    lines += [f"        if _entry({', '.join(params + outs)}) is None:",
              f"            return {returned}",
              f"        return _slow({args})",
              *_out_lines(params, len(outs)),
              "    return _slow(" + args + (", " if args else "") + "out=out)"]
    namespace = {"_empty": np.empty, "_ndarray": np.ndarray, "_entry": entry, "_slow": slow,
                 "_keepalive": keepalive}
    for i, (dtype, shape) in enumerate(slow.results):
        namespace[f"_shape{i}"] = shape
        namespace[f"_dtype{i}"] = dtype
    exec(compile("\n".join(lines), f"<tilegen {slow.name}>", "exec"), namespace)
    function = namespace[slow.name]
    function.__doc__ = slow.__doc__
    function.slow_path = slow
    function.plan = slow.plan
    function.params = slow.params
    function.results = slow.results
    return function


@dataclass
class NativeCode:
    """Where one function's compiled code lives and what keeps it alive."""

    kernel: int  # address of the kernel
    entry: int  # address of its METH_FASTCALL entry (positional inputs then outputs)
    call: int  # address of its METH_FASTCALL | METH_KEYWORDS front (inputs, out=)
    table: int | None  # address of the runtime table the entry reads
    profile: int | None  # address of the TILEGEN_PROFILE cycle counters, if compiled in
    owner: object  # the MCJIT engine or the loaded library, inside a _CodeOwner


_LIBC_FREE = ctypes.CDLL(None).free
_LIBC_FREE.argtypes = [ctypes.c_void_p]
_LIBC_FREE.restype = None


class _CodeOwner:
    """Keeps compiled code loaded, and owns the slots in which its kernel keeps heap blocks
    between calls (see tilegen.codegen): given to the kernel through `<symbol>.blocks`,
    freed here with plain libc `free` -- the code may already be gone when this goes."""

    def __init__(self, owner: object, table: int | None, count: int):
        self.owner = owner
        self._slots = (ctypes.c_void_p * max(count, 1))()
        if table:
            ctypes.c_void_p.from_address(table).value = ctypes.addressof(self._slots)

    def __del__(self):
        for block in self._slots:
            if block:
                _LIBC_FREE(block)


class CompiledModule:
    """The compiled functions of one Kina program, as attributes.

    In JIT mode each function is compiled to machine code on first use (lowering and
    checking already happened, so errors surface at compile_file time); a shared library
    holds all of them at once."""

    def __init__(self, plans: Sequence[KernelPlan] | Mapping[str, KernelPlan], kind: str,
                 load):
        self.kind = kind
        # A mapping by name may plan each function on first use (pipeline.PlanTable).
        self.plans = plans if isinstance(plans, Mapping) else \
            {plan.function.name: plan for plan in plans}
        self._load = load  # plan -> NativeCode
        self._functions: dict[str, object] = {}
        self._natives: dict[str, NativeCode] = {}
        self._lock = threading.Lock()

    @property
    def functions(self) -> dict[str, object]:
        """Every function, compiled (forces compilation of those not yet used)."""
        return {name: self.function(name) for name in self.plans}

    def function(self, name: str):
        compiled = self._functions.get(name)
        if compiled is not None:
            return compiled
        with self._lock:
            if name not in self._functions:
                self._functions[name] = self._wrap(self.plans[name])
            return self._functions[name]

    def _wrap(self, plan: KernelPlan):
        native = self._load(plan)
        self._natives[plan.function.name] = native
        slow = CompiledFunction(self, plan, native.kernel)
        if native.table is None or not layout_is_supported():
            return slow
        fill_runtime_table(native.table)
        entry = make_builtin(plan.entry_symbol, native.entry)
        wrapper = _fast_wrapper(slow, entry, self)
        # What users call: the native keyword front, falling back to `wrapper`.
        return make_builtin(slow.name, native.call, self_object=wrapper, keywords=True,
                            doc=_text_signature(wrapper))

    def profile_address(self, plan: KernelPlan) -> int | None:
        """Address of the kernel's cycle counters (compiled with TILEGEN_PROFILE=1)."""
        self.function(plan.function.name)
        return self._natives[plan.function.name].profile

    def __getattr__(self, name: str):
        plans = self.__dict__.get("plans", {})
        if name in plans:
            return self.function(name)
        raise AttributeError(f"the compiled program has no function '{name}' (it has: "
                             f"{', '.join(plans)})")

    def __dir__(self):
        return list(super().__dir__()) + list(self.plans)

    def __repr__(self) -> str:
        return f"<tilegen module ({self.kind}): {', '.join(self.plans)}>"


@functools.cache
def _load_openmp_runtime() -> None:
    """Parallel loops call libgomp (GOMP_parallel); make its symbols visible to MCJIT."""
    path = ctypes.util.find_library("gomp")
    if path is None:
        raise KinaError("io", "libgomp (the GNU OpenMP runtime) is needed for parallel loops; "
                        "install gcc/libgomp1 or set TILEGEN_NUM_THREADS=1", None)
    llvm.load_library_permanently(path)


def jit_module(plans: Sequence[KernelPlan] | Mapping[str, KernelPlan], profile: bool = False,
               disk=None, key: str | None = None) -> CompiledModule:
    """In-process MCJIT, one engine per function, compiled on first use. Nothing touches
    the disk unless a DiskCache is given (TILEGEN_CACHE_DIR), which supplies and keeps
    each function's object code."""
    _load_openmp_runtime()

    def engine_for(plan: KernelPlan):
        if disk is None:
            parsed = to_llvm(codegen([plan], profile=profile))
            with LLVM_LOCK:
                # The engine owns (and frees) its target machine: a fresh one each time.
                engine = llvm.create_mcjit_compiler(parsed, new_target_machine(False))
                engine.finalize_object()
            return engine
        cached = disk.load_object(key, plan.symbol)  # checksummed: damage reads as a miss
        if cached is not None:
            return _engine_from_object(cached)
        data = jit_object_code(to_llvm(codegen([plan], profile=profile)))
        disk.store_object(key, plan.symbol, data)
        return _engine_from_object(data)

    shared: dict[str, NativeCode] = {}  # functions computing the same thing share code

    def load(plan: KernelPlan) -> NativeCode:
        key = plan.canonical_key
        if key in shared:
            return shared[key]
        shared[key] = native = compile_one(plan)
        return native

    def compile_one(plan: KernelPlan) -> NativeCode:
        engine = engine_for(plan)
        with LLVM_LOCK:
            kernel = engine.get_function_address(plan.symbol)
            entry = engine.get_function_address(plan.entry_symbol)
            call = engine.get_function_address(plan.call_symbol)
            blocks = engine.get_global_value_address(plan.symbol + BLOCKS_SUFFIX)
            count = engine.get_global_value_address(plan.symbol + BLOCK_COUNT_SUFFIX)
            table = engine.get_global_value_address(TABLE_SYMBOL)
            counters = engine.get_global_value_address(plan.symbol + ".cycles") \
                if profile else None
            forksafe.bind(engine.get_global_value_address(plan.symbol + THREADS_SUFFIX))
        return NativeCode(kernel, entry, call, table, counters or None,
                          _CodeOwner(engine, blocks, ctypes.c_int64.from_address(count).value))

    return CompiledModule(plans, "jit", load)


def _engine_from_object(data: bytes):
    with LLVM_LOCK:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine(False))
        engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        engine.finalize_object()
    return engine


def link_shared_library(parsed: llvm.ModuleRef, path: str) -> None:
    """Write `path` (.so) from the module: object code, then the system linker. The library
    appears under its final name only when complete (temporary name, then rename)."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    with tempfile.TemporaryDirectory(prefix="tilegen-") as work:
        object_path = os.path.join(work, "module.o")
        with open(object_path, "wb") as handle:
            handle.write(object_code(parsed))
        linked = os.path.join(work, "module.so")
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise KinaError("io", "no C compiler found to link a shared library (set CC or "
                            "install gcc)", None)
        result = subprocess.run([compiler, "-shared", "-o", linked, object_path, "-lm",
                                 "-lgomp"], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise KinaError("io", f"linking {path} failed: {result.stderr.strip()}", None)
        if os.path.isdir(path):
            raise KinaError("io", f"cannot write '{path}': it is a directory", None)
        staging = None
        try:
            handle_fd, staging = tempfile.mkstemp(prefix=".tilegen-", suffix=".so",
                                                  dir=directory)
            os.close(handle_fd)
            shutil.copyfile(linked, staging)
            os.chmod(staging, 0o755)
            os.replace(staging, path)
        except OSError as error:
            raise KinaError("io", f"cannot write '{path}': {error.strerror or error}",
                            None) from None
        finally:
            if staging is not None and os.path.exists(staging):
                os.unlink(staging)


def load_shared_library(plans: list[KernelPlan], path: str) -> CompiledModule:
    library = ctypes.CDLL(os.path.abspath(path))
    table = ctypes.addressof(ctypes.c_void_p.in_dll(library, TABLE_SYMBOL))

    def address(symbol: str) -> int:
        return ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value

    def load(plan: KernelPlan) -> NativeCode:
        try:
            counters = ctypes.addressof(ctypes.c_int64.in_dll(library, plan.symbol + ".cycles"))
        except ValueError:
            counters = None
        forksafe.bind(ctypes.addressof(ctypes.c_void_p.in_dll(library,
                                                               plan.symbol + THREADS_SUFFIX)))
        return NativeCode(address(plan.symbol), address(plan.entry_symbol),
                          address(plan.call_symbol), table, counters,
                          _CodeOwner(library, ctypes.addressof(ctypes.c_void_p.in_dll(
                              library, plan.symbol + BLOCKS_SUFFIX)), ctypes.c_int64.in_dll(
                              library, plan.symbol + BLOCK_COUNT_SUFFIX).value))

    module = CompiledModule(plans, "so", load)
    module.functions  # noqa: B018 -- resolve every symbol now, while the file exists
    return module


def aot_module(plans: list[KernelPlan], profile: bool = False,
               keep_path: str | None = None) -> CompiledModule:
    """Build a .so, load it, and (unless `keep_path` is given) remove the file again."""
    parsed = to_llvm(codegen(plans, profile=profile), pic=True)
    if keep_path is not None:
        link_shared_library(parsed, keep_path)
        return load_shared_library(plans, keep_path)
    with tempfile.TemporaryDirectory(prefix="tilegen-so-") as work:
        path = os.path.join(work, "module.so")
        link_shared_library(parsed, path)
        return load_shared_library(plans, path)
