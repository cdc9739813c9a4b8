"""Code generation for reductions: scalar and vector-tiled sums and maxima, and loops whose
trips finish their vector reductions together (joint reductions)."""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L
from .codegen_values import FLOAT_FLAGS, I1, I64, SCALAR_LLVM, Lane, Val, constant
from .emitplan import joint_reduction, tail_width


def _joint_horizontal(builder: ir.IRBuilder, vectors: list[ir.Value],
                      combine) -> list[ir.Value]:
    """[combine over the lanes of v] for each of 2 or 4 vectors (same type, power-of-two
    width); `combine(builder, x, y)` is the lane-wise sum or max.

    A vector holds `len(group)` equal segments, segment s accumulating vectors[group[s]].
    Two vectors with the same segments merge into one whose segments are half as long
    (first halves + second halves of each, one combine); a lone vector folds its segments'
    halves onto each other. Merging first shares the shuffles among the vectors, and each
    vector's lanes are still folded in the halving order of LLVM's own reductions."""
    i32 = ir.IntType(32)

    def mask(lanes):
        return ir.Constant(ir.VectorType(i32, len(lanes)), lanes)

    states = [(vector, [number]) for number, vector in enumerate(vectors)]
    while len(states) > 1 or len(states[0][1]) < states[0][0].type.count:
        if len(states) > 1 and len(states[0][1]) == len(states[1][1]) and \
                states[0][0].type.count == states[1][0].type.count:
            (a, group_a), (b, group_b) = states[0], states[1]
            lanes = a.type.count
            segment = lanes // len(group_a)
            half = segment // 2
            firsts, seconds = [], []
            for source in (0, lanes):  # lanes of a, then of b
                for start in range(0, lanes, segment):
                    firsts += [source + start + i for i in range(half)]
                    seconds += [source + start + half + i for i in range(half)]
            low = builder.shuffle_vector(a, b, mask(firsts))
            high = builder.shuffle_vector(a, b, mask(seconds))
            # Segment order: a's segments, then b's.
            states = states[2:] + [(combine(builder, low, high), group_a + group_b)]
            continue
        vector, group = states[0]
        lanes = vector.type.count
        segment = lanes // len(group)
        half = segment // 2
        firsts = [start + i for start in range(0, lanes, segment) for i in range(half)]
        seconds = [start + half + i for start in range(0, lanes, segment) for i in range(half)]
        undefined = ir.Constant(vector.type, None)
        low = builder.shuffle_vector(vector, undefined, mask(firsts))
        high = builder.shuffle_vector(vector, undefined, mask(seconds))
        states = states[1:] + [(combine(builder, low, high), group)]
    vector, group = states[0]
    results: list[ir.Value] = [None] * len(vectors)  # type: ignore[list-item]
    for lane, number in enumerate(group):
        results[number] = builder.extract_element(vector, ir.Constant(i32, lane))
    return results


