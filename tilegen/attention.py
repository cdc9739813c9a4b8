"""Fused attention: `softmax(score(q @ kt), axis=-1) @ v` recognised and lowered blocked.

Not an op: the pattern is found on the inlined tensor IR, wherever it comes from (Kina
source, an inlined function such as MiniLM's encoder layer, reverseMode output):

    s  = matmul(q, kt)                   [batch..., tq, tk], one use
    x  = elementwise chain of s          add sub mul div neg where, each value one use
    p  = softmax(x, axis=last)           one use
    o  = matmul(p, v)                    [batch..., tq, dv]

The chain's other operands (a scale, an additive mask, a `where` condition) are lowered as
the ordinary views they are, so `score`, the element of x at (batch..., i, j), is a loop-IR
expression in the dot product `s` and the indices: any scale or mask form that exists is
handled alike. `o` becomes one `Attention` statement (tilegen/loopir.py) that
tilegen/attention_codegen.py emits as an online softmax over key blocks: p and the scores
are never stored. Only q, kt and v are copied (zero-padded to whole vector tiles), a cost
linear in T.

Why the tensor IR: the pattern is five ops there, while in the loop IR it is already three
nests around two temporaries (scores, exps) whose structure depends on the scheduler's
rewrites. Why not loop IR for the result: the online softmax carries a running max and sum
across the key loop, and causal block skipping needs a key loop whose trip count depends
on the query block; the loop IR has static extents and no carried scalars. So the fused
nest is a statement of its own, like `Gemm`.

A mask computed from positions (`where(greater(iota(axis=last), iota(axis=last - 1)), c,
x)`, or `x + where(..., c, 0.0)`, or `x + cast(...) * c`, for a constant c <= -1e6) makes
the statement causal: key blocks entirely past the diagonal are skipped, and only blocks
crossing it evaluate the mask. Skipping means those keys contribute exactly 0, which is
what exp(c - row max) is whenever the row max exceeds c + 745 (f64; c + 104 in f32): for
c = -1e9 any finite scores a model produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kina_frontend.tensor_ir import Function, Operation
from kina_frontend.types import DType

from . import loopir as L
from .affine import to_affine
from .gemm_tiles import GEMM_PARALLEL_WORK
from .views import View

# The operand positions through which each elementwise op may carry the scores.
CHAIN_OPS = {"add": (0, 1), "sub": (0, 1), "mul": (0, 1), "div": (0, 1), "neg": (0,),
             "where": (1, 2)}
# `auto` fuses when one head's score matrix has at least this many elements; smaller ones
# (StoryLM-0's 36 x 36) stay on the unfused path, whose rounding the decode checks know.
AUTO_MIN_SCORES = 64 * 64
# A masking constant at most this makes the mask one whose keys may be skipped.
MASKED_AT_MOST = -1e6
BLOCK_ROWS = 4
MAX_KEY_TILES = 4  # key block = up to this many vector tiles


@dataclass
class Match:
    scores: str
    softmax: str
    out: str
    chain: tuple[str, ...] = ()  # the values between scores and softmax
    views: dict = field(default_factory=dict)


def find_attention(function: Function, mode: str = "auto") -> list[Match]:
    """The attention patterns of `function` (see the module docstring); `mode` is the
    TILEGEN_FUSED_ATTENTION setting: auto, always or never."""
    if mode == "never":
        return []
    defs = {r.name: op for op in function.body for r in op.results}
    uses: dict[str, int] = {}
    for op in function.body:
        for value in op.operands:
            uses[value.name] = uses.get(value.name, 0) + 1
    for value in function.results:
        uses[value.name] = uses.get(value.name, 0) + 2  # a result is never absorbed

    def single(value) -> bool:
        return uses.get(value.name, 0) == 1

    matches = []
    for op in function.body:
        if op.op != "matmul" or op.result.type.dtype not in (DType.F32, DType.F64):
            continue
        probabilities, _ = op.operands
        softmax = defs.get(probabilities.name)
        rank = probabilities.type.rank
        if softmax is None or softmax.op != "softmax" or softmax.attr("axis") != rank - 1 \
                or not single(probabilities):
            continue
        chain: list[str] = []
        scores = score_chain(softmax.operands[0], defs, single, chain)
        if scores is None or scores.result.type.shape != probabilities.type.shape or \
                any(v.type.dtype != op.result.type.dtype for v in scores.operands + op.operands):
            continue  # (a BF16 matmul's F32 result, say)
        tq, tk = probabilities.type.concrete_shape[-2:]
        if mode == "auto" and tq * tk < AUTO_MIN_SCORES:
            continue
        matches.append(Match(scores.result.name, softmax.result.name, op.result.name,
                              tuple(chain)))
    return matches


def score_chain(value, defs: dict, single, chain: list, depth: int = 0) -> Operation | None:
    """The matmul whose product `value` is, through single-use elementwise ops (CHAIN_OPS,
    carrying the scores in one of their carrying positions), or None; the values between
    are appended to `chain`, the matmul's side first."""
    op = defs.get(value.name)
    if op is None or not single(value) or depth > 32:
        return None
    if op.op == "matmul":
        return op
    for position in CHAIN_OPS.get(op.op, ()):
        if position < len(op.operands):
            found = score_chain(op.operands[position], defs, single, chain, depth + 1)
            if found is not None:
                chain.append(value.name)
                return found
    return None


