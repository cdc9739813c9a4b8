"""Compile caches.

In memory (always on): compiling the same source with the same options again in one
process returns the module already built. On disk (opt-in, TILEGEN_CACHE_DIR): the
planned kernels and each function's object code, so a new process skips the frontend,
lowering and LLVM. `jit=True` without the opt-in writes nothing.

The key hashes everything that changes the bits: the source text and its name (error
locations), the options, the compiler's own sources, llvmlite/LLVM versions, the target
triple, the CPU name *and its feature string* (AVX-512 code must never be reused on a
CPU without it). Entries are written to a temporary name and renamed; an entry that
fails to load (truncated, corrupted, from an incompatible version) is deleted and
rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import tempfile
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

from kina_frontend.types import DType

from .config import MEMORY_CACHE_ENTRIES
from .staging import create_staging_file, staging_name
from .target import compiler_identity

_FORMAT = "tilegen-cache-v1"


@functools.cache
def compiler_fingerprint() -> str:
    """Hash of the compiler's own sources and of the toolchain/CPU identity."""
    digest = hashlib.sha256(_FORMAT.encode())
    root = Path(__file__).resolve().parent.parent
    for package in ("tilegen", "kina_frontend"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    digest.update(compiler_identity().encode())
    return digest.hexdigest()


def cache_key(source_name: str, source_text: str, options, jit: bool) -> str:
    digest = hashlib.sha256(compiler_fingerprint().encode())
    for part in (source_name, source_text, repr(options), "jit" if jit else "so"):
        digest.update(b"\0" + part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


class MemoryCache:
    """A small LRU of compiled modules, bounded by count (TILEGEN_MEMORY_CACHE, default 32)
    so compile/discard loops cannot grow the process without limit. A module's size is not
    known when it is stored (its machine code and heap blocks appear on first call), hence
    a count rather than bytes."""

    def __init__(self, capacity: int = MEMORY_CACHE_ENTRIES):
        self.capacity = capacity
        self.entries: OrderedDict[str, object] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str):
        with self.lock:
            module = self.entries.get(key)
            if module is not None:
                self.entries.move_to_end(key)
            return module

    def put(self, key: str, module, capacity: int | None = None) -> None:
        """Store `module`; `capacity` (the current TILEGEN_MEMORY_CACHE) replaces the bound
        when given."""
        with self.lock:
            if capacity is not None:
                self.capacity = capacity
            self.entries[key] = module
            self.entries.move_to_end(key)
            while len(self.entries) > self.capacity:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


MEMORY = MemoryCache()


class DiskCache:
    """<dir>/<key>/plans.pickle and <dir>/<key>/<symbol>.o."""

    def __init__(self, directory: str):
        self.root = Path(directory)

    @classmethod
    def open(cls, directory: str) -> DiskCache | None:
        """The cache at `directory`, or None (with a warning) when it cannot be used: the
        cache only saves time, so an unusable one never stops a compile."""
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
                pass
        except OSError as error:
            warnings.warn(f"TILEGEN_CACHE_DIR={directory!r} is not usable "
                          f"({error.strerror or error}); compiling without the disk cache",
                          RuntimeWarning, stacklevel=3)
            return None
        return cls(directory)

    def _entry(self, key: str) -> Path:
        # Native entries compare dtype numbers, and bfloat16's is assigned when ml_dtypes
        # registers it in this process: stored code is only reused under the same number.
        salted = hashlib.sha256(f"{key}\0bf16={DType.BF16.numpy.num}".encode()).hexdigest()
        return self.root / salted[:2] / salted

    def load_plans(self, key: str):
        path = self._entry(key) / "plans.pickle"
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            stored_format, plans = pickle.loads(data)
            if stored_format != _FORMAT:
                raise ValueError(stored_format)
            return plans
        except Exception:  # noqa: BLE001 -- any unreadable entry is rebuilt, never trusted
            self.discard(key)
            return None

    def store_plans(self, key: str, plans) -> None:
        _atomic_write(self._entry(key) / "plans.pickle",
                      pickle.dumps((_FORMAT, plans), protocol=pickle.HIGHEST_PROTOCOL))

    def load_object(self, key: str, symbol: str) -> bytes | None:
        """The stored object code, or None. Each file carries a SHA-256 of its contents:
        LLVM's object loader does not validate its input and would crash on a truncated
        file, so damaged entries are detected here and rebuilt."""
        try:
            stored = (self._entry(key) / f"{symbol}.o").read_bytes()
        except OSError:
            return None
        digest, data = stored[:32], stored[32:]
        if len(stored) < 32 or hashlib.sha256(data).digest() != digest:
            self.discard(key)
            return None
        return data

    def store_object(self, key: str, symbol: str, data: bytes) -> None:
        _atomic_write(self._entry(key) / f"{symbol}.o", hashlib.sha256(data).digest() + data)

    def discard(self, key: str) -> None:
        entry = self._entry(key)
        if entry.exists():
            for child in entry.iterdir():
                with contextlib.suppress(OSError):
                    child.unlink()
            with contextlib.suppress(OSError):
                entry.rmdir()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_name(path.parent, ".tmp-")
    try:
        with os.fdopen(create_staging_file(staging), "wb") as stream:
            stream.write(data)
        os.replace(staging, path)
    except BaseException:
        if os.path.exists(staging):
            os.unlink(staging)
        raise
