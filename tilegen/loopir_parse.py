"""Reads the text `loopir.format_kernel` prints back into a `Kernel`.

The printed form is fully parenthesised and names every buffer with its type, so the
grammar is small: a kernel header (buffers, id-check sites), then statements (`for`,
`let`, stores, `gemm`, `attention`) whose expressions are constants (`0.5:f32`, `3`), variables,
loads `buf[i, j]`, `(a op b)`, calls `exp(x)` / `max(a, b)` / `select(c, a, b)` /
`f64(x)`, reductions `sum[k < 4 vector<16>](...)` and `checked(v < n, site s, at [...])`.
"""

from __future__ import annotations

import json
import re

from kina_frontend.diagnostics import KinaError, Source, Span

from . import attention_ir
from . import loopir as L

_TOKEN = re.compile(r"""(?:\s|\#[^\n]*)*(?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<number>-?(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+|inf|nan)(?::(?:f32|f64|i1))?)
    | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
    | (?P<punct>\.\.|//|<=|>=|==|!=|&&|\|\||[@:,=()\[\]{}<>+\-*/%])
    )""", re.VERBOSE)

# `#` starts a comment to the end of the line (the emit-plan stage's notes).
_COMMENTS = re.compile(r"#[^\n]*")

_SYMBOLS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod",
            "<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge",
            "&&": "and", "||": "or"}


class LoopIRParseError(KinaError):
    """Malformed loop IR text: a KinaError (kind `ir`) at its line and column."""

    def __init__(self, message: str, span: Span | None = None):
        super().__init__("ir", message, span)


def parse_kernel(text: str, name: str = "<loop ir>", verify: bool = False) -> L.Kernel:
    """Read `format_kernel` text back (one kernel). Malformed text raises
    `LoopIRParseError`, a `KinaError` at the line and column of the token where reading
    failed; with `verify`, a kernel that breaks an invariant of the loop IR
    (tilegen/loopir_verify.py) is a KinaError at the statement that breaks it."""
    kernels = parse_kernels(text, name, verify)
    if len(kernels) != 1:
        raise LoopIRParseError(f"expected one kernel, found {len(kernels)}",
                               Span(Source(name, text), 0, 1))
    return kernels[0]


def parse_kernels(text: str, name: str = "<loop ir>",
                  verify: bool = False) -> tuple[L.Kernel, ...]:
    """Every kernel of a `.loops` file (the text `--emit loops` prints), in order. Reading
    alone checks only the grammar, names and types as it goes (tests build odd kernels
    this way); `verify=True` adds the loop-IR verifier, as `.loops` input does."""
    parser = _Parser(Source(name, text))
    kernels = []
    try:
        while parser.peek() == "kernel" or not kernels:
            kernels.append(parser.kernel())
            if verify:
                _verify(parser, kernels[-1])
        if parser.tokens[parser.at][0] != "eof":
            raise parser.error(f"expected 'kernel' or the end of the file, found "
                               f"{parser.peek()!r}")
        return tuple(kernels)
    except LoopIRParseError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as error:
        # A token of the right kind with a value the grammar cannot take (a number too
        # long for int, a bad string literal, an operator symbol that is no operator).
        raise parser.error(f"malformed loop IR: {type(error).__name__}: {error}",
                           max(parser.at - 1, 0)) from None


def _verify(parser: _Parser, kernel: L.Kernel) -> None:
    from .loopir_verify import LoopIRVerifyError, verify_kernel

    try:
        verify_kernel(kernel)
    except LoopIRVerifyError as error:
        span = parser.spans.get(id(error.stmt)) or parser.kernel_span
        raise LoopIRParseError(error.reason, span) from None