def lowering_hooks(function: Function, options) -> dict:
    """Result name -> `rule(ctx, op, operand_views)` replacing the op's own lowering, for
    the three ops of each pattern, and the op's own rule for the chain between them (all
    names here are kept as views, never materialised: the scores are a variable only the
    fused nest binds). tilegen/lower.py consults it."""
    from kina_frontend.ops import REGISTRY

    defs = {r.name: op for op in function.body for r in op.results}
    hooks = {}
    for match in find_attention(function, options.fused_attention):
        for name in match.chain:
            hooks[name] = REGISTRY[defs[name].op].lower
        hooks[match.scores] = scores_rule(match)
        hooks[match.softmax] = softmax_rule(match)
        hooks[match.out] = _out_rule(match)
    return hooks


def scores_rule(match: Match):
    def rule(ctx, op, operands):
        match.views["q"], match.views["kt"] = operands
        dtype = L.value_type(op.result.type.dtype.value)
        s = L.Var(ctx.fresh_name("s"), dtype)
        match.views["s"] = s
        return View(op.result.type, lambda index: s)
    return rule


def softmax_rule(match: Match):
    def rule(ctx, op, operands):
        match.views["x"] = operands[0]

        def absorbed(index):
            raise AssertionError("the fused softmax has no reader but its attention")
        return View(op.result.type, absorbed)
    return rule


def _out_rule(match: Match):
    def rule(ctx, op, operands):
        match.views["v"] = operands[1]
        return L.BufferWriter(op.result.type, lambda ctx, out: [emit_forward(ctx, match, out)])
    return rule


