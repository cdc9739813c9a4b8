"""Kina tokens: identifiers, keywords, numbers, punctuation; `//` and `/* */` comments."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .diagnostics import KinaError, Source, Span

KEYWORDS = frozenset({"const", "fn", "let", "return"})

# One pattern for every token and skipped run, tried at each position; the first
# alternative that matches wins, so `//` and `/*` precede `/`, and `->` precedes `-`.
# Digits are ASCII only (Python's \d would also take other scripts' digits).
_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<open_comment>/\*)
  | (?P<number>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>->|[()\[\]{},;:=+\-*/@])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "keyword", "int", "float", "punct", "eof"
    text: str
    span: Span

    def __str__(self) -> str:
        return f"{self.span.line}:{self.span.column} {self.kind} {self.text!r}"


def tokenize(source: Source) -> list[Token]:
    text = source.text
    tokens: list[Token] = []
    append = tokens.append
    match = _TOKEN.match
    pos, length = 0, len(text)
    while pos < length:
        found = match(text, pos)
        if found is None:
            char = text[pos]
            shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
            raise KinaError("lex", f"unexpected character {shown}", Span(source, pos, pos + 1))
        kind, end = found.lastgroup, found.end()
        if kind == "ident":
            word = found.group()
            append(Token("keyword" if word in KEYWORDS else "ident", word,
                         Span(source, pos, end)))
        elif kind == "punct":
            append(Token("punct", found.group(), Span(source, pos, end)))
        elif kind == "number":
            if end < length and _is_number_tail(text[end]):
                # `12abc`, `1.5e`, `1.2.3`: report the whole run, not a confusing later token.
                stop = end
                while stop < length and _is_number_tail(text[stop]):
                    stop += 1
                raise KinaError("lex", f"malformed number {text[pos:stop]!r}",
                                Span(source, pos, stop),
                                ("numbers look like 4, 0.5, .5, 1e-3 or 2.5E+2",))
            literal = found.group()
            is_float = any(c in literal for c in ".eE")
            append(Token("float" if is_float else "int", literal, Span(source, pos, end)))
        elif kind == "open_comment":
            raise KinaError("lex", "unterminated block comment", Span(source, pos, pos + 2),
                            ("a '/*' comment must be closed by '*/'",))
        pos = end  # spaces and comments are skipped
    tokens.append(Token("eof", "", Span(source, length, length)))
    return tokens


def _is_number_tail(char: str) -> bool:
    """A character that may not directly follow a number (letters, digits, `_`, `.`)."""
    return char.isalnum() or char in "_."
