"""Tensor IR -> tensor IR passes that prepare a function for code generation."""

from __future__ import annotations

from .tensor_ir import Function, Operation, Program, Value


def inline_calls(program: Program, function: Function) -> Function:
    """`function` with every `call` replaced by the callee's body (recursively).

    Callee values are renamed `<callee>.<n>.<name>` so SSA names stay unique.
    `reverse_mode` is expanded by the autodiff transform first, then inlined.
    """
    counter = [0]
    used = {v.name for v in function.params} | {r.name for op in function.body
                                                 for r in op.results}

    def fresh(base: str) -> str:
        name = base
        while name in used:
            counter[0] += 1
            name = f"{base}.{counter[0]}"
        used.add(name)
        return name

    # An explicit stack of the bodies being expanded (not recursion: a chain of thousands of
    # calls must not exhaust Python's recursion limit). A frame holds the rest of a body,
    # its renaming, and where the callee's results go when the body is done.
    rename: dict[str, Value] = {}
    body: list[Operation] = []
    stack = [(iter(function.body), rename, None)]
    while stack:
        ops, names, on_return = stack[-1]
        op = next(ops, None)
        if op is None:
            stack.pop()
            if on_return is not None:
                caller_names, call_results, callee_results = on_return
                for outer, inner in zip(call_results, callee_results, strict=True):
                    caller_names[outer.name] = names.get(inner.name, inner)
            continue
        operands = tuple(names.get(v.name, v) for v in op.operands)
        if op.op in ("call", "reverse_mode"):
            callee = _callee(program, op)
            inner = {p.name: a for p, a in zip(callee.params, operands, strict=True)}
            for inner_op in callee.body:
                for result in inner_op.results:
                    inner[result.name] = Value(fresh(f"{callee.name}.{result.name}"),
                                               result.type)
            stack.append((iter(callee.body), inner, (names, op.results, callee.results)))
            continue
        results = tuple(names.get(r.name, r) for r in op.results)
        body.append(Operation(op.op, operands, results, op.attrs, op.span))
    results = tuple(rename.get(v.name, v) for v in function.results)
    return Function(function.name, function.params, tuple(body), results, function.is_main,
                    function.span)


def _callee(program: Program, op: Operation) -> Function:
    callee = program.function(op.attr("callee"))
    if op.op == "reverse_mode":
        from .autodiff import gradient_function

        transformed = gradient_function(program, callee.name, op.attr("wrt"))
        return inline_calls(transformed.program, transformed.program.function(transformed.name))
    return callee


def placeholders_to_params(function: Function) -> Function:
    """An @main function's `placeholder` ops become its parameters, in order; its sink
    values (read by nothing) become its results when it has no `return`."""
    from .interpreter import main_outputs

    params = list(function.params)
    body = []
    for op in function.body:
        if op.op == "placeholder":
            params.append(op.result)
        else:
            body.append(op)
    results = function.results or main_outputs(function)
    return Function(function.name, tuple(params), tuple(body), results, function.is_main,
                    function.span)


def eliminate_dead_code(function: Function) -> Function:
    """Drop operations none of whose results reaches a function result."""
    live = {v.name for v in function.results}
    kept = []
    for op in reversed(function.body):
        if any(r.name in live for r in op.results):
            kept.append(op)
            live.update(v.name for v in op.operands)
    return Function(function.name, function.params, tuple(reversed(kept)), function.results,
                    function.is_main, function.span)


def prepare_for_codegen(program: Program, name: str) -> Function:
    """Inline calls, expand reverseMode, turn placeholders into params, drop dead code."""
    function = program.function(name)
    if function.is_main:
        function = placeholders_to_params(function)
    return eliminate_dead_code(inline_calls(program, function))
