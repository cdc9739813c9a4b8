"""Tensor IR -> loop-nest IR.

Each value of a function becomes a `View`: a rule giving the element at any index as a
scalar expression. Elementwise and layout ops compose views (so chains fuse and
reshape/transpose/broadcast become index arithmetic); matmul and reductions become
`Reduce` expressions. A view is materialised into a buffer only when it must be (a
function result, a row kernel such as softmax) or when a consumer would re-evaluate an
expensive view many times (`LowerContext.reusable`). The op-specific part of every
step is the op's `lower` rule in kina_frontend/ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kina_frontend.diagnostics import KinaError
from kina_frontend.ops import REGISTRY
from kina_frontend.tensor_ir import Function, Operation
from kina_frontend.types import DType, TensorType

from . import attention_backward, config, gemm_bf16, gemm_small, gemm_tiles
from . import loopir as L
from .affine import IndexSimplifier
from .config import Config
from .gemm_tiles import GEMM_MIN_WORK, GEMM_PARALLEL_WORK
from .views import View

# A fused chain deeper than this is stored and restarted: expression trees (and the
# recursion that builds and compiles them) stay bounded for chains of any length.
MAX_FUSION_DEPTH = 48

# Matrix products with at least gemm_tiles.GEMM_MIN_WORK multiply-adds use the packed
# micro-kernel (tilegen/gemm.py); smaller ones stay fused `Reduce` expressions.

# A view is materialised before a consumer that reads each element more than once when
# evaluating it costs more than this (see loopir.expr_cost): a few loads and arithmetic
# ops are cheaper to recompute than a store and reloads through memory (a transcendental
# or a reduction is not).
MATERIALIZE_COST = 6

def scalar_type(dtype: DType) -> str:
    """The loop IR's scalar type for elements of `dtype` (f32 for BF16, i1 for BOOL)."""
    return L.value_type(dtype.value)


# (dtype, batch extents, m, n, k, threads) -> the tiles of that matmul. The driver hands
# one in (tilegen/tuning.py: autotuning); without one, gemm_tiles.default_tiles.
TileChooser = Callable[[str, tuple[int, ...], int, int, int, int], L.GemmTiles]


