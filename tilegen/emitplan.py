"""The decisions codegen takes as it emits a kernel, outside the loop IR's own tags, made
visible: the `emit-plan` stage prints the loop IR with each one as a `#` comment.

- short static loops, runs of vector tiles and reductions of at most `UNROLL_TRIPS` trips
  are unrolled (their index arithmetic folded to constants);
- a vector loop's (or vectorised reduction's) last `extent % width` elements run as one
  narrow tile (`tail_width`), masked when they do not fill it;
- a serial loop whose trips each finish one vectorised float sum or maxnum runs four trips
  at a time with their horizontal reductions joined (`joint_reduction`);
- a vector loop inside another vector loop's tile runs serially (lanes are already taken).

Codegen (tilegen/codegen.py) calls these same functions, so the comments cannot drift from
the code it generates. The comments are ignored when the text is read back as a `.loops`
file.
"""

from __future__ import annotations

from . import loopir as L

# Static reduction loops, innermost loops and runs of vector tiles with at most this many
# trips are unrolled as they are emitted.
UNROLL_TRIPS = 4
# Reductions codegen can finish four trips at a time (their lane-wise combine).
JOINT_REDUCTIONS = (L.ReduceOp.SUM, L.ReduceOp.MAXNUM)


def tail_width(width: int, active: int) -> int:
    """Lanes for a loop's last `active` (< width) elements: the narrowest of 4 and 8 lanes
    that holds them. A masked 16-lane tile costs a full 512-bit op per instruction (two
    issue slots on Zen 4); a 4-lane one, a quarter of that."""
    for narrow in (4, 8):
        if active <= narrow < width:
            return narrow
    return width


def joint_reduction(loop: L.For, in_tile: bool) -> L.Reduce | None:
    """The one vectorised float sum or maxnum each trip of `loop` finishes, when codegen
    runs the loop four trips at a time and joins their horizontal reductions; else None."""
    if in_tile or loop.extent < 2:
        return None
    if any(isinstance(s, L.For) for s in loop.body) or \
            not all(isinstance(s, (L.Let, L.Store)) for s in loop.body):
        return None
    reductions = [e for s in loop.body for e in L.subexpressions(s.value)
                  if isinstance(e, L.Reduce)]
    if len(reductions) != 1:
        return None
    (reduce,) = reductions
    if reduce.op not in JOINT_REDUCTIONS or not reduce.vector_width or \
            reduce.dtype not in L.FLOAT_TYPES:
        return None
    return reduce


def _tail(extent: int, width: int) -> str:
    active = extent % width
    if not active:
        return ""
    narrow = tail_width(width, active)
    masked = f", {active} of its lanes active" if active < narrow else ""
    return f", then a {narrow}-lane tail tile{masked}"


def _tiles(extent: int, width: int, first_separate: bool = False) -> str:
    """How the whole tiles of a vector loop or reduction are emitted."""
    whole = extent // width
    if not whole:
        return "no whole tile"
    looped = whole - 1 if first_separate else whole
    how = "unrolled" if looped <= UNROLL_TRIPS else "in a loop"
    return f"{whole} tile(s) of {width} {how}"


def loop_decision(loop: L.For, in_tile: bool) -> str:
    """What codegen does with `loop`, given whether it sits inside a vector tile."""
    if loop.kind == L.LoopKind.VECTOR and not in_tile:
        text = _tiles(loop.extent, loop.width) + _tail(loop.extent, loop.width)
        if loop.threads > 1:
            text = f"whole tiles split across {loop.threads} threads (the tail tile with the " \
                   f"last); {text}"
        return text
    if loop.kind == L.LoopKind.PARALLEL and loop.width > 1:
        return f"outlined, {loop.extent} trips split across {loop.width} threads"
    prefix = "serial inside the enclosing tile; " if loop.kind == L.LoopKind.VECTOR else ""
    reduce = joint_reduction(loop, in_tile)
    if reduce is not None:
        groups, rest = divmod(loop.extent, 4)
        parts = [f"{groups} group(s) of 4"] if groups else []
        if rest >= 2:
            parts.append("a pair")
        if rest % 2:
            parts.append("a single trip")
        return f"{prefix}joint {reduce.op} reductions: {' + '.join(parts)}, horizontal " \
               f"reductions shared"
    if not any(isinstance(s, L.For) for s in loop.body) and loop.extent <= UNROLL_TRIPS:
        return f"{prefix}unrolled ({loop.extent} trips)"
    return prefix.rstrip("; ")


def reduce_decision(reduce: L.Reduce, in_tile: bool) -> str:
    if reduce.vector_width and not in_tile:
        width = reduce.vector_width
        first = reduce.op == L.ReduceOp.SUM and reduce.extent >= width
        return f"{reduce.op}[{reduce.var}]: {_tiles(reduce.extent, width, first)}" \
               f"{_tail(reduce.extent, width)}, one horizontal {reduce.op}"
    if reduce.extent <= UNROLL_TRIPS:
        return f"{reduce.op}[{reduce.var}]: unrolled ({reduce.extent} trips)"
    return ""


def _reductions(expr: L.Expr, in_tile: bool) -> list[str]:
    notes = []
    if isinstance(expr, L.Reduce):
        note = reduce_decision(expr, in_tile)
        if note:
            notes.append(note)
        in_tile = in_tile or bool(expr.vector_width)
    for child in L.children(expr):
        notes.extend(_reductions(child, in_tile))
    return notes


def _with_note(line: str, notes: list[str]) -> str:
    return f"{line}  # {'; '.join(notes)}" if notes else line


def _annotated(stmt: L.Stmt, depth: int, in_tile: bool) -> list[str]:
    if isinstance(stmt, L.For):
        header = L._format_stmt(L.For(stmt.var, stmt.extent, (), stmt.kind, stmt.width,
                                      stmt.threads), depth)
        decision = loop_decision(stmt, in_tile)
        lines = [_with_note(header[0], [decision] if decision else [])]
        inner = in_tile or (stmt.kind == L.LoopKind.VECTOR)
        for child in stmt.body:
            lines.extend(_annotated(child, depth + 1, inner))
        lines.append(header[-1])
        return lines
    lines = L._format_stmt(stmt, depth)
    if isinstance(stmt, (L.Let, L.Store)):
        lines[0] = _with_note(lines[0], _reductions(stmt.value, in_tile))
    return lines


def annotate(kernel: L.Kernel) -> str:
    """`format_kernel(kernel)` with codegen's decisions as `#` comments on the lines they
    concern (loops and statements holding reductions)."""
    text = L.format_kernel(kernel)
    head = text[:text.index("\n{\n") + 3]
    lines = [line for stmt in kernel.body for line in _annotated(stmt, 1, False)]
    return head + "\n".join(lines) + "\n}"
