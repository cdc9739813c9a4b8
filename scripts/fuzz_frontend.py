#!/usr/bin/env python3
"""Fuzz the Kina frontend: every input ends in success or a located KinaError.

    python scripts/fuzz_frontend.py                         # 20 000 cases, seed 0
    python scripts/fuzz_frontend.py --cases 200000 --seed 7 --findings fuzz-findings/
    python scripts/fuzz_frontend.py --replay 7:1234         # rerun one case, show the input

Each case takes a seed program (the bundled examples, the bad programs of
tests/test_diagnostics.py, the examples in docs/errors.md, generated programs from
tests/progen.py) and applies one strategy: character edits (delete, insert, swap, replace,
duplicate), line edits, token edits that keep the token's kind (so the checker sees the
mutant, not only the parser), splices of two programs, random token streams, random
grammar-shaped programs, raw random bytes, byte flips that break UTF-8, huge literals,
deep nesting, and long programs. The frontend (decode, lex, parse, check, specialise, and
the `--emit types` report) then runs under a time budget. A case passes when it succeeds
or raises a `KinaError` whose rendering starts `FILE:LINE:COL: error[CODE]:` with a line
and column inside the source. Anything else -- another exception, a timeout, an error
without a location -- is a finding. Every `--compile-every`-th successful case also goes
through tilegen (JIT), is called on generated inputs and compared with the interpreter.

Cases are reproducible: case i of seed s draws from random.Random(f"{s}:{i}"), so
`--replay s:i` rebuilds exactly that input. Exit status 1 when there are findings.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from kina_frontend import KinaError, Source, check_source, decode_source, specialize  # noqa: E402
from kina_frontend.lexer import tokenize  # noqa: E402
from kina_frontend.parser import MAX_NESTING  # noqa: E402
from kina_frontend.report import types_report  # noqa: E402

CASE_NAME = "fuzz.kina"
DEFAULT_BUDGET = 5.0  # seconds per case before it counts as a hang
MAX_COMPILE_ELEMENTS = 100_000  # programs with larger values are not compiled
_LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): error\[K\d{3}\]: ")


# ---- seed programs --------------------------------------------------------------------------

def seed_corpus(generated: int = 24, valid_weight: int = 4) -> list[str]:
    """The programs mutants start from. Valid programs appear `valid_weight` times each, so
    most mutants are one edit away from a program that checks (and reach the checker);
    the bad programs of the diagnostics catalogue make up the rest."""
    # minilm_l6.kina (370 lines, 101 weights per signature) is left out: a mutant of it
    # costs a whole BERT to check, and it would shift every mutant the fixed seeds make.
    valid = [p.read_text() for p in sorted((REPO / "examples").rglob("*.kina"))
             if p.name != "minilm_l6.kina"]
    invalid = re.findall(r"```kina\n(.*?)```", (REPO / "docs" / "errors.md").read_text(),
                         re.DOTALL)
    with contextlib.suppress(ImportError):  # the test helpers need pytest and hypothesis
        from tests.test_diagnostics import _EXAMPLE, CASES

        valid.append(_EXAMPLE)
        invalid += [case.source for case in CASES]
    with contextlib.suppress(ImportError):
        from tests.progen import generate_program

        valid += [generate_program(np.random.default_rng(seed)).source
                  for seed in range(generated)]
    return valid * valid_weight + invalid


# ---- strategies -----------------------------------------------------------------------------

# Characters worth inserting: mostly Kina's own (punctuation, token starts, whitespace), so
# mutants get past the lexer; sometimes a foreign one (a carriage return, non-ASCII letters
# and digits, a Unicode line separator, controls, a BOM, NUL, an emoji).
KINA_CHARS = "()[]{},;:=+-*/@._ \t\n0123456789eETDxyzFIH"
EXOTIC_CHARS = ("<>!#$%^&|~'\"\\?`\r\u00e9\u0663\u2028\ufeff\x00\x07\x1b\u200b"
                "\U0001f600")


def _char(rng) -> str:
    return rng.choice(EXOTIC_CHARS if rng.random() < 0.1 else KINA_CHARS)
# Whole tokens for token-level edits and random streams.
PIECES = ("(", ")", "[", "]", "{", "}", ",", ";", ":", "=", "+", "-", "*", "/", "@", "->",
          "fn", "let", "const", "return", "Tensor", "F32", "I64", "F64", "BF16", "@host",
          "@device", "@main", "x", "y", "T", "D", "ids", "axis=", "wrt=", "reverseMode",
          "placeholder", "matmul", "gather", "one_hot", "softmax", "log_softmax", "sum",
          "max", "argmax", "reshape", "transpose", "broadcast", "exp", "log", "sqrt", "tanh",
          "neg", "add", "sub", "mul", "div", "scatter_add", "fill", "cast", "0", "1", "-1",
          "2", "3", "4", "36", "2.5", "0.5", "1e-3", ".5", "1e38", "1e39", "[]", "[1, T]",
          "Tensor[F32, [], @host]", "Tensor[I64, [1, T], @host]", "(x, x)", "/*", "*/",
          "//", "\n", "9223372036854775807", "9223372036854775808", "2147483647",
          "2147483648")
OPS = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "matmul", "gather",
       "one_hot", "softmax", "log_softmax", "sum", "max", "argmax", "reshape", "transpose",
       "broadcast", "scatter_add", "fill", "cast")


def _edits(rng) -> int:
    """Edits per mutant: usually one, so many mutants stay close to a valid program."""
    return rng.choice((1, 1, 1, 1, 2, 2, 3, 6))


def _position(rng, text: str) -> int:
    return rng.randrange(len(text) + 1)


def char_delete(rng, corpus) -> str:
    text = rng.choice(corpus)
    for _ in range(_edits(rng)):
        if not text:
            break
        start = rng.randrange(len(text))
        text = text[:start] + text[start + rng.choice((1, 1, 1, 2, 5, 20)):]
    return text


def char_insert(rng, corpus) -> str:
    text = rng.choice(corpus)
    for _ in range(_edits(rng)):
        at = _position(rng, text)
        text = text[:at] + "".join(_char(rng) for _ in range(rng.randint(1, 3))) \
            + text[at:]
    return text


def char_swap(rng, corpus) -> str:
    chars = list(rng.choice(corpus))
    for _ in range(_edits(rng)):
        if len(chars) < 2:
            break
        i = rng.randrange(len(chars) - 1)
        j = i + 1 if rng.random() < 0.7 else rng.randrange(len(chars))
        chars[i], chars[j] = chars[j], chars[i]
    return "".join(chars)


def char_replace(rng, corpus) -> str:
    chars = list(rng.choice(corpus))
    for _ in range(_edits(rng)):
        if chars:
            chars[rng.randrange(len(chars))] = _char(rng)
    return "".join(chars)


def span_duplicate(rng, corpus) -> str:
    text = rng.choice(corpus)
    if not text:
        return text
    start = rng.randrange(len(text))
    end = min(len(text), start + rng.randint(1, 80))
    at = _position(rng, text)
    return text[:at] + text[start:end] + text[at:]


def line_edit(rng, corpus) -> str:
    lines = rng.choice(corpus).split("\n")
    for _ in range(_edits(rng)):
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        action = rng.randrange(3)
        if action == 0 and len(lines) > 1:
            del lines[i]
        elif action == 1:
            lines.insert(i, lines[j])
        else:
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _tokens(text: str):
    try:
        return [t for t in tokenize(Source("x", text)) if t.kind != "eof"]
    except KinaError:
        return []


def token_edit(rng, corpus) -> str:
    """Replace, delete or insert tokens; most replacements keep the kind (a name for a name,
    a number for a number) so the mutant usually parses and reaches the checker."""
    text = rng.choice(corpus)
    for _ in range(_edits(rng)):
        tokens = _tokens(text)
        if not tokens:
            break
        token = rng.choice(tokens)
        action = rng.randrange(10)
        if action < 6:
            replacement = _same_kind(rng, token, tokens)
        elif action < 7:
            replacement = ""
        else:
            replacement = rng.choice(PIECES)
        start, end = token.span.start, token.span.end
        if action == 9:
            replacement, end = replacement + " ", start  # insert before the token
        text = text[:start] + replacement + text[end:]
    return text


# Punctuation that can stand in for each other without breaking the grammar.
_SIMILAR_PUNCT = {"+": "+-*/@", "-": "+-*/@", "*": "+-*/@", "/": "+-*/@", "@": "+-*/@"}


def _same_kind(rng, token, tokens) -> str:
    if token.kind == "punct":
        return rng.choice(_SIMILAR_PUNCT.get(token.text, token.text))
    if token.kind in ("int", "float"):
        return rng.choice(["0", "1", "2", "3", "4", "-1", "7", "0.5"] +
                          [t.text for t in tokens if t.kind in ("int", "float")])
    same = [t.text for t in tokens if t.kind == token.kind] or [token.text]
    return rng.choice(same + (list(OPS) if token.kind == "ident" else []))


def splice(rng, corpus) -> str:
    first, second = rng.choice(corpus), rng.choice(corpus)
    a, b = _position(rng, first), _position(rng, second)
    return first[:a] + second[b:]


def random_tokens(rng, corpus) -> str:
    return " ".join(rng.choice(PIECES) for _ in range(rng.randint(0, 200)))


def random_bytes(rng, corpus) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))


# Byte sequences that are not UTF-8: a stray continuation byte, a truncated lead byte,
# overlong encodings, an encoded surrogate, values past U+10FFFF, 0xfe/0xff.
BAD_UTF8 = (b"\x80", b"\xc3", b"\xc3(", b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80", b"\xfe", b"\xff", b"\xe2\x82", b"\xf0\x9f\x98")


def byte_flip(rng, corpus) -> bytes:
    data = bytearray(rng.choice(corpus).encode("utf-8"))
    for _ in range(_edits(rng)):
        at = rng.randrange(len(data) + 1)
        if rng.random() < 0.5 and data and at < len(data):
            data[at] ^= 1 << rng.randrange(8)
        else:
            data[at:at] = rng.choice(BAD_UTF8)
    return bytes(data)


def huge_literal(rng, corpus) -> str:
    """Swap a number (or insert one) for an enormous or extreme literal."""
    digits = rng.choice((20, 300, 5000, 50_000))
    literal = rng.choice((
        "9" * digits, "1" + "0" * digits, "0" * digits + "7", "1" * digits + ".5",
        "0." + "0" * digits + "1", f"1e{rng.choice((38, 39, 308, 309, 400, 10**9))}",
        f"1e-{rng.choice((45, 46, 324, 10**9))}", "3.4028235e38", "3.4028236e38",
        "9223372036854775807", "9223372036854775808", "2147483647", "2147483648",
        "17179869184", "1e" + "9" * 30,
    ))
    text = rng.choice(corpus)
    numbers = [t for t in _tokens(text) if t.kind in ("int", "float")]
    if numbers and rng.random() < 0.85:
        token = rng.choice(numbers)
        return text[:token.span.start] + literal + text[token.span.end:]
    at = _position(rng, text)
    return text[:at] + literal + text[at:]


def deep_nesting(rng, corpus) -> str:
    """An expression nested around the limit or far beyond it, in every nesting form."""
    depth = rng.choice((MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 1000, 20_000))
    form = rng.randrange(7)
    if form == 0:
        expr = "exp(" * depth + "x" + ")" * depth
    elif form == 1:
        expr = "(" * depth + "x" + ")" * depth
    elif form == 2:
        expr = "-" * depth + "x"
    elif form == 3:
        expr = " + ".join(["x"] * depth)
    elif form == 4:
        expr = "reshape(x, " + "[" * depth + "2" + "]" * depth + ")"
    elif form == 5:
        expr = "x" + "(x)" * depth  # call of a call of a call ...
    else:
        body = "Tensor[F32, [" * depth + "]" * (2 * depth)
        return f"fn f(x: {body}) {{}}\n"
    if rng.random() < 0.3:  # unbalanced: cut the tail off
        expr = expr[: len(expr) // 2]
    typ = "Tensor[F32, [2, 3], @host]"
    return f"fn f(x: {typ}) -> {typ} {{\n  return {expr};\n}}\n"


def long_program(rng, corpus, lines: int | None = None) -> str:
    """Thousands of lines: repeated valid functions, then optionally one mutation."""
    return make_long_program(lines or rng.choice((2000, 5000)), rng)


def make_long_program(lines: int, rng=None) -> str:
    """A valid program of about `lines` lines: functions of ten `let`s each, mixing
    elementwise ops, reductions, softmax, reshapes and calls of the previous function."""
    header = ["const T = 4;", "const H = 2;", "const D = 2 * H;"]
    out = header[:]
    typ = "Tensor[F32, [1, T, D], @host]"
    index = 0
    while len(out) < lines - 12:
        out.append(f"fn f{index}(x: {typ}, y: {typ}) -> {typ} {{")
        out.append("  let a = add(x, y);")
        out.append("  let b = softmax(a * 0.5, axis=2);")
        out.append("  let c = reshape(b, [1, T, H, 2]);")
        out.append("  let d = reshape(transpose(c, [0, 1, 3, 2]), [1, T, D]);")
        out.append("  let e = exp(tanh(d)) - y;")
        out.append("  let s = broadcast(reshape(sum(e, axis=2), [1, T, 1]), [1, T, D]);")
        call = f"f{index - 1}(e, s)" if index else "neg(e)"
        out.append(f"  let g = {call};")
        out.append("  let h = mul(g, x) / (exp(s) + 1.0);")
        out.append("  return log_softmax(h, axis=1);")
        out.append("}")
        index += 1
    text = "\n".join(out) + "\n"
    if rng is not None and rng.random() < 0.5:
        text = rng.choice((char_delete, char_insert, token_edit))(rng, [text])
    return text


def grammar_program(rng, corpus) -> str:
    """A random program in Kina's grammar. Each function has a base type most of its
    parameters share and ops are applied with mostly plausible arguments, so some programs
    check; the rest fail on types, shapes, arities or names all over the checker."""
    lines, consts = [], []
    for index in range(rng.randint(0, 3)):
        name = rng.choice(("T", "D", "H", "N")) + str(index)
        if consts and rng.random() < 0.5:
            value = f"{rng.choice(consts)} {rng.choice('+-*/')} {rng.choice(consts + ['2'])}"
        else:
            value = rng.choice(("1", "2", "3", "4", "4", "0", "-1", "2147483648"))
        lines.append(f"const {name} = {value};")
        consts.append(name)

    def dim() -> str:
        return rng.choice(consts + ["1", "2", "3", "4", "8"])

    def ttype(rank: int | None = None, dtype: str | None = None) -> str:
        if dtype is None:
            dtype = rng.choices(("F32", "I64", "F64", "BF16", "Q"), (20, 4, 1, 1, 1))[0]
        rank = rng.choice((0, 1, 2, 2, 3, 3, 4, 5)) if rank is None else rank
        place = "host" if rng.random() < 0.95 else rng.choice(("device", "mesh"))
        return f"Tensor[{dtype}, [{', '.join(dim() for _ in range(rank))}], @{place}]"

    functions: list[tuple[str, int]] = []
    for findex in range(rng.randint(1, 3)):
        rank = rng.choice((1, 2, 3, 4))
        base = ttype(rank, "F32")
        params = [f"p{i}" for i in range(rng.randint(1, 3))]
        types = [base if rng.random() < 0.8 else ttype() for _ in params]
        scope = list(params)

        def expr(depth: int = 0, scope=scope, params=params, rank=rank) -> str:
            name = rng.choice(scope)
            choice = rng.randrange(12 if depth < 2 else 4)
            if choice == 0:
                return rng.choice(("1.5", "2", "-1", "0.0", "[1, 2]", "[]", "q", name))
            if choice <= 2:
                return name
            if choice == 3:
                return f"{rng.choice(('exp', 'log', 'sqrt', 'tanh', 'neg'))}({name})"
            if choice == 4:
                return f"{expr(depth + 1)} {rng.choice('+-*/')} {expr(depth + 1)}"
            if choice == 5:
                return f"{name} {rng.choice('+-*/')} {rng.choice(('2.0', '0.5', '1e-3'))}"
            if choice == 6:
                op = rng.choice(("sum", "max", "softmax", "log_softmax", "argmax"))
                return f"{op}({expr(depth + 1)}, axis={rng.randint(-1, rank)})"
            if choice == 7:
                perm = list(range(rank))
                rng.shuffle(perm)
                return f"transpose({name}, {perm})"
            if choice == 8:
                dims = [dim() for _ in range(rng.randint(1, 4))]
                op = rng.choice(("reshape", "broadcast"))
                return f"{op}({name}, [{', '.join(dims)}])"
            if choice == 9:
                op = rng.choice(("matmul", "add", "mul", "sub", "div", "scatter_add"))
                return f"{op}({name}, {rng.choice(scope)})"
            if choice == 10:
                op = rng.choice(("gather", "one_hot"))
                return f"{op}({name}, {rng.choice((rng.choice(scope), dim()))})"
            if functions:
                callee, arity = rng.choice(functions)
                count = arity + rng.choice((0, 0, 1))
                args = ", ".join(rng.choice(scope) for _ in range(count))
                if rng.random() < 0.3:
                    return f"reverseMode({callee}, wrt=[{rng.choice(params)}])({args})"
                return f"{callee}({args})"
            return name

        body = []
        for index in range(rng.randint(0, 5)):
            roll = rng.random()
            if roll < 0.08:
                body.append(f"  let v{index} = placeholder({ttype()});")
            elif roll < 0.18:
                body.append(f"  let (v{index}, w{index}) = {expr()};")
                scope.append(f"w{index}")
            else:
                annotation = f": {base}" if roll > 0.9 else ""
                body.append(f"  let v{index}{annotation} = {expr()};")
            scope.append(f"v{index}")
        result = ""
        if rng.random() < 0.85:
            result = f" -> {base if rng.random() < 0.8 else ttype()}"
            body.append(f"  return {rng.choice(scope) if rng.random() < 0.7 else expr()};")
        signature = ", ".join(f"{p}: {t}" for p, t in zip(params, types, strict=True))
        attribute = "@main\n" if rng.random() < 0.1 else ""
        name = f"g{findex}"
        lines.append(f"{attribute}fn {name}({signature}){result} {{")
        lines += body
        lines.append("}")
        functions.append((name, len(params)))
    return "\n".join(lines) + "\n"


STRATEGIES: dict[str, Callable] = {
    "char-delete": char_delete,
    "char-insert": char_insert,
    "char-swap": char_swap,
    "char-replace": char_replace,
    "span-duplicate": span_duplicate,
    "line-edit": line_edit,
    "token-edit": token_edit,
    "splice": splice,
    "random-tokens": random_tokens,
    "grammar": grammar_program,
    "random-bytes": random_bytes,
    "byte-flip": byte_flip,
    "huge-literal": huge_literal,
    "deep-nesting": deep_nesting,
    "long-program": long_program,
}
# Relative frequencies: the cheap edits dominate; long programs are rare (each costs ~1 s).
WEIGHTS = {"char-delete": 10, "char-insert": 10, "char-swap": 8, "char-replace": 8,
           "span-duplicate": 5, "line-edit": 6, "token-edit": 20, "splice": 5,
           "random-tokens": 5, "grammar": 12, "random-bytes": 3, "byte-flip": 4,
           "huge-literal": 4, "deep-nesting": 3, "long-program": 0.05}


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    strategy: str
    data: str | bytes

    @property
    def label(self) -> str:
        return f"{self.seed}:{self.index} ({self.strategy})"


def make_case(seed: int, index: int, corpus: list[str],
              strategies: tuple[str, ...] | None = None) -> Case:
    import random

    rng = random.Random(f"{seed}:{index}")
    names = list(strategies or STRATEGIES)
    strategy = rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
    return Case(seed, index, strategy, STRATEGIES[strategy](rng, corpus))


# ---- the oracle ------------------------------------------------------------------------------

class CaseTimeout(BaseException):
    """Raised inside the frontend when a case runs past its budget."""


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Interrupt the block after `seconds` (SIGALRM; main thread only, else unbounded)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    status: str  # "ok" | "error" | "finding"
    elapsed: float
    code: str = ""
    detail: str = ""
    program: object = None  # the specialised program, on success


def run_frontend(data: str | bytes, name: str = CASE_NAME,
                 budget: float = DEFAULT_BUDGET) -> Outcome:
    """Decode, lex, parse, check, specialise and print the types report; classify the end."""
    started = time.perf_counter()
    try:
        with time_budget(budget):
            source = decode_source(name, data) if isinstance(data, bytes) else Source(name, data)
            checked = check_source(source)
            program = specialize(checked)
            types_report(checked, name)
    except KinaError as error:
        elapsed = time.perf_counter() - started
        problem = diagnostic_problem(error, source_text(data), name)
        if problem:
            return Outcome("finding", elapsed, error.code, problem)
        return Outcome("error", elapsed, error.code)
    except CaseTimeout as error:
        return Outcome("finding", time.perf_counter() - started, "timeout", str(error))
    except BaseException as error:  # noqa: BLE001 -- anything else is what we hunt for
        if isinstance(error, KeyboardInterrupt):
            raise
        return Outcome("finding", time.perf_counter() - started, type(error).__name__,
                       _traceback_tail(error))
    return Outcome("ok", time.perf_counter() - started, program=program)


def source_text(data: str | bytes) -> str | None:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None  # the error is about the bytes; its location is checked by decode tests


def diagnostic_problem(error: KinaError, text: str | None, name: str) -> str:
    """'' when the error renders as FILE:LINE:COL with a caret inside the source."""
    try:
        rendered = str(error)
    except Exception as failure:  # noqa: BLE001
        return f"rendering the error raised {type(failure).__name__}: {failure}"
    if error.span is None:
        return f"error without a location: {rendered}"
    match = _LOCATED.match(rendered)
    if match is None or match.group("file") != name:
        return f"rendering does not start FILE:LINE:COL: {rendered[:200]!r}"
    line, column = int(match.group("line")), int(match.group("col"))
    if text is not None:
        lines = text.split("\n")
        if not 1 <= line <= len(lines) or not 1 <= column <= len(lines[line - 1]) + 1:
            return f"location {line}:{column} is outside the source: {rendered[:200]}"
    excerpt = rendered.split("\n")
    if len(excerpt) < 3 or "^" not in excerpt[2]:
        return f"no source excerpt with a caret: {rendered[:200]!r}"
    return ""


def _traceback_tail(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(error).__name__}: {str(error)[:300]} at {where}"


# ---- compile, run and compare a successful case ---------------------------------------------

def largest_value(program) -> int:
    sizes = [math.prod(v.type.concrete_shape) for f in program.functions
             for v in (*f.params, *(r for op in f.body for r in op.results))]
    return max(sizes, default=0)


def compile_and_compare(program, rng: np.random.Generator,
                        budget: float = 4 * DEFAULT_BUDGET) -> str:
    """'' when every function compiles (JIT), runs on generated inputs and matches the
    interpreter within `budget` seconds; otherwise a description of the finding."""
    try:
        with time_budget(budget):
            return _compile_and_compare(program, rng)
    except CaseTimeout as error:
        return f"compile/run: {error}"


def _compile_and_compare(program, rng: np.random.Generator) -> str:
    from kina_frontend import interpret
    from kina_frontend.ops.indexing import IdOutOfRange
    from kina_frontend.transforms import inline_calls, placeholders_to_params
    from tilegen.api import compile_program
    from tilegen.runtime import IdOutOfRangeError

    try:
        module = compile_program(program, jit=True)
        for function in program.functions:
            # Inlined but not pruned: ids that only reach a dead gather are still checked
            # by the interpreter, so they must be in range too.
            whole = placeholders_to_params(function) if function.is_main else function
            inputs = _inputs(inline_calls(program, whole), rng)
            compiled = getattr(module, function.name)
            try:
                got = compiled(*inputs)
            except IdOutOfRangeError:
                got = None
            try:
                if function.is_main:  # its own parameters first, then the placeholders
                    count = len(function.params)
                    want = interpret(program, function.name, *inputs[:count],
                                     placeholders=inputs[count:])
                else:
                    want = interpret(program, function.name, *inputs)
            except IdOutOfRange:
                want = None
            problem = _compare(function.name, got, want)
            if problem:
                return problem
    except KinaError as error:
        return f"compiling a checked program raised {error.code}: {str(error)[:300]}"
    except Exception as error:  # noqa: BLE001
        return "compile/run: " + _traceback_tail(error)
    return ""


def _inputs(function, rng: np.random.Generator) -> list[np.ndarray]:
    from tilegen.run_inputs import id_limits

    limits = id_limits(function)
    inputs = []
    for param in function.params:
        shape = param.type.concrete_shape
        if param.type.dtype.is_float:
            inputs.append(rng.standard_normal(shape).astype(param.type.dtype.numpy))
        else:
            inputs.append(rng.integers(0, limits.get(param.name, 3), size=shape,
                                       dtype=np.int64))
    return inputs


def _compare(name: str, got, want) -> str:
    if (got is None) != (want is None):
        return (f"{name}: compiled code raised an id-range error, the interpreter did not"
                if got is None else
                f"{name}: the interpreter raised an id-range error, compiled code did not")
    if got is None:
        return ""
    got = got if isinstance(got, tuple) else (got,)
    if len(got) != len(want):
        return f"{name}: {len(got)} results, the interpreter gives {len(want)}"
    for index, (have, expected) in enumerate(zip(got, want, strict=True)):
        if have.shape != expected.shape or have.dtype != expected.dtype:
            return f"{name}: result {index} is {have.dtype}{list(have.shape)}, expected " \
                   f"{expected.dtype}{list(expected.shape)}"
        if expected.dtype.kind != "f":
            if not np.array_equal(have, expected):
                return f"{name}: result {index} differs from the interpreter"
            continue
        finite = expected[np.isfinite(expected)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        if not np.allclose(have, expected, rtol=1e-3, atol=1e-4 * scale, equal_nan=True):
            worst = float(np.nanmax(np.abs(have.astype(np.float64) - expected)))
            return f"{name}: result {index} differs from the interpreter (max |diff| {worst:.3g})"
    return ""


# ---- the campaign ---------------------------------------------------------------------------

@dataclass
class Finding:
    case: Case
    kind: str
    detail: str


@dataclass
class Report:
    cases: int = 0
    elapsed: float = 0.0
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    codes: collections.Counter = field(default_factory=collections.Counter)
    strategies: collections.Counter = field(default_factory=collections.Counter)
    compiled: int = 0
    slowest: tuple[float, str] = (0.0, "")
    findings: list[Finding] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.cases} cases in {self.elapsed:.1f} s "
                 f"({self.cases / max(self.elapsed, 1e-9):.0f}/s): "
                 f"{self.outcomes['ok']} accepted, {self.outcomes['error']} KinaErrors, "
                 f"{len(self.findings)} findings; {self.compiled} accepted programs compiled, "
                 "run and compared with the interpreter",
                 f"slowest case {self.slowest[0]:.2f} s: {self.slowest[1]}",
                 "error codes: " + ", ".join(f"{c} {n}" for c, n in sorted(self.codes.items())),
                 "strategies: " + ", ".join(f"{s} {n}" for s, n in
                                            self.strategies.most_common())]
        seen = set()
        for finding in self.findings:
            key = (finding.kind, finding.detail.split(" at ")[-1][:120])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"FINDING {finding.case.label}: [{finding.kind}] {finding.detail}")
        return "\n".join(lines)


def run_campaign(cases: int, seed: int = 0, budget: float = DEFAULT_BUDGET,
                 compile_every: int = 0, strategies: tuple[str, ...] | None = None,
                 corpus: list[str] | None = None, start: int = 0,
                 time_limit: float | None = None, findings_dir: Path | None = None,
                 progress: Callable[[Report], None] | None = None) -> Report:
    corpus = corpus if corpus is not None else seed_corpus()
    report = Report()
    rng = np.random.default_rng(seed)
    accepted = 0
    began = time.perf_counter()
    for index in range(start, start + cases):
        case = make_case(seed, index, corpus, strategies)
        outcome = run_frontend(case.data, budget=budget)
        report.cases += 1
        report.outcomes[outcome.status] += 1
        report.strategies[case.strategy] += 1
        if outcome.code and outcome.status == "error":
            report.codes[outcome.code] += 1
        if outcome.elapsed > report.slowest[0]:
            report.slowest = (outcome.elapsed, case.label)
        if outcome.status == "finding":
            _record(report, Finding(case, outcome.code, outcome.detail), findings_dir)
        elif outcome.status == "ok":
            accepted += 1
            if compile_every and accepted % compile_every == 0 and \
                    largest_value(outcome.program) <= MAX_COMPILE_ELEMENTS:
                report.compiled += 1
                problem = compile_and_compare(outcome.program, rng, budget * 4)
                if problem:
                    _record(report, Finding(case, "compile", problem), findings_dir)
        if progress is not None and report.cases % 1000 == 0:
            progress(report)
        if time_limit is not None and time.perf_counter() - began > time_limit:
            break
    report.elapsed = time.perf_counter() - began
    return report


def _record(report: Report, finding: Finding, findings_dir: Path | None) -> None:
    report.findings.append(finding)
    if findings_dir is None:
        return
    findings_dir.mkdir(parents=True, exist_ok=True)
    stem = f"seed{finding.case.seed}-case{finding.case.index}-{finding.kind}"
    data = finding.case.data
    (findings_dir / f"{stem}.kina").write_bytes(data if isinstance(data, bytes)
                                                else data.encode("utf-8", "surrogatepass"))
    (findings_dir / f"{stem}.txt").write_text(f"{finding.case.label}\n{finding.detail}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20_000, help="number of cases (20 000)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (0)")
    parser.add_argument("--start", type=int, default=0, help="first case index (0)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help=f"seconds per case before it is a hang ({DEFAULT_BUDGET})")
    parser.add_argument("--compile-every", type=int, default=50, metavar="N",
                        help="compile, run and compare every Nth accepted program (50; 0: off)")
    parser.add_argument("--strategy", action="append", choices=sorted(STRATEGIES),
                        help="only these strategies (repeatable; default: all)")
    parser.add_argument("--time-limit", type=float, help="stop after this many seconds")
    parser.add_argument("--findings", type=Path, metavar="DIR",
                        help="write each finding's input (.kina) and description (.txt) here")
    parser.add_argument("--replay", metavar="SEED:INDEX",
                        help="rebuild one case, print its input and its outcome")
    args = parser.parse_args(argv)
    corpus = seed_corpus()
    if args.replay:
        seed, index = (int(part) for part in args.replay.split(":"))
        case = make_case(seed, index, corpus, tuple(args.strategy or ()) or None)
        shown = case.data if isinstance(case.data, str) else repr(case.data)
        print(f"case {case.label}, {len(case.data)} characters/bytes:\n{shown[:4000]}")
        outcome = run_frontend(case.data, budget=args.budget)
        print(f"-> {outcome.status} {outcome.code} in {outcome.elapsed:.3f} s {outcome.detail}")
        return 1 if outcome.status == "finding" else 0

    def progress(report: Report) -> None:
        print(f"  {report.cases} cases, {len(report.findings)} findings, "
              f"{time.perf_counter() - began:.0f} s", file=sys.stderr)

    began = time.perf_counter()
    report = run_campaign(args.cases, args.seed, args.budget, args.compile_every,
                          tuple(args.strategy) if args.strategy else None, corpus, args.start,
                          args.time_limit, args.findings, progress)
    print(report.summary())
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
