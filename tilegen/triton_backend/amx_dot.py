"""`tt.dot` on AMX tiles: `tdpbf16ps` (a 16 x 16 f32 tile += 16 x 32 bf16 times 32 x 16 bf16,
f32 accumulation) on the micro-kernel of tilegen's own AMX gemm (tilegen/amx_kernel.py).

Which dots, as products of bf16 terms (`terms_of`):
- bf16 x bf16: the operands as they are; products exact in f32, as on the FMA path.
- f32 x f32 of input_precision tf32, tf32x3 or bf16x3 (tl.dot's default on fp32 is tf32):
  bf16x3. Each operand is split as x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (x - hi is
  exact in f32), and the dot is hi_a hi_b + hi_a lo_b + lo_a hi_b: per product a relative
  error of about 3 x 2^-16 (the dropped lo_a lo_b and the two lo roundings, each at most
  2^-16 |a b|), finer than tf32's inputs rounded to 11 bits (2^-11). `ieee` (and bf16x6)
  stay the exact f32 FMA kernel. AMX flushes bf16 subnormals (below 2^-126) to zero. An
  infinite or NaN element is packed with zero parts in the correction terms
  (`_part_name`), so Inf and NaN come out as the exact product's.
- f16 x f16: every f16 is exactly hi + lo (11 significant bits: 8 in hi, the rest, at
  most 3 and a sign, in lo, and f16's range is inside bf16's normal one; tested over all
  65536), so hi hi + hi lo + lo hi + lo lo are the exact products the FMA path adds, at
  four times the AMX work: still faster where AMX is (docs/triton.md, "AMX dots"); Inf
  and NaN as for f32.
Only for tiles of at least 32 x 32 (a whole 2 x 2 block of C's tiles): tutorial 03's
16 x 32 x 16 config ran slower on AMX (f16 24 against 18 ms, f32 21 against 20), its
32 x 64 x 32 and 128 x 128 x 32 faster (1024^3, one thread, ad hoc).

The terms become one bf16 dot over `len(terms)` times the depth: a K loop's trip packs
its `a` (m x BLOCK_K) as the terms' a parts side by side along k, its `b` as the terms'
b parts one after the other along k, so one flush of the packed depth is an ordinary
bf16 AMX product (kloop.py's deferred dot, with these packs):

    A[k / 32][r][k % 32]        slabs of 32 depths, m_pad rows of 64 bytes each: a tile of
                                A (16 rows) is 1 KB of contiguous memory (amx_kernel's
                                packed flavour: step_bytes = m_pad x 64, row_bytes = 64)
    B[panel][k / 2][j][k % 2]   pairs of depths interleaved per column ("VNNI"), nr = 32
                                (or 16) columns a panel

A chunk of `b`'s row kk goes to its pair's half with one masked store of the chunk's 16-bit
lanes spread to every other lane (`_store_pairs`). A flush's depth is rounded up to 32
with zero depths in both packs (0 x anything finite is 0; what the pads meet is packed
operand data). Rows of A past m and columns of B past n within a tile are not written:
they reach only C's rows and columns past m and n, which the kernel never stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .elementwise import I32, I64, bf16_to_f32, f32_to_bf16, of_width
from .tileir import Op, TileType

I1, I16 = ir.IntType(1), ir.IntType(16)
SLAB = 32  # bf16 depths per tile row of A
BF16X3 = (("hi", "hi"), ("hi", "lo"), ("lo", "hi"))
EXACT_SPLIT = (("hi", "hi"), ("hi", "lo"), ("lo", "hi"), ("lo", "lo"))
SPLIT_PRECISIONS = ("tf32", "tf32x3", "bf16x3")
# Packed bf16 depths per flush at most: tilegen's AMX gemm's kc (gemm_bf16.AMX_MAX_KC). A
# 128-row block's A slabs are then 256 KB (L2); the kernel's runs of 16 steps keep 32 KB of
# a B panel in L1 while A streams by.
FLUSH_DEPTH = 1024
MODES = ("auto", "off")  # TILEGEN_TRITON_AMX (tilegen/config.py)
MIN_TILE = 32  # rows and columns of a dot's tile at least (see above)


def available(mode: str) -> bool:
    """Whether this compile may use AMX: the knob is not off, and the host has AMX-BF16 and
    Linux grants this process tile data (gemm_bf16.amx_usable asks it)."""
    from ..gemm_bf16 import amx_usable
    from ..target import host_target

    if mode not in MODES:
        raise ValueError(f"TILEGEN_TRITON_AMX={mode!r} must be one of {', '.join(MODES)}")
    return mode != "off" and amx_usable(host_target())[0]


def terms_of(op: Op, mode: str) -> tuple[tuple[str, str], ...] | None:
    """The (a part, b part) bf16 terms `op` runs as on AMX (see above), or None when it
    stays on the FMA kernel (other types, tiles under 32 x 32, depths not whole multiples
    of 16)."""
    a_value, b_value = op.operands[:2]
    elem = a_value.type.elem
    if op.name != "tt.dot" or len(a_value.type.shape) != 2 or op.result.type.elem != "f32" \
            or b_value.type.elem != elem or a_value.type.shape[1] % 16 or mode == "off":
        return None
    if a_value.type.shape[0] < MIN_TILE or b_value.type.shape[-1] < MIN_TILE:
        return None
    if elem == "bf16":
        return (("x", "x"),)
    if elem == "f32" and op.attr("input_precision", "ieee") in SPLIT_PRECISIONS:
        return BF16X3
    if elem == "f16":
        return EXACT_SPLIT
    return None


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


@dataclass(frozen=True)
class Layout:
    """The packs of one AMX dot: `group` trips (of `depth` each) per flush."""

    terms: tuple[tuple[str, str], ...]
    m: int
    n: int
    depth: int  # BLOCK_K
    group: int

    @property
    def mr(self) -> int:  # 2 x 2 tiles of C, or one row of them for at most 16 rows
        return 32 if self.m > 16 else 16

    @property
    def nr(self) -> int:
        return 32 if self.n > 16 else 16

    @property
    def m_pad(self) -> int:
        return _round_up(self.m, self.mr)

    @property
    def panels(self) -> int:
        return -(-self.n // self.nr)

    @property
    def trip_depth(self) -> int:
        return len(self.terms) * self.depth

    @property
    def kc_pad(self) -> int:
        return _round_up(self.group * self.trip_depth, SLAB)

    @property
    def panel_elements(self) -> int:
        return self.kc_pad * self.nr

    def pack_a_type(self) -> TileType:
        return TileType("bf16", (self.m_pad, self.kc_pad))

    def pack_b_type(self, groups: int = 1) -> TileType:
        return TileType("bf16", (groups * self.panels, self.kc_pad, self.nr))

    def kept_type(self) -> TileType:  # amx_micro_kernel's `kept`: mr x nr f32 per block
        return TileType("f32", (self.m_pad, self.nr))


def layout(op: Op, terms) -> Layout:
    m, depth = op.operands[0].type.shape
    n = op.operands[1].type.shape[-1]
    trip = len(terms) * depth
    group = max(1, FLUSH_DEPTH // trip)
    if trip % SLAB and group % 2:  # whole flushes need no zero depths
        group = group + 1 if group == 1 else group - 1
    return Layout(terms, m, n, depth, group)


def _const(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def _parts(e, chunk: ir.Value, elem: str, wanted) -> dict[str, ir.Value]:
    """The chunk's bf16 parts named in `wanted` (x: a bf16 chunk as it is; hi, lo: the
    split; hi*, lo*: the same, zero where the element is infinite or NaN), each as 16-bit
    lanes."""
    if elem == "bf16":
        return {"x": chunk}
    width = chunk.type.count
    wide = chunk if elem == "f32" else e.b.fpext(chunk, of_width(ir.FloatType(), width))
    hi = _to_bf16(e, wide, width)
    parts = {"hi": hi}
    if wanted & {"lo", "lo*"}:
        rest = e.b.fsub(wide, bf16_to_f32(e.b, hi, width))  # exact: x and hi are close
        parts["lo"] = _to_bf16(e, rest, width)
    if any(name.endswith("*") for name in wanted):
        # finite: the f32 exponent is not all ones
        exponent = e.b.and_(e.b.bitcast(wide, of_width(I32, width)),
                            ir.Constant(of_width(I32, width), [0x7F800000] * width))
        finite = e.b.icmp_unsigned("!=", exponent,
                                   ir.Constant(of_width(I32, width), [0x7F800000] * width))
        zero = ir.Constant(of_width(I16, width), [0] * width)
        for name in ("hi", "lo"):
            if name + "*" in wanted:
                parts[name + "*"] = e.b.select(finite, parts[name], zero)
    return parts


def _part_name(number: int, part: str) -> str:
    """The packed part of term `number`: the first term (hi hi, or x x) as split; the
    correction terms' parts zero for an infinite or NaN element, so that Inf x a zero lo
    part cannot turn the sum NaN: hi hi alone carries Inf and NaN through, as the exact
    product does (the fix Triton made to its own tf32x3, triton-lang/triton#5335)."""
    return part if number == 0 or part == "x" else part + "*"


def _to_bf16(e, value: ir.Value, width: int) -> ir.Value:
    """f32 lanes rounded to bf16 (nearest even) as 16-bit lanes: `vcvtneps2bf16` (LLVM's
    fptrunc to bfloat) where the target has AVX512-BF16, as every AMX-BF16 CPU does (a
    third of the packing's instructions against elementwise.f32_to_bf16's integer
    rounding). It treats subnormal inputs as zero, as `tdpbf16ps` does its operands."""
    from ..gemm_bf16 import DOT_FEATURE, NamedLLVMType
    from ..target import host_target

    if DOT_FEATURE not in host_target().features.split(","):
        return f32_to_bf16(e.b, value, width)
    narrow = e.b.fptrunc(value, ir.VectorType(NamedLLVMType("bfloat"), width))
    return e.b.bitcast(narrow, of_width(I16, width))


def store_a(e, lay: Layout, pack, slot: ir.Value, row: ir.Value, column: ir.Value,
            chunk: ir.Value, elem: str) -> None:
    """Lanes [column, column + w) of row `row` of trip `slot`'s `a`, each term's a part
    at its depth in the slabs (a chunk of at most 16, aligned, stays in one slab row)."""
    parts = _parts(e, chunk, elem, {_part_name(n, a) for n, (a, _) in enumerate(lay.terms)})
    base = e.b.add(e.b.mul(slot, _const(lay.trip_depth)), column)
    for number, (part, _) in enumerate(lay.terms):
        part = _part_name(number, part)
        k = e.b.add(base, _const(number * lay.depth))
        slab = e.b.lshr(k, _const(5))
        at = e.b.add(e.b.mul(e.b.add(e.b.mul(slab, _const(lay.m_pad)), row), _const(SLAB)),
                     e.b.and_(k, _const(SLAB - 1)))
        e.b.store(parts[part], e.address(pack, at), align=2)


def store_b(e, lay: Layout, pack, base: ir.Value, slot: ir.Value, kk: ir.Value,
            column: ir.Value, chunk: ir.Value, elem: str) -> None:
    """Lanes [column, column + w) of row `kk` of trip `slot`'s `b`, each term's b part in
    its depth pair's half of its panel (a chunk never crosses a panel), from element
    `base` of the packs on (a flush group's place in a panel cache)."""
    parts = _parts(e, chunk, elem, {_part_name(n, b) for n, (_, b) in enumerate(lay.terms)})
    depth0 = e.b.add(e.b.mul(slot, _const(lay.trip_depth)), kk)
    panel = e.b.udiv(column, _const(lay.nr))
    lane = e.b.urem(column, _const(lay.nr))
    start = e.b.add(base, e.b.mul(panel, _const(lay.panel_elements)))
    for number, (_, part) in enumerate(lay.terms):
        part = _part_name(number, part)
        k = e.b.add(depth0, _const(number * lay.depth))
        pair, half = e.b.lshr(k, _const(1)), e.b.and_(k, _const(1))
        at = e.b.add(start, e.b.add(e.b.mul(e.b.add(e.b.mul(pair, _const(lay.nr)), lane),
                                            _const(2)), half))
        _store_pairs(e, e.address(pack, at), parts[part])


def pack_a(e, lay: Layout, pack, slot: ir.Value, value, elem: str) -> None:
    """Trip `slot`'s whole `a` (an m x depth tile or lazy value of `elem`) into the slabs."""
    width = min(16, lay.depth)

    def row(r):
        for part in range(0, lay.depth, width):
            chunk = e.load_chunk(value, e.b.add(e.b.mul(r, _const(lay.depth)), _const(part)),
                                 width)
            store_a(e, lay, pack, slot, r, _const(part), chunk, elem)
    e.loop(lay.m, row, unroll=False)


def pack_b(e, lay: Layout, pack, base: ir.Value, slot: ir.Value, value, elem: str) -> None:
    """Trip `slot`'s whole `b` (depth x n) into the panels, from element `base` on."""
    width = min(16, lay.n, lay.nr)

    def row(kk):
        for part in range(0, lay.n, width):
            chunk = e.load_chunk(value, e.b.add(e.b.mul(kk, _const(lay.n)), _const(part)),
                                 width)
            store_b(e, lay, pack, base, slot, kk, _const(part), chunk, elem)
    e.loop(lay.depth, row, unroll=False)


def _store_pairs(e, address: ir.Value, chunk: ir.Value) -> None:
    """chunk's lanes to address, address + 2, ... (16-bit lanes): one masked store of a
    vector twice as wide with the chunk in its even lanes (vmovdqu16 under a mask)."""
    width = chunk.type.count
    wide = ir.VectorType(I16, 2 * width)
    spread = e.b.shuffle_vector(chunk, ir.Constant(chunk.type, None), ir.Constant(
        ir.VectorType(I32, 2 * width), [lane // 2 if lane % 2 == 0 else width
                                        for lane in range(2 * width)]))
    mask = ir.Constant(ir.VectorType(I1, 2 * width), [lane % 2 == 0
                                                      for lane in range(2 * width)])
    store = e.ew.declare(f"llvm.masked.store.v{2 * width}i16.p0", ir.VoidType(),
                         [wide, address.type, I32, mask.type])
    e.b.call(store, [spread, address, ir.Constant(I32, 2), mask])


def flush(e, lay: Layout, packs, trips: ir.Value, base: ir.Value, first: bool = False):
    """acc += the packed product of `trips` trips (acc = with `first`): one micro-kernel
    call per B panel over every register block of A (packs: the A slabs, the B panels,
    the kernel's scratch and the m x n f32 accumulator; B from element `base` of its
    pack)."""
    from ..amx_kernel import TILE_BYTES, amx_micro_kernel

    pack_a, pack_b, kept, accumulator = packs
    depth = e.b.mul(trips, _const(lay.trip_depth))
    if lay.trip_depth % SLAB:
        _zero_depth_tail(e, lay, pack_a, pack_b, base, depth)
    steps = e.b.lshr(e.b.add(depth, _const(SLAB - 1)), _const(5))
    kernel = amx_micro_kernel(e.module, lay.mr, lay.nr)
    a_first = e.address(pack_a, _const(0))
    kept_first = e.address(kept, _const(0))
    e.uses_amx = True

    def panel(p):
        column0 = e.b.mul(p, _const(lay.nr))
        columns = e.b.sub(_const(lay.n), column0)
        columns = e.b.select(e.b.icmp_signed("<", columns, _const(lay.nr)), columns,
                             _const(lay.nr))
        b_panel = e.address(pack_b, e.b.add(base, e.b.mul(p, _const(lay.panel_elements))))
        e.b.call(kernel, [a_first, b_panel, steps, e.address(accumulator, column0),
                          _const(lay.n), _const(lay.m), columns, ir.Constant(I1, first),
                          _const(lay.m_pad // lay.mr), _const(TILE_BYTES),
                          _const(lay.m_pad * TILE_BYTES), steps, a_first,
                          b_panel, _const(0), _const(0), kept_first])
    e.loop(lay.panels, panel, unroll=False)


def _zero_depth_tail(e, lay: Layout, pack_a, pack_b, base: ir.Value, depth: ir.Value):
    """Zeros from `depth` (a multiple of 16) up to the next multiple of 32 in A's slabs and
    in every B panel, when `depth` is not one."""
    half = _const(SLAB // 2)
    zeros = ir.Constant(ir.VectorType(I16, SLAB // 2), None)
    with e.b.if_then(e.b.icmp_unsigned("!=", e.b.and_(depth, _const(SLAB - 1)),
                                       _const(0))):
        slab = e.b.lshr(depth, _const(5))

        def a_row(r):
            at = e.b.add(e.b.mul(e.b.add(e.b.mul(slab, _const(lay.m_pad)), r),
                                 _const(SLAB)), half)
            e.b.store(zeros, e.address(pack_a, at), align=2)
        e.loop(lay.m_pad, a_row, unroll=False)

        def b_panel(p):  # 8 pairs x nr columns x 2: contiguous
            start = e.b.add(e.b.add(base, e.b.mul(p, _const(lay.panel_elements))),
                            e.b.mul(depth, _const(lay.nr)))
            for part in range(0, SLAB // 2 * lay.nr, SLAB // 2):
                e.b.store(zeros, e.address(pack_b, e.b.add(start, _const(part))), align=2)
        e.loop(lay.panels, b_panel, unroll=False)
