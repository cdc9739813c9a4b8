"""kina_models.arena: weights copied into one huge-page mapping."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kina_models.arena import ALIGNMENT, HUGE_PAGE, huge_page_arena

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _arrays():
    rng = np.random.default_rng(1)
    return [rng.standard_normal((384, 1536)).astype(np.float32),
            rng.standard_normal(7).astype(np.float32),
            rng.integers(0, 9, (3, 5)),
            rng.standard_normal((1536, 384)).astype(np.float32).astype(ml_dtypes.bfloat16),
            np.asfortranarray(rng.standard_normal((33, 17)).astype(np.float32))]


def test_copies_are_equal_aligned_read_only_and_share_one_mapping():
    arrays = _arrays()
    copies = huge_page_arena(arrays)
    first = copies[0].ctypes.data
    assert first % HUGE_PAGE == 0
    for array, copy in zip(arrays, copies, strict=True):
        assert copy.dtype == array.dtype and copy.shape == array.shape
        assert copy.flags.c_contiguous and not copy.flags.writeable
        assert copy.ctypes.data % ALIGNMENT == 0
        np.testing.assert_array_equal(copy.astype(np.float64), array.astype(np.float64))
        assert copy.base is not None
    ends = sorted((c.ctypes.data, c.ctypes.data + c.nbytes) for c in copies)
    assert all(end <= start for (_, end), (start, _) in zip(ends, ends[1:], strict=False))


def _mapping(address: int) -> tuple[str, set[str]]:
    """(permissions, VmFlags) of the mapping holding `address` (/proc/self/smaps)."""
    inside, permissions = False, ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
            permissions = span[3] if inside else permissions
        elif inside and line.startswith("VmFlags:"):
            return permissions, set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="no transparent huge pages here")
def test_the_arena_is_a_private_mapping_advised_for_huge_pages():
    """The mapping is private (a shared one gets no anonymous huge pages) and advised with
    MADV_HUGEPAGE (`hg`), which with THP in `madvise` mode is what asks for huge pages.
    Whether the kernel finds free 2 MiB pages at that moment is not this code's doing, so
    it is not asserted."""
    weights = [np.ones((1024, 1024), np.float32) for _ in range(2)]
    copies = huge_page_arena(weights)
    permissions, flags = _mapping(copies[0].ctypes.data)
    assert permissions.endswith("p"), permissions
    assert "hg" in flags, sorted(flags)
