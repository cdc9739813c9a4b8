"""Typed tensor IR: functions in A-normal form over SSA values.

Every operation names a registry op (or one of the structural ops `call`,
`reverse_mode`, `placeholder`, `fill`), its operand values, a sorted tuple of
attributes and its result values. The printer's text parses back with `parse_ir`
(locations are printed as trailing `// file:line:col` comments and not read back).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sympy

from .diagnostics import KinaError, Source, Span
from .types import DType, TensorType, const_symbol, format_dim

AttrValue = int | float | str | tuple


@dataclass(frozen=True)
class Value:
    name: str  # SSA name without the '%'
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class Operation:
    op: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    span: Span | None = field(default=None, compare=False)

    def attr(self, key: str, default: AttrValue | None = None) -> AttrValue | None:
        for name, value in self.attrs:
            if name == key:
                return value
        return default

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def result(self) -> Value:
        (only,) = self.results
        return only


def make_attrs(**attrs: AttrValue) -> tuple[tuple[str, AttrValue], ...]:
    return tuple(sorted(attrs.items()))


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Value, ...]
    body: tuple[Operation, ...]
    results: tuple[Value, ...]
    is_main: bool = False
    span: Span | None = field(default=None, compare=False)

    @property
    def result_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.results)

    @property
    def param_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.params)


@dataclass(frozen=True)
class Program:
    constants: tuple[tuple[str, int], ...]
    functions: tuple[Function, ...]

    def function(self, name: str) -> Function:
        # An index built on first use (a scan per lookup made inlining a chain of n calls
        # O(n^2)); kept in __dict__ as a cache, not a field, so equality ignores it.
        index = self.__dict__.get("_index")
        if index is None:
            index = {}
            for function in self.functions:
                index.setdefault(function.name, function)  # the first of a name wins
            self.__dict__["_index"] = index
        return index[name]

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)

    @property
    def main(self) -> Function | None:
        for function in self.functions:
            if function.is_main:
                return function
        return None

    def replace_function(self, new: Function) -> Program:
        return Program(self.constants,
                       tuple(new if f.name == new.name else f for f in self.functions))


# ---- printing -------------------------------------------------------------------------------

def format_attr(value: AttrValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else (
            "nan" if value != value else ("inf" if value > 0 else "-inf"))
    if isinstance(value, tuple):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return format_dim(value)


def format_operation(op: Operation, with_locations: bool = False) -> str:
    lhs = ", ".join(str(r) for r in op.results)
    text = f"{lhs} = {op.op}({', '.join(str(a) for a in op.operands)})"
    if op.attrs:
        text += " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in op.attrs) + "}"
    text += " : " + ", ".join(str(r.type) for r in op.results)
    if with_locations and op.span is not None:
        text += f"  // {op.span}"
    return text


def format_function(function: Function, with_locations: bool = False) -> str:
    params = ", ".join(f"%{p.name}: {p.type}" for p in function.params)
    results = ", ".join(str(t) for t in function.result_types)
    head = f"func @{function.name}({params}) -> ({results})"
    if function.is_main:
        head += " attributes {main}"
    lines = [head + " {"]
    for op in function.body:
        lines.append("  " + format_operation(op, with_locations))
    lines.append("  return " + ", ".join(str(v) for v in function.results))
    lines.append("}")
    return "\n".join(lines)


def format_program(program: Program, with_locations: bool = False) -> str:
    parts = [f"const {name} = {value}" for name, value in program.constants]
    if parts:
        parts.append("")
    body = "\n\n".join(format_function(f, with_locations) for f in program.functions)
    return "\n".join(parts) + body + "\n"


# ---- parsing (round trip of the printer) ----------------------------------------------------

class IRParseError(KinaError):
    """Malformed tensor IR text: a KinaError at the line and column of the IR text."""

    def __init__(self, message: str, span: Span | None, notes: tuple[str, ...] = ()):
        super().__init__("ir", message, span, notes)


_TOKEN = re.compile(r"""\s*(?:
      (?P<comment>//[^\n]*)
    | (?P<value>%[A-Za-z0-9_.]+)
    | (?P<symbol>@[A-Za-z_][A-Za-z0-9_]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*")
    | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+|inf|nan))
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>->|[()\[\]{},:=*+\-])
    )""", re.VERBOSE)

# Nesting deeper than this (attribute lists, parenthesised dims) is refused: the parser
# recurses, and hostile text must end in a diagnostic, not a RecursionError.
MAX_IR_NESTING = 100
# The largest integer an attribute or dim may spell (the I64 range).
MAX_IR_INT = 2**63 - 1


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int


def _lex_ir(source: Source) -> list[_Token]:
    text = source.text
    tokens = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match:
            at = len(text[pos:]) - len(text[pos:].lstrip()) + pos
            raise IRParseError(f"cannot read IR at {text[at:at + 20]!r}",
                               Span(source, at, at + 1))
        pos = match.end()
        kind = match.lastgroup
        if kind != "comment":
            tokens.append(_Token(kind, match.group(kind), match.start(kind), match.end(kind)))
    tokens.append(_Token("eof", "", len(text), len(text)))
    return tokens


class _IRParser:
    def __init__(self, source: Source):
        self.source = source
        self.tokens = _lex_ir(source)
        self.pos = 0
        self.depth = 0
        self.symbols: dict[str, sympy.Symbol] = {}
        self.values: dict[str, Value] = {}

    def span(self, first: _Token, last: _Token | None = None) -> Span:
        last = last or first
        return Span(self.source, first.start, max(last.end, first.start + 1))

    def fail(self, message: str, token: _Token | None = None) -> IRParseError:
        token = token or self.peek()
        return IRParseError(message, self.span(token))

    def next(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def shown(self, token: _Token) -> str:
        return "the end of the IR" if token.kind == "eof" else repr(token.text)

    def expect(self, text: str) -> _Token:
        token = self.next()
        if token.text != text or token.kind in ("string", "eof"):
            raise self.fail(f"expected {text!r}, found {self.shown(token)}", token)
        return token

    def expect_kind(self, kind: str, what: str) -> _Token:
        token = self.next()
        if token.kind != kind:
            raise self.fail(f"expected {what}, found {self.shown(token)}", token)
        return token

    def comma_or(self, closing: str) -> None:
        """After a list item: a ',' (then more), or the closing token (left for the caller)."""
        token = self.peek()
        if token.text == ",":
            self.next()
        elif token.text != closing:
            raise self.fail(f"expected ',' or {closing!r}, found {self.shown(token)}")

    def program(self) -> Program:
        constants = []
        functions = []
        while self.peek().kind != "eof":
            token = self.next()
            if token.text == "const" and token.kind == "word":
                name = self.expect_kind("word", "a const name")
                if name.text in self.symbols:
                    raise self.fail(f"const {name.text} is defined twice", name)
                self.expect("=")
                number = self.next()
                if number.kind != "number" or not re.fullmatch(r"\d+", number.text):
                    raise self.fail(f"expected a positive integer, found {self.shown(number)}",
                                    number)
                constants.append((name.text, self.integer(number)))
                self.symbols[name.text] = const_symbol(name.text)
            elif token.text == "func" and token.kind == "word":
                functions.append(self.function())
            else:
                raise self.fail(f"expected 'const' or 'func', found {self.shown(token)}", token)
        return Program(tuple(constants), tuple(functions))

    def integer(self, token: _Token) -> int:
        # Length first: int() of a few thousand digits raises (CPython's digit limit).
        value = int(token.text) if len(token.text.lstrip("-")) <= 20 else MAX_IR_INT + 1
        if abs(value) > MAX_IR_INT:
            raise self.fail(f"integer {token.text[:30]} is out of the I64 range", token)
        return value

    def function(self) -> Function:
        self.values = {}
        symbol = self.expect_kind("symbol", "a function name like @f")
        self.expect("(")
        params = []
        while self.peek().text != ")":
            name = self.expect_kind("value", "a parameter like %x")
            self.expect(":")
            if name.text in self.values:
                raise self.fail(f"parameter {name.text} is declared twice", name)
            value = Value(name.text[1:], self.type())
            self.values[name.text] = value
            params.append(value)
            self.comma_or(")")
        self.expect(")")
        self.expect("->")
        self.expect("(")
        declared = []
        while self.peek().text != ")":
            declared.append(self.type())
            self.comma_or(")")
        self.expect(")")
        is_main = False
        if self.peek().text == "attributes":
            self.next()
            self.expect("{")
            self.expect("main")
            self.expect("}")
            is_main = True
        self.expect("{")
        body = []
        while self.peek().text != "return":
            if self.peek().kind == "eof" or self.peek().text == "}":
                raise self.fail(f"expected an operation or 'return', found "
                                f"{self.shown(self.peek())}")
            body.append(self.operation())
        returned = self.next()
        results = []
        while self.peek().kind == "value":
            token = self.next()
            if token.text not in self.values:
                raise self.fail(f"return of undefined value {token.text}", token)
            results.append(self.values[token.text])
            self.comma_or("}")
        self.expect("}")
        actual = tuple(v.type for v in results)
        if tuple(declared) != actual:
            raise IRParseError(
                f"@{symbol.text[1:]} declares results ({', '.join(map(str, declared))}) but "
                f"returns ({', '.join(map(str, actual))})", self.span(returned))
        return Function(symbol.text[1:], tuple(params), tuple(body), tuple(results), is_main,
                        self.span(symbol))

    def operation(self) -> Operation:
        first = self.expect_kind("value", "a result like %y")
        names = [first]
        while self.peek().text == ",":
            self.next()
            names.append(self.expect_kind("value", "a result like %y"))
        self.expect("=")
        opname = self.expect_kind("word", "an op name")
        self.expect("(")
        operands = []
        while self.peek().text != ")":
            token = self.expect_kind("value", "an operand like %x")
            if token.text not in self.values:
                raise self.fail(f"use of undefined value {token.text}", token)
            operands.append(self.values[token.text])
            self.comma_or(")")
        closing = self.expect(")")
        attrs: list[tuple[str, AttrValue]] = []
        if self.peek().text == "{":
            self.next()
            while self.peek().text != "}":
                key = self.expect_kind("word", "an attribute name")
                if any(key.text == k for k, _ in attrs):
                    raise self.fail(f"attribute {key.text} is given twice", key)
                self.expect("=")
                attrs.append((key.text, self.attr_value()))
                self.comma_or("}")
            self.expect("}")
        self.expect(":")
        types = [self.type()]
        while self.peek().text == ",":
            self.next()
            types.append(self.type())
        span = self.span(opname, closing)
        if len(types) != len(names):
            raise IRParseError(f"'{opname.text}' binds {len(names)} result(s) but gives "
                               f"{len(types)} type(s)", span)
        results = tuple(Value(n.text[1:], t) for n, t in zip(names, types, strict=True))
        for token, result in zip(names, results, strict=True):
            if token.text in self.values:
                raise self.fail(f"{token.text} is defined twice", token)
            self.values[token.text] = result
        return Operation(opname.text, tuple(operands), results, tuple(sorted(attrs)), span)

    def nested(self):
        self.depth += 1
        if self.depth > MAX_IR_NESTING:
            raise self.fail(f"IR nested more than {MAX_IR_NESTING} levels deep")

    def attr_value(self) -> AttrValue:
        self.nested()
        try:
            return self._attr_value()
        finally:
            self.depth -= 1

    def _attr_value(self) -> AttrValue:
        token = self.peek()
        kind, text = token.kind, token.text
        if text == "[" and kind == "punct":
            self.next()
            items = []
            while self.peek().text != "]":
                items.append(self.attr_value())
                self.comma_or("]")
            self.expect("]")
            return tuple(items)
        if kind == "string":
            self.next()
            return re.sub(r"\\(.)", r"\1", text[1:-1])
        if text in self.symbols:
            return self.dim()
        if kind == "word" and text in ("true", "false"):
            self.next()
            return text == "true"
        if kind == "number" and re.fullmatch(r"-?\d+", text):
            return self.dim()  # an int, or a dim expression that starts with one (2*T)
        if kind == "number":
            self.next()
            return float(text)
        return self.dim()

    def dim(self):
        """A dim as sympy prints it without spaces (T*4, 2*T-1, T**2), parsed by precedence
        with the consts as symbols -- not by sympify, which chokes on const names that are
        Python keywords (`lambda`, `in`) or sympy names."""
        first = self.peek()
        expr = self.dim_sum()
        if expr.is_Integer:
            if abs(int(expr)) > MAX_IR_INT:
                raise self.fail("dimension is out of the I64 range", first)
            return int(expr)
        return expr

    def dim_sum(self) -> sympy.Expr:
        total = self.dim_term()
        while True:
            token = self.peek()
            if token.text in ("+", "-") and token.kind == "punct":
                self.next()
                rhs = self.dim_term()
                total = total + rhs if token.text == "+" else total - rhs
            elif token.kind == "number" and token.text.startswith("-") and \
                    re.fullmatch(r"-\d+", token.text):
                total = total + self.dim_term()  # `T-1` lexes as T, -1
            else:
                return total

    def dim_term(self) -> sympy.Expr:
        product = self.dim_power()
        while self.peek().text == "*" and self.peek(1).text != "*":
            self.next()
            product = product * self.dim_power()
        return product

    def dim_power(self) -> sympy.Expr:
        base = self.dim_atom()
        if self.peek().text == "*" and self.peek(1).text == "*":
            self.next()
            exponent = self.peek()
            self.next()
            power = self.dim_power()
            if not (power.is_Integer and 0 <= power <= 8):
                raise self.fail("a dim exponent must be an integer from 0 to 8", exponent)
            return base ** power
        return base

    def dim_atom(self) -> sympy.Expr:
        self.nested()
        try:
            token = self.next()
            if token.kind == "word" and token.text in self.symbols:
                return self.symbols[token.text]
            if token.text == "-" and token.kind == "punct":
                return -self.dim_power()
            if token.text == "(" and token.kind == "punct":
                inner = self.dim_sum()
                self.expect(")")
                return inner
            if token.kind == "number" and re.fullmatch(r"-?\d+", token.text):
                return sympy.Integer(self.integer(token))
            raise self.fail(f"expected a dimension, found {self.shown(token)}", token)
        finally:
            self.depth -= 1

    def type(self) -> TensorType:
        token = self.next()
        try:
            dtype = DType(token.text)
        except ValueError:
            names = ", ".join(d.value for d in DType)
            raise self.fail(f"expected an element type ({names}), found {self.shown(token)}",
                            token) from None
        if token.kind != "word":
            raise self.fail(f"expected an element type, found {self.shown(token)}", token)
        self.expect("[")
        dims = []
        while self.peek().text != "]":
            dims.append(self.dim())
            self.comma_or("]")
        self.expect("]")
        return TensorType(dtype, tuple(dims))


def parse_ir(text: str, name: str = "<ir>") -> Program:
    """Read tensor IR text (what `format_program` prints). Malformed text raises
    `IRParseError`, a `KinaError` at its line and column in `text` (shown as `name`); each
    operation and function gets a span into `text`, so later diagnostics point there too."""
    return _IRParser(Source(name, text)).program()


def main_outputs(function: Function) -> tuple[Value, ...]:
    """What an @main without `return` produces: every value no later operation reads."""
    read = {v.name for op in function.body for v in op.operands}
    return tuple(r for op in function.body for r in op.results
                 if r.name not in read and op.op != "placeholder")
