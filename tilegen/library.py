"""Libraries: build a .so, .o or .a (with its C header), and load a .so back.

A library holds, for every function, the kernel, the Python entries (tilegen.fastcall)
and the C ABI (tilegen.cabi), plus a description of its functions under the symbol
`tilegen.metadata` from which `load_library` rebuilds the Python calling convention.
The library references no CPython symbol (the Python entries call CPython through the
runtime table the loader fills), so a C program links it without libpython.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess

from kina_frontend.diagnostics import KinaError

from . import forksafe
from .cabi import check_c_names, glue_source, header
from .codegen_values import BLOCK_COUNT_SUFFIX, BLOCKS_SUFFIX, PROFILE_COUNTERS
from .parallel import THREADS_SUFFIX
from .pipeline import KernelPlan, codegen, object_code, plans_target, to_llvm
from .runtime import (
    CompiledModule,
    NativeCode,
    NativeProgram,
    _CodeOwner,
    _load_openmp_runtime,
    new_module,
)
from .signature import Signature
from .staging import create_staging_file, staging_name, temporary_directory
from .symbols import METADATA, RUNTIME_TABLE, function_symbol, kernel_symbol
from .target import host_target
from .version import __version__

FORMAT = "tilegen-library-v1"
KINDS = {".so": "shared", ".o": "object", ".a": "static"}


def output_kind(path: str) -> str:
    """"shared", "object" or "static", from the file name (a .so, .o or .a)."""
    for suffix, kind in KINDS.items():
        if path.endswith(suffix) or (suffix == ".so" and ".so." in os.path.basename(path)):
            return kind
    raise KinaError("io", f"cannot tell what to write from '{path}': name a .so (shared "
                    "library), .o (object) or .a (static library)", None)


def exported(plans: list[KernelPlan]) -> list[Signature]:
    """The functions with a C ABI entry: all but @main."""
    return [Signature.of_plan(plan) for plan in plans if not plan.function.is_main]


def metadata(plans: list[KernelPlan]) -> dict:
    target = plans_target(plans)
    return {"format": FORMAT, "tilegen": __version__, "triple": target.triple,
            "cpu": target.cpu, "features": target.features,
            "functions": [Signature.of_plan(plan).to_json() for plan in plans]}


def write_library(plans: list[KernelPlan], path: str, header_path: str | None = None,
                  source: str = "a Kina program", profile: str = "") -> None:
    """Write `path` (.so, .o or .a) from `plans`, and the C header if asked. Each file
    appears under its final name only when complete (temporary name, then rename)."""
    if os.path.isdir(path):
        raise KinaError("io", f"cannot write '{path}': it is a directory", None)
    kind = output_kind(path)
    signatures = exported(plans)
    check_c_names(signatures, {plan.function.name: plan.function.span for plan in plans})
    header_name = os.path.basename(header_path) if header_path else "kina.h"
    header_text = header(signatures, header_name, os.path.basename(path), source)
    target = plans_target(plans)
    if target.arch != host_target().arch and not os.environ.get("CC"):
        raise KinaError("unsupported", f"cannot build {path} for target '{target.name}' "
                        f"({target.arch}) with this machine's C compiler "
                        f"({host_target().arch}): set CC to a cross compiler for "
                        f"{target.triple}", None)
    parsed = to_llvm(codegen(plans, profile=profile), target, pic=True)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KinaError("io", f"no C compiler found to build {path} (set CC or install gcc)",
                        None)
    with temporary_directory("tilegen-") as work:
        kernels = os.path.join(work, "kernels.o")
        with open(kernels, "wb") as handle:
            handle.write(object_code(parsed, target))
        glue_c, glue = os.path.join(work, "cabi.c"), os.path.join(work, "cabi.o")
        with open(glue_c, "w", encoding="utf-8") as handle:
            handle.write(glue_source(signatures, header_text, metadata(plans)))
        _run([compiler, "-std=c11", "-O2", "-fPIC", "-Wall", "-Werror", "-c", glue_c, "-o",
              glue], path)
        built = os.path.join(work, "out")
        if kind == "shared":
            _run([compiler, "-shared", "-o", built, kernels, glue, "-lm", "-lgomp"], path)
        elif kind == "object":
            _run([compiler, "-r", "-nostdlib", "-o", built, kernels, glue], path)
        else:
            archiver = os.environ.get("AR") or shutil.which("ar")
            if archiver is None:
                raise KinaError("io", f"no archiver found to build {path} (set AR or "
                                "install binutils)", None)
            _run([archiver, "rcs", built, kernels, glue], path)
        _publish(built, path, 0o755 if kind == "shared" else 0o644)
        if header_path is not None:
            staged = os.path.join(work, "header.h")
            with open(staged, "w", encoding="utf-8") as handle:
                handle.write(header_text)
            _publish(staged, header_path, 0o644)


def _run(command: list[str], path: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise KinaError("io", f"building {path} failed: {os.path.basename(command[0])}: "
                        f"{result.stderr.strip()}", None)


def _publish(built: str, path: str, mode: int) -> None:
    if os.path.isdir(path):
        raise KinaError("io", f"cannot write '{path}': it is a directory", None)
    directory = os.path.dirname(os.path.abspath(path)) or "."
    staging = staging_name(directory, ".tilegen-")
    try:
        os.close(create_staging_file(staging))
        shutil.copyfile(built, staging)
        os.chmod(staging, mode)
        os.replace(staging, path)
    except OSError as error:
        raise KinaError("io", f"cannot write '{path}': {error.strerror or error}",
                        None) from None
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def _library_program(path: str, signatures: list[Signature], plans: list[KernelPlan],
                     kind: str) -> CompiledModule:
    _load_openmp_runtime()
    library = ctypes.CDLL(os.path.abspath(path))
    table = ctypes.addressof(ctypes.c_void_p.in_dll(library, RUNTIME_TABLE))

    def address(symbol: str) -> int:
        return ctypes.cast(library[symbol], ctypes.c_void_p).value

    def load(name: str) -> NativeCode:
        kernel = kernel_symbol(name)
        counters, unit = None, ""
        for suffix, counted in PROFILE_COUNTERS.values():
            try:
                counters = ctypes.addressof(ctypes.c_int64.in_dll(library, kernel + suffix))
            except ValueError:
                continue
            unit = counted
            break
        blocks = ctypes.addressof(ctypes.c_void_p.in_dll(library, kernel + BLOCKS_SUFFIX))
        count = ctypes.c_int64.in_dll(library, kernel + BLOCK_COUNT_SUFFIX).value
        # The thread cap after fork (tilegen/forksafe.py); every kernel has the pointer.
        forksafe.bind(ctypes.addressof(ctypes.c_void_p.in_dll(library, kernel + THREADS_SUFFIX)))
        return NativeCode(address(function_symbol(name, "packed")),
                          address(function_symbol(name, "entry")),
                          address(function_symbol(name, "call")), table, counters,
                          _CodeOwner(library, blocks, count), unit)

    program = NativeProgram(signatures, kind, load, plans, path)
    program.functions  # noqa: B018 -- resolve every symbol now, while the file exists
    return new_module(program)


def aot_module(plans: list[KernelPlan], profile: str = "",
               keep_path: str | None = None) -> CompiledModule:
    """Build a .so, load it, and (unless `keep_path` is given) remove the file again."""
    plans_target(plans).check_runs_on_host("load the library into this process")
    signatures = [Signature.of_plan(plan) for plan in plans]
    if keep_path is not None:
        write_library(plans, keep_path, profile=profile)
        return _library_program(keep_path, signatures, plans, "so")
    with temporary_directory("tilegen-so-") as work:
        path = os.path.join(work, "module.so")
        write_library(plans, path, profile=profile)
        return _library_program(path, signatures, plans, "so")


def load_library(path: str | os.PathLike) -> CompiledModule:
    """Load a shared library written by tilegen (`-o lib.so`, `compile_file(output=...)`)
    as a module: the same functions, checks and errors as the module that built it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise KinaError("io", f"cannot load '{path}': no such file", None)
    try:
        library = ctypes.CDLL(os.path.abspath(path))
        start = ctypes.c_char.in_dll(library, METADATA)
    except (OSError, ValueError) as error:
        raise KinaError("io", f"cannot load '{path}' as a tilegen library: {error}",
                        None) from None
    data = json.loads(ctypes.string_at(ctypes.addressof(start)))
    if data.get("format") != FORMAT:
        raise KinaError("io", f"'{path}' is a tilegen library of format "
                        f"{data.get('format')!r}; this tilegen reads {FORMAT}", None)
    _check_cpu(path, data)
    signatures = [Signature.from_json(function) for function in data["functions"]]
    return _library_program(path, signatures, [], "so")


def _check_cpu(path: str, data: dict) -> None:
    """Code for CPU features this machine lacks would die of SIGILL: refuse to load it."""
    have = {f[1:] for f in host_target().features.split(",") if f.startswith("+")}
    needed = {f[1:] for f in data["features"].split(",") if f.startswith("+")}
    missing = sorted(needed - have)
    if missing:
        raise KinaError("unsupported", f"'{path}' was compiled for {data['cpu']} and needs "
                        f"CPU features this machine lacks: {', '.join(missing[:8])}", None)

