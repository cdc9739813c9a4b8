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

from .diagnostics import Span
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

class IRParseError(ValueError):
    pass


_TOKEN = re.compile(r"""\s*(?:
      (?P<comment>//[^\n]*)
    | (?P<value>%[A-Za-z0-9_.]+)
    | (?P<symbol>@[A-Za-z_][A-Za-z0-9_]*)
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+|inf|nan))
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>->|[()\[\]{},:=*+\-])
    )""", re.VERBOSE)


def _lex_ir(text: str) -> list[tuple[str, str]]:
    tokens = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match:
            raise IRParseError(f"cannot read IR at offset {pos}: {text[pos:pos + 20]!r}")
        pos = match.end()
        kind = match.lastgroup
        if kind != "comment":
            tokens.append((kind, match.group(kind)))
    tokens.append(("eof", ""))
    return tokens


class _IRParser:
    def __init__(self, text: str):
        self.tokens = _lex_ir(text)
        self.pos = 0
        self.symbols: dict[str, sympy.Symbol] = {}
        self.values: dict[str, Value] = {}

    def next(self) -> tuple[str, str]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos]

    def expect(self, text: str) -> None:
        kind, got = self.next()
        if got != text:
            raise IRParseError(f"expected {text!r}, found {got!r}")

    def program(self) -> Program:
        constants = []
        functions = []
        while self.peek()[0] != "eof":
            kind, word = self.next()
            if word == "const":
                _, name = self.next()
                self.expect("=")
                _, number = self.next()
                constants.append((name, int(number)))
                self.symbols[name] = const_symbol(name)
            elif word == "func":
                functions.append(self.function())
            else:
                raise IRParseError(f"expected 'const' or 'func', found {word!r}")
        return Program(tuple(constants), tuple(functions))

    def function(self) -> Function:
        self.values = {}
        _, symbol = self.next()
        self.expect("(")
        params = []
        while self.peek()[1] != ")":
            _, name = self.next()
            self.expect(":")
            value = Value(name[1:], self.type())
            self.values[name] = value
            params.append(value)
            if self.peek()[1] == ",":
                self.next()
        self.expect(")")
        self.expect("->")
        self.expect("(")
        while self.peek()[1] != ")":
            self.type()
            if self.peek()[1] == ",":
                self.next()
        self.expect(")")
        is_main = False
        if self.peek()[1] == "attributes":
            self.next()
            self.expect("{")
            self.expect("main")
            self.expect("}")
            is_main = True
        self.expect("{")
        body = []
        while self.peek()[1] != "return":
            body.append(self.operation())
        self.next()
        results = []
        while self.peek()[0] == "value":
            results.append(self.values[self.next()[1]])
            if self.peek()[1] == ",":
                self.next()
        self.expect("}")
        return Function(symbol[1:], tuple(params), tuple(body), tuple(results), is_main)

    def operation(self) -> Operation:
        names = [self.next()[1]]
        while self.peek()[1] == ",":
            self.next()
            names.append(self.next()[1])
        self.expect("=")
        _, opname = self.next()
        self.expect("(")
        operands = []
        while self.peek()[1] != ")":
            _, name = self.next()
            if name not in self.values:
                raise IRParseError(f"use of undefined value {name}")
            operands.append(self.values[name])
            if self.peek()[1] == ",":
                self.next()
        self.expect(")")
        attrs = []
        if self.peek()[1] == "{":
            self.next()
            while self.peek()[1] != "}":
                _, key = self.next()
                self.expect("=")
                attrs.append((key, self.attr_value()))
                if self.peek()[1] == ",":
                    self.next()
            self.expect("}")
        self.expect(":")
        types = [self.type()]
        while self.peek()[1] == ",":
            self.next()
            types.append(self.type())
        results = tuple(Value(n[1:], t) for n, t in zip(names, types, strict=True))
        for result in results:
            self.values[str(result)] = result
        return Operation(opname, tuple(operands), results, tuple(attrs))

    def attr_value(self) -> AttrValue:
        kind, text = self.peek()
        if text == "[":
            self.next()
            items = []
            while self.peek()[1] != "]":
                items.append(self.attr_value())
                if self.peek()[1] == ",":
                    self.next()
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
        expr = self.dim_sum()
        return int(expr) if expr.is_Integer else expr

    def dim_sum(self) -> sympy.Expr:
        total = self.dim_term()
        while True:
            kind, text = self.peek()
            if text in ("+", "-"):
                self.next()
                rhs = self.dim_term()
                total = total + rhs if text == "+" else total - rhs
            elif kind == "number" and text.startswith("-") and text not in self.symbols:
                total = total + self.dim_term()  # `T-1` lexes as T, -1
            else:
                return total

    def dim_term(self) -> sympy.Expr:
        product = self.dim_power()
        while self.peek()[1] == "*" and self.tokens[self.pos + 1][1] != "*":
            self.next()
            product = product * self.dim_power()
        return product

    def dim_power(self) -> sympy.Expr:
        base = self.dim_atom()
        if self.peek()[1] == "*" and self.tokens[self.pos + 1][1] == "*":
            self.next()
            self.next()
            return base ** self.dim_power()
        return base

    def dim_atom(self) -> sympy.Expr:
        kind, text = self.next()
        if text in self.symbols:
            return self.symbols[text]
        if text == "-":
            return -self.dim_power()
        if text == "(":
            inner = self.dim_sum()
            self.expect(")")
            return inner
        if kind == "number" and re.fullmatch(r"-?\d+", text):
            return sympy.Integer(int(text))
        raise IRParseError(f"expected a dimension, found {text!r}")

    def type(self) -> TensorType:
        _, dtype = self.next()
        self.expect("[")
        dims = []
        while self.peek()[1] != "]":
            dims.append(self.dim())
            if self.peek()[1] == ",":
                self.next()
        self.expect("]")
        return TensorType(DType(dtype), tuple(dims))


def parse_ir(text: str) -> Program:
    return _IRParser(text).program()
