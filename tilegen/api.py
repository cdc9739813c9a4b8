"""The Python API: compile Kina source to a module of callables."""

from __future__ import annotations

import os

from kina_frontend import Program, Source, check_source, load_source, specialize
from kina_frontend.tensor_ir import format_program
from kina_frontend.verify import check_program

from . import config
from .cache import MEMORY, DiskCache, cache_key
from .library import aot_module
from .pipeline import PlanTable, plan_program
from .runtime import CompiledModule, jit_module


def compile_program(program: Program, jit: bool = True, output: str | None = None,
                    names: tuple[str, ...] | None = None) -> CompiledModule:
    """Compile concrete tensor IR. `jit=True` stays in memory; `jit=False` builds a shared
    library (kept at `output` if given, otherwise in a temporary folder that is removed).
    The program is verified first (`kina_frontend.verify.check_program`): ill-typed IR is a
    KinaError naming the operation, never lowered."""
    check_program(program)
    text = format_program(program, with_locations=True)
    return _compile(f"<program {names or ''}>", text, lambda: program, jit, output, names)


def compile_source(text: str, name: str = "<string>", jit: bool = True,
                   output: str | None = None) -> CompiledModule:
    return _compile(name, text, lambda: _checked(specialize(check_source(Source(name, text)))),
                    jit, output)


def compile_file(path: str | os.PathLike, jit: bool = True,
                 output: str | None = None) -> CompiledModule:
    """Compile a .kina file (or a bundled example name) into a module whose attributes are
    its functions; each takes NumPy arrays positionally and returns an array or a tuple."""
    source = load_source(path)
    return _compile(source.name, source.text,
                    lambda: _checked(specialize(check_source(source))), jit, output)


def _checked(program: Program) -> Program:
    """The checker's output verified like any program (about a millisecond for the
    StoryLM-0 training step): a checker bug is then a diagnostic, not native code."""
    check_program(program)
    return program


def planned(name: str, text: str, frontend, settings: config.Config, jit: bool,
            names: tuple[str, ...] | None = None, lazy: bool = False):
    """(plans, disk cache or None, cache key): the plans from the disk cache when
    TILEGEN_CACHE_DIR is set and holds them, else planned now (and stored there). `lazy`
    without a disk cache: each function planned on first use (a `PlanTable`), with the size
    and autodiff diagnostics raised here."""
    key = cache_key(name, f"{text}\0{names}", settings, jit)
    disk = DiskCache.open(settings.cache_dir) if settings.cache_dir and jit else None
    plans = disk.load_plans(key) if disk is not None else None
    if plans is None and lazy and disk is None:
        plans = PlanTable(frontend(), names, settings)
    elif plans is None:
        plans = plan_program(frontend(), names, settings)
        if disk is not None:
            disk.store_plans(key, plans)
    return plans, disk, key


def _compile(name: str, text: str, frontend, jit: bool, output: str | None,
             names: tuple[str, ...] | None = None) -> CompiledModule:
    settings = config.load()
    key = cache_key(name, f"{text}\0{names}", settings, jit)
    if output is None and settings.memory_cache_entries:
        cached = MEMORY.get(key)
        if cached is not None:
            return cached
    plans, disk, key = planned(name, text, frontend, settings, jit, names,
                               lazy=jit and output is None)
    if jit and output is None:
        module = jit_module(plans, settings.profile, disk, key)
    else:
        module = aot_module(plans, settings.profile, keep_path=output)
    if output is None:
        MEMORY.put(key, module, settings.memory_cache_entries)
    return module
