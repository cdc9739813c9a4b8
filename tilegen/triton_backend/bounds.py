"""TRITON_DEBUG=1 bounds checks: every lane a load, store or atomic touches must lie inside
one of the kernel's tensor arguments.

The launcher passes a table of each tensor argument's storage range ([count, lo0, hi0,
lo1, hi1, ...], its address in status[3]). A lane outside all of them stops its program
before the access: status[0..2] get 1, the check site (the op and its source line) and
the address, the grid's workers stop starting programs, and the launcher raises
`KernelBoundsError`. Addresses loaded from memory (grouped GEMM's pointer tables) are
checked the same way, so they must point into tensor arguments too.
"""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I1, I64, PTR, splat_constant


def emit_check(e, op, addresses, mask, width: int, size: int, contiguous: bool) -> None:
    b = e.b
    site = len(e.check_sites)
    place = f" at {op.loc}" if op.loc else ""
    e.check_sites.append(f"`{op.name}`{place}")
    lanes = width
    if contiguous and width:
        steps = ir.Constant(ir.VectorType(I64, width),
                            [ir.Constant(I64, k * size) for k in range(width)])
        addresses = b.add(e.splat(addresses, width), steps)
    table_slot = b.gep(e.status, [ir.Constant(I64, 3)], source_etype=I64)
    table = b.inttoptr(b.load(table_slot, typ=I64), PTR)
    count = b.load(table, typ=I64)
    last_byte = b.add(addresses, splat_constant(I64, size, lanes))

    def per_tensor(t, carried):
        (inside,) = carried
        lo_at = b.gep(table, [b.add(b.mul(t, ir.Constant(I64, 2)), ir.Constant(I64, 1))],
                      source_etype=I64)
        hi_at = b.gep(table, [b.add(b.mul(t, ir.Constant(I64, 2)), ir.Constant(I64, 2))],
                      source_etype=I64)
        lo = e.splat(b.load(lo_at, typ=I64), lanes)
        hi = e.splat(b.load(hi_at, typ=I64), lanes)
        within = b.and_(b.icmp_unsigned(">=", addresses, lo),
                        b.icmp_unsigned("<=", last_byte, hi))
        return [b.or_(inside, within)]

    (inside,) = e.counted_loop(ir.Constant(I64, 0), count, ir.Constant(I64, 1),
                               [splat_constant(I1, 0, lanes)], per_tensor)
    outside = b.not_(inside)
    if mask is not None:
        outside = b.and_(outside, mask)
    if lanes:
        bits = b.bitcast(outside, ir.IntType(lanes))
        any_outside = b.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(lanes), 0))
        first = b.call(e.ew.declare(f"llvm.cttz.i{lanes}", ir.IntType(lanes),
                                    [ir.IntType(lanes), I1]), [bits, ir.Constant(I1, 0)])
        lane = b.zext(first, I64) if lanes < 64 else first
        bad_address = b.extract_element(addresses, b.trunc(lane, ir.IntType(32)))
    else:
        any_outside, bad_address = outside, addresses
    with b.if_then(any_outside, likely=False):
        status = e.status
        b.store(ir.Constant(I64, site), b.gep(status, [ir.Constant(I64, 1)], source_etype=I64))
        b.store(bad_address, b.gep(status, [ir.Constant(I64, 2)], source_etype=I64))
        b.store(ir.Constant(I64, 1), status)
        b.ret_void()


def device_assert(e, op) -> None:
    """tt.assert (tl.device_assert, emitted by Triton only with debug=True): the first
    false element stops the program; status gets 2, the site and the element."""
    condition = e.env[op.operands[0].id]
    site = len(e.check_sites)
    place = f" at {op.loc}" if op.loc else ""
    e.check_sites.append(f"device_assert{place}: {op.attr('message', '')}")
    b = e.b

    def check(index, scalar):
        with b.if_then(b.not_(scalar), likely=False):
            status = e.status
            b.store(ir.Constant(I64, site), b.gep(status, [ir.Constant(I64, 1)],
                                                  source_etype=I64))
            b.store(index, b.gep(status, [ir.Constant(I64, 2)], source_etype=I64))
            b.store(ir.Constant(I64, 2), status)
            b.ret_void()

    if not op.operands[0].type.shape:
        check(ir.Constant(I64, 0), condition)
        return
    e.loop(op.operands[0].type.numel,
           lambda index: check(index, e.load_element(condition, index)), unroll=False)


HANDLERS = {"tt.assert": device_assert}
