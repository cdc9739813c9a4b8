"""The blocking decisions of the packed gemm (tilegen/gemm.py): when a product is packed
and runs on every thread, its register, depth and column blocks (`default_tiles`), and how
its threads split it (`splits_columns`) with what that costs in operand evaluations. Pure
functions of the shape and the `Target`, shared by lowering, autotuning and the emitters.
"""

from __future__ import annotations

from . import loopir as L
from .target import Target

# Products of at least this many multiply-adds become a packed gemm (lower.gemm_pays);
# from GEMM_PARALLEL_WORK flops on they (and fused attention) run on every thread.
GEMM_MIN_WORK = 1 << 16
GEMM_PARALLEL_WORK = 1 << 21
# The register block leaves a quarter of the vector registers for the B row and the A
# broadcasts, and takes at most this many rows.
MAX_MR = 14
# Depth blocks are a power of two up to this: past it the A block (mc x kc) outgrows L2.
MAX_KC = 512


def supports(dtype: str) -> bool:
    """Whether the packed gemm handles `dtype` (the float types computed in their own
    type)."""
    return dtype in L.FLOAT_TYPES


def default_tiles(dtype: str, m: int, n: int, k: int, target: Target) -> L.GemmTiles:
    """The deterministic default tiling (autotuning may pick another candidate)."""
    lanes = target.lanes(dtype)
    nr = 2 * lanes if n > lanes else lanes
    mr = min(MAX_MR, target.vector_registers * 3 // 4 // (nr // lanes))
    kc = min(depth_block(target), k)
    mc = max(mr, min(96 // mr * mr, -(-m // mr) * mr))  # whole register blocks
    nc = l2_column_block(n, nr, kc, L.ELEMENT_BYTES[dtype], target)
    return L.GemmTiles(mr, nr, kc, mc, nc)


def depth_block(target: Target) -> int:
    """The depth block kc: the largest power of two (at most MAX_KC) whose B micro-panel of
    two vectors per depth takes at most twice L1 (512 for 32 or 48 KB and 64-byte vectors):
    it streams from L2 with room to spare, while each depth block loads and stores all of C
    (figures in docs/architecture.md, "Depth blocks")."""
    per_depth = 2 * target.vector_bits // 8
    kc = 1
    while 2 * kc <= min(MAX_KC, target.l1d_bytes * 2 // per_depth):
        kc *= 2
    return kc


def column_block(n: int, nr: int, limit: int = 2048) -> int:
    """The B panel width: whole micro-panels (a multiple of nr), at most about `limit`."""
    return min(-(-n // nr), max(1, limit // nr)) * nr


def l2_column_block(n: int, nr: int, kc: int, element_bytes: int, target: Target) -> int:
    """nc for packed panels of `element_bytes`: at most 2048 columns, and at most as many as
    keep the B block (kc x nc) within the L2 of two cores, N shared out evenly over the
    blocks that takes (1536 columns 384 deep in f32: 2 x 768, not 1344 + 192). On Zen 4
    (1 MB L2), two threads, ad hoc A/B in one process with the peer alongside: 2048^3 f32
    (kc 512) ran 4-6 % faster in blocks of 1024 columns than of 2048, as the vdpbf16ps
    kernel's did (1024 deep: 43.8-45.7 against 45.8-48.6 ms); its threads then split the
    columns, each packing half of B instead of all of it (splits_columns). MiniLM's
    encode was unchanged."""
    limit = max(nr, min(2048, 2 * target.l2_bytes // (kc * element_bytes)))
    blocks = -(-n // limit)
    widest = -(-n // blocks)
    return column_block(n, nr, -(-widest // nr) * nr)


def splits_columns(m: int, n: int, tiles: L.GemmTiles, threads: int,
                   a_in_place: bool = False) -> bool:
    """Whether one batch entry's threads split the columns (each packing all of A once per
    column block of its part, and its part of B) rather than the rows (each packing its
    rows of A once per column block of all N, and all of B): whichever packs fewer
    elements per thread, the rows on a tie. With one column block that is columns when
    n > m; with several (AMX panels of 512 columns: 1024^3 on two threads packed 1.5 M
    elements a thread by rows, 1 M by columns, and ran ~15% faster) it can be columns.

    An A the kernel reads where it is (`a_in_place`: gemm_bf16.dot_a_in_place) is not
    packed, only read, by every thread that needs its rows; such a read counts a quarter
    of a packed element. On Zen 4, two threads, vdpbf16ps kernel, ad hoc A/B in one
    process: columns ran 1024^3 2 % faster than rows, 1536 x 1000 x 1024 4 %, 2048 x 1024 x
    512 1 %, 4096 x 1024 x 256 0.6 % (rows by this count), while 6000 x 1000 x 64, where
    each thread reads all of A for one panel of B, ran 5 % slower."""
    if threads <= 1 or -(-n // tiles.nr) < threads:
        return False
    share = -(-n // threads)
    a_weight, b_weight = (1, 4) if a_in_place else (1, 1)
    # Elements per thread times `threads` (the depth k is common to both and left out).
    by_rows = a_weight * -(-n // tiles.nc) * m + b_weight * n * threads
    by_columns = a_weight * -(-share // tiles.nc) * m * threads + b_weight * n
    return by_columns < by_rows


def operand_evaluations(m: int, n: int, batches: int, tiles: L.GemmTiles,
                        threads: int) -> tuple[int, int]:
    """How many times packing evaluates each element of A and of B (at most): A once per
    column block of each thread that packs it, B once per thread that packs it. An operand
    computed while packing (a fused producer) costs that many evaluations."""
    def blocks(columns: int) -> int:
        return -(-columns // tiles.nc)
    row_units = -(-m // tiles.mr)
    if threads > 1 and batches > 1 and batches * row_units >= 2:
        # (entry, row block) pairs split in contiguous runs: an entry's B is packed by
        # two threads at most, and by one when every thread has several entries.
        return blocks(n), 1 if batches >= 2 * threads else threads
    if splits_columns(m, n, tiles, threads):
        return threads * blocks(-(-n // threads)), 1
    return blocks(n), min(threads, row_units)
