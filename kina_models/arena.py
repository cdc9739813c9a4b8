"""Weights laid out in one huge-page arena.

A model's weights loaded one array at a time land wherever the allocator puts them: 16-byte
aligned (so three in four of MiniLM's 1536-byte weight rows start inside a cache line, and
every 64-byte vector load of them touches two lines) and on 4 KiB pages (a TLB miss every
few rows of a strided walk, with two-level page walks in a virtual machine). A one-sentence
MiniLM call streams all 42 MB of its Linear weights from memory on every call, and copied
into one private anonymous mapping, each array on a 4 KiB boundary and the mapping advised
MADV_HUGEPAGE before it is touched, it ran about 1.4x faster on one thread (docs/models.md,
"Where the time goes": most of that from the alignment, the rest from the huge pages).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

HUGE_PAGE = 2 << 20
# Each array starts on a page (and so a cache line) boundary.
ALIGNMENT = 4096


def huge_page_arena(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Read-only copies of `arrays` (any dtypes, C order) in one mapping advised to use huge
    pages where the kernel offers them (Linux transparent huge pages in `madvise` or `always`
    mode); elsewhere the same copies on ordinary pages."""
    offsets, size = [], 0
    for array in arrays:
        offsets.append(size)
        size += -(-array.nbytes // ALIGNMENT) * ALIGNMENT
    # Private: a shared anonymous mapping is shmem, which THP leaves alone.
    mapping = mmap.mmap(-1, max(size, 1) + HUGE_PAGE,
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(mapping, np.uint8)
    start = -base.ctypes.data % HUGE_PAGE
    advise = getattr(mapping, "madvise", None)
    hugepage = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is not None and hugepage is not None:
        # Before the first touch: the pages are huge from their first fault on.
        advise(hugepage, start - start % mmap.PAGESIZE, size + start % mmap.PAGESIZE)
    copies = []
    for array, offset in zip(arrays, offsets, strict=True):
        source = np.ascontiguousarray(array)
        at = start + offset
        view = base[at:at + source.nbytes].view(source.dtype).reshape(source.shape)
        view[...] = source
        view.flags.writeable = False
        copies.append(view)
    return tuple(copies)
