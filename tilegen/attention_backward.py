"""The attention backward fused: what reverseMode makes of `softmax(score(q @ kt)) @ v`,
recognised on the inlined tensor IR and lowered to one `AttentionBackward` statement
(tilegen/attention_ir.py) that recomputes the scores per block from the forward's row
statistics, FlashAttention-2 style, so no tq x tk value is ever stored.

The pattern is the one the VJP rules produce (docs/autodiff.md), found by its ops, not by
names, wherever it appears:

    s  = matmul(q, kt)            x = chain(s)            p = softmax(x, axis=last)
    o  = matmul(p, v)                                      optional: the forward itself
    g  = matmul(do, vt)                                    p's cotangent
    dx = p * (g - broadcast(reshape(sum(g * p, axis=last))))    softmax's rule
    ds = back(dx)                 elementwise, single use (the chain's rules: scale, where)
    gradients: matmul(transpose(p), y), matmul(a, p)       sums over queries (dV)
               matmul(transpose(ds), y), matmul(a, ds)     sums over queries (dK)
               matmul(ds, z)                               sums over keys (dQ)

Every use of p, g and the values between must be one of these; anything else (p returned,
the scores read by another op) leaves the ops to the unfused lowering. rowsum(g p) is
rowsum(do (p vtᵀ)), so the forward pass that produces the row statistics also gives it:
when `o` exists (before the gradients) its forward `Attention` statement saves them
(`stats=`), and the backward uses them if that v reads what vtᵀ reads; otherwise the
backward runs such a pass of its own first.

The statement is emitted where the last gradient is computed; consumers of earlier
gradients are moved after it (`fuse` reorders the body, which is legal because no input of
the group depends on a gradient: checked, else no fusion).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import Function, Operation
from kina_frontend.types import DType

from . import attention
from . import loopir as L
from .attention import CHAIN_OPS, padded_width
from .attention_ir import AttentionBackward, AttentionGradient
from .gemm_tiles import GEMM_PARALLEL_WORK
from .views import View


@dataclass
class _Gradient:
    result: str
    over: str            # "queries" or "keys"
    weight: str          # "p" or "ds"
    operand: int         # which matmul operand is the other factor
    transposed: bool     # matmul(a, w): the factor is aᵀ, the result [n, keys]
    view: View | None = None
    out: str | None = None


@dataclass
class _Backward:
    forward: attention.Match          # scores, chain and softmax; `out` is o or ""
    dp: str
    absorbed: tuple[str, ...]         # values only the fused statement reads
    dx: str
    back: tuple[str, ...]             # dx's successors up to ds (empty: ds is dx)
    gradients: list[_Gradient]
    forward_saves: bool               # o exists before the gradients: it saves the statistics
    views: dict = field(default_factory=dict)


def fuse(function: Function, options) -> tuple[Function, dict]:
    """The function with its body ordered for the fused backward statements, and the
    lowering hooks (result name -> rule) of every fused attention forward and backward."""
    groups = find_backward(function, options.fused_attention)
    for group in groups:
        function = _reordered(function, group)
    hooks = attention.lowering_hooks(function, options)
    for group in groups:
        hooks.update(_hooks(function, group))
    return function, hooks


def find_backward(function: Function, mode: str = "auto") -> list[_Backward]:
    """The attention backward patterns of `function` (module docstring); `mode` is the
    TILEGEN_FUSED_ATTENTION setting."""
    if mode == "never" or any(len(op.results) != 1 for op in function.body):
        return []  # (lowering reports an op of several results itself)
    defs = {r.name: op for op in function.body for r in op.results}
    users: dict[str, list[tuple[Operation, int]]] = {}
    for op in function.body:
        for position, value in enumerate(op.operands):
            users.setdefault(value.name, []).append((op, position))
    results = {value.name for value in function.results}
    graph = _Graph(defs, users, results)
    groups = []
    for op in function.body:
        if op.op != "softmax" or op.result.type.dtype not in (DType.F32, DType.F64) or \
                op.result.type.rank < 2 or op.attr("axis") != op.result.type.rank - 1:
            continue
        tq, tk = op.result.type.concrete_shape[-2:]
        if mode == "auto" and tq * tk < attention.AUTO_MIN_SCORES:
            continue
        group = graph.backward(op, function)
        if group is not None:
            groups.append(group)
    return groups


@dataclass
class _Graph:
    defs: dict
    users: dict
    results: set

    def count(self, name: str) -> int:
        return len(self.users.get(name, ())) + (2 if name in self.results else 0)

    def single(self, value) -> bool:
        return self.count(value.name) == 1

    def only_user(self, value, opname: str) -> Operation | None:
        op = self.single_use(value)
        return op if op is not None and op.op == opname else None

    def backward(self, softmax: Operation, function: Function) -> _Backward | None:
        p = softmax.result
        if p.name in self.results:
            return None
        chain: list[str] = []
        scores = attention.score_chain(softmax.operands[0], self.defs, self.single, chain)
        if scores is None or scores.result.type.shape != p.type.shape:
            return None
        forward, gradients, absorbed, products = None, [], [], []
        for op, position in self.users.get(p.name, ()):
            if op.op == "matmul" and position == 0 and forward is None:
                forward = op
            elif op.op == "mul":
                products.append(op)
            elif (found := self.gradient(op, position, "p")) is not None:
                gradients.append(found[0])
                absorbed += found[1]
            else:
                return None
        vjp = self.softmax_vjp(p, products)
        if vjp is None:
            return None
        g, vjp_values, dx = vjp
        dp = self.defs.get(g.name)
        if dp is None or dp.op != "matmul" or self.count(g.name) != 2:
            return None
        value, back = dx.result, []
        while self.count(value.name) == 1:
            (op, position), = self.users[value.name]
            if op.op not in CHAIN_OPS or position not in CHAIN_OPS[op.op] or \
                    op.result.type != p.type:
                break
            back.append(op.result.name)
            value = op.result
        if value.name in self.results:
            return None
        for op, position in self.users.get(value.name, ()):
            found = self.gradient(op, position, "ds")
            if found is None:
                return None
            gradients.append(found[0])
            absorbed += found[1]
        if not gradients:
            return None
        ops = [scores, softmax, dp] + ([forward] if forward is not None else []) + \
            [self.defs[name] for name in chain + [g.name, dx.result.name] + back]
        ops += [self.defs[name] for name in vjp_values + absorbed] + \
            [self.defs[gradient.result] for gradient in gradients]
        dtype = p.type.dtype
        if any(v.type.dtype != dtype for op in (scores, dp, forward) if op is not None
               for v in op.operands):
            return None
        if not self.acyclic(ops, [gr.result for gr in gradients]):
            return None
        # The operands the statement reads (q, kt, v, do, vt, the gradients' factors) must
        # be values of their own, not ones the fusion absorbs (matmul(p, p), say).
        inside = {op.result.name for op in ops}
        factors = [self.defs[gr.result].operands[gr.operand] for gr in gradients]
        if any(v.name in inside for v in [*scores.operands, *dp.operands, *factors,
                                          *(forward.operands[1:] if forward else ())]):
            return None
        saves = False
        if forward is not None:
            order = {op.result.name: n for n, op in enumerate(function.body)}
            saves = order[forward.result.name] < min(order[gr.result] for gr in gradients)
        match = attention.Match(scores.result.name, p.name,
                                forward.result.name if forward is not None else "",
                                tuple(chain))
        return _Backward(match, g.name, tuple(vjp_values + absorbed), dx.result.name,
                         tuple(back), gradients, saves)

    def gradient(self, op: Operation, position: int, weight: str):
        """(_Gradient, absorbed transposes) when `op`, using the weight (p or ds) at
        `position`, is one of the gradient forms; else None."""
        if op.op == "matmul" and position == 1:
            return _Gradient(op.result.name, "queries", weight, 0, True), []
        if op.op == "matmul" and position == 0 and weight == "ds":
            return _Gradient(op.result.name, "keys", weight, 1, False), []
        if op.op == "transpose" and _swaps_last(op.attr("perm"), op.result.type.rank):
            product = self.only_user(op.result, "matmul")
            if product is not None and product.operands[0].name == op.result.name:
                return _Gradient(product.result.name, "queries", weight, 1, False), \
                    [op.result.name]
        return None

    def softmax_vjp(self, p, products: list[Operation]):
        """(g, the values between, the dx op) when `products` are the two muls of softmax's
        rule, p * (g - broadcast(reshape(sum(g * p)))), else None."""
        if len(products) != 2:
            return None
        for weighted, outer in (products, products[::-1]):
            g = _other(weighted, p)
            path = self.restore_path(weighted.result, p.type) if g is not None else None
            if path is None:
                continue
            restored = self.defs[path[-1]].result if path else weighted.result
            difference = self.only_user(restored, "sub")
            if difference is None or \
                    [v.name for v in difference.operands] != [g.name, restored.name] or \
                    _other(outer, p) is None or _other(outer, p).name != difference.result.name:
                continue
            return g, [weighted.result.name, *path, difference.result.name], outer
        return None

    def restore_path(self, value, like) -> list[str] | None:
        """The values of `broadcast(reshape(sum(value, axis=last)))` back to `like`, or,
        with one key (where the simplifier folds those ops away), any chain of them that
        keeps every element (possibly empty); None if `value` is not followed by one."""
        rank, path = like.rank, []
        if like.concrete_shape[-1] == 1:
            while (op := self.single_use(value)) is not None and \
                    op.op in ("sum", "reshape", "broadcast") and \
                    _elements(op.result.type) == _elements(like):
                path.append(op.result.name)
                value = op.result
            return path if value.type == like else None
        total = self.only_user(value, "sum")
        if total is None or total.attr("axis") != rank - 1:
            return None
        kept = self.only_user(total.result, "reshape")
        if kept is None or kept.result.type.shape != like.shape[:-1] + (1,):
            return None
        restored = self.only_user(kept.result, "broadcast")
        if restored is None or restored.result.type != like:
            return None
        return [total.result.name, kept.result.name, restored.result.name]

    def single_use(self, value) -> Operation | None:
        if self.count(value.name) != 1:
            return None
        (op, _), = self.users[value.name]
        return op

    def acyclic(self, ops: list[Operation], outputs: list[str]) -> bool:
        """No input of the group's ops depends on one of its gradients."""
        inside = {op.result.name for op in ops}
        downstream, frontier = set(), list(outputs)
        while frontier:
            name = frontier.pop()
            for op, _ in self.users.get(name, ()):
                if op.result.name not in downstream:
                    downstream.add(op.result.name)
                    frontier.append(op.result.name)
        return not any(v.name in downstream for op in ops for v in op.operands
                       if v.name not in inside)


