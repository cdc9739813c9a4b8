"""The `--emit types` report: each binding's proven type and every discharged obligation."""

from __future__ import annotations

from collections import defaultdict

import sympy

from .checker import CheckedProgram, evaluate_dim
from .types import const_symbol, format_dim


def derived_names(checked: CheckedProgram) -> dict[sympy.Expr, sympy.Symbol]:
    """Derived consts (`const D = H * Dh`) by their expression, to print `D`, not `Dh*H`."""
    return {expr: sympy.Symbol(name) for name, expr in checked.symbols.items()
            if expr != const_symbol(name)}


def shown_type(ttype, derived: dict[sympy.Expr, sympy.Symbol],
               memo: dict | None = None) -> str:
    """`f32[1, T, D]`: a symbolic type with derived consts written by name. `memo` caches
    each dim's text across calls (sympy's subs is slow, and a program repeats its dims)."""
    return f"{ttype.dtype.value}[{_dims_text(ttype, derived, {} if memo is None else memo)}]"


def _dims_text(ttype, derived: dict[sympy.Expr, sympy.Symbol], memo: dict) -> str:
    texts = []
    for dim in ttype.shape:
        text = memo.get(dim)
        if text is None:
            text = memo[dim] = format_dim(sympy.sympify(dim).subs(derived))
        texts.append(text)
    return ", ".join(texts)


def types_report(checked: CheckedProgram, source_name: str) -> str:
    derived = derived_names(checked)
    memo: dict = {}

    def shown(ttype) -> str:
        return shown_type(ttype, derived, memo)

    def surface(ttype) -> str:
        return f"Tensor[{ttype.dtype.kina_name}, [{_dims_text(ttype, derived, memo)}], @host]"

    lines = [f"// {source_name}: shapes proved for every positive value of the constants,"]
    statics = ", ".join(f"{n} = {v}" for n, v in checked.constants.items())
    lines.append(f"// then specialised to the static values {statics or '(none)'}")
    for name, expr in checked.symbols.items():
        if expr == const_symbol(name):
            lines.append(f"const {name} = {checked.constants[name]}    "
                         "// symbol: positive integer")
        else:
            lines.append(f"const {name} = {format_dim(expr)} = {checked.constants[name]}")
    by_function = defaultdict(list)
    for obligation in checked.obligations:
        by_function[obligation.function].append(obligation)

    def concrete(ttype) -> str:
        dims = ", ".join(str(evaluate_dim(d, checked.constants)) for d in ttype.shape)
        return f"[{dims}]"

    for function in checked.program.functions:
        lines.append("")
        params = ", ".join(f"{p.name}: {surface(p.type)}" for p in function.params)
        results = ", ".join(surface(v.type) for v in function.results)
        marker = "@main " if function.is_main else ""
        lines.append(f"{marker}fn {function.name}({params}) -> ({results})")
        width = max([len(r.name) for op in function.body for r in op.results] + [4])
        for op in function.body:
            where = f"{op.span.line}:{op.span.column}" if op.span else ""
            for result in op.results:
                lines.append(f"  {result.name:<{width}} : {shown(result.type):<22} = "
                             f"{concrete(result.type):<16} {op.op:<12} @{where}")
        proved = by_function.get(function.name, [])
        lines.append(f"  proved ({len(proved)} obligations):")
        for obligation in proved:
            where = f"{obligation.span.line}:{obligation.span.column}" if obligation.span else ""
            lines.append(f"    [{obligation.kind}] {obligation.claim}  @{where}")
    total = len(checked.obligations)
    lines.append("")
    lines.append(f"// {total} obligations discharged symbolically; all shapes legal at "
                 f"{statics or 'the given sizes'}")
    return "\n".join(lines)
