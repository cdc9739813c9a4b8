"""Transparent huge pages for the large tensors a kernel writes.

A kernel that writes a fresh tensor (`torch.empty_like` of 64 MB: layer norm forward's
output) spends most of its time in page faults, one per 4 KB page touched first by its
stores, each zeroing the page. Where Linux gives huge pages only on request
(/sys/kernel/mm/transparent_hugepage/enabled is `madvise`), the launcher asks for them
(`madvise(MADV_HUGEPAGE)`) on the part of each written tensor argument of MIN_BYTES or
more that whole 2 MB pages cover: one fault per 2 MB. Only that 2 MB-aligned range inside
the tensor's own bytes is advised, so no neighbouring memory changes; the advice is only a
hint, and a failed call (a file mapping, an old kernel) is ignored. Memory that already
has its pages keeps them (the kernel's khugepaged may merge them later). TILEGEN_HUGEPAGES=0
turns it off; with `always` or `never` there is nothing to ask.
"""

from __future__ import annotations

import ctypes
import functools
import sys

from .panel_cache import _Roots
from .tileir import Program, walk

MIN_BYTES = 4 << 20
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
_WRITES = ("tt.store", "tt.atomic_rmw", "tt.atomic_cas")


def written_params(program: Program) -> list[int]:
    """The parameters (numbers) whose tensors the kernel stores into through an offset of
    the parameter (a pointer loaded from memory is not followed)."""
    root = _Roots(program)
    found = {root(op.operands[0]) for op in walk(program.body) if op.name in _WRITES}
    return sorted(number for number in found if number is not None)


@functools.cache
def madvise():
    """libc's madvise when huge pages are given on request here and allowed, else None."""
    from ..config import hugepages_allowed

    if not sys.platform.startswith("linux") or not hugepages_allowed():
        return None
    try:
        with open(_THP_ENABLED) as mode:
            if "[madvise]" not in mode.read():
                return None
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def advise(call, tensor) -> None:
    """Ask for huge pages under the whole 2 MB pages of `tensor`'s bytes (a CPU tensor of
    MIN_BYTES or more; anything else is left alone). Never raises."""
    try:
        if getattr(tensor, "is_cpu", False) is not True or tensor.nbytes < MIN_BYTES:
            return
        # within the storage: an expanded view's numel may exceed what it holds
        storage = tensor.untyped_storage()
        start = tensor.data_ptr()
        end = min(start + tensor.nbytes, storage.data_ptr() + storage.nbytes())
    except (AttributeError, RuntimeError, TypeError):
        return
    low = -(-start // HUGE_PAGE) * HUGE_PAGE
    high = end // HUGE_PAGE * HUGE_PAGE
    if high > low:
        call(low, high - low, _MADV_HUGEPAGE)  # a failure only leaves 4 KB pages