def _other(op: Operation, value):
    """The operand of the binary `op` that is not `value` (None if both or neither are)."""
    names = [v.name for v in op.operands]
    if len(names) != 2 or names.count(value.name) != 1:
        return None
    return op.operands[1 - names.index(value.name)]


def _elements(ttype) -> int:
    return math.prod(ttype.concrete_shape)


def _swaps_last(perm, rank: int) -> bool:
    return list(perm) == list(range(rank - 2)) + [rank - 1, rank - 2]


def _reordered(function: Function, group: _Backward) -> Function:
    """The body with every op that depends on a gradient other than the last moved right
    after the last (where the fused statement writes them all)."""
    body = list(function.body)
    position = {op.results[0].name: n for n, op in enumerate(body) if len(op.results) == 1}
    last = max(position[g.result] for g in group.gradients)
    tainted = {g.result for g in group.gradients if position[g.result] != last}
    kept, moved = [], []
    for n, op in enumerate(body):
        if n < last and any(v.name in tainted for v in op.operands):
            moved.append(op)
            tainted.update(r.name for r in op.results)
        else:
            kept.append(op)
        if n == last:
            kept += moved
    return replace(function, body=tuple(kept))


# ---- lowering ------------------------------------------------------------------------------

def _hooks(function: Function, group: _Backward) -> dict:
    defs = {r.name: op for op in function.body for r in op.results}
    match = group.forward
    hooks = {name: REGISTRY[defs[name].op].lower for name in match.chain + group.back}
    hooks[match.scores] = attention.scores_rule(match)
    hooks[match.softmax] = attention.softmax_rule(match)
    if match.out:
        hooks[match.out] = _forward_rule(group)
    for name in group.absorbed:
        hooks[name] = _absorbed
    hooks[group.dp] = _dp_rule(group)
    hooks[group.dx] = _dx_rule(group)
    ds = (group.back or (group.dx,))[-1]
    hooks[ds] = _capturing(hooks[ds], group)
    for gradient in group.gradients:
        hooks[gradient.result] = _gradient_rule(group, gradient)
    return hooks


