"""The cyclic garbage collector paused while tilegen compiles.

A compile allocates some 10^5 Python objects that live until it ends (the llvmlite IR
builder's instructions, blocks and constants, which point at each other and so are freed
only by the collector). Allocations that many push them into the oldest generation and
start a full collection, which walks every object of the process: 0.05 s in a process
holding tilegen alone, 0.43 s with torch and sentence-transformers imported (MiniLM's
benchmark process), most times a (B, T) shape was compiled. Paused, the compile's objects
stay in the youngest generation, and one collection of that generation when the outermost
compile ends frees the dead ones (the IR) without walking the rest of the heap.

The collector is process-wide: while a compile runs, other threads' cycles wait for it to
end (they are then collected as usual). A program that disabled the collector itself finds
it disabled afterwards."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()
_depth = 0  # compiles running (threads may compile at once)
_resume = False  # whether the outermost compile found the collector enabled


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with the cyclic collector off; re-entrant and thread-safe."""
    global _depth, _resume
    with _LOCK:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0 and _resume:
                # The compile's garbage, all in the youngest generation.
                gc.collect(0)
                gc.enable()
