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
from dataclasses import dataclass, field

import sympy

from . import ast
from .diagnostics import KinaError, Span
from .names import NameSupply
from .ops import REGISTRY, OpDef
from .tensor_ir import Function, Operation, Program, Value, make_attrs
from .types import (
    RESERVED_DTYPES,
    SUPPORTED_PLACEMENTS,
    SURFACE_DTYPES,
    DType,
    TensorType,
    const_symbol,
    format_dim,
)

# Guards that keep hostile programs from asking for absurd allocations.
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**34

STRUCTURAL_CALLS = ("placeholder", "reverseMode")


@dataclass(frozen=True)
class Obligation:
    function: str
    kind: str
    claim: str
    span: Span | None


@dataclass(frozen=True)
class CheckedProgram:
    """The symbolic tensor IR plus what was proved about it."""

    program: Program
    constants: dict[str, int]
    symbols: dict[str, sympy.Expr]
    obligations: tuple[Obligation, ...]


def check_module(module: ast.Module, consts: Mapping[str, int] | None = None) -> CheckedProgram:
    """Check a parsed module. `consts` gives other values to consts defined by an integer
    literal (`{"T": 128}` compiles `const T = 16;` as T = 128); the proofs are the same, since
    such a const is a free symbol while checking."""
    return _Checker(module, dict(consts or {})).run()


# ---- the checker ----------------------------------------------------------------------------

@dataclass
class _Signature:
    decl: ast.FnDecl
    params: tuple[Value, ...]
    results: tuple[TensorType, ...]


@dataclass
class _FunctionScope:
    name: str
    is_main: bool
    env: dict[str, Value] = field(default_factory=dict)
    body: list[Operation] = field(default_factory=list)
    names: NameSupply = field(default_factory=NameSupply)
    temp_counter: int = 0
    placeholders: int = 0
    calls: list[tuple[str, Span]] = field(default_factory=list)

    def fresh(self, hint: str | None) -> str:
        base = hint or f"t{self.temp_counter}"
        if hint is None:
            self.temp_counter += 1
        return self.names.fresh(base)


