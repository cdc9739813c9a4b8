"""Debugging ops. TRITON_DEBUG=1 bounds checks: every lane a load, store or atomic touches
must lie inside one of the kernel's tensor arguments; also `tl.device_assert` and
`tl.device_print`.

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


def device_print(e, op) -> None:
    """tt.print (tl.device_print): one line per element through the C library's printf,
    `pid (x, y, z) idx (i, j) <prefix><value> ...`, flushed at once (the order of lines
    from different programs follows the threads)."""
    b = e.b
    printf = e.module.globals.get("printf") or ir.Function(
        e.module, ir.FunctionType(ir.IntType(32), [PTR], var_arg=True), "printf")
    flush = e.ew.declare("fflush", ir.IntType(32), [PTR])
    prefix = op.attr("message", "")
    hexadecimal = op.attr("hex", False)
    shape = next((v.type.shape for v in op.operands if v.type.shape), ())
    index_text = ", ".join(["%lld"] * len(shape))
    fields, conversions = [], []
    for value in op.operands:
        elem = value.type.elem
        is_float = elem in ("f16", "bf16", "f32", "f64")
        fields.append("%g" if is_float else ("0x%llx" if hexadecimal else "%lld"))
        conversions.append((value, elem, is_float))
    text = f"pid (%d, %d, %d) idx ({index_text}){prefix}{' '.join(fields)}\n"
    if not shape:
        text = f"pid (%d, %d, %d){prefix}{' '.join(fields)}\n"
    format_string = _string_constant(e, text)

    def line(index):
        args = [format_string, *e.program_ids]
        remaining = index
        coordinates = []
        for dim in reversed(shape):
            coordinates.append(b.urem(remaining, ir.Constant(I64, dim)))
            remaining = b.udiv(remaining, ir.Constant(I64, dim))
        args += coordinates[::-1]
        for value, elem, is_float in conversions:
            scalar = e.load_element(e.env[value.id], index) if value.type.shape else \
                e.env[value.id]
            if is_float:
                if elem == "bf16":
                    from .elementwise import bf16_to_f32
                    scalar = bf16_to_f32(b, scalar, 0)
                scalar = b.fpext(scalar, ir.DoubleType()) if elem != "f64" else scalar
            elif scalar.type != I64:
                scalar = b.sext(scalar, I64) if scalar.type.width > 1 else b.zext(scalar, I64)
            args.append(scalar)
        b.call(printf, args)

    if shape:
        count = 1
        for dim in shape:
            count *= dim
        e.loop(count, line, unroll=False)
    else:
        line(ir.Constant(I64, 0))
    b.call(flush, [ir.Constant(PTR, None)])


def _string_constant(e, text: str) -> ir.Value:
    data = bytearray(text.encode()) + b"\0"
    name = f"{e.program.name}.fmt{len(e.module.globals)}"
    variable = ir.GlobalVariable(e.module, ir.ArrayType(ir.IntType(8), len(data)), name)
    variable.global_constant = True
    variable.linkage = "internal"
    variable.initializer = ir.Constant(ir.ArrayType(ir.IntType(8), len(data)), data)
    return variable


HANDLERS = {"tt.assert": device_assert, "tt.print": device_print}