def emit_forward(ctx, match: Match, out: str, stats: str | None = None) -> L.Attention:
    q, kt, v, x = (match.views[k] for k in ("q", "kt", "v", "x"))
    extents = q.type.concrete_shape[:-2]
    tq, d = q.type.concrete_shape[-2:]
    tk, dv = kt.type.concrete_shape[-1], v.type.concrete_shape[-1]
    dtype = L.value_type(q.type.dtype.value)
    target = ctx.options.target
    block_keys = key_block(target, dtype, tk)
    tk_padded = -(-tk // block_keys) * block_keys
    dv_padded = padded_width(target, dtype, dv)
    batch = tuple(ctx.var(e, "b") for e in extents)
    i, j = ctx.var(tq, "i"), ctx.var(tk, "j")
    score = x.at(batch + (i, j))
    causal, unmasked = positional_mask(score, i, j)
    q_name = _identity_buffer(ctx, q) or ctx.materialize(q, "attn_q").buffer
    kt_name = key_blocks(ctx, kt, block_keys, tk_padded)
    v_name = padded_copy(ctx, v, "attn_v", (tk, dv), (tk_padded, dv_padded))
    work = 2 * tq * tk * (d + dv)
    for extent in extents:
        work *= extent
    threads = ctx.options.num_threads if work >= GEMM_PARALLEL_WORK else 1
    return L.Attention(out, q_name, kt_name, v_name, batch, extents, i, j, match.views["s"],
                       tq, tk, d, dv, score, unmasked, causal, dtype, BLOCK_ROWS, block_keys,
                       threads, stats)


def key_block(target, dtype: str, tk: int) -> int:
    """Keys per block: up to MAX_KEY_TILES vector tiles of `target`, no more than tk
    needs, and few enough that the BLOCK_ROWS x tiles score accumulators take at most half
    the vector registers (16 zmm on AVX-512: 4 tiles of 16; 8 ymm on AVX2: 2 of 8)."""
    lanes = target.lanes(dtype)
    tiles = max(1, min(MAX_KEY_TILES, target.vector_registers // (2 * BLOCK_ROWS)))
    return lanes * min(tiles, -(-tk // lanes))


def padded_width(target, dtype: str, extent: int) -> int:
    """`extent` rounded up to whole vector tiles of `target` (the copies' row width)."""
    lanes = target.lanes(dtype)
    return -(-extent // lanes) * lanes


def _identity_buffer(ctx, view) -> str | None:
    """The buffer `view` reads element for element, if it is one."""
    if view.buffer is None:
        return None
    index = tuple(ctx.var(max(e, 1), "probe") for e in view.type.concrete_shape)
    return view.buffer if view.at(index) == L.Load(view.buffer, index, view.at(index).dtype) \
        else None


def key_blocks(ctx, kt, block_keys: int, tk_padded: int, hint: str = "attn_kt") -> str:
    """kt [batch..., d, tk] stored block by block, [batch..., tk_padded / block_keys, d,
    block_keys], zeros past tk: one key block's d x block_keys tile is contiguous. (Row
    major [d, tk_padded] put a block's d rows a power of two apart at long T, all in one
    L1 set.)"""
    extents = kt.type.concrete_shape[:-2]
    d, tk = kt.type.concrete_shape[-2:]
    shape = extents + (tk_padded // block_keys, d, block_keys)
    buffer = ctx.add_buffer(hint, kt.type.with_shape(shape), "temp")
    zero = L.Const(0.0, L.value_type(buffer.dtype))

    def store(index):
        block, row, column = index[-3:]
        j = L.add(L.mul(block, L.const(block_keys)), column)
        inside = L.binary("lt", j, L.const(tk))
        clamped = L.binary("min", j, L.const(tk - 1))  # never read past kt
        return [L.Store(buffer.name, index, L.Select(
            inside, kt.at(index[:-3] + (row, clamped)), zero, zero.dtype))]
    ctx.body.extend(ctx.loops(shape, store, hint="k"))
    return buffer.name


def padded_copy(ctx, view, hint: str, shape: tuple[int, int], padded: tuple[int, int]) -> str:
    """`view` copied into a temporary whose last two dims are `padded`, zeros beyond
    `shape` (whole vector tiles for the kernel, no masks in its inner loops)."""
    extents = view.type.concrete_shape[:-2]
    buffer = ctx.add_buffer(hint, view.type.with_shape(extents + padded), "temp")
    zero = L.Const(0.0, L.value_type(buffer.dtype))
    ctx.body.extend(ctx.loops(extents + shape, lambda index: [
        L.Store(buffer.name, index, view.at(index))], hint="p"))
    rows, columns = shape
    if padded[0] > rows:
        ctx.body.extend(ctx.loops(extents + (padded[0] - rows, padded[1]), lambda index: [
            L.Store(buffer.name, index[:-2] + (L.add(index[-2], L.const(rows)), index[-1]),
                    zero)], hint="z"))
    if padded[1] > columns:
        ctx.body.extend(ctx.loops(extents + (rows, padded[1] - columns), lambda index: [
            L.Store(buffer.name, index[:-1] + (L.add(index[-1], L.const(columns)),),
                    zero)], hint="z"))
    return buffer.name


# ---- positional masks --------------------------------------------------------------------------

def positional_mask(score: L.Expr, i: L.Var, j: L.Var) -> tuple[int | None, L.Expr]:
    """(c, the score without its mask) when `score` is masked exactly where j > i + c with
    c >= 0 (every row keeps key 0, so skipping never empties a row), else (None, score)."""
    if isinstance(score, L.Select) and _masking(score.if_true):
        offset = _offset(score.cond, i, j)
        if offset is not None:
            return offset, score.if_false
    if isinstance(score, L.Binary) and score.op == "add":
        for term, rest in ((score.rhs, score.lhs), (score.lhs, score.rhs)):
            cond = _mask_term(term)
            offset = _offset(cond, i, j) if cond is not None else None
            if offset is not None:
                return offset, rest
    return None, score


def _masking(expr: L.Expr) -> bool:
    return isinstance(expr, L.Const) and float(expr.value) <= MASKED_AT_MOST


def _mask_term(expr: L.Expr) -> L.Expr | None:
    """The condition of `where(cond, c, 0)` (maybe cast to another float type) or
    `cast(cond) * c` (c masking), else None."""
    if isinstance(expr, L.Cast) and expr.operand.dtype in L.FLOAT_TYPES:
        return _mask_term(expr.operand)
    if isinstance(expr, L.Select) and _masking(expr.if_true) and \
            isinstance(expr.if_false, L.Const) and float(expr.if_false.value) == 0.0:
        return expr.cond
    if isinstance(expr, L.Binary) and expr.op == "mul":
        for cast, factor in ((expr.lhs, expr.rhs), (expr.rhs, expr.lhs)):
            if isinstance(cast, L.Cast) and cast.operand.dtype == L.BOOL and _masking(factor):
                return cast.operand
    return None


def _offset(cond: L.Expr, i: L.Var, j: L.Var) -> int | None:
    """c when `cond` is exactly j > i + c (in any of its comparison spellings), c >= 0."""
    if not isinstance(cond, L.Binary) or cond.op not in ("gt", "lt", "ge", "le") or \
            cond.lhs.dtype != L.I64:
        return None
    lhs, rhs = (cond.lhs, cond.rhs) if cond.op in ("gt", "ge") else (cond.rhs, cond.lhs)
    difference = to_affine(L.Binary("add", lhs, L.mul(rhs, L.const(-1)), L.I64))
    if difference.opaque or dict(difference.terms) != {j.name: 1, i.name: -1}:
        return None
    # j - i + k > 0 (or >= 0, i.e. > -1): masked where j > i - k.
    offset = -difference.constant - (1 if cond.op in ("ge", "le") else 0)
    return offset if offset >= 0 else None
