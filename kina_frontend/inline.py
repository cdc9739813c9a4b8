"""Inlining calls: sizes counted without inlining, the size limit, and the inliner.

The inliner knows nothing of autodiff: a `reverse_mode` is expanded by the callback it is
handed (`kina_frontend.autodiff.expand_reverse_mode`), so autodiff can inline its callee
and `transforms` can inline everything without the modules importing each other.
"""

from __future__ import annotations

from collections.abc import Callable

from .diagnostics import KinaError
from .tensor_ir import Function, Operation, Program, Value

# (program, the reverse_mode op, max_ops) -> the function to inline in its place
ReverseExpander = Callable[[Program, Operation, int], Function]

# Operations one function may have once its calls are inlined (tilegen reads
# TILEGEN_MAX_INLINED_OPS). Each call is a copy of its callee, so a program whose calls
# double per level reaches 2^levels operations from a few lines; beyond this, a
# diagnostic instead of minutes of compiling. The largest bundled program (the scaled
# training step with its gradient) inlines to about a thousand.
MAX_INLINED_OPS = 200_000

_CALLS = ("call", "reverse_mode")


def inlined_sizes(program: Program) -> dict[str, int]:
    """Operations each function has once every call in it is inlined, counted without
    inlining (each function once, callees first: linear in the program). A `reverse_mode`
    counts as its callee's size, a lower bound: its expansion is counted again when the
    gradient function is inlined. Computed once per program."""
    sizes = program.__dict__.get("_inlined_sizes")
    if sizes is not None:
        return sizes
    sizes = {}
    for root in program.functions:
        stack, entered = [root], set()
        while stack:
            function = stack[-1]
            if function.name in sizes:
                stack.pop()
                continue
            calls = [op for op in function.body if op.op in _CALLS]
            pending = [program.function(op.attr("callee")) for op in calls
                       if op.attr("callee") not in sizes]
            if pending:
                if function.name in entered:
                    call = next(op for op in calls if op.attr("callee") not in sizes)
                    raise KinaError("unsupported", f"recursive call to "
                                    f"'{call.attr('callee')}'", call.span,
                                    ("Kina functions are inlined; recursion is not "
                                     "supported",))
                entered.add(function.name)
                stack.extend(pending)
                continue
            sizes[function.name] = sum(sizes[op.attr("callee")] if op.op in _CALLS else 1
                                       for op in function.body)
            stack.pop()
    program.__dict__["_inlined_sizes"] = sizes  # a cache, not a field (frozen dataclass)
    return sizes


def check_inlined_size(program: Program, function: Function,
                       max_ops: int = MAX_INLINED_OPS) -> None:
    """Raise a KinaError at the call that first takes a function over `max_ops` operations
    once inlined: follow callees over the limit down to the smallest one, then the call in
    it whose running count crosses the limit."""
    sizes = inlined_sizes(program)

    def size(op: Operation) -> int:
        return sizes[op.attr("callee")] if op.op in _CALLS else 1

    total = sum(size(op) for op in function.body)
    if total <= max_ops:
        return
    current = function
    while True:
        heavier = next((op for op in current.body
                        if op.op in _CALLS and sizes[op.attr("callee")] > max_ops), None)
        if heavier is None:
            break
        current = program.function(heavier.attr("callee"))
    running = 0
    for op in current.body:
        running += size(op)
        if running > max_ops:
            break
    callee = op.attr("callee") if op.op in _CALLS else None
    what = f"this call of '{callee}' ({sizes[callee]} operations once inlined)" \
        if callee else "this operation"
    where = f"'{current.name}'" if current is not function else "it"
    raise KinaError(
        "unsupported",
        f"inlining every call in '{function.name}' would give {total} operations, over "
        f"the limit of {max_ops}", op.span,
        (f"{what} takes {where} to {running}; every call is a copy of its callee, so calls "
         "that repeat per level multiply per level",
         "compute a value once and pass it on instead of calling again, or raise the "
         "limit with TILEGEN_MAX_INLINED_OPS"))


def inline_calls(program: Program, function: Function, max_ops: int = MAX_INLINED_OPS,
                 expand_reverse: ReverseExpander | None = None) -> Function:
    """`function` with every `call` replaced by the callee's body (recursively).

    Callee values are renamed `<callee>.<n>.<name>` so SSA names stay unique. A
    `reverse_mode` is replaced by the function `expand_reverse` returns for it (the
    autodiff transform's gradient, inlined), then inlined like a call. A function that
    would exceed `max_ops` operations raises a KinaError before any inlining.
    """
    check_inlined_size(program, function, max_ops)
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
            callee = _callee(program, op, max_ops, expand_reverse)
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


def _callee(program: Program, op: Operation, max_ops: int,
            expand_reverse: ReverseExpander | None) -> Function:
    if op.op == "reverse_mode":
        if expand_reverse is None:
            raise KinaError("autodiff", "'reverse_mode' needs the autodiff transform to be "
                            "inlined (kina_frontend.transforms.inline_calls)", op.span)
        return expand_reverse(program, op, max_ops)
    return program.function(op.attr("callee"))