class LowerContext:
    """What an op's `lower` rule may use; one per function being lowered."""

    def __init__(self, function: Function, options: Config,
                 choose_tiles: TileChooser | None = None):
        self.function = function
        self.options = options
        self.choose_tiles = choose_tiles
        self.simplifier = IndexSimplifier()
        self.buffers: list[L.Buffer] = []
        self.bf16_buffers: set[str] = set()
        self.body: list[L.Stmt] = []
        self.check_sites: list[L.CheckSite] = []
        # Ids read straight from a parameter are validated once, before anything else runs:
        # the uses then load them unchecked, and a bad id stops the kernel before it writes.
        self.prologue: list[L.Stmt] = []
        self._validated: set[tuple[str, int]] = set()
        self.current: Operation | None = None
        self._counter = 0
        self._names: set[str] = set()

    # ---- names and loops ----------------------------------------------------------------------

    def fresh_name(self, hint: str) -> str:
        name = hint
        while name in self._names:
            self._counter += 1
            name = f"{hint}_{self._counter}"
        self._names.add(name)
        return name

    def var(self, extent: int, hint: str = "i") -> L.Var:
        var = L.Var(self.fresh_name(hint))
        self.simplifier.declare(var, extent)
        return var

    def loops(self, shape: tuple[int, ...], body: Callable[[tuple[L.Expr, ...]], list[L.Stmt]],
              hint: str = "i") -> list[L.Stmt]:
        """A loop nest over `shape` (row-major) around `body(index)`; size-1 dims get no loop."""
        variables: list[L.Expr] = []
        loop_vars: list[tuple[L.Var, int]] = []
        for axis, extent in enumerate(shape):
            if extent == 1:
                variables.append(L.const(0))
            else:
                var = self.var(extent, f"{hint}{axis}")
                variables.append(var)
                loop_vars.append((var, extent))
        statements = body(tuple(variables))
        for var, extent in reversed(loop_vars):
            statements = [L.For(var, extent, tuple(statements))]
        return statements

    # ---- views ------------------------------------------------------------------------------

    def view(self, ttype: TensorType, at) -> View:
        return View(ttype, at)

    def buffer_view(self, buffer: L.Buffer, ttype: TensorType, param: str | None = None) -> View:
        dtype = L.value_type(buffer.dtype)
        name = buffer.name
        return View(ttype, lambda index: L.Load(name, tuple(index), dtype), name, param)

    def sample(self, view: View) -> L.Expr:
        """The view's element expression at a fresh symbolic index (for cost analysis)."""
        index = tuple(self.var(max(d, 1), "probe") for d in view.type.concrete_shape)
        return view.at(index)

    def reusable(self, view: View, reuse: int) -> View:
        """`view` for a consumer that reads each element `reuse` times: materialised into a
        temporary buffer first when recomputing it would cost more than storing it."""
        if view.buffer is not None or reuse <= 1:
            return view
        sample = self.sample(view)
        if L.expr_cost(sample) <= MATERIALIZE_COST and not _reads_by_id(sample):
            return view
        return self.materialize(view, "tmp")

    def materialize(self, view: View, hint: str) -> View:
        buffer = self.add_buffer(hint, view.type, "temp")
        _write(self, view, buffer)
        return self.buffer_view(buffer, view.type)

    def materialize_transposed(self, view: View, hint: str) -> View:
        """`view` stored with its last two dims swapped (so its second-last dim is the
        contiguous one), read back through the swap: for consumers that walk that dim."""
        shape = view.type.concrete_shape
        stored = shape[:-2] + (shape[-1], shape[-2])
        buffer = self.add_buffer(hint, view.type.with_shape(stored), "temp")

        def store(index):
            source = index[:-2] + (index[-1], index[-2])
            return [L.Store(buffer.name, index, view.at(source))]
        self.body.extend(self.loops(stored, store))
        dtype, name = L.value_type(buffer.dtype), buffer.name
        return View(view.type, lambda index: L.Load(name, tuple(index[:-2]) + (
            index[-1], index[-2]), dtype), name)

    def add_buffer(self, hint: str, ttype: TensorType, role: str) -> L.Buffer:
        # DType values ("f32", "bf16", "bool", ...) are the loop IR's buffer type names.
        buffer = L.Buffer(self.fresh_name(_sanitize(hint)), ttype.dtype.value,
                          ttype.concrete_shape, role)
        if buffer.dtype == L.BF16_STORAGE:
            self.bf16_buffers.add(buffer.name)
        self.buffers.append(buffer)
        return buffer

    # ---- id checks --------------------------------------------------------------------------

    def id_checker(self, ids: View, limit: int):
        """For the op being lowered: a function from an index of `ids` to the id there,
        checked to lie in [0, limit) when the kernel runs."""
        op = self.current
        if ids.param is not None and (ids.param, limit) in self._validated:
            return ids.at
        site = L.CheckSite(op.op if op else "?", str(op.span) if op and op.span else "?",
                           limit, ids.type.concrete_shape, ids.param)
        self.check_sites.append(site)
        number = len(self.check_sites) - 1

        def checked(index: tuple[L.Expr, ...]) -> L.Expr:
            return L.CheckedId(ids.at(index), limit, number, tuple(index))
        if ids.param is None:
            return checked
        # The whole parameter is the ids tensor (`param` marks its identity view), so every
        # element is an id and checking all of them up front reports exactly what the uses
        # would, in row-major order.
        self._validated.add((ids.param, limit))
        self.prologue.extend(self.loops(ids.type.concrete_shape, lambda index: [
            L.Let(self.var(1, "valid_id"), checked(index))], hint="id"))
        return ids.at

    def gemm_pays(self, a: View, b: View) -> bool:
        """Whether a @ b is big enough for packed panels to beat the fused `Reduce` form."""
        m, k = a.type.concrete_shape[-2:]
        n = b.type.concrete_shape[-1]
        packed = gemm_tiles.supports(a.type.dtype.value) or a.type.dtype is DType.BF16
        return packed and m * n * k >= GEMM_MIN_WORK and n >= 8 and k >= 8

    def gemm(self, out: str, a: View, b: View) -> L.Gemm:
        """A packed, register-blocked matrix multiply of a @ b writing `out`."""
        a_shape, b_shape = a.type.concrete_shape, b.type.concrete_shape
        m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
        dtype = a.type.dtype.value
        if a.type.dtype is DType.BF16:
            dtype = gemm_bf16.gemm_dtype(self.options)
        batch_extents = a_shape[:-2]
        batch = tuple(self.var(e, "b") for e in batch_extents)
        i, j, kk = self.var(m, "i"), self.var(n, "j"), self.var(k, "k")
        # The work of the whole product, every batch entry's: gemm.emit_gemm splits a batched
        # one over (entry, row block) pairs, so 12 heads of 48 x 48 x 32 are worth threads
        # even though one head is not.
        flops = 2 * m * n * k * math.prod(batch_extents)
        threads = self.options.num_threads if flops >= GEMM_PARALLEL_WORK else 1
        buffers = {buffer.name: buffer for buffer in self.buffers}
        if gemm_small.applies(dtype, m, b.at(batch + (kk, j)), j, kk, buffers):
            # Few rows: B (a weight matrix) streamed once where it lies, not packed.
            tiles = gemm_small.small_m_tiles(dtype, m, n, k, self.options.target)
        elif dtype == L.BF16_STORAGE:
            tiles = gemm_bf16.bf16_tiles(m, n, k, self.options, threads)
        elif self.choose_tiles is not None:
            tiles = self.choose_tiles(dtype, batch_extents, m, n, k, threads)
        else:
            tiles = gemm_tiles.default_tiles(dtype, m, n, k, self.options.target)
        # An operand computed while packing (a fused producer) is evaluated once per packing
        # of it; one that is dear to recompute (a contraction, as p @ v read by the output
        # projection) is stored first when packing would evaluate it more than once.
        evaluations = gemm_small.operand_evaluations if tiles.b_in_place else \
            gemm_tiles.operand_evaluations
        a_evaluations, b_evaluations = evaluations(
            m, n, math.prod(batch_extents), tiles, threads)
        a, b = self.reusable(a, a_evaluations), self.reusable(b, b_evaluations)
        return L.Gemm(out, batch, batch_extents, i, j, kk, m, n, k, a.at(batch + (i, kk)),
                      b.at(batch + (kk, j)), dtype, tiles, threads)

    def error(self, message: str) -> KinaError:
        return KinaError("lowering", message, self.current.span if self.current else None)


