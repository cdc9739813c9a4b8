"""The tilegen backend's driver: the CPU as Triton's one device, the loader for `obj`
artifacts (MCJIT), the launcher that packs a kernel's arguments and runs its grid, and the
benchmarker `triton.autotune` times configs with (benchmarker.py)."""

from __future__ import annotations

import ctypes
import functools
import math
import os
import struct
import threading
import time

import llvmlite.binding as llvm
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase, decompose_descriptor

from .. import config, perfmap
from .. import target as host
from . import hugepages
from .compiler import BACKEND_NAME
from .grid import LAUNCH_FIELDS
from .tileir import TileError

# `<kernel>.launch(ptr params)`: the grid's fields (grid.LAUNCH_FIELDS) and then the
# argument slots, packed by struct into one bytes object (read only by the kernel)
_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_U64 = 0xFFFFFFFFFFFFFFFF


class KernelBoundsError(IndexError):
    """TRITON_DEBUG=1: a load, store or atomic of a kernel touched memory outside every
    tensor argument."""


class KernelAssertionError(AssertionError):
    """A `tl.device_assert` of a kernel compiled with debug=True (TRITON_DEBUG=1) failed."""


class LoadedKernel:
    """An MCJIT engine holding one kernel's machine code (freed with this object)."""

    def __init__(self, name: str, data: bytes):
        from ..runtime import _load_openmp_runtime
        _load_openmp_runtime()
        with host.LLVM_LOCK:
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                                host.new_target_machine(host.host_target()))
            engine.add_object_file(llvm.ObjectFileRef.from_data(data))
            engine.finalize_object()
            self.address = engine.get_function_address(f"{name}.launch")
        if config.perf_map():
            perfmap.record(engine, data)
        self.engine = engine
        self.launch = _LAUNCH(self.address)


class TilegenUtils:
    def load_binary(self, name, kernel, shared, device):
        loaded = LoadedKernel(name, kernel)
        return loaded, loaded, 0, 0, 1 << 30

    def unload_module(self, module) -> None:
        pass  # the engine goes with the LoadedKernel

    def get_device_properties(self, device):
        return {"max_shared_mem": 1 << 30, "multiprocessor_count": num_threads(),
                "max_num_regs": 1 << 16, "warpSize": 1, "sm_clock_rate": 0,
                "mem_clock_rate": 0, "mem_bus_width": 0}


@functools.cache
def num_threads() -> int:
    from ..config import load as load_config
    return max(1, load_config().num_threads)


def _defined_at(fn) -> str:
    """` at file:line` of a JITFunction's `def`, when Python can tell."""
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    return f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""


