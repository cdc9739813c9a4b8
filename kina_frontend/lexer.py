"""Kina tokens: identifiers, keywords, numbers, punctuation; `//` and `/* */` comments."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .diagnostics import KinaError, Source, Span

KEYWORDS = frozenset({"const", "fn", "let", "return"})

# Longest punctuation first so `->` wins over `-`.
PUNCTUATION = ("->", "(", ")", "[", "]", "{", "}", ",", ";", ":", "=", "+", "-", "*", "/", "@")

_NUMBER = re.compile(r"(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"[ \t\r\n]+")


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
    pos = 0
    while pos < len(text):
        space = _SPACE.match(text, pos)
        if space:
            pos = space.end()
            continue
        if text.startswith("//", pos):
            newline = text.find("\n", pos)
            pos = len(text) if newline < 0 else newline + 1
            continue
        if text.startswith("/*", pos):
            close = text.find("*/", pos + 2)
            if close < 0:
                raise KinaError("lex", "unterminated block comment", Span(source, pos, pos + 2),
                                ("a '/*' comment must be closed by '*/'",))
            pos = close + 2
            continue
        number = _NUMBER.match(text, pos)
        if number:
            end = number.end()
            if end < len(text) and (text[end].isalnum() or text[end] in "_."):
                # `12abc`, `1.5e`, `1.2.3`: report the whole run, not a confusing later token.
                stop = end
                while stop < len(text) and (text[stop].isalnum() or text[stop] in "_."):
                    stop += 1
                raise KinaError("lex", f"malformed number {text[pos:stop]!r}",
                                Span(source, pos, stop),
                                ("numbers look like 4, 0.5, .5, 1e-3 or 2.5E+2",))
            literal = number.group()
            is_float = any(c in literal for c in ".eE")
            tokens.append(Token("float" if is_float else "int", literal, Span(source, pos, end)))
            pos = end
            continue
        ident = _IDENT.match(text, pos)
        if ident:
            word = ident.group()
            kind = "keyword" if word in KEYWORDS else "ident"
            tokens.append(Token(kind, word, Span(source, pos, ident.end())))
            pos = ident.end()
            continue
        for punct in PUNCTUATION:
            if text.startswith(punct, pos):
                tokens.append(Token("punct", punct, Span(source, pos, pos + len(punct))))
                pos += len(punct)
                break
        else:
            char = text[pos]
            shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
            raise KinaError("lex", f"unexpected character {shown}", Span(source, pos, pos + 1))
    tokens.append(Token("eof", "", Span(source, len(text), len(text))))
    return tokens