def _sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _reads_by_id(expr: L.Expr) -> bool:
    """Whether `expr` loads through a loaded index (a gathered row): cheap once, but a
    gather per lane wherever a consumer walks it along a vector axis, so a reused one is
    stored contiguously instead."""
    return any(isinstance(e, L.Load) and any(L.contains(i, (L.Load,)) for i in e.index)
               for e in L.subexpressions(expr))


def lower_function(function: Function, kernel_name: str | None = None,
                   options: Config | None = None,
                   choose_tiles: TileChooser | None = None) -> L.Kernel:
    """Lower an inlined function (no `call`/`reverse_mode`/`placeholder`) to a kernel;
    `choose_tiles` picks each matmul's tiles (default: gemm_tiles.default_tiles)."""
    ctx = LowerContext(function, options or config.load(), choose_tiles)
    views: dict[str, View] = {}
    inputs = []
    for param in function.params:
        buffer = ctx.add_buffer(param.name, param.type, "input")
        inputs.append(buffer.name)
        views[param.name] = ctx.buffer_view(buffer, param.type, param=param.name)
    # A result is written straight into its output buffer where it is computed; consumers
    # inside the function then read it back from there.
    result_position: dict[str, int] = {}
    for position, value in enumerate(function.results):
        result_position.setdefault(value.name, position)
    output_buffers: dict[int, L.Buffer] = {}
    # attention patterns' ops, forward and backward (whose consumers it may reorder)
    function, fused = attention_backward.fuse(function, ctx.options)
    uses = _use_counts(function)
    for op in function.body:
        ctx.current = op
        rule = fused.get(op.results[0].name) if len(op.results) == 1 else None
        rule = rule or _lower_rule(op, ctx)
        produced = rule(ctx, op, [views[v.name] for v in op.operands])
        (result,) = op.results
        if result.type.dtype is DType.BF16 and isinstance(produced, View):
            produced = _rounded_to_bf16(produced, ctx.bf16_buffers)
        position = result_position.get(result.name)
        if position is not None:
            buffer = ctx.add_buffer(f"out{position}", result.type, "output")
            output_buffers[position] = buffer
            _write(ctx, produced, buffer)
            produced = ctx.buffer_view(buffer, result.type)
        elif isinstance(produced, L.BufferWriter):
            buffer = ctx.add_buffer(result.name, result.type, "temp")
            _write(ctx, produced, buffer)
            produced = ctx.buffer_view(buffer, result.type)
        else:
            operand_depth = max((views[v.name].depth for v in op.operands), default=0)
            produced.depth = max(produced.depth, operand_depth + 1)
            if produced.depth > MAX_FUSION_DEPTH and result.name not in fused:
                produced = ctx.materialize(produced, result.name)
            elif uses.get(result.name, 0) > 1 and result.name not in fused:
                produced = ctx.reusable(produced, uses[result.name])
        views[result.name] = produced
    ctx.current = None
    for position, value in enumerate(function.results):
        if position not in output_buffers:  # a parameter returned, or a result repeated
            output_buffers[position] = ctx.add_buffer(f"out{position}", value.type, "output")
            _write(ctx, views[value.name], output_buffers[position])
    outputs = [output_buffers[p].name for p in range(len(function.results))]
    return L.Kernel(kernel_name or function.name, tuple(ctx.buffers),
                    tuple(ctx.prologue) + tuple(ctx.body),
                    tuple(inputs), tuple(outputs), tuple(ctx.check_sites))