class TilegenLauncher:
    """Called by Triton as `run(gx, gy, gz, stream, function, packed_metadata,
    launch_metadata, enter_hook, exit_hook, *args)` with the kernel's Python arguments
    (constexprs included); packs the non-constexpr ones into 8-byte slots."""

    def __init__(self, src, metadata):
        signature = list(src.signature.items())
        constants = getattr(src, "constants", {})
        fn = getattr(src, "fn", None)
        arg_names = list(getattr(fn, "arg_names", [name for name, _ in signature]))
        constant_positions = {arg_names.index(k) if isinstance(k, str) else k[0]
                              for k in constants}
        self.kinds = []
        self.names = [name for name, _ in signature]
        for position, (name, kind) in enumerate(signature):
            if kind == "constexpr" or position in constant_positions:
                self.kinds.append(None)
                continue
            if isinstance(kind, str) and kind.startswith("tensordesc"):
                self.kinds.append(kind)  # host-side TensorDescriptor: its decomposed form
                continue
            if isinstance(kind, tuple) or not isinstance(kind, str):
                raise TileError(
                    f"kernel `{metadata.name}`{_defined_at(fn)}: argument `{name}` of type "
                    f"{kind} is not supported by the tilegen backend (pass tensors and "
                    "scalars, not tuples)")
            self.kinds.append(kind)
        self.name = metadata.name
        self.frame_bytes = metadata.tilegen_frame_bytes
        self.check_sites = list(getattr(metadata, "tilegen_check_sites", []))
        self.program_period = int(getattr(metadata, "tilegen_program_period", 0))
        self.debug = bool(getattr(metadata, "debug", False))
        if getattr(metadata, "tilegen_amx", False):
            _tile_data(metadata.name)
        self.local = threading.local()
        # Pairs of tensor parameters whose storages must not overlap for the kernel's
        # packed-panel caches to be used (panel_cache.py): the launcher checks them and
        # passes the answer in one word after the argument slots.
        self.disjoint = [tuple(pair) for pair in getattr(metadata, "tilegen_disjoint_params",
                                                         [])]
        descriptors = any(kind and kind.startswith("tensordesc") for kind in self.kinds)
        # the Python argument of each slot (not known with descriptors: several slots each)
        self.slot_args = None if descriptors else [
            position for position, kind in enumerate(self.kinds) if kind is not None]
        # the arguments the kernel writes, advised huge pages when large (hugepages.py)
        self.written = [] if self.slot_args is None else [
            self.slot_args[param] for param in getattr(metadata, "tilegen_written_params", [])]
        # The common launch (no tensor descriptors, no bounds checks) packs its slots with
        # one precompiled struct: pointers and integers as u64, floats as f64.
        plain = not self.debug and not descriptors
        self.converters = [kind and _convert(kind) for kind in self.kinds] if plain else None
        self.packer = struct.Struct(f"<{LAUNCH_FIELDS}q" + "".join(
            "d" if _is_float(kind) else "Q" for kind in self.kinds if kind is not None) +
            ("Q" if self.disjoint else "")) if plain else None

    def _scratch(self, threads: int):
        size = self.frame_bytes * threads + 64
        buffer = getattr(self.local, "scratch", None)
        if buffer is None or len(buffer) < size:
            buffer = self.local.scratch = ctypes.create_string_buffer(size)
        address = ctypes.addressof(buffer)
        return address + (-address) % 64

    def _status(self):
        status = getattr(self.local, "status", None)
        if status is None:
            status = self.local.status = (ctypes.c_int64 * 4)()
        # only a failure writes status[1] and [2], together with [0]; [3] is the bounds
        # table, set for each debug launch (ctypes.memset, a foreign call, cost ~1.9 us)
        status[0] = 0
        return status

    def _slots(self, args) -> tuple[list, list, list]:
        """(slot values as u64, (name, tensor) of each pointer argument, their storages'
        byte ranges) for the general launch: tensor descriptors, bounds checks."""
        slots, bounds, tensors = [], [], []
        for kind, name, value in zip(self.kinds, self.names, args, strict=False):
            if kind is None:
                continue
            if kind.startswith("tensordesc"):
                # base, shape, strides, padding, round-to-tf32, shape (i32), strides: the
                # arguments libtriton's descriptor-to-pointer rewrite gave the kernel
                parts = decompose_descriptor(value)
                slots.extend(_pack("*" if index == 0 else "i64", part, bounds)
                             for index, part in enumerate(parts))
                tensors.append((name, parts[0]))
                continue
            slots.append(_pack(kind, value, bounds))
            if len(bounds) > len(tensors):
                tensors.append((name, value))
        return slots, bounds, tensors

    def _apart(self, args) -> int:
        """1 when the storages of every pair of `self.disjoint` are apart, else 0 (also
        when an argument is not a tensor, or its slot is not known)."""
        if self.slot_args is None:
            return 0
        for pair in self.disjoint:
            ranges = []
            for param in pair:
                storage = getattr(args[self.slot_args[param]], "untyped_storage", None)
                if storage is None:
                    return 0
                storage = storage()
                ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
            (start, end), (other_start, other_end) = ranges
            if start < other_end and other_start < end:
                return 0
        return 1

    def __call__(self, gridX, gridY, gridZ, stream, function, packed_metadata,
                 launch_metadata, enter_hook, exit_hook, *args):
        total = gridX * gridY * gridZ
        if total == 0:
            return
        threads = min(num_threads(), total)
        status = self._status()
        fields = (gridX, gridY, gridZ, self._scratch(threads), self.frame_bytes, threads,
                  ctypes.addressof(status),
                  run_length(self.program_period, gridX, total, threads))
        tensors = ()
        trailing = (self._apart(args),) if self.disjoint else ()
        if self.packer is not None:
            params = self.packer.pack(*fields, *[convert(value) for convert, value in
                                                 zip(self.converters, args, strict=False)
                                                 if convert is not None], *trailing)
        else:
            slots, bounds, tensors = self._slots(args)
            if self.debug:
                _set_bounds(status, bounds)
            slots.extend(trailing)
            params = struct.pack(f"<{LAUNCH_FIELDS}q{len(slots)}Q", *fields, *slots)
        if self.written:
            advise = hugepages.madvise()
            if advise is not None:
                for position in self.written:
                    hugepages.advise(advise, args[position])
        if enter_hook is not None:
            enter_hook(launch_metadata)
        function.launch(params)
        if exit_hook is not None:
            exit_hook(launch_metadata)
        if status[0]:
            site = self.check_sites[status[1]] if status[1] < len(self.check_sites) else "?"
            if status[0] == 2:
                raise KernelAssertionError(f"kernel `{self.name}`: {site} (element "
                                           f"{status[2]} of the condition is false)")
            raise KernelBoundsError(
                f"kernel `{self.name}`: {site} accessed address {status[2]:#x}, outside "
                f"every tensor argument: {_nearest(status[2], tensors)} (TRITON_DEBUG "
                "bounds check)")


