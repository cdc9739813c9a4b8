"""Code generation for loads, stores and gathers: addresses of buffer elements, a contiguous
vector, a splat or a gather from the index's coefficient of the lane variable."""

from __future__ import annotations

from llvmlite import ir

from . import loopir as L
from . import storage
from .affine import split_aligned_lanes, to_affine
from .codegen_values import I1, I32, I64, PTR, SCALAR_LLVM, Val, zeros


class MemoryCodegen:
    """KernelCodegen's loads and stores (a mixin: it uses the kernel's state)."""

    # ---- memory -------------------------------------------------------------------------------

    def _flat_offset(self, buffer: L.Buffer, index: tuple[L.Expr, ...]) -> L.Expr:
        flat: L.Expr = L.const(0)
        for component, stride in zip(index, buffer.strides, strict=True):
            flat = L.add(flat, L.mul(component, L.const(stride)))
        return flat

    def _address_plan(self, buffer: L.Buffer, index: tuple[L.Expr, ...]):
        """('scalar', offset) | ('contiguous', offset) | ('strided', offset, coeff) |
        ('gather', offsets) for the current tile."""
        flat = self._flat_offset(buffer, index)
        lane = self.lane
        if lane is None or not self._depends_on_lane(flat):
            return ("scalar", self.expr(flat).value)
        affine = to_affine(flat)
        if any(self._depends_on_lane(e) for e, _ in affine.opaque):
            split = self._split_lanes(flat)
            if split is None:
                return ("gather", self.as_vector(self.expr(flat)))
            return split
        coefficient = affine.coefficient(lane.var)
        base = self._uniform(flat)
        if coefficient == 1:
            return ("contiguous", base)
        return ("strided", base, coefficient)

    def _split_lanes(self, flat: L.Expr):
        """The address plan of an index whose `//` and `%` of the lane variable the tile's
        alignment decides (affine.split_aligned_lanes), or None."""
        lane = self.lane
        if lane.aligned == 1:
            return None
        base_name = f"{lane.var}.tile_base"
        split = split_aligned_lanes(flat, lane.var, base_name, lane.width, lane.aligned,
                                    frozenset(self.varying_names))
        affine = to_affine(split)
        if any(self._depends_on_lane(e) for e, _ in affine.opaque):
            return None
        coefficient = affine.coefficient(lane.var)
        self.push_scope()
        self.env[-1][base_name] = Val(lane.base, False)
        try:
            base = self._uniform(split)
        finally:
            self.pop_scope()
        if coefficient == 1:
            return ("contiguous", base)
        return ("strided", base, coefficient)

    def _uniform(self, expr: L.Expr) -> ir.Value:
        """`expr` evaluated with the lane variable at the tile's base (lane 0)."""
        lane, cache = self.lane, self.cache
        # Cached values may be vectors of this tile; evaluate from a clean cache (LLVM's CSE
        # merges what is recomputed).
        self.lane, self.cache = None, [{}]
        self.push_scope()
        self.env[-1][lane.var] = Val(lane.base, False)
        try:
            value = self.expr(expr)
        finally:
            self.pop_scope()
            self.lane, self.cache = lane, cache
        return value.value

    def _depends_on_lane(self, expr: L.Expr) -> bool:
        names = L.free_vars(expr)
        return self.lane is not None and (self.lane.var in names or
                                          bool(names & self.varying_names))

    def _element_pointer(self, buffer: L.Buffer, offset: ir.Value) -> ir.Value:
        return self.b.gep(self.pointers[buffer.name], [offset], inbounds=True,
                          source_etype=SCALAR_LLVM[buffer.dtype])

    def _vector_gep(self, buffer: L.Buffer, offsets: ir.Value) -> ir.Value:
        pointers = self.b.gep(self.pointers[buffer.name], [offsets], inbounds=True,
                              source_etype=SCALAR_LLVM[buffer.dtype])
        # llvmlite types a GEP by its base pointer; with vector offsets it yields a vector of
        # pointers.
        pointers.type = ir.VectorType(PTR, offsets.type.count)
        return pointers

    def _lane_offsets(self, base: ir.Value, coefficient: int) -> ir.Value:
        width = self.lane.width
        steps = ir.Constant(ir.VectorType(I64, width), [i * coefficient for i in range(width)])
        return self.b.add(self.splat(base, width), steps)

    def _load(self, load: L.Load) -> Val:
        loaded = self._load_stored(load)
        kind = self.buffers[load.buffer].dtype
        if kind in storage.STORAGE_LLVM:
            return Val(storage.widen(self.b, loaded.value, kind), loaded.vector)
        return loaded

    def _load_stored(self, load: L.Load) -> Val:
        buffer = self.buffers[load.buffer]
        element = SCALAR_LLVM[buffer.dtype]
        plan = self._address_plan(buffer, load.index)
        if plan[0] == "scalar":
            return Val(self.b.load(self._element_pointer(buffer, plan[1]), typ=element), False)
        width = self.lane.width
        vtype = ir.VectorType(element, width)
        mask = self.lane.mask
        if plan[0] == "contiguous":
            pointer = self._element_pointer(buffer, plan[1])
            if mask is None:
                return Val(self.b.load(pointer, typ=vtype, align=L.ELEMENT_BYTES[buffer.dtype]),
                           True)
            intrinsic = self._intrinsic("llvm.masked.load", vtype, [PTR, I32, mask.type, vtype])
            return Val(self.b.call(intrinsic, [pointer, ir.Constant(I32, L.ELEMENT_BYTES[
                buffer.dtype]), mask, zeros(vtype)]), True)
        offsets = self._lane_offsets(plan[1], plan[2]) if plan[0] == "strided" else plan[1]
        return Val(self._gather(buffer, offsets, vtype), True)

    def _gather(self, buffer: L.Buffer, offsets: ir.Value, vtype: ir.VectorType) -> ir.Value:
        width = vtype.count
        pointers = self._vector_gep(buffer, offsets)
        mask = self.lane.mask if self.lane.mask is not None else ir.Constant(
            ir.VectorType(I1, width), [1] * width)
        intrinsic = self._intrinsic("llvm.masked.gather", vtype,
                                    [ir.VectorType(PTR, width), I32, mask.type, vtype])
        return self.b.call(intrinsic, [pointers, ir.Constant(I32, L.ELEMENT_BYTES[buffer.dtype]),
                                       mask, zeros(vtype)])

    def _store(self, store: L.Store) -> None:
        buffer = self.buffers[store.buffer]
        element = SCALAR_LLVM[buffer.dtype]
        value = self.expr(store.value)
        if buffer.dtype in storage.STORAGE_LLVM:
            value = Val(storage.narrow(self.b, value.value, buffer.dtype), value.vector)
        plan = self._address_plan(buffer, store.index)
        if plan[0] == "scalar":
            if value.vector:
                raise AssertionError("a varying value stored to one address")
            self.b.store(value.value, self._element_pointer(buffer, plan[1]))
            return
        width = self.lane.width
        vtype = ir.VectorType(element, width)
        vector = self.as_vector(value)
        mask = self.lane.mask
        if plan[0] == "contiguous":
            pointer = self._element_pointer(buffer, plan[1])
            if mask is None:
                self.b.store(vector, pointer, align=L.ELEMENT_BYTES[buffer.dtype])
                return
            lone = _lone_active_lane(mask)
            if lone is not None:
                # LLVM 22's x86 backend turns a masked store of a truncated vector (bf16's
                # i32 -> i16) with one constant lane into a scalar store of the untruncated
                # lane: 4 bytes for a 2-byte element, the next element (or the byte after
                # the buffer) overwritten (llvm/llvm-project#179489, fixed after 22). The
                # one lane is stored as a scalar here, as that combine means to.
                self.b.store(self.b.extract_element(vector, ir.Constant(I32, lone)),
                             self.b.gep(pointer, [ir.Constant(I64, lone)], inbounds=True,
                                        source_etype=element),
                             align=L.ELEMENT_BYTES[buffer.dtype])
                return
            intrinsic = self._intrinsic("llvm.masked.store", None,
                                        [vtype, PTR, I32, mask.type], overload=(vtype,))
            self.b.call(intrinsic, [vector, pointer, ir.Constant(I32, L.ELEMENT_BYTES[
                buffer.dtype]), mask])
            return
        offsets = (self._lane_offsets(plan[1], plan[2]) if plan[0] == "strided" else plan[1])
        pointers = self._vector_gep(buffer, offsets)
        mask = mask if mask is not None else ir.Constant(ir.VectorType(I1, width), [1] * width)
        intrinsic = self._intrinsic("llvm.masked.scatter", None,
                                    [vtype, ir.VectorType(PTR, width), I32, mask.type],
                                    overload=(vtype,))
        self.b.call(intrinsic, [vector, pointers, ir.Constant(I32, L.ELEMENT_BYTES[buffer.dtype]),
                                mask])


def _lone_active_lane(mask: ir.Value) -> int | None:
    """The lane of a constant mask with exactly one lane set, else None."""
    if not isinstance(mask, ir.Constant) or not isinstance(mask.constant, (list, tuple)):
        return None
    lanes = [int(getattr(lane, "constant", lane)) for lane in mask.constant]
    return lanes.index(1) if sum(lanes) == 1 else None