def _rounded_to_bf16(view: View, bf16_buffers: set[str]) -> View:
    """A BF16 result computed in f32 rounds to bf16 at the op, as the reference does (loads
    from bf16 buffers and values already rounded are left alone; a load from an f32
    buffer, `cast(x, BF16)` of an F32 parameter, is rounded)."""
    at = view.at

    def rounded(index):
        value = at(index)
        if isinstance(value, L.Load) and value.buffer in bf16_buffers:
            return value
        return L.round_bf16(value)
    return View(view.type, rounded, view.buffer, view.param, view.depth)


def _write(ctx: LowerContext, produced: View | L.BufferWriter, buffer: L.Buffer) -> None:
    if isinstance(produced, L.BufferWriter) and produced.type.dtype is DType.BF16 \
            and produced.reads_back:
        # A row kernel reads back what it stored (softmax's exps): it runs on an f32 row
        # buffer, and only the finished result is rounded to bf16, as the reference does.
        wide = ctx.add_buffer(buffer.name + "_f32", produced.type.with_dtype(DType.F32), "temp")
        ctx.body.extend(produced.emit(ctx, wide.name))
        produced = ctx.buffer_view(wide, produced.type)
    if isinstance(produced, L.BufferWriter):
        ctx.body.extend(produced.emit(ctx, buffer.name))
        return
    ctx.body.extend(ctx.loops(produced.type.concrete_shape,
                              lambda index: [L.Store(buffer.name, index, produced.at(index))]))


def _lower_rule(op: Operation, ctx: LowerContext):
    definition = REGISTRY.get(op.op)
    if definition is None:
        raise ctx.error(f"no lowering for '{op.op}' (inline calls and expand reverseMode "
                        "before lowering)")
    if definition.lower is None:
        raise ctx.error(f"op '{op.op}' has no loop-nest lowering rule")
    if len(op.results) != 1:
        raise ctx.error(f"op '{op.op}' with {len(op.results)} results cannot be lowered")
    return definition.lower


def _use_counts(function: Function) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in function.body:
        for value in op.operands:
            counts[value.name] = counts.get(value.name, 0) + 1
    for value in function.results:
        counts[value.name] = counts.get(value.name, 0) + 1
    return counts