class _Checker:
    def __init__(self, module: ast.Module, overrides: dict[str, int]):
        self.module = module
        self.overrides = overrides
        self.symbols: dict[str, sympy.Expr] = {}
        self.values: dict[str, int] = {}
        self.const_spans: dict[str, Span] = {}
        self.signatures: dict[str, _Signature] = {}
        self.obligations: list[Obligation] = []
        self.scope: _FunctionScope | None = None

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
        self.signatures[name] = _Signature(decl, tuple(params), results)

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
        scope = _FunctionScope(decl.name.ident, is_main)
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

    def check_return(self, statement: ast.Return, signature: _Signature) -> tuple[Value, ...]:
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
        ctx = _OpContext(self, "return", span, {})
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
            if _literal_value(expr) is not None:
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
                        _did_you_mean(name.ident, list(self.scope.env)))

    def check_infix(self, expr: ast.Binary, hints) -> tuple[Value, ...]:
        opname = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul"}[expr.op]
        op = REGISTRY[opname]
        names = [p.name for p in op.params]
        return self.apply_op(op, expr, {names[0]: expr.lhs, names[1]: expr.rhs}, hints)

    def check_call(self, call: ast.Call, hints) -> tuple[Value, ...]:
        if isinstance(call.callee, ast.Call):
            return self.check_reverse_mode(call, hints)
        if not isinstance(call.callee, ast.Name):
            raise KinaError("syntax", "only names can be called", call.callee.span)
        name = call.callee.ident
        if name == "placeholder":
            return (self.check_placeholder(call, hints),)
        if name == "reverseMode":
            raise KinaError("syntax", "reverseMode(f, wrt=[...]) is a function value; call it "
                            "with f's arguments: reverseMode(f, wrt=[w])(x, w)", call.span)
        if name in self.signatures:
            return self.check_fn_call(call, self.signatures[name], hints)
        op = REGISTRY.get(name)
        if op is None or op.internal:
            if name in self.scope.env:
                raise KinaError("type", f"'{name}' is a tensor, not a function", call.callee.span)
            candidates = [n for n, o in REGISTRY.items() if not o.internal] + list(self.signatures)
            raise KinaError("name", f"unknown op or function '{name}'", call.callee.span,
                            _did_you_mean(name, candidates))
        bound = _bind_arguments(op, call)
        return self.apply_op(op, call, bound, hints)

    def check_placeholder(self, call: ast.Call, hints) -> Value:
        if not self.scope.is_main:
            raise KinaError("type", "placeholder(...) is only allowed in the @main "
                            "function", call.span,
                            ((f"'{self.scope.name}' receives its inputs as parameters; mark "
                              "the entry function with @main to declare placeholders"),))
        if len(call.args) != 1 or call.kwargs or \
                not isinstance(call.args[0], ast.TensorTypeExpr):
            raise KinaError("arity", "placeholder takes one tensor type: "
                            "placeholder(Tensor[F32, [dims], @host])", call.span)
        ttype = self.resolve_type(call.args[0])
        result = Value(self.scope.fresh(hints[0] if hints else None), ttype)
        self.scope.body.append(Operation("placeholder", (), (result,),
                                         make_attrs(index=self.scope.placeholders), call.span))
        self.scope.placeholders += 1
        return result

    def check_fn_call(self, call: ast.Call, signature: _Signature, hints) -> tuple[Value, ...]:
        name = signature.decl.name.ident
        self.reject_main_callee(signature, call.callee.span)
        if call.kwargs:
            raise KinaError("arity", f"function '{name}' takes positional arguments only",
                            call.kwargs[0].span)
        if len(call.args) != len(signature.params):
            raise KinaError("arity", f"'{name}' takes {len(signature.params)} argument(s), "
                            f"got {len(call.args)}", call.span,
                            (f"'{name}' is declared at {signature.decl.name.span}",))
        operands = self.check_call_args(call, signature)
        self.scope.calls.append((name, call.callee.span))
        return self.emit("call", operands, {"callee": name}, signature.results, call.span, hints)

    @staticmethod
    def reject_main_callee(signature: _Signature, span: Span) -> None:
        # @main's placeholders are the program's inputs; a call would smuggle them elsewhere.
        if any(a.ident == "main" for a in signature.decl.attributes):
            raise KinaError("type", f"the @main function '{signature.decl.name.ident}' cannot "
                            "be called", span,
                            ("move the shared computation into a function and call that",))

    def check_call_args(self, call: ast.Call, signature: _Signature) -> tuple[Value, ...]:
        operands = []
        for arg, param in zip(call.args, signature.params, strict=True):
            value = self.check_tensor(arg, None)
            self.require_type(value.type, param.type, arg.span,
                              f"argument '{param.name}' of '{signature.decl.name.ident}'")
            operands.append(value)
        return tuple(operands)

    def check_reverse_mode(self, call: ast.Call, hints) -> tuple[Value, ...]:
        inner = call.callee
        if not (isinstance(inner.callee, ast.Name) and inner.callee.ident == "reverseMode"):
            raise KinaError("syntax", "only reverseMode(f, wrt=[...]) returns a callable",
                            inner.span)
        if len(inner.args) != 1 or not isinstance(inner.args[0], ast.Name):
            raise KinaError("arity", "reverseMode takes one function name: "
                            "reverseMode(f, wrt=[p1, p2])", inner.span)
        fname = inner.args[0].ident
        signature = self.signatures.get(fname)
        if signature is None:
            raise KinaError("name", f"reverseMode of unknown function '{fname}'",
                            inner.args[0].span, _did_you_mean(fname, list(self.signatures)))
        self.reject_main_callee(signature, inner.args[0].span)
        if len(signature.results) != 1:
            raise KinaError("autodiff", f"reverseMode needs '{fname}' to return one tensor; it "
                            f"returns {len(signature.results)}", inner.args[0].span)
        if not signature.results[0].dtype.is_float:
            raise KinaError("autodiff", f"reverseMode needs '{fname}' to return a floating-point "
                            "tensor", inner.args[0].span)
        param_index = {p.name: i for i, p in enumerate(signature.params)}
        wrt: list[int] = []
        for kwarg in inner.kwargs:
            if kwarg.name != "wrt":
                raise KinaError("arity", f"reverseMode has no argument '{kwarg.name}'",
                                kwarg.span, ("its only keyword is wrt=[...]",))
            if not isinstance(kwarg.value, ast.ListExpr):
                raise KinaError("type", "wrt must be a list of parameter names", kwarg.value.span)
            for item in kwarg.value.elements:
                if not isinstance(item, ast.Name) or item.ident not in param_index:
                    raise KinaError("name", f"wrt entry must name a parameter of '{fname}'",
                                    item.span,
                                    (f"parameters: {', '.join(param_index) or '(none)'}",))
                index = param_index[item.ident]
                if index in wrt:
                    raise KinaError("name", f"'{item.ident}' appears twice in wrt", item.span)
                if not signature.params[index].type.dtype.is_float:
                    raise KinaError("autodiff", f"cannot differentiate with respect to "
                                    f"'{item.ident}': it is "
                                    f"{signature.params[index].type.surface()}", item.span,
                                    (("only floating-point parameters have gradients; leave "
                                     "integer inputs such as ids out of wrt"),))
                wrt.append(index)
        if not inner.kwargs:
            wrt = [i for i, p in enumerate(signature.params) if p.type.dtype.is_float]
        if call.kwargs:
            raise KinaError("arity", "the reverseMode callable takes positional arguments only",
                            call.kwargs[0].span)
        if len(call.args) != len(signature.params):
            raise KinaError("arity", f"reverseMode({fname}) takes {len(signature.params)} "
                            f"argument(s), got {len(call.args)}", call.span)
        operands = self.check_call_args(call, signature)
        self.scope.calls.append((fname, inner.args[0].span))
        result_types = signature.results + tuple(signature.params[i].type for i in wrt)
        return self.emit("reverse_mode", operands, {"callee": fname, "wrt": tuple(wrt)},
                         result_types, call.span, hints)

    def apply_op(self, op: OpDef, node: ast.Node, bound: dict[str, ast.Expr], hints):
        """Check the bound arguments of a registry op and emit the operation."""
        operands: dict[str, Value] = {}
        literals: dict[str, tuple[float | int, ast.Expr]] = {}
        attrs: dict[str, object] = {}
        variadic: list[Value] = []
        for param in op.params:
            expr = bound.get(param.name)
            if expr is None:
                attrs[param.name] = param.default
                continue
            number = self.number_value(expr) if param.kind == "tensor_or_literal" else None
            if number is not None:
                literals[param.name] = (number, expr)
            elif param.variadic:
                variadic = [self.check_tensor(e, None) for e in expr]
            elif param.is_operand:
                operands[param.name] = self.check_tensor(expr, None)
            else:
                attrs[param.name] = self.attr_value(param.kind, expr, op.name)
        if literals:
            self.materialize_literals(op, node, operands, literals)
        ordered = tuple(operands[p.name] for p in op.operand_params if not p.variadic)
        ordered += tuple(variadic)
        arg_spans = {name: expr.span for name, expr in bound.items()
                     if not isinstance(expr, list)}
        ctx = _OpContext(self, op.name, node.span, arg_spans)
        result_types = op.shape_rule(ctx, [v.type for v in ordered], attrs)
        for rtype in result_types:
            self.require_concrete(rtype, node.span, op.name)
        return self.emit(op.name, ordered, attrs, result_types, node.span, hints)

    def number_value(self, expr: ast.Expr):
        """The number `expr` stands for where an op takes a number: a literal, a const's
        value (a const name not shadowed by a tensor), or + - * of those; else None."""
        literal = _literal_value(expr)
        if literal is not None:
            return literal
        if isinstance(expr, ast.Name):
            in_scope = self.scope is not None and expr.ident in self.scope.env
            return self.values.get(expr.ident) if not in_scope else None
        if isinstance(expr, ast.Binary) and expr.op in "+-*":
            lhs, rhs = self.number_value(expr.lhs), self.number_value(expr.rhs)
            if lhs is None or rhs is None:
                return None
            return {"+": operator.add, "-": operator.sub, "*": operator.mul}[expr.op](lhs, rhs)
        return None

    def materialize_literals(self, op, node, operands, literals) -> None:
        if not operands:
            raise KinaError("type", f"'{op.name}' needs at least one tensor operand", node.span)
        # A number takes the type of a tensor it combines with (where's condition is BOOL:
        # a number branch takes the other branch's type, or F32 when both are numbers).
        peers = [operands[p.name] for p in op.params
                 if p.kind == "tensor_or_literal" and p.name in operands]
        like = (peers[0] if peers else next(iter(operands.values()))).type
        if not peers and like.dtype == DType.BOOL:
            like = like.with_dtype(DType.F32)
        for name, (number, expr) in literals.items():
            if not like.dtype.is_float and isinstance(number, float):
                raise KinaError("type", f"float literal {number} used with an "
                                f"{like.dtype.kina_name} tensor", expr.span,
                                (("a literal takes the element type of the other operand; "
                                 "write an integer, or use an F32 tensor"),))
            value = float(number) if like.dtype.is_float else int(number)
            attrs = {"value": value, "shape": like.shape, "dtype": like.dtype.value}
            (filled,) = self.emit("fill", (), attrs, (like,), expr.span, None)
            operands[name] = filled

    def emit(self, opname, operands, attrs, result_types, span, hints) -> tuple[Value, ...]:
        names = list(hints or [])
        results = []
        for index, rtype in enumerate(result_types):
            hint = names[index] if index < len(names) else None
            results.append(Value(self.scope.fresh(hint), rtype))
        attr_items = {k: _freeze(v) for k, v in attrs.items()}
        self.scope.body.append(Operation(opname, tuple(operands), tuple(results),
                                         make_attrs(**attr_items), span))
        return tuple(results)

    # ---- attributes, dims and types -----------------------------------------------------------

    def attr_value(self, kind: str, expr: ast.Expr, opname: str):
        if kind == "dims":
            if not isinstance(expr, ast.ListExpr):
                raise KinaError("type", f"'{opname}' expects a list of dims like [1, T, 4]",
                                expr.span)
            return tuple(self.dim_expr(e, allow_infer=(opname == "reshape"))
                         for e in expr.elements)
        if kind == "ints":
            if not isinstance(expr, ast.ListExpr):
                raise KinaError("type", f"'{opname}' expects a list of integers like [0, 2, 1]",
                                expr.span)
            return tuple(self.int_literal(e) for e in expr.elements)
        if kind == "dim":
            dim = self.dim_expr(expr)
            self.require_dim_positive(dim, expr.span)
            return dim
        if kind == "axis":
            return self.int_literal(expr)
        if kind == "offset":
            dim = self.dim_expr(expr)
            if self.evaluate(dim) < 0:
                raise KinaError("shape", f"'{opname}' needs a position >= 0, got "
                                f"{format_dim(dim)} = {self.evaluate(dim)}", expr.span)
            return dim
        if kind == "number":
            number = self.number_value(expr)
            if number is None:
                raise KinaError("type", f"'{opname}' expects a number (a literal or a const)",
                                expr.span)
            return float(number)
        if kind == "dtype":
            if not isinstance(expr, ast.Name) or expr.ident not in SURFACE_DTYPES:
                raise KinaError("type", f"'{opname}' expects an element type: "
                                f"{', '.join(SURFACE_DTYPES)}", expr.span)
            return SURFACE_DTYPES[expr.ident].value
        raise AssertionError(kind)

    def int_literal(self, expr: ast.Expr) -> int:
        value = _literal_value(expr)
        if not isinstance(value, int):
            raise KinaError("type", "expected an integer literal", expr.span)
        if abs(value) > MAX_DIM:
            raise KinaError("type", f"integer {value} is out of range", expr.span)
        return value

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
                            _did_you_mean(expr.ident, list(self.symbols)))
        if isinstance(expr, ast.Unary) and allow_infer and _literal_value(expr) == -1:
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


