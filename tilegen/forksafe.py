"""Parallel kernels in a forked child: one thread, with a warning.

libgomp keeps a pool of worker threads after the first parallel region. `fork` copies
only the calling thread, so in the child the pool's workers are gone while libgomp still
counts them: the child's next region of two threads waits for them forever (JIT and `.so`
alike; `multiprocessing` with the fork start method, pre-fork servers). A region of one
thread runs on the caller without touching the pool, which works in the child (checked
against libgomp: after fork, `GOMP_parallel(fn, data, 1, 0)` runs and returns, with 2 it
hangs). libgomp has no call that rebuilds its pool, so the child runs every parallel
kernel on one thread, correctly, and says so once.

Every kernel reads the thread cap from one array this module owns (`STATE`, bound to the
kernel's `<symbol>.threads` pointer when its code is loaded; see tilegen/parallel.py).
A child forked before any parallel region ran has no stale pool and keeps every thread.
"""

from __future__ import annotations

import ctypes
import os
import warnings

# [thread cap, set to 1 by a kernel once it has run a parallel region]
_UNCAPPED = 1 << 30
STATE = (ctypes.c_int64 * 2)(_UNCAPPED, 0)


def bind(pointer_address: int | None) -> None:
    """Point a loaded kernel's `<symbol>.threads` (at `pointer_address`) at STATE."""
    if pointer_address:
        ctypes.c_void_p.from_address(pointer_address).value = ctypes.addressof(STATE)


def _after_fork_in_child() -> None:
    if STATE[1] and STATE[0] > 1:
        STATE[0] = 1
        warnings.warn("tilegen: this process was forked after a parallel kernel ran; "
                      "libgomp's thread pool does not survive fork, so parallel kernels "
                      "run on one thread in this process (use the 'spawn' or 'forkserver' "
                      "start method to keep every core)", RuntimeWarning, stacklevel=1)


os.register_at_fork(after_in_child=_after_fork_in_child)
