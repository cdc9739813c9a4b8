"""Type checker: Kina syntax tree -> typed tensor IR, with symbolic shape proofs.

While checking, each `const` defined by a number is a sympy positive-integer symbol
and each `const` defined by an expression is that expression over earlier consts,
so a shape fact is proved for every value of the constants (`reshape([1,T,4] ->
[1,T,2,2])` holds for all T). Every discharged proof obligation is recorded; the
`--emit types` report prints them. `specialize` then substitutes the values.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import sympy

from . import ast
from .check_calls import CallChecker, FunctionScope, Signature
from .checked import MAX_DIM, MAX_ELEMENTS, CheckedProgram, Obligation, evaluate_dim, specialize
from .diagnostics import KinaError, Span
from .op_calls import OpContext, did_you_mean, literal_value
from .ops import REGISTRY
from .tensor_ir import Function, Program, Value
from .types import (
    RESERVED_DTYPES,
    SUPPORTED_PLACEMENTS,
    SURFACE_DTYPES,
    TensorType,
    const_symbol,
    format_dim,
)

STRUCTURAL_CALLS = ("placeholder", "reverseMode")
# Re-exported: what callers import from the checker.
__all__ = ["MAX_DIM", "MAX_ELEMENTS", "STRUCTURAL_CALLS", "CheckedProgram", "Obligation",
           "check_module", "evaluate_dim", "specialize"]


def check_module(module: ast.Module, consts: Mapping[str, int] | None = None) -> CheckedProgram:
    """Check a parsed module. `consts` gives other values to consts defined by an integer
    literal (`{"T": 128}` compiles `const T = 16;` as T = 128); the proofs are the same, since
    such a const is a free symbol while checking."""
    return _Checker(module, dict(consts or {})).run()


# ---- the checker ----------------------------------------------------------------------------

class _Checker(CallChecker):
    def __init__(self, module: ast.Module, overrides: dict[str, int]):
        self.module = module
        self.overrides = overrides
        self.symbols: dict[str, sympy.Expr] = {}
        self.values: dict[str, int] = {}
        self.const_spans: dict[str, Span] = {}
        self.signatures: dict[str, Signature] = {}
        self.obligations: list[Obligation] = []
        self.scope: FunctionScope | None = None

    # ---- driver -------------------------------------------------------------------------------

    def run(self) -> CheckedProgram:
        for const in self.module.consts:
            self.declare_const(const)
        unknown = sorted(set(self.overrides) - set(self.symbols))
        if unknown:
            raise KinaError("name", f"consts= names {', '.join(map(repr, unknown))}, which the "
                            "program does not declare", None,
                            (f"its consts are {', '.join(self.symbols) or 'none'}",))
        mains = []
        for decl in self.module.functions:
            self.declare_function(decl)
            if any(a.ident == "main" for a in decl.attributes):
                mains.append(decl)
        if len(mains) > 1:
            raise KinaError("name", "more than one @main function", mains[1].name.span,
                            (f"the first is '{mains[0].name.ident}' at {mains[0].name.span}",))
        functions = []
        call_graph: dict[str, list[tuple[str, Span]]] = {}
        for decl in self.module.functions:
            function, calls = self.check_function(decl)
            functions.append(function)
            call_graph[decl.name.ident] = calls
        self.reject_recursion(call_graph)
        program = Program(tuple((n, self.values[n]) for n in self.symbols), tuple(functions))
        return CheckedProgram(program, dict(self.values), dict(self.symbols),
                              tuple(self.obligations))

    def declare_const(self, const: ast.ConstDecl) -> None:
        name = const.name.ident
        if name in self.symbols:
            raise KinaError("name", f"const '{name}' is defined twice", const.name.span,
                            (f"first defined at {self.const_spans[name]}",))
        if name in REGISTRY or name in STRUCTURAL_CALLS:
            raise KinaError("name", f"const '{name}' clashes with the op of that name",
                            const.name.span)
        expr = self.dim_expr(const.value)
        value = self.evaluate(expr)
        notes: tuple[str, ...] = ()
        if name in self.overrides:
            value = self.override(const)
            notes = (f"the value {value} was set by consts=",)
        if value < 1:
            raise KinaError("shape", f"const '{name}' must be a positive integer, got {value}",
                            const.value.span, notes)
        if value > MAX_DIM:
            raise KinaError("shape", f"const '{name}' = {value} is larger than the largest "
                            f"supported dimension {MAX_DIM}", const.value.span, notes)
        # A const given by a literal is a free symbol; one given by an expression is that
        # expression, so `const D = H * Dh` lets reshape [.., D] -> [.., H, Dh] be proved.
        self.symbols[name] = const_symbol(name) if isinstance(const.value, ast.IntLit) else expr
        self.values[name] = value
        self.const_spans[name] = const.name.span

    def override(self, const: ast.ConstDecl) -> int:
        name = const.name.ident
        value = self.overrides[name]
        if not isinstance(const.value, ast.IntLit):
            raise KinaError("name", f"consts= sets '{name}', which is defined by an expression",
                            const.value.span, ("only a const given by an integer literal can "
                                               "be set; set the consts it is made of",))
        try:
            if isinstance(value, bool):
                raise TypeError
            return operator.index(value)
        except TypeError:
            raise KinaError("type", f"consts= sets '{name}' to {value!r}, not an integer",
                            const.value.span) from None

    @property
    def substitution(self) -> dict[sympy.Symbol, int]:
        return {const_symbol(name): value for name, value in self.values.items()}

    def evaluate(self, dim) -> int:
        """The value of a dim expression with the consts substituted."""
        return evaluate_dim(dim, self.values)

    def declare_function(self, decl: ast.FnDecl) -> None:
        name = decl.name.ident
        if name in self.signatures:
            raise KinaError("name", f"function '{name}' is defined twice", decl.name.span,
                            (f"first defined at {self.signatures[name].decl.name.span}",))
        if name in REGISTRY or name in STRUCTURAL_CALLS:
            raise KinaError("name", f"function '{name}' clashes with the built-in op of that "
                            "name", decl.name.span, ("rename the function",))
        if name in self.symbols:
            raise KinaError("name", f"function '{name}' clashes with the const of that name",
                            decl.name.span)
        for index, attribute in enumerate(decl.attributes):
            if attribute.ident != "main":
                raise KinaError("name", f"unknown attribute '@{attribute.ident}'",
                                attribute.span, ("the only function attribute is @main",))
            if any(a.ident == attribute.ident for a in decl.attributes[:index]):
                raise KinaError("name", f"attribute '@{attribute.ident}' is given twice",
                                attribute.span)
        params = []
        seen: dict[str, Span] = {}
        for param in decl.params:
            pname = param.name.ident
            if pname in seen:
                raise KinaError("name", f"parameter '{pname}' is declared twice",
                                param.name.span, (f"first declared at {seen[pname]}",))
            # The same rule as for `let`: a dimension or callee name cannot name a tensor.
            if pname in self.symbols:
                raise KinaError("name", f"parameter '{pname}' has the name of a const",
                                param.name.span,
                                (f"const '{pname}' is defined at {self.const_spans[pname]}",))
            if pname in REGISTRY or pname in STRUCTURAL_CALLS:
                raise KinaError("name", f"parameter '{pname}' has the name of an op",
                                param.name.span, ("rename the parameter",))
            seen[pname] = param.name.span
            params.append(Value(pname, self.resolve_type(param.type)))
        results = tuple(self.resolve_type(t) for t in decl.results)
        self.signatures[name] = Signature(decl, tuple(params), results)

    def reject_recursion(self, graph: dict[str, list[tuple[str, Span]]]) -> None:
        """Depth-first search for a cycle, with an explicit stack: a chain of thousands of
        calls must not exhaust Python's recursion limit."""
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for root in graph:
            if root in state:
                continue
            state[root] = 1
            stack = [(root, iter(graph.get(root, ())))]
            while stack:
                name, calls = stack[-1]
                for callee, span in calls:
                    if state.get(callee) == 1:
                        raise KinaError("unsupported", f"recursive call to '{callee}'", span,
                                        ("Kina functions are inlined; recursion is not "
                                         "supported",))
                    if callee not in state:
                        state[callee] = 1
                        stack.append((callee, iter(graph.get(callee, ()))))
                        break
                else:
                    state[name] = 2
                    stack.pop()

    # ---- functions and statements -------------------------------------------------------------

    def check_function(self, decl: ast.FnDecl) -> tuple[Function, list[tuple[str, Span]]]:
        signature = self.signatures[decl.name.ident]
        is_main = any(a.ident == "main" for a in decl.attributes)
        scope = FunctionScope(decl.name.ident, is_main)
        self.scope = scope
        for param_decl, param in zip(decl.params, signature.params, strict=True):
            if param.name in self.signatures:
                raise KinaError("name", f"parameter '{param.name}' has the name of a function",
                                param_decl.name.span, ("rename the parameter",))
            scope.env[param.name] = param
            scope.names.add(param.name)
        results: tuple[Value, ...] | None = None
        for statement in decl.body:
            if results is not None:
                raise KinaError("syntax", "statement after 'return' is unreachable",
                                statement.span)
            if isinstance(statement, ast.Let):
                self.check_let(statement)
            elif isinstance(statement, ast.Return):
                results = self.check_return(statement, signature)
            else:
                self.check_values(statement.value, None)
        if results is None:
            if signature.results:
                raise KinaError("type", f"function '{decl.name.ident}' declares a result but "
                                "has no 'return'", decl.name.span)
            results = ()
        function = Function(decl.name.ident, signature.params, tuple(scope.body), results,
                            is_main, decl.span)
        self.scope = None
        return function, scope.calls

    def check_let(self, let: ast.Let) -> None:
        hints = [t.ident for t in let.targets]
        values = self.check_values(let.value, hints)
        if len(values) != len(let.targets) or (let.destructure and len(values) == 1 and
                                                len(let.targets) != 1):
            raise KinaError("arity", f"'let' binds {len(let.targets)} name(s) but the value "
                            f"has {len(values)} result(s)", let.span)
        if not let.destructure and len(values) != 1:
            raise KinaError("arity", f"the value has {len(values)} results; bind them with "
                            "'let (a, b, ...) = ...'", let.span)
        if let.annotation is not None:
            declared = self.resolve_type(let.annotation)
            self.require_type(values[0].type, declared, let.annotation.span,
                              f"'{hints[0]}' is annotated")
        for index, target in enumerate(let.targets):
            if any(t.ident == target.ident for t in let.targets[:index]):
                raise KinaError("name", f"'{target.ident}' is bound twice in this 'let'",
                                target.span)
        for target, value in zip(let.targets, values, strict=True):
            if target.ident in REGISTRY or target.ident in self.signatures:
                raise KinaError("name", f"'{target.ident}' is an op or function name and "
                                "cannot be rebound", target.span)
            if target.ident in self.symbols:
                raise KinaError("name", f"'{target.ident}' is a const and cannot be rebound",
                                target.span)
            self.scope.env[target.ident] = value

    def check_return(self, statement: ast.Return, signature: Signature) -> tuple[Value, ...]:
        values = self.check_values(statement.value, None)
        declared = signature.results
        if len(values) != len(declared):
            raise KinaError("arity", f"'return' gives {len(values)} value(s) but "
                            f"'{signature.decl.name.ident}' declares {len(declared)} result(s)",
                            statement.span)
        fname = signature.decl.name.ident
        items = statement.value.elements if isinstance(statement.value, ast.TupleExpr) else ()
        for index, (value, expected) in enumerate(zip(values, declared, strict=True)):
            # Point at the returned expression, and say where the result type was declared.
            where = items[index].span if len(items) == len(values) else statement.value.span
            self.require_type(value.type, expected, where, f"result {index} of '{fname}'",
                              ((f"the result type is declared at "
                               f"{signature.decl.results[index].span}"),))
        return values

    def require_type(self, actual: TensorType, expected: TensorType, span: Span,
                     what: str, notes: tuple[str, ...] = ()) -> None:
        if actual.dtype != expected.dtype or actual.rank != expected.rank:
            raise KinaError("type", f"{what}: expected {expected.surface()}, got "
                            f"{actual.surface()}", span, notes)
        ctx = OpContext(self, "return", span, {})
        for axis, (a, b) in enumerate(zip(actual.shape, expected.shape, strict=True)):
            claim = f"{what}: dim {axis} {format_dim(a)} == {format_dim(b)}"
            if a == b:  # the common case; the message below costs O(rank) to build
                ctx.record("type-equality", claim)
                continue
            ctx.prove_equal(a, b, "type-equality", claim, f"{what}: expected "
                            f"{expected.surface()}, got {actual.surface()} (dim {axis} "
                            "differs)", notes=notes)

    # ---- expressions --------------------------------------------------------------------------

    def check_values(self, expr: ast.Expr, hints: list[str] | None) -> tuple[Value, ...]:
        """Check an expression in value position; returns its result values."""
        if isinstance(expr, ast.TupleExpr):
            return tuple(self.check_tensor(e, None) for e in expr.elements)
        if isinstance(expr, ast.Call):
            return self.check_call(expr, hints)
        if isinstance(expr, ast.Binary):
            return self.check_infix(expr, hints)
        if isinstance(expr, ast.Unary):
            if literal_value(expr) is not None:
                raise KinaError("type", "a number is not a tensor; use it as an operand of an "
                                "elementwise op", expr.span)
            return self.apply_op(REGISTRY["neg"], expr, {"x": expr.operand}, hints)
        if isinstance(expr, ast.Name):
            return (self.lookup_tensor(expr),)
        if isinstance(expr, (ast.IntLit, ast.FloatLit)):
            raise KinaError("type", "a number is not a tensor here", expr.span,
                            ("number literals may be operands of add, sub, mul and div",))
        if isinstance(expr, ast.ListExpr):
            raise KinaError("type", "a list is not a tensor here", expr.span)
        if isinstance(expr, ast.TensorTypeExpr):
            raise KinaError("type", "a type is not a value here", expr.span,
                            ("to declare an input of @main use placeholder(Tensor[...])",))
        raise KinaError("syntax", "unsupported expression", expr.span)

    def check_tensor(self, expr: ast.Expr, hint: str | None) -> Value:
        values = self.check_values(expr, [hint] if hint else None)
        if len(values) != 1:
            raise KinaError("arity", f"expected one tensor, but this has {len(values)} "
                            "results", expr.span)
        return values[0]

    def lookup_tensor(self, name: ast.Name) -> Value:
        value = self.scope.env.get(name.ident)
        if value is not None:
            return value
        if name.ident in self.symbols:
            raise KinaError("type", f"'{name.ident}' is a const dimension, not a tensor",
                            name.span)
        if name.ident in self.signatures or name.ident in REGISTRY:
            raise KinaError("type", f"'{name.ident}' is a function; call it with arguments",
                            name.span)
        raise KinaError("name", f"unknown name '{name.ident}'", name.span,
                        did_you_mean(name.ident, list(self.scope.env)))

    def check_infix(self, expr: ast.Binary, hints) -> tuple[Value, ...]:
        opname = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul"}[expr.op]
        op = REGISTRY[opname]
        names = [p.name for p in op.params]
        return self.apply_op(op, expr, {names[0]: expr.lhs, names[1]: expr.rhs}, hints)

    def dim_expr(self, expr: ast.Expr, allow_infer: bool = False) -> sympy.Expr:
        if isinstance(expr, ast.IntLit):
            if expr.value > MAX_DIM:
                raise KinaError("shape", f"dimension {expr.value} is larger than {MAX_DIM}",
                                expr.span)
            return sympy.Integer(expr.value)
        if isinstance(expr, ast.Name):
            if expr.ident in self.symbols:
                return self.symbols[expr.ident]
            if self.scope is not None and expr.ident in self.scope.env:
                raise KinaError("type", f"'{expr.ident}' is a tensor, not a dimension",
                                expr.span)
            raise KinaError("name", f"unknown const '{expr.ident}' in a dimension", expr.span,
                            did_you_mean(expr.ident, list(self.symbols)))
        if isinstance(expr, ast.Unary) and allow_infer and literal_value(expr) == -1:
            return sympy.Integer(-1)
        if isinstance(expr, ast.Binary) and expr.op in "+-*":
            lhs, rhs = self.dim_expr(expr.lhs), self.dim_expr(expr.rhs)
            combine = {"+": operator.add, "-": operator.sub, "*": operator.mul}[expr.op]
            return sympy.expand(combine(lhs, rhs))
        if isinstance(expr, ast.Binary):
            raise KinaError("shape", f"'{expr.op}' is not allowed in a dimension", expr.span,
                            ("dimension expressions use integers, consts, + - * and "
                             "parentheses",))
        raise KinaError("shape", "expected a dimension (an integer, a const, or + - * of them)",
                        expr.span)

    def require_dim_positive(self, dim, span: Span) -> None:
        value = self.evaluate(dim)
        if value < 1:
            raise KinaError("shape", f"dimension {format_dim(dim)} = {value} is not positive",
                            span, ("every dimension must be at least 1",))
        if value > MAX_DIM:
            raise KinaError("shape", f"dimension {format_dim(dim)} = {value} is too large",
                            span, (f"the largest supported dimension is {MAX_DIM}",))

    def require_concrete(self, ttype: TensorType, span: Span, what: str) -> None:
        subject = f"the type {ttype.surface()}" if what == "type" else \
            f"'{what}' produces {ttype}, which"
        count = 1
        for dim in ttype.shape:
            value = self.evaluate(dim)
            if value < 1 or value > MAX_DIM:
                raise KinaError("shape", f"{subject} has dim {format_dim(dim)} = {value}, out "
                                "of range", span, (f"dimensions must lie in 1..{MAX_DIM}",))
            count *= value
        if count > MAX_ELEMENTS:
            raise KinaError("shape", f"{subject} has {count} elements, more than the supported "
                            f"{MAX_ELEMENTS}", span)

    def resolve_type(self, texpr: ast.TensorTypeExpr) -> TensorType:
        dname = texpr.dtype.ident
        if dname in RESERVED_DTYPES:
            raise KinaError("unsupported", f"element type {dname} is not supported yet",
                            texpr.dtype.span,
                            ("supported element types: F32, F64, I64, BF16, BOOL",))
        if dname not in SURFACE_DTYPES:
            raise KinaError("type", f"unknown element type '{dname}'", texpr.dtype.span,
                            ("supported element types: F32, F64, I64, BF16, BOOL",))
        placement = texpr.placement.ident
        if placement not in SUPPORTED_PLACEMENTS:
            raise KinaError("unsupported", f"placement '@{placement}' is not supported",
                            texpr.placement.span, ("tilegen compiles for the CPU: use @host",))
        dims = []
        for dim_node in texpr.dims:
            dim = self.dim_expr(dim_node)
            self.require_dim_positive(dim, dim_node.span)
            dims.append(dim)
        ttype = TensorType(SURFACE_DTYPES[dname], tuple(dims))
        self.require_concrete(ttype, texpr.span, "type")
        return ttype


