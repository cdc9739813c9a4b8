"""Compiled modules and their Python callables.

A `NativeProgram` owns the native code (an MCJIT engine per function, or a loaded shared
library) for as long as any of its functions is alive; a `CompiledModule` is the namespace
of its functions and nothing else. Each `CompiledFunction` validates its arguments (dtype,
shape, contiguity), allocates or checks its outputs, calls the native entry point and turns
a failed id check into a Python exception. Libraries are built and loaded in
tilegen.library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import keyword
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np

from . import config, forksafe, perfmap
from .codegen_values import BLOCK_COUNT_SUFFIX, BLOCKS_SUFFIX, PROFILE_COUNTERS
from .fastcall import fill_runtime_table, layout_is_supported, make_builtin
from .gcpause import collector_paused
from .gemm_amx import STATUS_NO_TILE_DATA
from .interop import ArgumentError, as_input, as_output
from .openmp import load_openmp_runtime as _load_openmp_runtime
from .parallel import THREADS_SUFFIX
from .pipeline import KernelPlan, PlanTable, codegen, jit_object_code, plans_target, to_llvm
from .signature import Signature
from .symbols import RUNTIME_TABLE
from .target import LLVM_LOCK, Target, new_target_machine


class IdOutOfRangeError(IndexError):
    """A gather/one_hot id outside its table reached compiled code (which then stopped
    before reading anything out of bounds)."""


class _ErrorRecord(threading.local):
    def __init__(self) -> None:
        self.array = np.zeros(3, dtype=np.int64)
        self.pointer = self.array.ctypes.data


class CompiledFunction:
    """The checked call of one compiled function: validates in Python, calls the kernel
    through its `packed` trampoline (one pointer to the buffer addresses, so any arity
    fits ctypes), raises the precise error. The fast native entries fall back to it."""

    def __init__(self, program: NativeProgram, signature: Signature, native: NativeCode,
                 plan: KernelPlan | None = None):
        self._module = program  # keeps the native code alive
        self.name = signature.name
        self.signature = signature
        self.plan = plan
        self.params = signature.params
        self.results = signature.results
        self._addresses = ctypes.c_void_p * (len(self.params) + len(self.results) + 1)
        self._native = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(native.packed)
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
        addresses = self._addresses(*[a.ctypes.data for a in inputs],
                                    *[o.ctypes.data for o in outputs], self._errors.pointer)
        status = self._native(addresses)
        if status != 0:
            self._raise(status)
        if out is not None:  # what was given (a torch tensor stays one), as the fast path
            return tuple(out) if isinstance(out, (tuple, list)) else out
        if len(outputs) == 1:
            return outputs[0]
        return tuple(outputs)

    def _argument(self, position: int, arg) -> np.ndarray:
        name, dtype, shape = self.params[position]
        if not isinstance(arg, np.ndarray):
            arg = as_input(arg, f"{self.name}(): argument '{name}'")
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
        if isinstance(out, (tuple, list)):
            given = list(out)
        elif isinstance(out, np.ndarray) or (
                len(self.results) == 1 and not isinstance(out, (int, float, str))):
            given = [out]  # an array, or (for one result) a tensor from elsewhere
        else:
            raise ArgumentError(f"{self.name}(): out= must be an array or a tuple of arrays, got "
                                f"{type(out).__name__}")
        if len(given) != len(self.results):
            raise ArgumentError(f"{self.name}(): out= needs {len(self.results)} array(s), got "
                                f"{len(given)}")
        given = [as_output(array, f"{self.name}(): out[{position}]")
                 for position, array in enumerate(given)]
        for position, (array, (dtype, shape)) in enumerate(zip(given, self.results, strict=True)):
            what = f"{self.name}(): out[{position}]"
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
        if status == STATUS_NO_TILE_DATA:
            raise RuntimeError(f"{self.name}(): the OS refused AMX tile data (arch_prctl "
                               "ARCH_REQ_XCOMP_PERM), which this code's BF16 matmul needs")
        if status < 0:
            raise MemoryError(f"{self.name}(): could not allocate temporary buffers")
        site_index, value, position = (int(x) for x in self._errors.array)
        site = self.signature.check_sites[site_index]
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


def wrapper_parameters(names: Sequence[str]) -> list[str]:
    """The generated wrapper's parameter names: the Kina names where Python takes them
    (so its own arity errors name them), `_p<position>` otherwise. Every other name in the
    wrapper (`_entry`, `_slow`, `_o0`, ...) starts with `_` and no Kina name that does is
    kept, so no parameter can shadow them or another parameter."""
    return [name if name.isidentifier() and not keyword.iskeyword(name) and
            not name.startswith("_") and name != "out" else f"_p{position}"
            for position, name in enumerate(names)]


def _fast_wrapper(slow: CompiledFunction, entry, keepalive):
    """A plain Python function with the Kina signature that calls the native entry and
    falls back to `slow` (which validates and raises) when the entry declines."""
    params = wrapper_parameters([name for name, _, _ in slow.params])
    outs = [f"_o{i}" for i in range(len(slow.results))]
    args = ", ".join(params)
    returned = outs[0] if len(outs) == 1 else "(" + "".join(o + ", " for o in outs) + ")"
    # Defined under a fixed name and renamed afterwards: a Kina function may be called
    # `lambda` or `_entry`.
    lines = [f"def _wrapper({args}{', ' if args else ''}*, out=None):",
             "    if out is None:"]
    lines += [f"        _o{i} = _empty(_shape{i}, _dtype{i})" for i in range(len(outs))]
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
    function = namespace["_wrapper"]
    function.__code__ = function.__code__.replace(co_name=slow.name, co_qualname=slow.name)
    function.__name__ = function.__qualname__ = slow.name
    function.__doc__ = slow.__doc__
    function.slow_path = slow
    function.plan = slow.plan
    function.params = slow.params
    function.results = slow.results
    return function


@dataclass
class NativeCode:
    """Where one function's compiled code lives and what keeps it alive."""

    packed: int  # address of `i64 (ptr addresses)`: the kernel on an array of buffer addresses
    entry: int  # address of its METH_FASTCALL entry (positional inputs then outputs)
    call: int  # address of its METH_FASTCALL | METH_KEYWORDS front (inputs, out=)
    table: int | None  # address of the runtime table the entry reads
    profile: int | None  # address of the TILEGEN_PROFILE counters, if compiled in
    owner: object  # the MCJIT engine or the loaded library, inside a _CodeOwner
    profile_unit: str = ""  # what those counters count (codegen.PROFILE_COUNTERS)


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


