"""MADV_HUGEPAGE under the large tensors a kernel writes (hugepages.py): the advised range
is the whole 2 MB pages inside the written tensor's bytes, read back from the VMA flags in
/proc/self/smaps (`hg`); inputs, small outputs and TILEGEN_HUGEPAGES=0 are left alone."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend import hugepages  # noqa: E402

_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
pytestmark = pytest.mark.skipif(
    not _MODE.exists() or "[madvise]" not in _MODE.read_text(),
    reason="transparent huge pages are not in madvise mode here")


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3.0, mask=mask)


def _advised(address: int) -> bool:
    """Whether the mapping holding `address` has MADV_HUGEPAGE (VmFlags `hg`)."""
    flags = _advice_at(address)
    if flags is None:
        raise AssertionError(f"no mapping holds {address:#x}")
    return flags


def _advice_at(address: int) -> bool | None:
    """_advised, or None when nothing is mapped there."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(part, 16) for part in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return None


def _fresh(count: int) -> torch.Tensor:
    """A float32 tensor in an anonymous mapping of its own: memory an earlier launch in
    this process cannot have advised already (the allocator's heap may have been)."""
    mapping = mmap.mmap(-1, count * 4)
    tensor = torch.frombuffer(mapping, dtype=torch.float32)
    _MAPPINGS.append(mapping)
    return tensor


_MAPPINGS: list = []


def _run(x, y):
    n = x.numel()
    _scale[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
    torch.testing.assert_close(y, x * 3.0)


@pytest.fixture(autouse=True)
def _fresh_madvise(monkeypatch):
    monkeypatch.delenv("TILEGEN_HUGEPAGES", raising=False)
    hugepages.madvise.cache_clear()
    yield
    hugepages.madvise.cache_clear()


def test_a_large_written_view_advises_only_its_whole_huge_pages():
    big = 2 << 20
    buffer = _fresh((24 << 20) // 4)
    start = buffer.data_ptr()
    first = -(-start // big) * big + big + 4096 * 3  # not on a 2 MB boundary
    offset = (first - start) // 4
    y = buffer[offset:offset + (9 << 20) // 4 + 5]  # 9 MB and 20 bytes
    # an input, not advised: in a mapping of its own too, since the heap torch.randn
    # would take may hold pages an earlier test's output advised
    x = _fresh(y.numel())
    x.copy_(torch.randn(y.numel()))
    _run(x, y)
    low = -(-y.data_ptr() // big) * big
    high = (y.data_ptr() + y.nbytes) // big * big
    assert _advised(low) and _advised(high - 1)
    assert not _advised(low - 1) and not _advised(high)  # outside the whole pages
    assert not _advised(x.data_ptr() + x.nbytes // 2)


def test_an_expanded_output_advises_nothing_past_its_storage():
    """numel x 4 bytes is 16 MB, the storage 4 MB: only the storage's own pages."""
    big = 2 << 20
    storage = _fresh((4 << 20) // 4)
    y = storage.view(1, -1).expand(4, -1)
    past = [y.data_ptr() + y.nbytes - 4096 * k for k in (1, 2)] + \
        [storage.data_ptr() + storage.nbytes + 4096 * k for k in range(0, 512, 64)]
    before = [_advice_at(address) for address in past]
    hugepages.advise(hugepages.madvise(), y)
    low = -(-storage.data_ptr() // big) * big
    high = (storage.data_ptr() + storage.nbytes) // big * big
    assert high > low and _advised(low) and _advised(high - 1)
    # what lies past the storage is as it was
    assert [_advice_at(address) for address in past] == before


def test_small_outputs_and_the_knob_leave_memory_alone(monkeypatch):
    x = torch.randn((hugepages.MIN_BYTES >> 2) - 1)  # just under the threshold
    y = _fresh(x.numel())
    _run(x, y)
    assert not _advised(y.data_ptr() + y.nbytes // 2)
    monkeypatch.setenv("TILEGEN_HUGEPAGES", "0")
    hugepages.madvise.cache_clear()
    x, y = torch.randn(3 << 20), _fresh(3 << 20)
    _run(x, y)
    assert not _advised(y.data_ptr() + y.nbytes // 2)


@triton.jit
def _total(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(total_ptr, tl.sum(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)))


def test_written_params_follow_stores_and_atomics():
    x, y = torch.randn(5000), torch.empty(5000)
    assert _scale[(2,)](x, y, 5000, BLOCK=4096).metadata.tilegen_written_params == [1]
    total = torch.zeros(1)
    compiled = _total[(2,)](x, total, 5000, BLOCK=4096)
    torch.testing.assert_close(total[0], x.sum(), rtol=1e-5, atol=1e-3)
    assert compiled.metadata.tilegen_written_params == [1]