def _lane_sum(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return builder.fadd(x, y, flags=FLOAT_FLAGS)


def _lane_max(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    # maxnum accumulators hold no NaN (see KernelCodegen._combine): one vmaxps.
    return builder.select(builder.fcmp_ordered(">", x, y), x, y)


_JOINT_COMBINE = {"sum": _lane_sum, "maxnum": _lane_max}


_REDUCE_OPS = frozenset(L.ReduceOp)


class ReductionCodegen:
    """KernelCodegen's reductions (a mixin: it uses the kernel's state)."""

    # ---- reductions ---------------------------------------------------------------------------

    def _identity(self, op: str, dtype: str) -> ir.Constant:
        if op == "sum":
            return constant(dtype, 0)
        if dtype in L.FLOAT_TYPES:
            return constant(dtype, float("-inf"))
        return constant(dtype, -(2**63))

    def _reduce(self, reduce: L.Reduce) -> Val:
        if reduce.op not in _REDUCE_OPS:  # _combine's last branch would take it as argmax
            raise L.unknown_op("reduction", reduce.op, L.ReduceOp)
        if reduce.vector_width and self.lane is None:
            return self._vector_reduce(reduce)
        varying = self._depends_on_lane(reduce)
        body_dtype = reduce.body.dtype
        width = self.lane.width if varying else 0

        def typed(constant: ir.Constant) -> ir.Value:
            return ir.Constant(ir.VectorType(constant.type, width),
                               [constant.constant] * width) if width else constant

        if reduce.op == "argmax":
            inits = [typed(self._identity("max", body_dtype)), typed(ir.Constant(I64, 0))]
        elif reduce.op == "max" and body_dtype in L.FLOAT_TYPES:
            inits = [typed(self._identity("max", body_dtype)), typed(ir.Constant(I1, 0))]
        else:
            inits = [typed(self._identity(reduce.op, reduce.dtype))]

        def body(index, carried):
            self.push_scope()
            self.env[-1][reduce.var.name] = Val(index, False)
            value = self.expr(reduce.body)
            self.pop_scope()
            if varying and not value.vector:
                value = Val(self.splat(value.value, width), True)
            return self._combine(reduce.op, carried, value, index, body_dtype, varying)

        final = self.loop(0, reduce.extent, 1, inits, body)
        if reduce.op == "argmax":
            return Val(final[-1], varying)
        if reduce.op == "max" and body_dtype in L.FLOAT_TYPES:
            return Val(self._nan_if(final[1], final[0], body_dtype), varying)
        return Val(final[0], varying)

    def _nan_if(self, flag: ir.Value, value: ir.Value, dtype: str) -> ir.Value:
        nan = constant(dtype, float("nan"))
        if isinstance(value.type, ir.VectorType):
            nan = ir.Constant(value.type, [nan.constant] * value.type.count)
        return self.b.select(flag, nan, value)

    def _combine(self, op: str, carried, value: Val, index, dtype: str, varying: bool):
        if op == "sum":
            return [self._binary("add", Val(carried[0], varying), value, dtype).value]
        if op == "maxnum":
            best = Val(carried[0], varying)
            greater = self._binary("gt", value, best, dtype)
            return [self.b.select(greater.value, value.value, best.value)]
        if op == "max" and dtype in L.FLOAT_TYPES:
            # A plain compare-and-select max (one vmaxps) and a separate NaN flag: cheaper
            # than llvm.maximum's NaN handling at every step; the flag makes the result NaN
            # at the end, as numpy's max does.
            best = Val(carried[0], varying)
            greater = self._binary("gt", value, best, dtype)
            is_nan = self._binary("ne", value, value, dtype)
            return [self.b.select(greater.value, value.value, best.value),
                    self.b.or_(carried[1], is_nan.value)]
        if op == "max":
            return [self._binary("max", Val(carried[0], varying), value, dtype).value]
        best, best_index = carried
        greater = self._binary("gt", value, Val(best, varying), dtype)
        if dtype in L.FLOAT_TYPES:
            # numpy's argmax: a NaN is the maximum and the first NaN wins.
            value_nan = self._binary("ne", value, value, dtype)
            best_nan = self._binary("ne", Val(best, varying), Val(best, varying), dtype)
            not_best_nan = Val(self.b.xor(best_nan.value, ir.Constant(best_nan.value.type,
                                                                      -1)), varying)
            first_nan = self._binary("and", value_nan, not_best_nan, L.BOOL)
            greater = self._binary("or", greater, first_nan, L.BOOL)
        index_val = Val(index, False)
        if varying:
            index_val = Val(self.splat(index, self.lane.width), True)
        new_best = self.b.select(greater.value, value.value, best)
        new_index = self.b.select(greater.value, index_val.value, best_index)
        return [new_best, new_index]

    def _vector_reduce(self, reduce: L.Reduce) -> Val:
        return self._finish_vector_reduce(reduce, self._vector_accumulate(reduce))

    def _vector_accumulate(self, reduce: L.Reduce) -> list[ir.Value]:
        """The lane-wise accumulators of a vectorised reduction (before the horizontal
        combine): [sum] or [max, NaN flags]."""
        width = reduce.vector_width
        dtype = reduce.dtype
        vtype = ir.VectorType(SCALAR_LLVM[dtype], width)
        identity = self._identity(reduce.op, dtype)
        init = ir.Constant(vtype, [identity.constant] * width)
        main = reduce.extent // width * width
        float_max = reduce.op == "max" and dtype in L.FLOAT_TYPES

        def tile(base, mask, carried, tile_width=width):
            """One tile folded into `carried`; None: the tile starts the accumulator."""
            saved = self.lane
            self.lane = Lane(reduce.var.name, tile_width, base, mask)
            self.push_scope()
            value = self.as_vector(self.expr(reduce.body))
            self.pop_scope()
            if tile_width < width or mask is not None:
                # Masked-off lanes, and the lanes a narrow tail lacks, hold the identity.
                fill = ir.Constant(ir.VectorType(vtype.element, tile_width),
                                   [identity.constant] * tile_width)
                if mask is not None:
                    value = self.b.select(mask, value, fill)
                if tile_width < width:
                    value = self.b.shuffle_vector(value, fill, ir.Constant(
                        ir.VectorType(ir.IntType(32), width),
                        [min(lane, tile_width) for lane in range(width)]))
            if carried is None:
                # 0 + x is x (a -0 stays -0, as numpy's sum keeps it): skip the add.
                # maxnum's first combine stays: it is what keeps NaN out of the accumulator.
                combined = [value]
            else:
                combined = self._combine(reduce.op, carried, Val(value, True), None, dtype,
                                         True)
            self.lane = saved
            return combined

        carried = [init, ir.Constant(ir.VectorType(I1, width), [0] * width)] if float_max \
            else [init]
        start = 0
        if reduce.op == "sum" and main:
            carried = tile(ir.Constant(I64, 0), None, None)
            start = width
        if main > start:
            carried = self.loop(start, main, width, carried,
                                 lambda index, acc: tile(index, None, acc))
        if reduce.extent - main:
            active = reduce.extent - main
            narrow = tail_width(width, active)
            carried = tile(ir.Constant(I64, main),
                           self._tail_mask(narrow, active) if active < narrow else None,
                           carried, narrow)
        return carried

    def _finish_vector_reduce(self, reduce: L.Reduce, carried: list[ir.Value]) -> Val:
        width, dtype = reduce.vector_width, reduce.dtype
        vtype = ir.VectorType(SCALAR_LLVM[dtype], width)
        float_max = reduce.op == "max" and dtype in L.FLOAT_TYPES
        accumulator = carried[0]
        if reduce.op == "sum":
            name = "llvm.vector.reduce.fadd" if dtype in L.FLOAT_TYPES else \
                "llvm.vector.reduce.add"
            if dtype in L.FLOAT_TYPES:
                intrinsic = self._intrinsic(name, SCALAR_LLVM[dtype], [SCALAR_LLVM[dtype], vtype],
                                            overload=(vtype,))
                result = self.b.call(intrinsic, [ir.Constant(SCALAR_LLVM[dtype], -0.0),
                                                 accumulator], fastmath=("reassoc",))
            else:
                intrinsic = self._intrinsic(name, SCALAR_LLVM[dtype], [vtype], overload=(vtype,))
                result = self.b.call(intrinsic, [accumulator])
        elif float_max or reduce.op == "maxnum":
            # The accumulator holds no NaN (see _combine): maxnum's plain vmaxps tree.
            intrinsic = self._intrinsic("llvm.vector.reduce.fmax", SCALAR_LLVM[dtype], [vtype],
                                        overload=(vtype,))
            result = self.b.call(intrinsic, [accumulator], fastmath=("nnan",))
            if float_max:
                flags = carried[1]
                any_nan = self.b.icmp_unsigned("!=", self.b.bitcast(flags, ir.IntType(width)),
                                               ir.Constant(ir.IntType(width), 0))
                result = self._nan_if(any_nan, result, dtype)
        else:
            intrinsic = self._intrinsic("llvm.vector.reduce.smax", SCALAR_LLVM[dtype], [vtype],
                                        overload=(vtype,))
            result = self.b.call(intrinsic, [accumulator])
        return Val(result, False)

    def _joint_reductions(self, loop: L.For) -> bool:
        """A loop whose trips each finish one vectorised float sum or max (a short row of
        dot products, as in p @ v with a narrow v; the row maxima and sums of short softmax
        rows) runs four trips at a time and finishes their reductions together: the
        accumulators are halved pairwise in shared shuffles, about a third of the
        instructions of one horizontal reduction each, with the other trips' work to
        overlap. False when the loop is not that."""
        reduce = joint_reduction(loop, in_tile=self.lane is not None)  # tilegen/emitplan.py
        if reduce is None:
            return False

        def trips(first, count: int) -> None:
            def bind(trip):
                self.push_scope()
                index = self._binary("add", Val(first, False),
                                     Val(ir.Constant(I64, trip), False), L.I64)
                self.env[-1][loop.var.name] = index

            accumulators = []
            for trip in range(count):
                bind(trip)
                accumulators.append(self._vector_accumulate(reduce)[0])
                self.pop_scope()
            totals = _joint_horizontal(self.b, accumulators, _JOINT_COMBINE[reduce.op])
            for trip, total in enumerate(totals):
                bind(trip)
                self.cache[-1][reduce] = Val(total, False)
                for stmt in loop.body:
                    self.stmt(stmt)
                self.pop_scope()

        groups = loop.extent // 4
        if groups > 1:
            self.loop(0, 4 * groups, 4, [], lambda index, carried: trips(index, 4) or carried)
        elif groups == 1:
            trips(ir.Constant(I64, 0), 4)
        done = 4 * groups
        if loop.extent - done >= 2:
            trips(ir.Constant(I64, done), 2)
            done += 2
        if done < loop.extent:
            self._loop_body(loop)(ir.Constant(I64, done), [])
        return True
