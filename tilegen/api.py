"""The Python API: compile Kina source to a module of callables."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from kina_frontend import KinaError, Program, Source, check_source, load_source, specialize
from kina_frontend.tensor_ir import format_program

from . import config
from .cache import MEMORY, DiskCache, cache_key
from .pipeline import plan_program
from .runtime import CompiledModule, aot_module, jit_module


def compile_program(program: Program, jit: bool = True, output: str | None = None,
                    names: tuple[str, ...] | None = None) -> CompiledModule:
    """Compile concrete tensor IR. `jit=True` stays in memory; `jit=False` builds a shared
    library (kept at `output` if given, otherwise in a temporary folder that is removed)."""
    text = format_program(program, with_locations=True)
    return _compile(f"<program {names or ''}>", text, lambda: program, jit, output, names)


def compile_source(text: str, name: str = "<string>", jit: bool = True,
                   output: str | None = None, consts: Mapping[str, int] | None = None,
                   functions: Iterable[str] | None = None) -> CompiledModule:
    """Compile Kina source text; `name` is the file name diagnostics show. The keywords are
    those of `compile_file`."""
    source = Source(name, text)
    return _compile_source(source, jit, output, consts, functions)


def compile_file(path: str | os.PathLike, jit: bool = True, output: str | None = None,
                 consts: Mapping[str, int] | None = None,
                 functions: Iterable[str] | None = None) -> CompiledModule:
    """Compile a .kina file (or a bundled example name) into a module whose attributes are
    its functions; each takes NumPy arrays positionally and returns an array or a tuple.

    `consts={"T": 128}` compiles the program with those values for consts defined by an
    integer literal (shapes are proved for every value, so one source serves every size);
    `functions=("f",)` compiles only those functions (the others are still checked)."""
    return _compile_source(load_source(path), jit, output, consts, functions)


def _compile_source(source: Source, jit: bool, output: str | None,
                    consts: Mapping[str, int] | None,
                    functions: Iterable[str] | None) -> CompiledModule:
    consts = dict(consts or {})
    names = None if functions is None else tuple(functions)

    def frontend() -> Program:
        program = specialize(check_source(source, consts))
        if names is not None:
            missing = [n for n in names if n not in {f.name for f in program.functions}]
            if missing:
                raise KinaError("name", f"functions= names {', '.join(map(repr, missing))}, "
                                f"which {source.name} does not define", None)
        return program

    return _compile(source.name, source.text, frontend, jit, output, names,
                    tuple(sorted(consts.items())))


def _compile(name: str, text: str, frontend, jit: bool, output: str | None,
             names: tuple[str, ...] | None = None,
             consts: tuple[tuple[str, int], ...] = ()) -> CompiledModule:
    settings = config.load()
    key = cache_key(name, f"{text}\0{names}\0{consts}", settings, jit)
    if output is None:
        cached = MEMORY.get(key)
        if cached is not None:
            return cached
    disk = DiskCache.open(settings.cache_dir) if settings.cache_dir and jit else None
    plans = disk.load_plans(key) if disk is not None else None
    if plans is None:
        plans = plan_program(frontend(), names, settings)
        if disk is not None:
            disk.store_plans(key, plans)
    if jit and output is None:
        module = jit_module(plans, settings.profile, disk, key)
    else:
        module = aot_module(plans, settings.profile, keep_path=output)
    if output is None:
        MEMORY.put(key, module)
    return module
