"""A dot's `b` read by the micro-kernel where it lies in memory, not copied to the frame.

Attention's `v = tl.load(V_ptrs)` is a [BLOCK_N, 64] f32 block whose rows are whole
four-vector panels of the micro-kernel already (tiles.dot: such a `b` is not packed).
Loaded into the frame first, it was a 16 KB copy per trip (about 5 % of the kernel); when
its rows lie in memory at the micro-kernel's row stride (64 elements: a contiguous V with
HEAD_DIM = 64), the micro-kernel reads them there.

It applies to a contiguous, unmasked `tt.load` whose only reader is a dot taking that
unpacked path (the load is then a lazy fused load, fused_loads.py, read at the dot): the
dot checks at run time that row r of the pointer tile starts at row 0's address plus r
rows of the panel, and otherwise stores the load to the frame and runs as before. Not with
bounds checks (TRITON_DEBUG=1), which check each chunk a load reads.
"""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I1, I64
from .tileir import Op, element_bytes


def panel_width(lanes_of, op: Op) -> int | None:
    """The width of `op`'s b rows when it is a dot whose b is its own panel (four vectors
    of the accumulator type, the same type as b), else None. `lanes_of(dtype)` is the
    target's lanes."""
    if op.name != "tt.dot" or len(op.operands[0].type.shape) != 2:
        return None
    elem = op.result.type.elem
    b_value = op.operands[1]
    if elem not in ("f32", "f64") or b_value.type.elem != elem or \
            op.operands[0].type.elem not in ("f16", "bf16", "f32", "f64"):
        return None
    n = b_value.type.shape[-1]
    return n if n == 4 * lanes_of(elem) else None


def reads_in_place(e, reader: Op, value) -> bool:
    """Whether `reader` can read the load `value` as its b in memory (see above)."""
    from ..target import host_target

    if e.debug or panel_width(host_target().lanes, reader) is None or \
            e.deferred_dots.get(reader.result.id) is not None:
        return False
    a_value, b_value, c_value = reader.operands[:3]
    return b_value is value and a_value is not value and c_value is not value


def rows_in_place(e, lazy, rows: int, row_elements: int):
    """(i64 address of row 0, i1: every row r of the lazy load starts `r` rows of
    `row_elements` after it)."""
    addresses = lazy.operands[0]
    size = element_bytes(lazy.type.elem)
    first = e.load_chunk(addresses, ir.Constant(I64, 0), 0)
    together = e.entry_alloca(I1)
    e.b.store(ir.Constant(I1, 1), together)

    def row(r):
        at = e.load_chunk(addresses, e.b.mul(r, ir.Constant(I64, row_elements)), 0)
        expected = e.b.add(first, e.b.mul(r, ir.Constant(I64, row_elements * size)))
        e.b.store(e.b.and_(e.b.load(together), e.b.icmp_unsigned("==", at, expected)),
                  together)
    e.loop(rows, row, unroll=False)
    return first, e.b.load(together)


def in_memory(lazy) -> bool:
    """Whether the dot's b value is a fused load without a mask (read in place)."""
    return getattr(lazy, "kind", None) == "load" and lazy.payload == (False, False)
