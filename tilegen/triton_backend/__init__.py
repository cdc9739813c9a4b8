"""Triton kernels on the CPU: tilegen as a `triton.backends` plugin named `tilegen`.

Triton finds this package through the `triton.backends` entry point in pyproject.toml
(`compiler.py` holds the backend, `driver.py` the driver). `register()` adds it by hand to
an already imported Triton (for checkouts that were not installed with their entry
points). Stages: ttir (libtriton passes) -> ttile (tile IR, tileir.py, from
ttir_import.py) -> llir (emit.py and its op families) -> obj (machine code).
"""

from __future__ import annotations


def register() -> None:
    """Make `tilegen` a Triton backend in this process, if its entry point did not."""
    import triton.backends as backends

    if "tilegen" in backends.backends:
        return
    from . import compiler, driver
    backends.backends["tilegen"] = backends.Backend(compiler.TilegenBackend,
                                                    driver.TilegenDriver)