class NativeProgram:
    """The native code of one compiled Kina program (an MCJIT engine per function, or a
    loaded library), with each function's signature and plan: everything about a module
    except its functions, which `CompiledModule` holds alone (`tilegen.program_of`).

    In JIT mode each function is compiled to machine code on first use (lowering and
    checking already happened, so errors surface at compile_file time); a shared library
    holds all of them at once."""

    def __init__(self, signatures: Sequence[Signature] | Mapping[str, Signature], kind: str,
                 load, plans: Sequence[KernelPlan] | Mapping[str, KernelPlan] = (),
                 path: str | None = None):
        self.kind = kind
        self.path = path  # the library file, when loaded from one that stays
        # Mappings by name may plan each function on first use (pipeline.PlanTable).
        self.signatures = signatures if isinstance(signatures, Mapping) else \
            {signature.name: signature for signature in signatures}
        self.plans = plans if isinstance(plans, Mapping) else \
            {plan.function.name: plan for plan in plans}
        self._load = load  # function name -> NativeCode
        self._functions: dict[str, object] = {}
        self._natives: dict[str, NativeCode] = {}
        self._lock = threading.Lock()
        self.module: CompiledModule | None = None  # the namespace (see new_module)

    @property
    def functions(self) -> dict[str, object]:
        """Every function, compiled (forces compilation of those not yet used)."""
        return {name: self.function(name) for name in self.signatures}

    def function(self, name: str):
        compiled = self._functions.get(name)
        if compiled is not None:
            return compiled
        with self._lock, collector_paused():
            if name not in self._functions:
                self._functions[name] = self._wrap(name)
            return self._functions[name]

    def _wrap(self, name: str):
        native = self._load(name)
        self._natives[name] = native
        slow = CompiledFunction(self, self.signatures[name], native, self.plans.get(name))
        if native.table is None or not layout_is_supported():
            return slow
        fill_runtime_table(native.table)
        entry = make_builtin(name, native.entry)
        wrapper = _fast_wrapper(slow, entry, self)
        # What users call: the native keyword front, falling back to `wrapper`.
        return make_builtin(name, native.call, self_object=wrapper, keywords=True,
                            doc=_text_signature(wrapper))

    def profile_address(self, plan: KernelPlan) -> int | None:
        """Address of the kernel's counters (compiled with TILEGEN_PROFILE set)."""
        self.function(plan.function.name)
        return self._natives[plan.function.name].profile

    def profile_unit(self, plan: KernelPlan) -> str:
        self.function(plan.function.name)
        return self._natives[plan.function.name].profile_unit