class _OpContext:
    """The `ShapeContext` handed to an op's typing rule for one call site."""

    def __init__(self, checker: _Checker, opname: str, span: Span, arg_spans: dict[str, Span]):
        self.checker = checker
        self.opname = opname
        self.span = span
        self.arg_spans = arg_spans

    def _span(self, at: str | None) -> Span:
        return self.arg_spans.get(at, self.span) if at else self.span

    def record(self, kind: str, claim: str) -> None:
        function = self.checker.scope.name if self.checker.scope else ""
        self.checker.obligations.append(Obligation(function, kind, claim, self.span))

    def prove_equal(self, lhs, rhs, kind, claim, message, at=None, notes=()) -> None:
        lhs_expanded, rhs_expanded = sympy.expand(lhs), sympy.expand(rhs)
        # Expanded polynomials are canonical, so equal ones need no subtraction (which builds
        # an Add, and sympy's first Add costs ~30 ms of lazy imports).
        if lhs_expanded == rhs_expanded:
            self.record(kind, claim)
            return
        difference = sympy.expand(lhs_expanded - rhs_expanded)
        if difference == 0:
            self.record(kind, claim)
            return
        values = self.checker.substitution
        concrete_lhs = sympy.sympify(lhs).subs(values)
        concrete_rhs = sympy.sympify(rhs).subs(values)
        extra = [f"{format_dim(lhs)} - ({format_dim(rhs)}) simplifies to "
                 f"{format_dim(difference)}, not 0"]
        if concrete_lhs == concrete_rhs:
            extra.append(f"they are equal for the current values ({concrete_lhs}), but not "
                         "for every value of the constants, and shapes are checked for all "
                         "values")
            lhs_e, rhs_e = sympy.sympify(lhs), sympy.sympify(rhs)
            if kind == "reshape-count":
                extra.append("write the target dims with the consts of the source shape")
            elif lhs_e.is_Integer != rhs_e.is_Integer:
                symbolic, literal = (rhs_e, lhs_e) if lhs_e.is_Integer else (lhs_e, rhs_e)
                extra.append(f"write {format_dim(symbolic)} instead of the literal {literal}")
            else:
                extra.append("define one const in terms of the other (e.g. const D = H * Dh)")
        raise KinaError("shape", message, self._span(at), tuple(notes) + tuple(extra))

    def fail(self, kind, message, at=None, notes=()) -> None:
        raise KinaError(kind, message, self._span(at), tuple(notes))

    def prove_at_most(self, lhs, rhs, kind, claim, message, at=None) -> None:
        """lhs <= rhs: proved for every value of the consts when sympy can (T - 1 >= 0),
        otherwise checked at the declared values and recorded as such."""
        gap = sympy.expand(sympy.sympify(rhs) - sympy.sympify(lhs))
        if gap.is_nonnegative:
            self.record(kind, claim)
            return
        if self.checker.evaluate(gap) < 0:
            raise KinaError("shape", message, self._span(at))
        self.record(kind, claim + " (at the declared const values)")


