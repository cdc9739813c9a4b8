"""The Python API: compile Kina source to a module of callables."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from kina_frontend import KinaError, Program, Source, check_source, load_source, specialize
from kina_frontend.tensor_ir import format_program
from kina_frontend.verify import check_program

from . import config
from .cache import MEMORY, DiskCache, cache_key
from .gcpause import collector_paused
from .library import aot_module
from .pipeline import PlanTable, plan_program
from .runtime import CompiledModule, jit_module
from .tuning import tile_chooser


def compile_program(program: Program, jit: bool = True, output: str | None = None,
                    names: tuple[str, ...] | None = None,
                    target: str | None = None) -> CompiledModule:
    """Compile concrete tensor IR. `jit=True` stays in memory; `jit=False` builds a shared
    library (kept at `output` if given, otherwise in a temporary folder that is removed).
    The program is verified first (`kina_frontend.verify.check_program`): ill-typed IR is a
    KinaError naming the operation, never lowered."""
    check_program(program)
    text = format_program(program, with_locations=True)
    return _compile(f"<program {names or ''}>", text, lambda: program, jit, output, names,
                    target=target)


def compile_source(text: str, name: str = "<string>", jit: bool = True,
                   output: str | None = None, consts: Mapping[str, int] | None = None,
                   functions: Iterable[str] | None = None,
                   target: str | None = None) -> CompiledModule:
    """Compile Kina source text; `name` is the file name diagnostics show. The keywords are
    those of `compile_file`."""
    return _compile_source(Source(name, text), jit, output, consts, functions, target)


def compile_file(path: str | os.PathLike, jit: bool = True, output: str | None = None,
                 consts: Mapping[str, int] | None = None,
                 functions: Iterable[str] | None = None,
                 target: str | None = None) -> CompiledModule:
    """Compile a .kina file (or a bundled example name) into a module whose attributes are
    its functions; each takes NumPy arrays positionally and returns an array or a tuple.

    `consts={"T": 128}` compiles the program with those values for consts defined by an
    integer literal (shapes are proved for every value, so one source serves every size);
    `functions=("f",)` compiles only those functions (the others are still checked);
    `target="x86-64-v3"` generates code for that target instead of TILEGEN_TARGET or this
    machine (tilegen/target.py; it must be one this machine can run).

    A path ending in `.loops` is loop IR (the text `--emit loops` prints, verified as it is
    read): its kernels are compiled as written, each a function of its input buffers
    returning its outputs (tilegen/loopfile.py)."""
    source = load_source(path)
    if source.name.endswith(".loops"):
        from .loopfile import compile_loops

        if consts:
            raise KinaError("io", f"consts= has no meaning for loop IR ({source.name}: its "
                            f"shapes are fixed)", None)
        return compile_loops(source, jit, output, functions, target)
    return _compile_source(source, jit, output, consts, functions, target)


def _compile_source(source: Source, jit: bool, output: str | None,
                    consts: Mapping[str, int] | None,
                    functions: Iterable[str] | None,
                    target: str | None = None) -> CompiledModule:
    consts = dict(consts or {})
    names = None if functions is None else tuple(functions)

    def frontend() -> Program:
        program = specialize(check_source(source, consts))
        if names is not None:
            missing = [n for n in names if n not in {f.name for f in program.functions}]
            if missing:
                raise KinaError("name", f"functions= names {', '.join(map(repr, missing))}, "
                                f"which {source.name} does not define", None)
        # The checker's output verified like any program (about a millisecond for the
        # StoryLM-0 training step): a checker bug is then a diagnostic, not native code.
        check_program(program)
        return program

    return _compile(source.name, source.text, frontend, jit, output, names,
                    tuple(sorted(consts.items())), target)


def planned(name: str, text: str, frontend, settings: config.Config, jit: bool,
            names: tuple[str, ...] | None = None, lazy: bool = False,
            consts: tuple[tuple[str, int], ...] = ()):
    """(plans, disk cache or None, cache key): the plans from the disk cache when
    TILEGEN_CACHE_DIR is set and holds them, else planned now (and stored there). `lazy`
    without a disk cache: each function planned on first use (a `PlanTable`), with the size
    and autodiff diagnostics raised here."""
    key = _key(name, text, names, consts, settings, jit)
    disk = DiskCache.open(settings.cache_dir) if settings.cache_dir and jit else None
    plans = disk.load_plans(key) if disk is not None else None
    if plans is None and lazy and disk is None:
        plans = PlanTable(frontend(), names, settings, tile_chooser(settings))
    elif plans is None:
        plans = plan_program(frontend(), names, settings, tile_chooser(settings))
        if disk is not None:
            disk.store_plans(key, plans)
    return plans, disk, key


def _key(name: str, text: str, names, consts, settings: config.Config, jit: bool) -> str:
    return cache_key(name, f"{text}\0{names}\0{consts}", settings, jit)


def _compile(name: str, text: str, frontend, jit: bool, output: str | None,
             names: tuple[str, ...] | None = None,
             consts: tuple[tuple[str, int], ...] = (),
             target: str | None = None) -> CompiledModule:
    settings = config.load(target)
    key = _key(name, text, names, consts, settings, jit)
    if output is None and settings.memory_cache_entries:
        cached = MEMORY.get(key)
        if cached is not None:
            return cached
    with collector_paused():
        plans, disk, key = planned(name, text, frontend, settings, jit, names,
                                   lazy=jit and output is None, consts=consts)
        if jit and output is None:
            module = jit_module(plans, settings.profile, disk, key)
        else:
            module = aot_module(plans, settings.profile, keep_path=output)
    if output is None:
        MEMORY.put(key, module, settings.memory_cache_entries)
    return module