RUNS_PER_THREAD = 16  # at least, so that the threads' shares differ by 1/16 at most


@functools.lru_cache(maxsize=256)
def run_length(period: int, nx: int, total: int, threads: int) -> int:
    """The grid's run length (grid.py) for a kernel whose atomics repeat with the program
    id mod `period` (program_order.py): the longest run R, dividing period / threads, that
    gives every thread RUNS_PER_THREAD runs, so that ids agreeing mod `period` fall on one
    thread; 0 (one contiguous run per thread) when there is no such R, the kernel has no
    period, or the linear id mod `period` is not the x id's (a 2- or 3-D grid whose x extent
    `period` does not divide)."""
    if period <= 0 or threads <= 1 or period % threads or (total != nx and nx % period):
        return 0
    share, cap = period // threads, total // (RUNS_PER_THREAD * threads)
    divisors = {d for i in range(1, math.isqrt(share) + 1) if share % i == 0
                for d in (i, share // i)}
    return max((d for d in divisors if d <= cap), default=0)


def _nearest(address: int, tensors) -> str:
    """Where `address` is relative to the tensor argument it most likely belongs to."""
    if not tensors:
        return "the kernel has no tensor arguments"

    below = [entry for entry in tensors if entry[1].data_ptr() <= address]
    if below:  # past the end of the highest tensor starting below the address
        name, tensor = max(below, key=lambda entry: entry[1].data_ptr())
    else:
        name, tensor = min(tensors, key=lambda entry: entry[1].data_ptr())
    offset = address - tensor.data_ptr()
    size = tensor.element_size()
    return (f"byte offset {offset} (element {offset // size}) from `{name}`, a tensor of "
            f"{tensor.numel()} elements")


_BOUNDS_TABLE = threading.local()


def _set_bounds(status, bounds) -> None:
    table = (ctypes.c_int64 * (1 + 2 * len(bounds)))(len(bounds), *[x for b in bounds for x in b])
    _BOUNDS_TABLE.table = table  # kept alive for the launch
    status[3] = ctypes.addressof(table)


def _is_float(kind: str) -> bool:
    return kind.startswith("fp") or kind == "bf16"


def _convert(kind: str):
    """value -> what the launch's struct packs for an argument of `kind`."""
    if kind.startswith("*"):
        return _address
    if _is_float(kind):
        return float
    return lambda value: int(value) & _U64


def _address(value) -> int:
    """A pointer argument's address; a CPU tensor's directly (`is_cpu` is cheap where
    `device.type` costs ~0.6 us), anything else through _pack's checks."""
    if getattr(value, "is_cpu", False) is True:
        return value.data_ptr()
    return _pack("*", value, [])


def _pack(kind: str, value, bounds: list) -> int:
    if kind.startswith("*"):
        if value is None:
            return 0
        if hasattr(value, "data_ptr"):
            device = getattr(value, "device", None)
            if device is not None and getattr(device, "type", "cpu") != "cpu":
                raise ValueError(f"the tilegen backend runs on the CPU; got a tensor on "
                                 f"{device}")
            address = value.data_ptr()
            storage = value.untyped_storage()
            bounds.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
            return address
        return int(value)
    if _is_float(kind):
        return struct.unpack("<Q", struct.pack("<d", float(value)))[0]
    return int(value) & _U64


class _CpuEvent:
    def __init__(self, enable_timing: bool = True):
        self.time = 0.0

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def elapsed_time(self, end: _CpuEvent) -> float:
        return (end.time - self.time) * 1000.0

    def synchronize(self) -> None:
        pass


class CpuDeviceInterface:
    """What `triton.testing.do_bench` asks of `torch.cuda`: events and synchronize."""

    Event = _CpuEvent

    @staticmethod
    def synchronize(device=None) -> None:
        pass

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def is_available() -> bool:
        return True


class TilegenDriver(DriverBase):
    def __init__(self):
        super().__init__()
        self.utils = TilegenUtils()
        self.launcher_cls = TilegenLauncher
        self.get_current_device = lambda: 0
        self.set_current_device = lambda device: None
        self.get_current_stream = lambda device=None: 0

    @staticmethod
    def is_active() -> bool:
        """Active unless disabled, or unless another backend's device is (a CUDA or ROCm
        machine keeps its GPU by default; TRITON_DEFAULT_BACKEND=tilegen selects us)."""
        from ..config import triton_disabled  # lazily: Triton imports us at its own import

        if triton_disabled():
            return False
        selected = os.environ.get("TRITON_DEFAULT_BACKEND", "")
        if selected:
            return selected == BACKEND_NAME
        from triton.backends import backends

        return not any(backend.driver.is_active() for name, backend in backends.items()
                       if name != BACKEND_NAME)

    def map_python_to_cpp_type(self, ty: str) -> str:
        return "void*" if ty.startswith("*") else {"i1": "bool", "i32": "int32_t",
                                                   "i64": "int64_t", "fp32": "float",
                                                   "fp64": "double"}.get(ty, ty)

    def get_current_target(self) -> GPUTarget:
        return GPUTarget(BACKEND_NAME, host.host_target().cpu, 1)

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")

    def get_device_interface(self):
        return CpuDeviceInterface

    def get_benchmarker(self):
        from .benchmarker import do_bench  # warm calls, best of small groups
        return do_bench

    def get_empty_cache_for_benchmark(self):
        import torch
        return torch.empty(64 * 1024 * 1024 // 4, dtype=torch.int32)

    def clear_cache(self, cache) -> None:
        cache.zero_()


def _tile_data(name: str) -> None:
    """Ask Linux for AMX tile data before a kernel with AMX dots (amx_dot.py) first runs: a
    kernel from Triton's disk cache was compiled by another process, and a tile
    instruction without the permission dies of SIGILL."""
    granted, why = host.amx_tile_permission()
    if not granted:
        raise TileError(f"kernel `{name}` runs tt.dot on AMX tiles, but {why}; "
                        "TILEGEN_TRITON_AMX=0 compiles it without them")