# ---- helpers --------------------------------------------------------------------------------

def _literal_value(expr: ast.Expr):
    if isinstance(expr, ast.IntLit):
        return expr.value
    if isinstance(expr, ast.FloatLit):
        return expr.value
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = _literal_value(expr.operand)
        return None if inner is None else -inner
    return None


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, sympy.Integer):
        return int(value)
    return value


def _bind_arguments(op: OpDef, call: ast.Call) -> dict[str, ast.Expr]:
    params = op.params
    positional = [p for p in params if not p.keyword_only]
    args: list = list(call.args)
    if positional and positional[-1].variadic:
        # The trailing variadic parameter takes every remaining positional argument.
        fixed = len(positional) - 1
        if len(args) <= fixed:
            raise KinaError("arity", f"'{op.name}' needs at least one tensor", call.span,
                            (_signature_text(op),))
        args = args[:fixed] + [args[fixed:]]
    if len(args) > len(positional):
        raise KinaError("arity", f"'{op.name}' takes at most {len(positional)} positional "
                        f"argument(s), got {len(call.args)}", call.args[len(positional)].span,
                        (_signature_text(op),))
    bound: dict[str, ast.Expr] = {}
    for param, arg in zip(positional, args, strict=False):
        bound[param.name] = arg
    by_name = {p.name: p for p in params}
    for kwarg in call.kwargs:
        if kwarg.name not in by_name:
            raise KinaError("arity", f"'{op.name}' has no argument named '{kwarg.name}'",
                            kwarg.span, (_signature_text(op),))
        if kwarg.name in bound:
            raise KinaError("arity", f"argument '{kwarg.name}' of '{op.name}' is given twice",
                            kwarg.span)
        bound[kwarg.name] = kwarg.value
    for param in params:
        if param.name not in bound and not param.has_default:
            raise KinaError("arity", f"'{op.name}' is missing argument '{param.name}'",
                            call.span, (_signature_text(op),))
    return bound


