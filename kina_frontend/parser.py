"""Recursive-descent parser for Kina (grammar in docs/kina.md)."""

from __future__ import annotations

from . import ast
from .diagnostics import KinaError, Source, Span
from .lexer import Token, tokenize

# Nested expressions beyond this depth are rejected with a diagnostic rather than
# letting Python's recursion limit turn into a traceback. Each level costs the parser about
# seven Python frames and the checker about four, so 100 stays well inside the default
# limit of 1000 even when called from a deep stack (a test runner). Operator chains count
# too (`a + b + c` nests to the left), since the checker recurses on them.
MAX_NESTING = 100

F32_MAX = 3.4028234663852886e38
I64_MAX = 2**63 - 1

# Infix sugar: each operator maps to the Kina op it stands for (see docs/kina.md).
INFIX_LEVELS = (("+", "-"), ("*", "/", "@"))


def parse(source: Source) -> ast.Module:
    return Parser(source).parse_module()


class Parser:
    def __init__(self, source: Source):
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0
        self.depth = 0

    # ---- token helpers ------------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def at(self, text: str) -> bool:
        return self.tok.kind in ("punct", "keyword") and self.tok.text == text

    def advance(self) -> Token:
        token = self.tok
        if token.kind != "eof":
            self.pos += 1
        return token

    def expect(self, text: str, context: str) -> Token:
        if self.at(text):
            return self.advance()
        message = f"expected '{text}' {context}, found {describe(self.tok)}"
        previous = self.tokens[self.pos - 1] if self.pos > 0 else None
        if text == ";" and previous is not None and previous.span.line < self.tok.span.line:
            # A forgotten ';' belongs at the end of the line before, not at the next token.
            at = Span(self.source, previous.span.end, previous.span.end + 1)
            raise KinaError("syntax", message, at)
        raise self.error(message)

    def expect_ident(self, context: str) -> ast.Name:
        if self.tok.kind == "ident":
            token = self.advance()
            return ast.Name(token.span, token.text)
        hint = ()
        if self.tok.kind == "keyword":
            hint = (f"'{self.tok.text}' is a reserved word",)
        raise self.error(f"expected a name {context}, found {describe(self.tok)}", hint)

    def error(self, message: str, notes: tuple[str, ...] = ()) -> KinaError:
        span = self.tok.span
        if self.tok.kind == "eof" and self.pos > 0:
            # Point just after the last token, not at an empty line past the end.
            end = self.tokens[self.pos - 1].span.end
            span = Span(self.source, end, end + 1)
        return KinaError("syntax", message, span, notes)

    # ---- declarations -------------------------------------------------------------------------

    def parse_module(self) -> ast.Module:
        start = self.tok.span
        consts: list[ast.ConstDecl] = []
        functions: list[ast.FnDecl] = []
        while self.tok.kind != "eof":
            if self.at("const"):
                consts.append(self.parse_const())
            elif self.at("fn") or self.at("@"):
                functions.append(self.parse_fn())
            else:
                raise self.error(f"expected 'const' or 'fn' at top level, found "
                                 f"{describe(self.tok)}")
        return ast.Module(start.to(self.tok.span), tuple(consts), tuple(functions))

    def parse_const(self) -> ast.ConstDecl:
        keyword = self.advance()
        name = self.expect_ident("after 'const'")
        self.expect("=", f"after 'const {name.ident}'")
        value = self.parse_expr()
        end = self.expect(";", "after a const declaration")
        return ast.ConstDecl(keyword.span.to(end.span), name, value)

    def parse_fn(self) -> ast.FnDecl:
        start = self.tok.span
        attributes = []
        while self.at("@"):
            self.advance()
            attributes.append(self.expect_ident("after '@'"))
        self.expect("fn", "to start a function")
        name = self.expect_ident("after 'fn'")
        self.expect("(", f"after 'fn {name.ident}'")
        params: list[ast.Param] = []
        while not self.at(")"):
            pname = self.expect_ident("for a parameter")
            self.expect(":", f"after parameter '{pname.ident}' (every parameter needs a type)")
            ptype = self.parse_type()
            params.append(ast.Param(pname.span.to(ptype.span), pname, ptype))
            if not self.at(")"):
                self.expect(",", "between parameters")
        self.expect(")", "to close the parameter list")
        results: tuple[ast.TensorTypeExpr, ...] = ()
        tuple_result = False
        if self.tok.kind == "ident" and self.tok.text == "Tensor" or self.at(":"):
            raise self.error(f"expected '->' before the result type, found {describe(self.tok)}",
                             (f"write: fn {name.ident}(...) -> Tensor[...] {{ ... }}",))
        if self.at("->"):
            self.advance()
            if self.at("("):
                self.advance()
                tuple_result = True
                items = [self.parse_type()]
                while self.at(","):
                    self.advance()
                    if self.at(")"):
                        break
                    items.append(self.parse_type())
                self.expect(")", "to close the result types")
                results = tuple(items)
            else:
                results = (self.parse_type(),)
        body, end = self.parse_block()
        return ast.FnDecl(start.to(end), name, tuple(attributes), tuple(params), results,
                          tuple_result, body)

    def parse_type(self) -> ast.TensorTypeExpr:
        if not (self.tok.kind == "ident" and self.tok.text == "Tensor"):
            raise self.error(f"expected a type 'Tensor[DTYPE, [dims], @placement]', "
                             f"found {describe(self.tok)}")
        start = self.advance().span
        self.expect("[", "after 'Tensor'")
        dtype = self.expect_ident("for the element type (F32 or I64)")
        self.expect(",", "after the element type")
        self.expect("[", "to open the dimension list")
        dims = self.parse_expr_list("]")
        self.expect("]", "to close the dimension list")
        self.expect(",", "after the dimension list")
        self.expect("@", "before the placement (e.g. '@host')")
        placement = self.expect_ident("for the placement")
        end = self.expect("]", "to close the tensor type")
        return ast.TensorTypeExpr(start.to(end.span), dtype, dims, placement)

    # ---- statements ---------------------------------------------------------------------------

    def parse_block(self):
        opener = self.expect("{", "to open a function body")
        statements: list[ast.Stmt] = []
        while not self.at("}"):
            if self.tok.kind == "eof":
                raise self.error("unexpected end of file inside a function body; missing '}'",
                                 (f"the body opened at {opener.span} is not closed",))
            statements.append(self.parse_statement())
        end = self.advance().span
        return tuple(statements), end

    def parse_statement(self) -> ast.Stmt:
        start = self.tok.span
        if self.at("let"):
            self.advance()
            destructure = False
            if self.at("("):
                self.advance()
                destructure = True
                targets = [self.expect_ident("in a tuple 'let'")]
                while self.at(","):
                    self.advance()
                    targets.append(self.expect_ident("in a tuple 'let'"))
                self.expect(")", "to close the tuple 'let'")
            else:
                targets = [self.expect_ident("after 'let'")]
            annotation = None
            if self.at(":"):
                if destructure:
                    raise self.error("a type annotation needs a single name",
                                     ("annotate each result in its own 'let'",))
                self.advance()
                annotation = self.parse_type()
            self.expect("=", "in a 'let' binding")
            value = self.parse_expr()
            end = self.expect(";", "after a 'let' binding")
            return ast.Let(start.to(end.span), tuple(targets), destructure, annotation, value)
        if self.at("return"):
            self.advance()
            value = self.parse_expr()
            end = self.expect(";", "after 'return'")
            return ast.Return(start.to(end.span), value)
        value = self.parse_expr()
        end = self.expect(";", "after an expression statement")
        return ast.ExprStmt(start.to(end.span), value)

    # ---- expressions --------------------------------------------------------------------------

    def parse_expr(self) -> ast.Expr:
        self.enter()
        try:
            return self.parse_infix(0)
        finally:
            self.depth -= 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"expression nested more than {MAX_NESTING} levels deep",
                             ("split it into several 'let' bindings",))

    def parse_infix(self, level: int) -> ast.Expr:
        if level == len(INFIX_LEVELS):
            return self.parse_unary()
        lhs = self.parse_infix(level + 1)
        chained = 0
        try:
            while self.tok.kind == "punct" and self.tok.text in INFIX_LEVELS[level]:
                self.enter()
                chained += 1
                op = self.advance().text
                rhs = self.parse_infix(level + 1)
                lhs = ast.Binary(lhs.span.to(rhs.span), op, lhs, rhs)
        finally:
            self.depth -= chained
        return lhs

    def parse_unary(self) -> ast.Expr:
        if self.at("-"):
            start = self.advance().span
            self.enter()
            try:
                operand = self.parse_unary()
            finally:
                self.depth -= 1
            return ast.Unary(start.to(operand.span), "-", operand)
        return self.parse_postfix()

    def parse_postfix(self) -> ast.Expr:
        expr = self.parse_primary()
        while self.at("("):
            opener = self.advance()
            args: list[ast.Expr] = []
            kwargs: list[ast.Keyword] = []
            while not self.at(")"):
                if self.tok.kind == "ident" and self.peek().kind == "punct" and \
                        self.peek().text == "=":
                    key = self.advance()
                    self.advance()
                    value = self.parse_expr()
                    kwargs.append(ast.Keyword(key.span.to(value.span), key.text, value))
                else:
                    if kwargs:
                        raise self.error("positional argument after a keyword argument",
                                         ("keyword arguments such as axis=1 come last",))
                    args.append(self.parse_expr())
                if not self.at(")"):
                    if not self.at(","):
                        raise self.error(f"expected ',' or ')' after an argument, found "
                                         f"{describe(self.tok)}",
                                         ((f"the argument list opened at {opener.span} is not "
                                          "closed"),))
                    self.advance()
            end = self.advance().span
            expr = ast.Call(expr.span.to(end), expr, tuple(args), tuple(kwargs))
        return expr

    def parse_primary(self) -> ast.Expr:
        token = self.tok
        if token.kind == "int":
            # Check the digit count before int(): Python refuses > 4300 digits with ValueError
            # (leading zeros count too, so they are stripped first).
            digits = token.text.lstrip("0") or "0"
            if len(digits) > 19 or int(digits) > I64_MAX:
                raise KinaError("lex", f"integer literal {_shorten(token.text)} is out of the "
                                "I64 range", token.span,
                                ((f"the largest I64 is {I64_MAX}; for a large F32 constant "
                                 "write a float literal such as 1e20"),))
            self.advance()
            return ast.IntLit(token.span, int(digits))
        if token.kind == "float":
            self.advance()
            value = float(token.text)
            if abs(value) > F32_MAX:
                raise KinaError("lex", f"float literal {_shorten(token.text)} is out of the "
                                "F32 range",
                                token.span, ("the largest finite F32 is about 3.4028235e38",))
            return ast.FloatLit(token.span, value, token.text)
        if token.kind == "ident":
            if token.text == "Tensor" and self.peek().text == "[":
                return self.parse_type()
            self.advance()
            return ast.Name(token.span, token.text)
        if self.at("("):
            start = self.advance().span
            first = self.parse_expr()
            if self.at(","):
                items = [first]
                while self.at(","):
                    self.advance()
                    if self.at(")"):
                        break
                    items.append(self.parse_expr())
                end = self.expect(")", "to close the tuple")
                return ast.TupleExpr(start.to(end.span), tuple(items))
            self.expect(")", "to close the parenthesis")
            return first
        if self.at("["):
            start = self.advance().span
            items = self.parse_expr_list("]")
            end = self.expect("]", "to close the list")
            return ast.ListExpr(start.to(end.span), items)
        raise self.error(f"expected an expression, found {describe(token)}")

    def parse_expr_list(self, closer: str) -> tuple[ast.Expr, ...]:
        items: list[ast.Expr] = []
        while not self.at(closer):
            items.append(self.parse_expr())
            if not self.at(closer):
                self.expect(",", "between list elements")
        return tuple(items)


def _shorten(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:10]}...{text[-6:]} ({len(text)} digits)"


def describe(token: Token) -> str:
    if token.kind == "eof":
        return "end of file"
    if token.kind in ("int", "float"):
        return f"number {token.text}"
    if token.kind == "ident":
        return f"name '{token.text}'"
    return f"'{token.text}'"
