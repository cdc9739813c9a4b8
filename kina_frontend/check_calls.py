"""The checker's calls: of registry ops, of user functions, `placeholder` and `reverseMode`,
with attribute and dimension arguments.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from . import ast
from .checked import MAX_DIM
from .diagnostics import KinaError, Span
from .names import NameSupply
from .op_calls import OpContext, bind_arguments, did_you_mean, freeze, literal_value
from .ops import REGISTRY, OpDef
from .tensor_ir import Operation, Value, make_attrs
from .types import SURFACE_DTYPES, DType, TensorType, format_dim


@dataclass
class Signature:
    decl: ast.FnDecl
    params: tuple[Value, ...]
    results: tuple[TensorType, ...]


@dataclass
class FunctionScope:
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


class CallChecker:
    """The call-checking half of the checker (a mixin of `checker._Checker`, whose state it
    uses)."""

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
                            did_you_mean(name, candidates))
        bound = bind_arguments(op, call)
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

    def check_fn_call(self, call: ast.Call, signature: Signature, hints) -> tuple[Value, ...]:
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
    def reject_main_callee(signature: Signature, span: Span) -> None:
        # @main's placeholders are the program's inputs; a call would smuggle them elsewhere.
        if any(a.ident == "main" for a in signature.decl.attributes):
            raise KinaError("type", f"the @main function '{signature.decl.name.ident}' cannot "
                            "be called", span,
                            ("move the shared computation into a function and call that",))

    def check_call_args(self, call: ast.Call, signature: Signature) -> tuple[Value, ...]:
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
                            inner.args[0].span, did_you_mean(fname, list(self.signatures)))
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
        ctx = OpContext(self, op.name, node.span, arg_spans)
        result_types = op.shape_rule(ctx, [v.type for v in ordered], attrs)
        for rtype in result_types:
            self.require_concrete(rtype, node.span, op.name)
        return self.emit(op.name, ordered, attrs, result_types, node.span, hints)

    def number_value(self, expr: ast.Expr):
        """The number `expr` stands for where an op takes a number: a literal, a const's
        value (a const name not shadowed by a tensor), or + - * of those; else None."""
        literal = literal_value(expr)
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
        attr_items = {k: freeze(v) for k, v in attrs.items()}
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
        value = literal_value(expr)
        if not isinstance(value, int):
            raise KinaError("type", "expected an integer literal", expr.span)
        if abs(value) > MAX_DIM:
            raise KinaError("type", f"integer {value} is out of range", expr.span)
        return value
