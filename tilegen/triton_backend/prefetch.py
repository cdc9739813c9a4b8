"""Software prefetch ahead of row-long contiguous loads and stores.

A program that sweeps a long row (softmax, layer norm: 4 KB and more) starts each row on a
new 4 KB page, and the hardware's streaming prefetcher does not cross pages: every row began
with demand misses while the prefetcher ramped up again (`perf` put the first instruction
after the row loads of layer norm backward and softmax among the hottest). Each chunk of a
contiguous access whose tile rows span at least MIN_ROW_BYTES prefetches the line
DISTANCE bytes further on: in the row's second half that is the start of the next row when
rows follow each other in memory (the next program on the thread, whose ids run in
contiguous order, grid.py), in its first half the rest of its own row. Prefetches never
fault, so lanes past a tensor's end cost at most a line fetched for nothing; rows with gaps
between them fetch up to DISTANCE bytes of each gap. Short rows (the tiles of matmul and
attention, a few hundred bytes per row) are left to the hardware. Stores prefetch for
writing, so the line is owned before the store needs it.
"""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I32, PTR
from .tileir import TileType, element_bytes

DISTANCE = 2048
MIN_ROW_BYTES = 2048
STORES = True


def row_long(type_: TileType) -> bool:
    return bool(DISTANCE) and bool(type_.shape) and \
        type_.shape[-1] * element_bytes(type_.elem) >= MIN_ROW_BYTES


def ahead(e, address: ir.Value, write: bool = False) -> None:
    """Prefetch the line DISTANCE bytes after `address` (an i64) into L1."""
    function = e.ew.declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    target = e.b.inttoptr(e.b.add(address, ir.Constant(address.type, DISTANCE)), PTR)
    e.b.call(function, [target, ir.Constant(I32, int(write)), ir.Constant(I32, 3),
                        ir.Constant(I32, 1)])