def _signature_text(op: OpDef) -> str:
    shown = {"tensor": "tensor", "tensor_or_literal": "tensor or number", "dims": "[dims]",
             "ints": "[ints]", "dim": "dim", "axis": "int", "tensors": "tensor, ...",
             "offset": "dim", "number": "number", "dtype": "DTYPE"}
    parts = [f"{p.name}: {shown[p.kind]}" for p in op.params]
    return f"signature: {op.name}({', '.join(parts)})"


def _did_you_mean(name: str, candidates: list[str]) -> tuple[str, ...]:
    import difflib

    close = difflib.get_close_matches(name, candidates, n=1)
    return (f"did you mean '{close[0]}'?",) if close else ()


# ---- specialisation -------------------------------------------------------------------------

_EVALUATED: dict[tuple, int] = {}
_FREE_NAMES: dict = {}  # dim -> the names of the consts it mentions


def evaluate_dim(dim, constants: dict[str, int]) -> int:
    """int(dim) with each const symbol replaced by its value; memoised, since the same few
    dims recur through a program (sympy's subs is slow)."""
    if isinstance(dim, int):
        return dim
    if dim.is_Integer:
        return int(dim)
    # Only the consts the dim mentions: keying and substituting over every const made a
    # program with thousands of consts quadratic.
    names = _FREE_NAMES.get(dim)
    if names is None:
        names = tuple(sorted(symbol.name for symbol in dim.free_symbols))
        if len(_FREE_NAMES) > 100_000:
            _FREE_NAMES.clear()
        _FREE_NAMES[dim] = names
    used = tuple((name, constants[name]) for name in names if name in constants)
    key = (dim, used)
    value = _EVALUATED.get(key)
    if value is None:
        mapping = {const_symbol(n): sympy.Integer(v) for n, v in used}
        value = int(dim.xreplace(mapping))
        if len(_EVALUATED) > 100_000:
            _EVALUATED.clear()
        _EVALUATED[key] = value
    return value


def specialize(checked: CheckedProgram) -> Program:
    """Substitute every const's value: all shapes and dim attributes become ints."""

    def concrete(dim):
        return evaluate_dim(dim, checked.constants)

    def ttype(t: TensorType) -> TensorType:
        return TensorType(t.dtype, tuple(concrete(d) for d in t.shape))

    def value(v: Value) -> Value:
        return Value(v.name, ttype(v.type))

    def attr(key, v):
        if key in ("shape", "n") or (isinstance(v, sympy.Expr)):
            if isinstance(v, tuple):
                return tuple(concrete(d) for d in v)
            return concrete(v) if not isinstance(v, (str, float)) else v
        return v

    functions = []
    for function in checked.program.functions:
        body = tuple(Operation(op.op, tuple(value(v) for v in op.operands),
                               tuple(value(v) for v in op.results),
                               tuple((k, attr(k, v)) for k, v in op.attrs), op.span)
                     for op in function.body)
        functions.append(Function(function.name, tuple(value(v) for v in function.params), body,
                                  tuple(value(v) for v in function.results), function.is_main,
                                  function.span))
    return Program(checked.program.constants, tuple(functions))

