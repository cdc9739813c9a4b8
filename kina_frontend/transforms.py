"""Tensor IR -> tensor IR passes that prepare a function for code generation."""

from __future__ import annotations

from .autodiff import expand_reverse_mode
from .inline import MAX_INLINED_OPS, check_inlined_size, inlined_sizes
from .inline import inline_calls as _inline_calls
from .simplify import eliminate_dead_code
from .tensor_ir import Function, Operation, Program, Value, main_outputs

__all__ = ["MAX_INLINED_OPS", "check_inlined_size", "eliminate_dead_code", "inline_calls",
           "inlined_sizes", "placeholders_to_params", "prepare_for_codegen",
           "project_before_gather"]


def inline_calls(program: Program, function: Function,
                 max_ops: int = MAX_INLINED_OPS) -> Function:
    """`function` with every `call` inlined and every `reverse_mode` expanded by the
    autodiff transform first (kina_frontend.inline.inline_calls)."""
    return _inline_calls(program, function, max_ops, expand_reverse_mode)


def placeholders_to_params(function: Function) -> Function:
    """An @main function's `placeholder` ops become its parameters, in order; its sink
    values (read by nothing) become its results when it has no `return`."""
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


def prepare_for_codegen(program: Program, name: str,
                        max_ops: int = MAX_INLINED_OPS) -> Function:
    """Inline calls, expand reverseMode, turn placeholders into params, drop dead code."""
    function = program.function(name)
    if function.is_main:
        function = placeholders_to_params(function)
    return eliminate_dead_code(inline_calls(program, function, max_ops))


def project_before_gather(function: Function) -> Function:
    """`matmul(gather(table, ids), w)` -> `gather(matmul(table, w), ids)` when fewer table
    rows exist than ids are gathered (a small vocabulary projected at every position:
    StoryLM-0's q, k and v read 36 rows of an 8-row embedding). Each output element is
    the same sum over the same products in the same order, so nothing changes but the
    work: rows x K x N multiply-adds instead of len(ids) x K x N. `w` must be the same
    matrix for every batch: a rank-2 operand, or a broadcast of one. The new gather keeps
    the old one's location, so an out-of-range id is reported where it was."""
    defs: dict[str, Operation] = {}
    taken = {v.name for v in function.params}
    taken |= {r.name for op in function.body for r in op.results}
    body: list[Operation] = []
    for op in function.body:
        rewritten = _projected_gather(op, defs, taken)
        for new in rewritten or (op,):
            body.append(new)
            for result in new.results:
                defs[result.name] = new
    return Function(function.name, function.params, tuple(body), function.results,
                    function.is_main, function.span)


def _projected_gather(op: Operation, defs: dict[str, Operation],
                      taken: set[str]) -> tuple[Operation, Operation] | None:
    if op.op != "matmul":
        return None
    a, b = op.operands
    gather = defs.get(a.name)
    if gather is None or gather.op != "gather":
        return None
    table, ids = gather.operands
    weight = b
    source = defs.get(b.name)
    if b.type.rank > 2:
        if source is None or source.op != "broadcast" or source.operands[0].type.rank != 2:
            return None
        weight = source.operands[0]
    if weight.type.concrete_shape != b.type.concrete_shape[-2:]:
        return None
    rows = table.type.concrete_shape[0]
    gathered = 1
    for extent in ids.type.concrete_shape:
        gathered *= extent
    if rows >= gathered:
        return None
    name, suffix = f"{op.result.name}_rows", 1
    while name in taken:
        suffix += 1
        name = f"{op.result.name}_rows{suffix}"
    taken.add(name)
    projected = Value(name, table.type.with_shape((table.type.shape[0], weight.type.shape[1])))
    return (Operation("matmul", (table, weight), (projected,), (), op.span),
            Operation("gather", (projected, ids), op.results, gather.attrs, gather.span))
