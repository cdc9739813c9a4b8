"""`AttentionBackward`, the loop-IR statement of the fused attention backward: its fields,
its printed form, and the reader and verifier of that form (tilegen/attention_backward.py
builds it, tilegen/attention_backward_codegen.py emits it).

With P = softmax(score) as the forward computed it and G the score cotangent's source,

    s[i, j]   = dot over d of q[i, :] and kt[:, j]          P = exp(score - m[i]) / l[i]
    g[i, j]   = dot over dv of do[i, :] and vt[:, j]        D[i] = sum over n of do[i, n] o[i, n]
    dx[i, j]  = P (g - D[i])                                 (softmax's vector-Jacobian product)
    ds[i, j]  = dscore, an expression in dx                  (back through scale and mask)

and each `AttentionGradient` is a product with P or ds that the statement writes: summed
over queries (out[key, n] = sum_i w[i, key] operand[i, n]: dK, dV) or over keys
(out[query, n] = sum_j w[query, j] operand[j, n]: dQ, through per-thread `partial` sums).
m and l come from the forward's `stats` buffer (an `Attention` with `stats=`); D is
written into its third column.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import loopir as L


@dataclass(frozen=True)
class AttentionGradient:
    over: str            # "queries" (one row per key) or "keys" (one row per query)
    weight: str          # "p" or "ds"
    operand: str         # [batch..., rows padded, extent padded], zeros in the padding
    extent: int
    out: str             # [batch..., rows, extent], or [batch..., extent, rows] transposed
    transposed: bool = False
    # over keys: [threads, batch..., tq, extent padded], each thread's partial sums (the
    # pass over key blocks adds into its own slice, a last pass adds the slices up)
    partial: str | None = None


@dataclass(frozen=True)
class AttentionBackward(L.FusedStmt):
    stats: str
    q: str
    kt: str
    do: str
    vt: str
    o: str
    batch: tuple[L.Var, ...]
    batch_extents: tuple[int, ...]
    i: L.Var
    j: L.Var
    s: L.Var
    dx: L.Var
    tq: int
    tk: int
    d_extent: int
    dv: int
    score: L.Expr
    unmasked: L.Expr
    dscore: L.Expr
    causal: int | None
    dtype: str
    gradients: tuple[AttentionGradient, ...]
    block_rows: int
    block_keys: int
    threads: int = 1

    def expressions(self) -> tuple[L.Expr, ...]:
        return self.score, self.unmasked, self.dscore

    def reads(self) -> set[str]:
        loads = {e.buffer for expr in self.expressions()
                 for e in L.subexpressions(expr) if isinstance(e, L.Load)}
        return loads | {self.stats, self.q, self.kt, self.do, self.vt, self.o} | \
            {g.operand for g in self.gradients} | self._partials()

    def writes(self) -> set[str]:
        return {self.stats} | {g.out for g in self.gradients} | self._partials()

    def _partials(self) -> set[str]:
        return {g.partial for g in self.gradients if g.partial is not None}

    def work(self) -> int:
        # Both passes recompute the scores and g; then one product per gradient.
        per_pair = 4 * (self.d_extent + self.dv) + 2 * sum(g.extent for g in self.gradients)
        total = self.tq * self.tk * per_pair
        for extent in self.batch_extents:
            total *= extent
        return total

    def format_lines(self, pad: str) -> list[str]:
        batch = "".join(f"{v}<{e}>, " for v, e in zip(self.batch, self.batch_extents,
                                                       strict=True))
        lines = [f"{pad}attention_backward {self.stats}[{batch}{self.i}<{self.tq}>], "
                 f"{self.s}: {self.dtype} = dot[{self.d_extent}]({self.q}, {self.kt})",
                 f"{pad}  = softmax[{self.j} < {self.tk}]({self.score})",
                 f"{pad}  unmasked {self.unmasked}",
                 f"{pad}  {self.dx}: {self.dtype} = p * (dot[{self.dv}]({self.do}, {self.vt}) "
                 f"- rowsum({self.do} * {self.o}))",
                 f"{pad}  dscore {self.dscore}"]
        for g in self.gradients:
            lines.append(f"{pad}  gradient {g.over} {g.weight} {g.operand}[{g.extent}] into "
                         f"{g.out}" + (" transposed" if g.transposed else "") +
                         (f" via {g.partial}" if g.partial else ""))
        lines.append(f"{pad}  " + L.attention_blocks_text(self.block_rows, self.block_keys,
                                                           self.causal, self.threads))
        return lines


def parse_attention_backward(p) -> AttentionBackward:
    """Read what `format_lines` printed (`p`: the loop-IR parser, tilegen/loopir_parse.py)."""
    p.take("attention_backward")
    stats = p.take()
    named = p.named_extents()
    p.take(",")
    s = p.take()
    p.take(":")
    dtype = p.take()
    p.take("=")
    d_extent, q, kt = _dot(p)
    p.take("=")
    p.take("softmax")
    p.take("[")
    j = p.take()
    p.take("<")
    tk = p.integer()
    p.take("]")
    indices = {var.name: L.I64 for var, _ in named} | {j: L.I64}
    p.scopes.append(indices | {s: dtype})
    p.take("(")
    score = p.expr()
    p.take(")")
    p.take("unmasked")
    unmasked = p.expr()
    p.scopes.pop()
    dx = p.take()
    for word in (":", dtype, "=", "p", "*", "("):
        p.take(word)
    dv, do, vt = _dot(p)
    for word in ("-", "rowsum", "(", do, "*"):
        p.take(word)
    o = p.take()
    for word in (")", ")", "dscore"):
        p.take(word)
    p.scopes.append(indices | {dx: dtype})
    dscore = p.expr()
    p.scopes.pop()
    gradients = []
    while p.peek() == "gradient":
        p.take()
        over, weight, operand = p.take(), p.take(), p.take()
        p.take("[")
        extent = p.integer()
        p.take("]")
        p.take("into")
        out = p.take()
        transposed = p.peek() == "transposed"
        if transposed:
            p.take()
        partial = None
        if p.peek() == "via":
            p.take()
            partial = p.take()
        gradients.append(AttentionGradient(over, weight, operand, extent, out, transposed,
                                           partial))
    fields = p.attention_blocks()
    (i, tq) = named[-1]
    batch = named[:-1]
    return AttentionBackward(stats, q, kt, do, vt, o, tuple(v for v, _ in batch),
                             tuple(e for _, e in batch), i, L.Var(j), L.Var(s, dtype),
                             L.Var(dx, dtype), tq, tk, d_extent, dv, score, unmasked, dscore,
                             fields["causal"], dtype, tuple(gradients), fields["rows"],
                             fields["keys"], fields["threads"])


def _dot(p) -> tuple[int, str, str]:
    p.take("dot")
    p.take("[")
    extent = p.integer()
    p.take("]")
    p.take("(")
    a = p.take()
    p.take(",")
    b = p.take()
    p.take(")")
    return extent, a, b


def verify_attention_backward(v, att: AttentionBackward) -> None:
    """The statement's invariants (`v`: the loop-IR verifier, tilegen/loopir_verify.py)."""
    batch = tuple(att.batch_extents)
    if att.dtype not in L.FLOAT_TYPES:
        raise v.fail(f"attention backward of {att.dtype}")
    if min(att.tq, att.tk, att.d_extent, att.dv, att.block_rows, att.block_keys,
           att.threads) < 1:
        raise v.fail("attention backward extents, blocks and threads must be at least 1")
    if v.access(att.stats, None).shape != batch + (att.tq, 3):
        raise v.fail(f"attention backward statistics {att.stats!r} are not "
                     f"{list(batch + (att.tq, 3))}")
    for name, rank in ((att.q, 2), (att.kt, 3), (att.do, 2), (att.vt, 3), (att.o, 2)):
        operand = v.access(name, None)
        if len(operand.shape) != len(batch) + rank or operand.shape[:len(batch)] != batch:
            raise v.fail(f"attention backward operand {name!r} of shape "
                         f"{list(operand.shape)} does not match the batch {list(batch)}")
    for g in att.gradients:
        out = v.access(g.out, None)
        if out.role == L.BufferRole.INPUT:
            raise v.fail(f"attention backward stores to the input {out.name!r}")
        rows = att.tk if g.over == "queries" else att.tq
        shape = batch + ((g.extent, rows) if g.transposed else (rows, g.extent))
        if g.over not in ("queries", "keys") or g.weight not in ("p", "ds") or \
                (g.over == "keys" and g.weight != "ds") or out.shape != shape:
            raise v.fail(f"attention gradient {g} does not write {list(shape)}")
        if L.value_type(out.dtype) != att.dtype or \
                L.value_type(v.access(g.operand, None).dtype) != att.dtype:
            raise v.fail(f"attention gradient {g.out!r} is not {att.dtype}")
        if (g.partial is None) != (g.over == "queries"):
            raise v.fail(f"attention gradient {g.out!r}: partial sums are for sums over keys")
        if g.partial is not None:
            partial = v.access(g.partial, None)
            if partial.role == L.BufferRole.INPUT or \
                    partial.shape[:-1] != (att.threads,) + batch + (att.tq,) or \
                    partial.shape[-1] != v.access(g.operand, None).shape[-1]:
                raise v.fail(f"attention partial sums {g.partial!r} of shape "
                             f"{list(partial.shape)} are not [threads, batch..., tq, width]")
    indices = {**{x.name: (L.I64, e) for x, e in zip(att.batch, batch, strict=True)},
               att.i.name: (L.I64, att.tq), att.j.name: (L.I64, att.tk)}
    if len(indices) != len(batch) + 2 or {att.s.name, att.dx.name} & set(indices):
        raise v.fail("attention backward index variables are not distinct")
    for name in (*indices, att.s.name, att.dx.name):
        if v.scope.lookup(name) is not None:
            raise v.fail(f"attention backward index {name!r} shadows a variable in scope")
    for bound, expressions in ((att.s, (att.score, att.unmasked)), (att.dx, (att.dscore,))):
        v.scope.frames.append({**indices, bound.name: (att.dtype, None)})
        for expr in expressions:
            v.expr(expr)
            if expr.dtype != att.dtype:
                raise v.fail(f"attention backward expression is {expr.dtype}, not "
                             f"{att.dtype}")
        v.scope.frames.pop()
