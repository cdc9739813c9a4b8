"""Kina frontend: parse, diagnose, prove shapes, build typed tensor IR.

    from kina_frontend import load_program
    checked = load_program("examples/storylm0_forward.kina")   # symbolic IR + proofs
    program = specialize(checked)                              # concrete shapes
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from . import ast
from .checker import CheckedProgram, Obligation, check_module, specialize
from .diagnostics import KinaError, Source, Span
from .interpreter import interpret
from .parser import parse
from .tensor_ir import Function, Operation, Program, Value, format_program, parse_ir
from .types import DType, TensorType

__version__ = "0.1.0"

# The bundled example programs: examples/ in a source checkout (or an editable install);
# an installed wheel ships them as the package data tilegen/examples (see pyproject.toml).
_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = next((folder for folder in (_ROOT / "examples", _ROOT / "tilegen" / "examples")
                     if (folder / "storylm0_forward.kina").is_file()), _ROOT / "examples")

# A .kina file larger than this is refused before reading (a hostile input guard).
MAX_SOURCE_BYTES = 16 * 1024 * 1024


def _exists(path: Path) -> bool:
    """Path.exists, but False for names the OS rejects (too long, a NUL byte)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def resolve_path(name: str | os.PathLike) -> Path:
    """A path as given, or a bare example name resolved against the bundled examples."""
    path = Path(name)
    if _exists(path) or path.parent != Path("."):
        return path
    for candidate in (EXAMPLES_DIR / path.name, EXAMPLES_DIR / (path.name + ".kina")):
        if _exists(candidate):
            return candidate
    return path


def load_source(path: str | os.PathLike) -> Source:
    path = resolve_path(path)
    shown = str(path)
    if "\x00" in shown:
        raise KinaError("io", f"cannot read {shown!r}: the path contains a NUL byte", None)
    try:
        if path.is_dir():
            raise KinaError("io", f"{shown}: is a directory, not a .kina file", None)
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            raise KinaError("io", f"{shown}: file is {size} bytes; the limit is "
                            f"{MAX_SOURCE_BYTES}", None)
        # Read at most one byte past the limit: a device or pipe (/dev/zero, a FIFO) has no
        # size to check up front and could otherwise be read forever.
        with path.open("rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as error:
        reason = error.strerror or str(error)
        raise KinaError("io", f"cannot read '{shown}': {reason}", None) from None
    if len(data) > MAX_SOURCE_BYTES:
        raise KinaError("io", f"{shown}: more than the limit of {MAX_SOURCE_BYTES} bytes",
                        None)
    return decode_source(shown, data)


def decode_source(name: str, data: bytes) -> Source:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        # Point at the first undecodable byte in terms of the decodable prefix.
        prefix = data[:error.start].decode("utf-8", errors="replace")
        source = Source(name, prefix + "\ufffd")
        raise KinaError("lex", f"invalid UTF-8 byte 0x{data[error.start]:02x}",
                        Span(source, len(prefix), len(prefix) + 1)) from None
    if "\x00" in text:
        index = text.index("\x00")
        raise KinaError("lex", "NUL byte in source", Span(Source(name, text), index, index + 1))
    return Source(name, text)


def parse_source(source: Source) -> ast.Module:
    return parse(source)


def check_source(source: Source, consts: Mapping[str, int] | None = None) -> CheckedProgram:
    """Parse and check; `consts` sets consts defined by an integer literal to other values."""
    return check_module(parse(source), consts)


def load_program(path: str | os.PathLike) -> CheckedProgram:
    return check_source(load_source(path))


def program_from_text(text: str, name: str = "<string>",
                      consts: Mapping[str, int] | None = None) -> Program:
    """Parse, check and specialise Kina source text into concrete tensor IR."""
    return specialize(check_source(Source(name, text), consts))


__all__ = [
    "CheckedProgram", "DType", "Function", "KinaError", "Obligation", "Operation", "Program",
    "Source", "Span", "TensorType", "Value", "check_source", "decode_source", "format_program",
    "interpret", "load_program", "load_source", "parse_ir", "parse_source", "program_from_text",
    "resolve_path", "specialize",
]
