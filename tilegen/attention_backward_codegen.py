"""Code generation for `AttentionBackward` (tilegen/attention_ir.py), FlashAttention-2 style:

    pass 1, parallel over (batch entry, block of R query rows):
      D[r] = sum over n of do[row r, n] o[row r, n]           into stats[row, 2]
      partial[every thread][row r, :] = 0                      for each gradient over keys
    pass 2, parallel over (batch entry, block of BK keys):
      for row blocks from the first row that sees the block (causal):
        P, ds = tile(rows, j0)
        acc[key] += sum over rows of w[r][key] y[row r, :]     each gradient over queries,
                                                               w = P (dV) or ds (dK)
        partial[this thread][row r, :] += sum over keys of ds[r][key] z[key, :]   (dQ)
      out[key, :] = acc[key]                                   (or out[:, key] transposed)
    pass 3, parallel over (batch entry, block of R query rows):
      out[row r, :] = sum over threads of partial[thread][row r, :]

    tile: s = q kt (R x BK/W vector accumulators, one broadcast FMA per d, as the forward),
          P = exp(score(s) - m) / l, g = do vt likewise, dx = P (g - D), ds = dscore(dx).

Pass 2 writes keys no other unit writes, and its sums over keys go to the running thread's
own slice: no races, no atomics, and the scores of each (row, key) pair are computed once.
The slices are linear in T (threads x tq x width); the result depends on the thread count
only through the order of that last sum. Padded keys (past tk) and padded rows (past tq)
get P = ds = 0 (a padded row's partial sums go to scratch); blocks past the causal
diagonal are skipped, blocks wholly before it use the unmasked score, exactly as the
forward chose its blocks.
"""

from __future__ import annotations

import math

from llvmlite import ir

from . import loopir as L
from .attention_codegen import (
    I1,
    I32,
    PTR,
    AttentionEmitter,
    emit_attention,
    i64,
    smin,
)
from .attention_ir import AttentionBackward
from .codegen_values import Lane, Val, bind_flat_index


def emit_fused_attention(cg, stmt) -> None:
    """Emit a fused attention statement, forward or backward (the codegen's emitter)."""
    if isinstance(stmt, AttentionBackward):
        emit_attention_backward(cg, stmt)
    else:
        emit_attention(cg, stmt)


