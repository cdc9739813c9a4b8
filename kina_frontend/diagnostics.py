"""Source files, spans and the one error type every stage raises.

A `KinaError` always points at a place: `file:line:col: error[CODE]: message`,
then the source line and a caret run under the offending span, then notes.
The CLI prints it and exits 1; it never surfaces as a Python traceback.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """The text of one `.kina` file and the name used in diagnostics."""

    name: str
    text: str

    def line_starts(self) -> tuple[int, ...]:
        """The offset at which each line starts (computed once per source: the checker
        formats many spans, and a scan per span made large programs quadratic)."""
        starts = self.__dict__.get("_line_starts")
        if starts is None:
            starts = (0, *(match.end() for match in re.finditer("\n", self.text)))
            self.__dict__["_line_starts"] = starts  # a cache, not a field (frozen dataclass)
        return starts

    def location(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        starts = self.line_starts()
        line = bisect.bisect_right(starts, offset)
        return line, offset - starts[line - 1] + 1

    def line_text(self, line: int) -> str:
        starts = self.line_starts()
        if not 0 < line <= len(starts):
            return ""
        end = starts[line] - 1 if line < len(starts) else len(self.text)
        return self.text[starts[line - 1]:end]


@dataclass(frozen=True)
class Span:
    """A half-open character range [start, end) in a source file."""

    source: Source = field(repr=False, compare=False, hash=False)
    start: int
    end: int

    @property
    def line(self) -> int:
        return self.source.location(self.start)[0]

    @property
    def column(self) -> int:
        return self.source.location(self.start)[1]

    def to(self, other: Span) -> Span:
        """The span covering both `self` and `other`."""
        return Span(self.source, min(self.start, other.start), max(self.end, other.end))

    def __str__(self) -> str:
        return f"{self.source.name}:{self.line}:{self.column}"


# Stable error codes, grouped by stage (docs/errors.md lists them all).
ERROR_CODES = {
    "lex": "K100",
    "syntax": "K200",
    "name": "K300",
    "arity": "K310",
    "type": "K400",
    "shape": "K410",
    "unsupported": "K500",
    "io": "K600",
    "autodiff": "K700",
    "ir": "K750",
    "lowering": "K800",
    "run": "K900",
}


class KinaError(Exception):
    """A diagnostic with a location, a message class and optional notes."""

    def __init__(self, kind: str, message: str, span: Span | None, notes: tuple[str, ...] = ()):
        if kind not in ERROR_CODES:
            raise ValueError(f"unknown diagnostic kind {kind!r}")
        self.kind = kind
        self.code = ERROR_CODES[kind]
        self.message = message
        self.span = span
        self.notes = (notes,) if isinstance(notes, str) else tuple(notes)
        super().__init__(self.render())

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span else None

    def render(self) -> str:
        if self.span is None:
            lines = [f"error[{self.code}]: {self.message}"]
        else:
            lines = [f"{self.span}: error[{self.code}]: {self.message}"]
            lines.extend(_excerpt(self.span))
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def _excerpt(span: Span) -> list[str]:
    line, column = span.source.location(span.start)
    text = span.source.line_text(line).rstrip("\r")  # CRLF files: no stray carriage return
    # Keep excerpts readable for minified or generated one-line programs.
    if len(text) > 160:
        lo = max(0, column - 60)
        text, column = text[lo:lo + 160], column - lo
    end_line, _ = span.source.location(max(span.start, span.end - 1))
    width = max(1, span.end - span.start) if end_line == line else len(text) - column + 1
    width = max(1, min(width, len(text) - column + 1))
    gutter = f"{line:>4} | "
    printable = text.replace("\t", " ")
    return [gutter + printable, " " * (len(gutter) + column - 1) + "^" * width]