def _absorbed(ctx, op, operands):
    def never(index):
        raise AssertionError("a value of a fused attention backward has no other reader")
    return View(op.result.type, never)


def _forward_rule(group: _Backward):
    def rule(ctx, op, operands):
        group.forward.views["v"] = operands[1]

        def emit(ctx, out):
            stats = _stats_buffer(ctx, group) if group.forward_saves else None
            statement = attention.emit_forward(ctx, group.forward, out, stats)
            group.views["forward"] = statement
            return [statement]
        return L.BufferWriter(op.result.type, emit)
    return rule


def _stats_buffer(ctx, group: _Backward) -> str:
    q = group.forward.views["q"]
    shape = q.type.concrete_shape[:-1] + (3,)
    return ctx.add_buffer("attn_stats", q.type.with_shape(shape), "temp").name


def _dp_rule(group: _Backward):
    def rule(ctx, op, operands):
        group.views["do"], group.views["vt"] = operands
        return _absorbed(ctx, op, operands)
    return rule


def _dx_rule(group: _Backward):
    def rule(ctx, op, operands):
        dx = L.Var(ctx.fresh_name("dx"), L.value_type(op.result.type.dtype.value))
        group.views["dx"] = dx
        return View(op.result.type, lambda index: dx)
    return rule


def _capturing(rule, group: _Backward):
    def captured(ctx, op, operands):
        view = rule(ctx, op, operands)
        group.views["ds"] = view
        return view
    return captured