class _Parser:
    def __init__(self, source: Source):
        self.source = source
        text = source.text
        # (kind, text, start offset) per token.
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while _COMMENTS.sub("", text[position:]).strip():
            match = _TOKEN.match(text, position)
            if match is None:
                at = position + len(text[position:]) - len(text[position:].lstrip())
                raise LoopIRParseError(f"cannot read loop IR at {text[at:at + 30]!r}",
                                       Span(source, at, at + 1))
            kind = match.lastgroup
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            position = match.end()
        self.tokens.append(("eof", "", len(text)))
        self.at = 0
        self.buffers: dict[str, L.Buffer] = {}
        self.scopes: list[dict[str, str]] = [{}]  # variable name -> dtype
        # Where each statement starts (by object identity: equal statements are distinct),
        # for the verifier's errors.
        self.spans: dict[int, Span] = {}
        self.kernel_span: Span | None = None

    # ---- tokens -------------------------------------------------------------------------------

    def error(self, message: str, at: int | None = None) -> LoopIRParseError:
        _, text, start = self.tokens[self.at if at is None else at]
        return LoopIRParseError(message, Span(self.source, start, start + max(len(text), 1)))

    def peek(self, offset: int = 0) -> str:
        return self.tokens[min(self.at + offset, len(self.tokens) - 1)][1]

    def take(self, expected: str | None = None) -> str:
        kind, text, _ = self.tokens[self.at]
        if expected is not None and text != expected:
            raise self.error(f"expected {expected!r}, found "
                             f"{'the end of the loop IR' if kind == 'eof' else repr(text)}")
        if kind == "eof":
            raise self.error("unexpected end of loop IR")
        self.at += 1
        return text

    def integer(self) -> int:
        text = self.take()
        if not re.fullmatch(r"-?\d{1,19}", text):
            raise self.error(f"expected an integer, found {text!r}", self.at - 1)
        return int(text)

    def shape(self) -> tuple[int, ...]:
        self.take("[")
        text = self.take()
        if text == "scalar":
            self.take("]")
            return ()
        dims = [text] if "x" not in text else text.split("x")
        # `4x8` lexes as one word only after a letter; numbers and `x` come apart.
        while self.peek() != "]":
            part = self.take()
            dims.extend(p for p in part.split("x") if p)
        self.take("]")
        return tuple(int(d) for d in dims if d)

    # ---- kernel -------------------------------------------------------------------------------

    def kernel(self) -> L.Kernel:
        self.kernel_span = self.span_here()
        self.buffers = {}
        self.take("kernel")
        self.take("@")
        name = self.take()
        buffers, sites = [], []
        results = None
        while self.peek() != "{":
            if self.peek() == "check":
                sites.append(self.check_site())
                continue
            if self.peek() == "results":  # outputs in result order, when it differs
                self.take()
                results = [self.take()]
                while self.peek() == ",":
                    self.take()
                    results.append(self.take())
                continue
            role = self.take()
            buffer_name = self.take()
            self.take(":")
            dtype = self.take()
            buffer = L.Buffer(buffer_name, dtype, self.shape(), role)
            buffers.append(buffer)
            self.buffers[buffer.name] = buffer
        body = self.block()
        inputs = tuple(b.name for b in buffers if b.role == "input")
        outputs = tuple(results) if results is not None else \
            tuple(b.name for b in buffers if b.role == "output")
        return L.Kernel(name, tuple(buffers), body, inputs, outputs, tuple(sites))

    def check_site(self) -> L.CheckSite:
        self.take("check")
        self.integer()
        self.take(":")
        op = self.take()
        location = json.loads(self.take())
        self.take("limit")
        limit = self.integer()
        self.take("ids")
        shape = self.shape()
        argument = None
        if self.peek() == "from":
            self.take()
            argument = self.take()
        return L.CheckSite(op, location, limit, shape, argument)

    def block(self) -> tuple[L.Stmt, ...]:
        self.take("{")
        self.scopes.append({})
        statements = []
        while self.peek() != "}":
            statements.append(self.statement())
        self.take("}")
        self.scopes.pop()
        return tuple(statements)

    def span_here(self) -> Span:
        _, text, start = self.tokens[self.at]
        return Span(self.source, start, start + max(len(text), 1))

    def statement(self) -> L.Stmt:
        span = self.span_here()
        stmt = self._statement()
        self.spans[id(stmt)] = span
        return stmt

    def _statement(self) -> L.Stmt:
        word = self.peek()
        if word == "for":
            return self.loop()
        if word == "let":
            self.take()
            name = self.take()
            self.take(":")
            dtype = self.take()
            self.take("=")
            value = self.expr()
            self.scopes[-1][name] = dtype
            return L.Let(L.Var(name, dtype), value)
        if word == "gemm":
            return self.gemm()
        if word == "attention":
            return self.attention()
        if word == "attention_backward":
            return attention_ir.parse_attention_backward(self)
        buffer = self.take()
        index = self.index_list()
        self.take("=")
        return L.Store(buffer, index, self.expr())

    def loop(self) -> L.For:
        self.take("for")
        name = self.take()
        self.take("in")
        if self.integer() != 0:
            raise self.error("loops start at 0", self.at - 1)
        self.take("..")
        extent = self.integer()
        kind, width, threads = "serial", 1, 1
        if self.peek() in ("vector", "parallel"):
            kind = self.take()
            self.take("<")
            width = self.integer()
            self.take(">")
        if kind == "vector" and self.peek() == "parallel":  # tiles split across threads
            self.take("parallel")
            self.take("<")
            threads = self.integer()
            self.take(">")
        self.scopes.append({name: L.I64})
        body = self.block()
        self.scopes.pop()
        return L.For(L.Var(name), extent, body, kind, width, threads)

    def attention_blocks(self) -> dict[str, int | None]:
        """`blocks rows=R keys=K causal=C|none threads=T` of a fused attention statement,
        forward or backward (L.attention_blocks_text prints it)."""
        fields: dict[str, int | None] = {}
        self.take("blocks")
        for key in ("rows", "keys", "causal", "threads"):
            self.take(key)
            self.take("=")
            if key == "causal" and self.peek() == "none":
                fields[key] = None
                self.take()
            else:
                fields[key] = self.integer()
        return fields

    def named_extents(self) -> list[tuple[L.Var, int]]:
        """`[b<2>, i<M>, j<N>]`: index variables with their extents."""
        self.take("[")
        named = []
        while True:
            name = self.take()
            self.take("<")
            named.append((L.Var(name), self.integer()))
            self.take(">")
            if self.peek() == "]":
                break
            self.take(",")
        self.take("]")
        return named

    def gemm(self) -> L.Gemm:
        self.take("gemm")
        out = self.take()
        named = self.named_extents()
        self.take("=")
        self.scopes.append({var.name: L.I64 for var, _ in named})
        product = self.expr()
        self.scopes.pop()
        if not (isinstance(product, L.Reduce) and isinstance(product.body, L.Binary)
                and product.body.op == "mul"):
            raise self.error("gemm needs sum[k < K](a * b)", self.at - 1)
        tiles = {}
        self.take("tiles")
        in_place = False
        for key in ("mr", "nr", "kc", "mc", "nc", "threads"):
            if key == "threads" and self.peek() == "b":
                self.take("b")
                self.take("=")
                self.take("in_place")
                in_place = True
            self.take(key)
            self.take("=")
            tiles[key] = self.integer()
        self.take("dtype")
        self.take("=")
        dtype = self.take()
        (i, m), (j, n) = named[-2:]
        batch = named[:-2]
        return L.Gemm(out, tuple(v for v, _ in batch), tuple(e for _, e in batch), i, j,
                      product.var, m, n, product.extent, product.body.lhs, product.body.rhs,
                      dtype, L.GemmTiles(tiles["mr"], tiles["nr"], tiles["kc"], tiles["mc"],
                                         tiles["nc"], in_place), tiles["threads"])

    def attention(self) -> L.Attention:
        self.take("attention")
        out = self.take()
        named = self.named_extents()
        self.take(",")
        scores = self.take()
        self.take(":")
        dtype = self.take()
        self.take("=")
        self.take("dot")
        self.take("[")
        d_extent = self.integer()
        self.take("]")
        self.take("(")
        q = self.take()
        self.take(",")
        kt = self.take()
        self.take(")")
        self.take("=")
        self.take("softmax")
        self.take("[")
        j = self.take()
        self.take("<")
        tk = self.integer()
        self.take("]")
        (i, tq), (_, dv) = named[-2], named[-1]
        batch = named[:-2]
        self.scopes.append({var.name: L.I64 for var, _ in named[:-1]} |
                           {j: L.I64, scores: dtype})
        self.take("(")
        score = self.expr()
        self.take(")")
        self.take("@")
        v = self.take()
        self.take("unmasked")
        unmasked = self.expr()
        self.scopes.pop()
        fields = self.attention_blocks()
        stats = None
        if self.peek() == "stats" and self.peek(1) == "=":
            self.take()
            self.take()
            stats = self.take()
        return L.Attention(out, q, kt, v, tuple(var for var, _ in batch),
                           tuple(e for _, e in batch), i, L.Var(j), L.Var(scores, dtype), tq,
                           tk, d_extent, dv, score, unmasked, fields["causal"], dtype,
                           fields["rows"], fields["keys"], fields["threads"], stats)

    # ---- expressions --------------------------------------------------------------------------

    def index_list(self) -> tuple[L.Expr, ...]:
        self.take("[")
        items = []
        while self.peek() != "]":
            items.append(self.expr())
            if self.peek() == ",":
                self.take()
        self.take("]")
        return tuple(items)

    def variable_type(self, name: str) -> str:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise self.error(f"unknown variable {name!r}", self.at - 1)

    def expr(self) -> L.Expr:
        kind, text, _ = self.tokens[self.at]
        if kind == "number":
            self.take()
            if ":" in text:
                value, dtype = text.split(":")
                return L.Const(float(value), dtype)
            return L.Const(int(text), L.I64)
        if text == "(":
            self.take()
            lhs = self.expr()
            symbol = self.take()
            if symbol not in _SYMBOLS:
                raise self.error(f"expected an operator, found {symbol!r}", self.at - 1)
            rhs = self.expr()
            self.take(")")
            op = _SYMBOLS[symbol]
            dtype = L.BOOL if op in L.COMPARISONS else lhs.dtype
            return L.Binary(op, lhs, rhs, dtype)
        name = self.take()
        if name in L.REDUCE_OPS and self.peek() == "[":
            return self.reduce(name)
        if name == "checked":
            return self.checked()
        if self.peek() == "[":
            buffer = self.buffers.get(name)
            if buffer is None:
                raise self.error(f"unknown buffer {name!r}", self.at - 1)
            return L.Load(name, self.index_list(), L.value_type(buffer.dtype))
        if self.peek() == "(":
            call_at = self.at - 1
            self.take()
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            if name == "select":
                return L.Select(args[0], args[1], args[2], args[1].dtype)
            if name in (L.F32, L.F64, L.I64, L.BOOL):
                return L.Cast(args[0], name)
            arity = 1 if name in L.UNARY_OPS else 2 if name in L.BINARY_OPS else None
            if arity is None:
                raise self.error(f"unknown op {name!r} (known: "
                                 f"{', '.join(L.UNARY_OPS + L.BINARY_OPS)}, select, casts)",
                                 call_at)
            if len(args) != arity:
                raise self.error(f"'{name}' takes {arity} operand(s), given {len(args)}",
                                 call_at)
            if arity == 1:
                return L.Unary(L.UnaryOp(name), args[0], args[0].dtype)
            op = L.BinaryOp(name)
            return L.Binary(op, args[0], args[1], L.BOOL if op in L.COMPARISONS else
                            args[0].dtype)
        return L.Var(name, self.variable_type(name))

    def reduce(self, op: str) -> L.Reduce:
        self.take("[")
        name = self.take()
        self.take("<")
        extent = self.integer()
        width = 0
        if self.peek() == "vector":
            self.take()
            self.take("<")
            width = self.integer()
            self.take(">")
        self.take("]")
        self.take("(")
        self.scopes.append({name: L.I64})
        body = self.expr()
        self.scopes.pop()
        self.take(")")
        dtype = L.I64 if op == "argmax" else body.dtype
        return L.Reduce(op, L.Var(name), extent, body, dtype, width)

    def checked(self) -> L.CheckedId:
        self.take("(")
        value = self.expr()
        self.take("<")
        limit = self.integer()
        self.take(",")
        self.take("site")
        site = self.integer()
        self.take(",")
        self.take("at")
        position = self.index_list()
        self.take(")")
        return L.CheckedId(value, limit, site, position)
