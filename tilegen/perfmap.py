"""Names for JIT code in Linux `perf` (TILEGEN_PERF_MAP=1).

MCJIT puts code in anonymous memory, so `perf report` shows its samples as bare addresses.
For such code perf reads `/tmp/perf-<pid>.map`, one `START SIZE name` line (hex) per
symbol. With TILEGEN_PERF_MAP=1 every engine tilegen loads (a Kina function's kernel, a
Triton kernel through tilegen's backend) appends its functions there: the kernel, its
parallel regions and micro-kernels (`kina.f.par1`, `tilegen.gemm.amx.32x32.in_place`), each
at the address the engine gave it and of the size the object code's symbol table says
(parsed here from the ELF bytes the engine was loaded from). The file stays after the
process ends, where `perf report` finds it; nothing removes it.

A map that cannot be written (no /tmp, a full disk) or object code whose symbols cannot be
read costs the compile nothing: a RuntimeWarning says so, once per process.
"""

from __future__ import annotations

import os
import struct
import threading
import warnings

from .target import LLVM_LOCK

_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB = 2
_STT_FUNC = 2
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section, value, size
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_lock = threading.Lock()
_warned = False


def map_path() -> str:
    """Where perf looks for this process's JIT symbols."""
    return f"/tmp/perf-{os.getpid()}.map"


def function_sizes(data: bytes) -> dict[str, int]:
    """The defined functions of an ELF64 little-endian object (what MCJIT loads on
    x86-64 Linux) and their sizes in bytes, from its symbol table; {} for other formats."""
    if data[:4] != _ELF_MAGIC or data[4] != 2 or data[5] != 1:
        return {}
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [_SECTION.unpack_from(data, section_offset + index * entry_size)
                for index in range(count)]
    sizes: dict[str, int] = {}
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != _SHT_SYMTAB or symbol_size != _SYMBOL.size:
            continue
        names = sections[link][4]  # the string table's file offset
        for at in range(offset, offset + size, symbol_size):
            name_at, info, _, section, _, length = _SYMBOL.unpack_from(data, at)
            if info & 0xF != _STT_FUNC or section == 0 or length == 0:
                continue
            end = data.index(b"\0", names + name_at)
            sizes[data[names + name_at:end].decode()] = length
    return sizes


def record(engine, data: bytes) -> None:
    """Append the functions of `engine`, loaded from the object code `data`, to this
    process's perf map."""
    try:
        sizes = function_sizes(data)
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as error:
        _warn_once(f"cannot read the object code's symbols ({error})")
        return
    with LLVM_LOCK:
        lines = [f"{address:x} {size:x} {name}\n" for name, size in sorted(sizes.items())
                 if (address := engine.get_function_address(name))]
    try:
        with _lock, open(map_path(), "a", encoding="utf-8") as out:
            out.writelines(lines)
    except OSError as error:
        _warn_once(f"cannot write {map_path()}: {error}")


def _warn_once(problem: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"tilegen: TILEGEN_PERF_MAP: {problem}", RuntimeWarning, stacklevel=3)
