"""The Python API: compile Kina source to a module of callables."""

from __future__ import annotations

import os

from kina_frontend import Program, Source, check_source, load_source, specialize

from . import config
from .pipeline import plan_program
from .runtime import CompiledModule, aot_module, jit_module


def compile_program(program: Program, jit: bool = True, output: str | None = None,
                    names: tuple[str, ...] | None = None) -> CompiledModule:
    """Compile concrete tensor IR. `jit=True` stays in memory; `jit=False` builds a shared
    library (kept at `output` if given, otherwise in a temporary folder that is removed)."""
    settings = config.load()
    plans = plan_program(program, names, settings)
    if jit and output is None:
        return jit_module(plans, settings.profile)
    return aot_module(plans, settings.profile, keep_path=output)


def compile_source(text: str, name: str = "<string>", jit: bool = True,
                   output: str | None = None) -> CompiledModule:
    return compile_program(specialize(check_source(Source(name, text))), jit, output)


def compile_file(path: str | os.PathLike, jit: bool = True,
                 output: str | None = None) -> CompiledModule:
    """Compile a .kina file (or a bundled example name) into a module whose attributes are
    its functions; each takes NumPy arrays positionally and returns an array or a tuple."""
    return compile_program(specialize(check_source(load_source(path))), jit, output)