# A module's NativeProgram, stored in its instance dict under a key no Kina name can be.
_PROGRAM = "tilegen.program"


class CompiledModule:
    """The functions of one Kina program as attributes, and nothing else.

    A program may call a function `kind`, `plans`, `function` or `__init__`, so the
    module's own data lives apart (`tilegen.program_of(module)`) and every function is a
    plain instance attribute, set when it is first compiled -- reading `m.f` costs what a
    bound name does. Names the class itself defines (its dunders) are set at creation, and
    the data descriptors every such object has (`__class__`, `__dict__`, `__weakref__`)
    become attributes of a per-module subclass."""

    __slots__ = ("__dict__", "__weakref__")

    def __getattr__(self, name: str):
        # Only reached for a name not set yet: compile it, then it is a real attribute.
        program = object.__getattribute__(self, _PROGRAM)
        if name in program.signatures:
            function = program.function(name)
            object.__setattr__(self, name, function)
            return function
        raise AttributeError(f"the compiled program has no function '{name}' (it has: "
                             f"{', '.join(program.signatures)})")

    def __dir__(self):
        return list(object.__getattribute__(self, _PROGRAM).signatures)

    def __repr__(self) -> str:
        program = object.__getattribute__(self, _PROGRAM)
        return f"<tilegen module ({program.kind}): {', '.join(program.signatures)}>"


_MISSING = object()


def _class_attribute(name: str):
    """What an instance lookup of `name` finds on the module's class (not its metaclass)."""
    for klass in CompiledModule.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


def _is_data_descriptor(value) -> bool:
    return hasattr(type(value), "__set__") or hasattr(type(value), "__delete__")


def new_module(program: NativeProgram) -> CompiledModule:
    """The namespace of `program`'s functions (see CompiledModule)."""
    shadowed = [name for name in program.signatures if _class_attribute(name) is not _MISSING]
    pinned = {name: program.function(name) for name in shadowed
              if _is_data_descriptor(_class_attribute(name))}
    module_type = CompiledModule
    if pinned:
        module_type = type("CompiledModule", (CompiledModule,), {"__slots__": (), **pinned})
    module = object.__new__(module_type)
    object.__setattr__(module, _PROGRAM, program)
    program.module = module  # a function keeps its module alive (a cycle the GC breaks)
    for name in shadowed:
        if name not in pinned:
            object.__setattr__(module, name, program.function(name))
    return module


def program_of(module: CompiledModule) -> NativeProgram:
    """A compiled module's own data: kind ("jit"/"so"), plans, signatures, functions."""
    if not isinstance(module, CompiledModule):
        raise TypeError(f"program_of() takes a tilegen module, got {type(module).__name__}")
    return object.__getattribute__(module, _PROGRAM)