def emit_attention_backward(cg, att: AttentionBackward) -> None:
    entries = math.prod(att.batch_extents)
    query_blocks = -(-att.tq // att.block_rows)
    key_blocks = -(-att.tk // att.block_keys)
    _run(cg, att, entries * query_blocks, _BackwardEmitter.delta_pass)
    _run(cg, att, entries * key_blocks, _BackwardEmitter.key_pass)
    if any(g.over == "keys" for g in att.gradients):
        _run(cg, att, entries * query_blocks, _BackwardEmitter.reduce_pass)


def _run(cg, att, units: int, method) -> None:
    if att.threads > 1 and units >= 2:
        cg.parallel(units, att.threads,
                    lambda child, lo, hi: method(_BackwardEmitter(child, att), lo, hi))
    else:
        method(_BackwardEmitter(cg, att), i64(0), i64(units))


class _BackwardEmitter(AttentionEmitter):
    def __init__(self, cg, att: AttentionBackward):
        super().__init__(cg, att)
        self.check_width(att.do, att.dv)
        for g in att.gradients:
            self.check_width(g.operand, g.extent)

    def _alloca(self, elements: int, name: str):
        block = self.b.alloca(self.element, size=i64(elements), name=name)
        block.align = 64
        block.type = PTR
        return block

    def _tiles(self, extent: int) -> int:
        return -(-extent // self.lanes)

    def _setup(self):
        a, b, cg = self.a, self.b, self.cg
        self.q, self.kt, self.do, self.vt, self.o, self.stats = (
            cg.pointers[n] for n in (a.q, a.kt, a.do, a.vt, a.o, a.stats))
        self.weights = {w: self._alloca(self.rows * a.block_keys, f"attn.{w}")
                        for w in ("p", "ds")}
        self.gradients = [g for g in a.gradients if g.over == "queries"]
        self.sums = [self._alloca(a.block_keys * self._tiles(g.extent) * self.lanes,
                                  "attn.sum") for g in self.gradients]
        self.row_gradients = [g for g in a.gradients if g.over == "keys"]
        widest = max((self._tiles(g.extent) for g in a.gradients), default=1)
        self.scratch = self._alloca(widest * self.lanes, "attn.scratch")
        # This thread's slice of the partial sums over keys (one per thread: no races).
        number = getattr(cg, "thread_number", None)
        self.slot = i64(0) if number is None else smin(b, number, i64(a.threads - 1))

    def _partial_row(self, g, slot, row):
        """Where row `row` of thread `slot`'s partial sums of g begins (in elements)."""
        b, a = self.b, self.a
        entries = math.prod(a.batch_extents)
        line = b.add(b.mul(b.add(b.mul(slot, i64(entries)), self.entry), i64(a.tq)), row)
        return b.mul(line, i64(self._tiles(g.extent) * self.lanes))

    def _unit(self, unit, blocks: int):
        """(batch entry, block) of a unit, the batch variables bound; zigzag order, as the
        forward: a thread's contiguous share of a causal problem is long and short alike."""
        a, b, cg = self.a, self.b, self.cg
        entry = b.sdiv(unit, i64(blocks))
        position = b.srem(unit, i64(blocks))
        half = b.sdiv(position, i64(2))
        odd = b.icmp_signed("!=", b.srem(position, i64(2)), i64(0))
        block = b.select(odd, b.sub(i64(blocks - 1), half), half)
        bind_flat_index(b, cg.env[-1], a.batch, a.batch_extents, entry)
        self.entry = entry
        return block

    def _zero(self, slots: int, base) -> None:
        zero = ir.Constant(self.vector, None)
        for slot in range(slots):
            self._store_vector(zero, self._pointer(base, i64(slot * self.lanes)))

    def _row_stats(self, rows):
        """(shift, 1 / l, D) of each row: the forward's statistics and pass 1's D."""
        b, out = self.b, []
        for row in rows:
            base = b.mul(b.add(b.mul(self.entry, i64(self.a.tq)), row), i64(3))
            m, total, delta = (b.load(self._pointer(self.stats, b.add(base, i64(k))),
                                      typ=self.element) for k in range(3))
            # A row with no key at all (every score -inf) shifts by 0: no inf - inf.
            shift = b.select(b.fcmp_ordered("==", m, self._f(-math.inf)), self._f(0.0), m)
            out.append((shift, b.fdiv(self._f(1.0), total), delta))
        return out

    # ---- one R x BK tile of P and ds ---------------------------------------------------------

    def _dots(self, rows, a_ptr, a_stride: int, blocked, extent: int, j0):
        b, lanes, tiles = self.b, self.lanes, self.key_tiles
        a_rows = [b.mul(b.add(b.mul(self.entry, i64(self.a.tq)), row), i64(a_stride))
                  for row in rows]
        base = b.add(b.mul(self.entry, i64(extent * self.tk_padded)), b.mul(j0, i64(extent)))

        def step(d, sums):
            k_row = b.add(base, b.mul(d, i64(self.a.block_keys)))
            keys = [self._load_vector(blocked, b.add(k_row, i64(c * lanes)))
                    for c in range(tiles)]
            updated = []
            for r in range(len(rows)):
                left = self._splat(b.load(self._pointer(a_ptr, b.add(a_rows[r], d)),
                                          typ=self.element))
                updated += [self._fma(left, keys[c], sums[r * tiles + c]) for c in range(tiles)]
            return updated
        zero = ir.Constant(self.vector, None)
        return self.cg.loop(0, extent, 1, [zero] * (len(rows) * tiles), step)

    def _vector(self, expr: L.Expr, bound: L.Var, value, row, base) -> ir.Value:
        """`expr` for W keys from `base` at query `row`, `bound` taking the vector `value`."""
        a, cg = self.a, self.cg
        saved_lane, saved_cache = cg.lane, cg.cache
        cg.lane, cg.cache = Lane(a.j.name, self.lanes, base, self._real(base)), [{}]
        cg.push_scope()
        cg.env[-1][a.i.name] = Val(row, False)
        cg.env[-1][bound.name] = Val(value, True)
        cg.varying_names.add(bound.name)
        try:
            return cg.as_vector(cg.expr(expr))
        finally:
            cg.pop_scope()
            cg.lane, cg.cache = saved_lane, saved_cache

    def _real(self, base):
        """Which of the W keys from `base` exist (None: all of them, always)."""
        if self.tk_padded == self.a.tk:
            return None
        keys = self.b.add(self.cg.splat(base, self.lanes), ir.Constant(
            ir.VectorType(ir.IntType(64), self.lanes), list(range(self.lanes))))
        return self.b.icmp_signed("<", keys, self.cg.splat(i64(self.a.tk), self.lanes))

    def _tile(self, j0, rows, valid, stats, score: L.Expr) -> None:
        """P and ds of `rows` x the key block at j0 into the weight blocks (0 for keys past
        tk and rows not `valid`)."""
        a, b, lanes, tiles = self.a, self.b, self.lanes, self.key_tiles
        zero = ir.Constant(self.vector, None)
        sums = self._dots(rows, self.q, a.d_extent, self.kt, a.d_extent, j0)
        probabilities = []
        for r, row in enumerate(rows):
            shift, inverse, _ = stats[r]
            for c in range(tiles):
                base = b.add(j0, i64(c * lanes))
                value = self._vector(score, a.s, sums[r * tiles + c], row, base)
                p = b.fmul(self._exp(b.fsub(value, self._splat(shift))), self._splat(inverse))
                probabilities.append(self._keep(p, base, valid[r], zero))
        products = self._dots(rows, self.do, self._tiles(a.dv) * lanes, self.vt, a.dv, j0)
        for r, row in enumerate(rows):
            delta = self._splat(stats[r][2])
            for c in range(tiles):
                base = b.add(j0, i64(c * lanes))
                p = probabilities[r * tiles + c]
                dx = b.fmul(p, b.fsub(products[r * tiles + c], delta))
                ds = self._keep(self._vector(a.dscore, a.dx, dx, row, base), base, valid[r],
                                zero)
                offset = i64(r * a.block_keys + c * lanes)
                self._store_vector(p, self._pointer(self.weights["p"], offset))
                self._store_vector(ds, self._pointer(self.weights["ds"], offset))

    def _keep(self, value, base, valid, zero):
        real = self._real(base)
        if real is not None:
            value = self.b.select(real, value, zero)
        return value if valid is None else self.b.select(valid, value, zero)

    # ---- pass 1: D, the partial sums cleared; pass 3: the partial sums added up -----------

    def _rows(self, unit):
        block = self._unit(unit, self.blocks)
        first_row = self.b.mul(block, i64(self.rows))
        return first_row, [smin(self.b, self.b.add(first_row, i64(r)), i64(self.a.tq - 1))
                           for r in range(self.rows)]

    def _each_valid_row(self, first_row, rows, body) -> None:
        for r, row in enumerate(rows):
            with self.b.if_then(self.b.icmp_signed("<", self.b.add(first_row, i64(r)),
                                                   i64(self.a.tq))):
                body(row)

    def delta_pass(self, lo, hi) -> None:
        self._setup()

        def unit(index, carried):
            self.cg.push_scope()
            first_row, rows = self._rows(index)
            self._store_deltas(first_row, rows)
            zero = ir.Constant(self.vector, None)

            def clear(row):
                for g in self.row_gradients:
                    for slot in range(self.a.threads):
                        start = self._partial_row(g, i64(slot), row)
                        for t in range(self._tiles(g.extent)):
                            pointer = self._pointer(self.cg.pointers[g.partial],
                                                    self.b.add(start, i64(t * self.lanes)))
                            self._store_vector(zero, pointer)
            self._each_valid_row(first_row, rows, clear)
            self.cg.pop_scope()
            return carried
        self.cg.loop(lo, hi, 1, [], unit)

    def reduce_pass(self, lo, hi) -> None:
        self._setup()
        line_sums = self._alloca(max(self._tiles(g.extent) for g in self.row_gradients) *
                                 self.lanes, "attn.row")

        def unit(index, carried):
            self.cg.push_scope()
            first_row, rows = self._rows(index)

            def add_up(row):
                b = self.b
                for g in self.row_gradients:
                    partial = self.cg.pointers[g.partial]
                    for t in range(self._tiles(g.extent)):
                        total = None
                        for slot in range(self.a.threads):
                            start = self._partial_row(g, i64(slot), row)
                            value = self._load_vector(partial, b.add(start, i64(t * self.lanes)))
                            total = value if total is None else b.fadd(total, value)
                        self._store_vector(total, self._pointer(line_sums, i64(t * self.lanes)))
                    line = b.add(b.mul(self.entry, i64(self.a.tq)), row)
                    self._store_row(line_sums, i64(0), g, line)
            self._each_valid_row(first_row, rows, add_up)
            self.cg.pop_scope()
            return carried
        self.cg.loop(lo, hi, 1, [], unit)

    def _store_deltas(self, first_row, rows) -> None:
        """D = rowsum(do * o) of `rows` into column 2 of the statistics."""
        a, b, cg = self.a, self.b, self.cg
        dv_padded = self._tiles(a.dv) * self.lanes
        for r, row in enumerate(rows):
            line = b.add(b.mul(self.entry, i64(a.tq)), row)

            def product(n, carried, line=line):
                do = b.load(self._pointer(self.do, b.add(b.mul(line, i64(dv_padded)), n)),
                            typ=self.element)
                o = b.load(self._pointer(self.o, b.add(b.mul(line, i64(a.dv)), n)),
                           typ=self.element)
                return [b.fadd(carried[0], b.fmul(do, o))]
            (delta,) = cg.loop(0, a.dv, 1, [self._f(0.0)], product)
            with b.if_then(b.icmp_signed("<", b.add(first_row, i64(r)), i64(a.tq))):
                b.store(delta, self._pointer(self.stats, b.add(b.mul(line, i64(3)), i64(2))))

    def _sum_over_keys(self, g, rows, valid_rows, j0) -> None:
        """partial[row r] += sum over the BK keys of ds[r][key] * operand[j0 + key, :], in
        this thread's slice."""
        a, b, cg = self.a, self.b, self.cg
        tiles = self._tiles(g.extent)
        operand, partial = cg.pointers[g.operand], cg.pointers[g.partial]
        base = b.mul(b.add(b.mul(self.entry, i64(self.tk_padded)), j0), i64(tiles * self.lanes))
        slots = []
        for row, valid in zip(rows, valid_rows, strict=True):
            start = self._partial_row(g, self.slot, row)
            for t in range(tiles):
                slot = self._pointer(partial, b.add(start, i64(t * self.lanes)))
                if valid is not None:  # a padded row (clamped to the last) adds into scratch
                    slot = b.select(valid, slot, self._pointer(self.scratch,
                                                               i64(t * self.lanes)))
                slots.append(slot)
        start = [b.load(slot, typ=self.vector, align=self.bytes) for slot in slots]

        def key(index, sums):
            line = b.add(base, b.mul(index, i64(tiles * self.lanes)))
            values = [self._load_vector(operand, b.add(line, i64(t * self.lanes)))
                      for t in range(tiles)]
            updated = []
            for r in range(self.rows):
                weight = self._splat(b.load(self._pointer(
                    self.weights["ds"], b.add(index, i64(r * a.block_keys))), typ=self.element))
                updated += [self._fma(weight, values[t], sums[r * tiles + t])
                            for t in range(tiles)]
            return updated
        finished = cg.loop(0, a.block_keys, 1, start, key)
        for slot, value in zip(slots, finished, strict=True):
            self._store_vector(value, slot)

    def _store_row(self, block, first, g, line) -> None:
        """The sums at block[first...] into row `line` of g.out (g.extent wide)."""
        b = self.b
        out = self.cg.pointers[g.out]
        partial = g.extent % self.lanes
        mask = ir.Constant(ir.VectorType(I1, self.lanes),
                           [1 if k < partial else 0 for k in range(self.lanes)])
        store = self.cg._intrinsic("llvm.masked.store", None,
                                   [self.vector, PTR, I32, mask.type], overload=(self.vector,))
        tiles = self._tiles(g.extent)
        for t in range(tiles):
            value = self._load_vector(block, self.b.add(first, i64(t * self.lanes)))
            pointer = self._pointer(out, b.add(b.mul(line, i64(g.extent)), i64(t * self.lanes)))
            if partial and t == tiles - 1:
                b.call(store, [value, pointer, ir.Constant(I32, self.bytes), mask])
            else:
                self._store_vector(value, pointer)

    # ---- pass 2: the gradients summed over queries -------------------------------------------

    def key_pass(self, lo, hi) -> None:
        self._setup()
        self.cg.loop(lo, hi, 1, [], lambda unit, carried: self._key_block_unit(unit) or carried)

    def _key_block_unit(self, unit) -> None:
        a, b, cg = self.a, self.b, self.cg
        cg.push_scope()
        j0 = b.mul(self._unit(unit, -(-a.tk // a.block_keys)), i64(a.block_keys))
        for g, block in zip(self.gradients, self.sums, strict=True):
            self._zero(a.block_keys * self._tiles(g.extent), block)
        row_end = i64(self.blocks * self.rows)
        if a.causal is None:
            start = clean = i64(0)
        else:
            # Rows before j0 - c see none of the block; rows from j0 + BK - 1 - c see all.
            first = b.sub(j0, i64(a.causal))
            first = b.select(b.icmp_signed("<", first, i64(0)), i64(0), first)
            start = b.mul(b.sdiv(first, i64(self.rows)), i64(self.rows))
            whole = b.add(j0, i64(a.block_keys - 1 - a.causal + self.rows - 1))
            whole = b.select(b.icmp_signed("<", whole, i64(0)), i64(0), whole)
            clean = smin(b, b.mul(b.sdiv(whole, i64(self.rows)), i64(self.rows)), row_end)
            clean = b.select(b.icmp_signed("<", clean, start), start, clean)

        def rows_from(begin, stop, score):
            def step(i0, carried):
                rows = [smin(b, b.add(i0, i64(r)), i64(a.tq - 1)) for r in range(self.rows)]
                valid = [b.icmp_signed("<", b.add(i0, i64(r)), i64(a.tq))
                         if self.blocks * self.rows > a.tq else None for r in range(self.rows)]
                self._tile(j0, rows, valid, self._row_stats(rows), score)
                for g, block in zip(self.gradients, self.sums, strict=True):
                    self._sum_over_queries(g, block, rows)
                for g in self.row_gradients:
                    self._sum_over_keys(g, rows, valid, j0)
                return carried
            cg.loop(begin, stop, self.rows, [], step)
        rows_from(start, clean, a.score)
        rows_from(clean, row_end, a.unmasked)
        for g, block in zip(self.gradients, self.sums, strict=True):
            self._store_keys(g, block, j0)
        cg.pop_scope()

    def _sum_over_queries(self, g, block, rows) -> None:
        """block[key] += sum over the R rows of w[r][key] * operand[row r, :]."""
        a, b, cg = self.a, self.b, self.cg
        tiles = self._tiles(g.extent)
        operand = cg.pointers[g.operand]
        lines = [b.mul(b.add(b.mul(self.entry, i64(a.tq)), row), i64(tiles * self.lanes))
                 for row in rows]
        values = [self._load_vector(operand, b.add(lines[r], i64(t * self.lanes)))
                  for r in range(self.rows) for t in range(tiles)]

        def key(index, carried):
            weights = [self._splat(b.load(self._pointer(
                self.weights[g.weight], b.add(index, i64(r * a.block_keys))), typ=self.element))
                for r in range(self.rows)]
            for t in range(tiles):
                slot = self._pointer(block, b.add(b.mul(index, i64(tiles * self.lanes)),
                                                  i64(t * self.lanes)))
                total = b.load(slot, typ=self.vector, align=self.bytes)
                for r in range(self.rows):
                    total = self._fma(weights[r], values[r * tiles + t], total)
                self._store_vector(total, slot)
            return carried
        cg.loop(0, a.block_keys, 1, [], key)

    def _store_keys(self, g, block, j0) -> None:
        a, b, cg = self.a, self.b, self.cg
        tiles = self._tiles(g.extent)
        count = smin(b, i64(a.block_keys), b.sub(i64(a.tk), j0))

        def key(index, carried):
            slot = b.mul(index, i64(tiles))
            if not g.transposed:
                line = b.add(b.mul(self.entry, i64(a.tk)), b.add(j0, index))
                self._store_row(block, b.mul(slot, i64(self.lanes)), g, line)
                return carried
            out = cg.pointers[g.out]

            def column(n, inner):
                value = b.load(self._pointer(block, b.add(b.mul(slot, i64(self.lanes)), n)),
                               typ=self.element)
                target = b.add(b.mul(b.add(b.mul(self.entry, i64(g.extent)), n), i64(a.tk)),
                               b.add(j0, index))
                b.store(value, self._pointer(out, target))
                return inner
            cg.loop(0, g.extent, 1, [], column)
            return carried
        cg.loop(i64(0), count, 1, [], key)