def _gradient_rule(group: _Backward, gradient: _Gradient):
    def rule(ctx, op, operands):
        factor = operands[gradient.operand]
        gradient.view = _transposed(factor) if gradient.transposed else factor

        def emit(ctx, out):
            gradient.out = out
            if any(g.out is None for g in group.gradients):
                return []  # written with the others by the last one's statement
            return _emit(ctx, group)
        return L.BufferWriter(op.result.type, emit)
    return rule


def _transposed(view: View) -> View:
    shape = view.type.concrete_shape
    return View(view.type.with_shape(shape[:-2] + (shape[-1], shape[-2])),
                lambda index: view.at(tuple(index[:-2]) + (index[-1], index[-2])))


def _same(ctx, view: View, other: View) -> bool:
    """Whether two views read the same element expression everywhere (structurally)."""
    if view.type != other.type:
        return False
    index = tuple(ctx.var(e, "probe") for e in view.type.concrete_shape)
    return view.at(index) == other.at(index)


def _emit(ctx, group: _Backward) -> list[L.Stmt]:
    match, views = group.forward, group.views
    q, x = match.views["q"], match.views["x"]
    do, vt = views["do"], views["vt"]
    extents = q.type.concrete_shape[:-2]
    tq, d = q.type.concrete_shape[-2:]
    dv, tk = vt.type.concrete_shape[-2:]
    dtype = L.value_type(q.type.dtype.value)
    target = ctx.options.target
    statements: list[L.Stmt] = []
    forward = views.get("forward")
    if forward is None or forward.stats is None or not _same(ctx, match.views["v"],
                                                             _transposed(vt)):
        # No forward saved the statistics, or its v is not vtᵀ: a forward pass of p @ vtᵀ
        # does (its result gives rowsum(g p) = rowsum(do (p vtᵀ))).
        match.views["v"] = _transposed(vt)
        o = ctx.add_buffer("attn_o", q.type.with_shape(extents + (tq, dv)), "temp").name
        forward = attention.emit_forward(ctx, match, o, _stats_buffer(ctx, group))
        statements.append(forward)
    block_keys = forward.block_keys
    tk_padded = -(-tk // block_keys) * block_keys
    batch = tuple(ctx.var(e, "b") for e in extents)
    i, j = ctx.var(tq, "i"), ctx.var(tk, "j")
    score = x.at(batch + (i, j))
    causal, unmasked = attention.positional_mask(score, i, j)
    dscore = views["ds"].at(batch + (i, j))
    dv_padded = padded_width(target, dtype, dv)
    do_name = attention.padded_copy(ctx, do, "attn_do", (tq, dv), (tq, dv_padded))
    vt_name = attention.key_blocks(ctx, vt, block_keys, tk_padded, "attn_vt")
    outputs = []
    work = 2 * tq * tk * (2 * (d + dv) + sum(g.view.type.concrete_shape[-1]
                                             for g in group.gradients))
    for extent in extents:
        work *= extent
    threads = ctx.options.num_threads if work >= GEMM_PARALLEL_WORK else 1
    for g in group.gradients:
        rows, padded_rows = (tq, tq) if g.over == "queries" else (tk, tk_padded)
        extent = g.view.type.concrete_shape[-1]
        if g.over == "queries" and g.view is do:  # dV's factor: the copy of do serves
            operand = do_name
        else:
            operand = attention.padded_copy(ctx, g.view, f"attn_{g.over[0]}", (rows, extent),
                                            (padded_rows, padded_width(target, dtype, extent)))
        partial = None
        if g.over == "keys":
            width = padded_width(target, dtype, extent)
            partial = ctx.add_buffer("attn_partial", q.type.with_shape(
                (threads,) + extents + (tq, width)), "temp").name
        outputs.append(AttentionGradient(g.over, g.weight, operand, extent, g.out,
                                         g.transposed, partial))
    statements.append(AttentionBackward(
        forward.stats, forward.q, forward.kt, do_name, vt_name, forward.out, batch, extents,
        i, j, match.views["s"], views["dx"], tq, tk, d, dv, score, unmasked, dscore, causal,
        dtype, tuple(outputs), forward.block_rows, block_keys, threads))
    return statements