def jit_module(plans: Sequence[KernelPlan] | Mapping[str, KernelPlan], profile: str = "",
               disk=None, key: str | None = None) -> CompiledModule:
    """In-process MCJIT, one engine per function, compiled on first use. Nothing touches
    the disk unless a DiskCache is given (TILEGEN_CACHE_DIR), which supplies and keeps
    each function's object code. The plans' target must be one this machine runs."""
    target = plans.target if isinstance(plans, PlanTable) else \
        plans_target(list(plans.values() if isinstance(plans, Mapping) else plans))
    target.check_runs_on_host("JIT compile")
    _load_openmp_runtime()

    def engine_for(plan: KernelPlan):
        named = config.perf_map()
        if disk is None and not named:
            parsed = to_llvm(codegen([plan], profile=profile), target)
            with LLVM_LOCK:
                # The engine owns (and frees) its target machine: a fresh one each time.
                engine = llvm.create_mcjit_compiler(parsed, new_target_machine(target))
                engine.finalize_object()
            return engine
        # From object code: the disk cache keeps it, and the perf map reads its symbols.
        data = disk.load_object(key, plan.symbol) if disk is not None else None
        if data is None:  # checksummed: damage reads as a miss
            data = jit_object_code(to_llvm(codegen([plan], profile=profile), target), target)
            if disk is not None:
                disk.store_object(key, plan.symbol, data)
        engine = _engine_from_object(data, target)
        if named:
            perfmap.record(engine, data)
        return engine

    shared: dict[str, NativeCode] = {}  # functions computing the same thing share code
    by_name = plans if isinstance(plans, Mapping) else {plan.function.name: plan for plan in plans}

    def load(name: str) -> NativeCode:
        plan = by_name[name]
        key = plan.canonical_key
        if key in shared:
            return shared[key]
        shared[key] = native = compile_one(plan)
        return native

    def compile_one(plan: KernelPlan) -> NativeCode:
        engine = engine_for(plan)
        with LLVM_LOCK:
            packed = engine.get_function_address(plan.packed_symbol)
            entry = engine.get_function_address(plan.entry_symbol)
            call = engine.get_function_address(plan.call_symbol)
            blocks = engine.get_global_value_address(plan.symbol + BLOCKS_SUFFIX)
            count = engine.get_global_value_address(plan.symbol + BLOCK_COUNT_SUFFIX)
            table = engine.get_global_value_address(RUNTIME_TABLE)
            suffix, unit = PROFILE_COUNTERS[profile] if profile else ("", "")
            counters = engine.get_global_value_address(plan.symbol + suffix) \
                if profile else None
            forksafe.bind(engine.get_global_value_address(plan.symbol + THREADS_SUFFIX))
        return NativeCode(packed, entry, call, table, counters or None,
                          _CodeOwner(engine, blocks, ctypes.c_int64.from_address(count).value),
                          unit)

    return new_module(NativeProgram(_PlannedSignatures(by_name), "jit", load, by_name))


class _PlannedSignatures(Mapping[str, Signature]):
    """The signatures of planned functions by name, each read from its plan when first
    asked for: names alone (a module's `dir`, `hasattr`) never plan a function."""

    def __init__(self, plans: Mapping[str, KernelPlan]):
        self._plans = plans
        self._signatures: dict[str, Signature] = {}

    def __getitem__(self, name: str) -> Signature:
        signature = self._signatures.get(name)
        if signature is None:
            signature = self._signatures[name] = Signature.of_plan(self._plans[name])
        return signature

    def __contains__(self, name: object) -> bool:
        return name in self._plans

    def __iter__(self) -> Iterator[str]:
        return iter(self._plans)

    def __len__(self) -> int:
        return len(self._plans)


def _engine_from_object(data: bytes, target: Target):
    with LLVM_LOCK:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                            new_target_machine(target))
        engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        engine.finalize_object()
    return engine
