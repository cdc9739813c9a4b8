"""tilegen: a Triton-style tile-kernel generator for the CPU, fed by Kina programs.

    import tilegen
    module = tilegen.compile_file("examples/storylm0_forward.kina")   # in-process JIT
    logits = module.storylm0_forward(ids, embed, mask, scale, wq, wk, wv, wo, lm_head)
"""

from __future__ import annotations

from .version import __version__

__all__ = [
    "ArgumentError",
    "IdOutOfRangeError",
    "KinaError",
    "__version__",
    "compile_file",
    "compile_program",
    "compile_source",
    "load_library",
    "program_of",
]


def __getattr__(name: str):
    # Importing the package stays cheap (the CLI's --help, --version); the compiler and
    # llvmlite load on first use.
    if name in ("compile_file", "compile_source", "compile_program"):
        from . import api
        return getattr(api, name)
    if name in ("ArgumentError", "IdOutOfRangeError", "program_of"):
        from . import runtime
        return getattr(runtime, name)
    if name == "load_library":
        from .library import load_library
        return load_library
    if name == "KinaError":
        from kina_frontend import KinaError
        return KinaError
    raise AttributeError(name)
