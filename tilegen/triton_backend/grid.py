"""The grid launcher in LLVM IR: every program id of a 1-, 2- or 3-D grid, run by the CPU
threads of libgomp (`GOMP_parallel`, as tilegen's parallel loops), each thread with its own
scratch frame.

The linear program ids (x fastest) are cut into runs of consecutive ids, dealt to the
threads in turn (block-cyclic, as OpenMP's `schedule(static, chunk)`): thread t runs runs
t, t + T, t + 2T, ... The run length is the launch's `run` argument; 0 gives one contiguous
run per thread, which keeps what consecutive programs share (a program's prefetch of the
next row, matmul's packed panels of B reused by the programs of a GROUP_SIZE_M group) on one
thread. The driver passes a shorter run only for kernels whose atomics repeat with the
program id modulo a constant (program_order.py)."""

from __future__ import annotations

from llvmlite import ir

from .elementwise import I32, I64, PTR

LAUNCH_FIELDS = 8  # nx, ny, nz, scratch, frame_bytes, threads, status, run; then the args


def emit_launcher(module: ir.Module, program: ir.Function, name: str,
                  resets: tuple[int, ...] = ()) -> ir.Function:
    """`void @<name>.launch(ptr params)`: params is i64[LAUNCH_FIELDS] followed by the
    kernel's argument slots (one pointer, so that the driver's ctypes call converts one
    argument: a call of nine cost about 1.3 us of Python, a call of one 0.2 us)."""
    launch = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), f"{name}.launch")
    worker = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), f"{name}.worker")
    worker.linkage = "internal"
    _emit_worker(module, worker, program, resets)
    b = ir.IRBuilder(launch.append_basic_block("entry"))
    params = launch.args[0]
    nx, ny, nz, scratch, frame, threads, status, run = (
        b.load(b.gep(params, [ir.Constant(I64, field)], source_etype=I64), typ=I64)
        for field in range(LAUNCH_FIELDS))
    kernel_args = b.ptrtoint(b.gep(params, [ir.Constant(I64, LAUNCH_FIELDS)],
                                   source_etype=I64), I64)
    threads = b.trunc(threads, I32)
    context = b.alloca(I64, size=8)
    for slot, value in enumerate((kernel_args, nx, ny, nz, scratch, frame, status, run)):
        pointer = b.gep(context, [ir.Constant(I64, slot)])
        b.store(value, pointer)
    serial = b.icmp_signed("<=", threads, ir.Constant(I32, 1))
    with b.if_else(serial) as (then, otherwise):
        with then:
            b.call(worker, [context])
        with otherwise:
            gomp = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]),
                               "GOMP_parallel")
            b.call(gomp, [worker, context, threads, ir.Constant(I32, 0)])
    b.ret_void()
    return launch


def _emit_worker(module: ir.Module, worker: ir.Function, program: ir.Function,
                 resets: tuple[int, ...] = ()) -> None:
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    context = worker.args[0]

    def field(slot):
        pointer = b.gep(context, [ir.Constant(I64, slot)], source_etype=I64)
        return b.load(pointer, typ=I64)

    kernel_args, nx, ny, nz, scratch, frame, status, run = (field(s) for s in range(8))
    thread_num = ir.Function(module, ir.FunctionType(I32, []), "omp_get_thread_num")
    num_threads = ir.Function(module, ir.FunctionType(I32, []), "omp_get_num_threads")
    tid = b.sext(b.call(thread_num, []), I64)
    count = b.sext(b.call(num_threads, []), I64)
    one, zero = ir.Constant(I64, 1), ir.Constant(I64, 0)
    total = b.mul(b.mul(nx, ny), nz)
    halves = b.sdiv(b.add(total, b.sub(count, one)), count)
    run = b.select(b.icmp_signed(">", run, zero), run, halves)
    step = b.mul(run, count)
    own_frame = b.inttoptr(b.add(scratch, b.mul(tid, frame)), PTR)
    args_pointer, status_pointer = b.inttoptr(kernel_args, PTR), b.inttoptr(status, PTR)
    for offset in resets:  # frame state kept across the thread's programs, not launches
        b.store(ir.Constant(I64, 0), b.gep(own_frame, [ir.Constant(I64, offset)],
                                           source_etype=ir.IntType(8)))
    own_first = b.mul(tid, run)
    pre = b.block
    runs = worker.append_basic_block("runs")
    run_start = worker.append_basic_block("run")
    header = worker.append_basic_block("programs")
    body = worker.append_basic_block("program")
    run_end = worker.append_basic_block("run_end")
    done = worker.append_basic_block("done")
    b.branch(runs)
    b.position_at_end(runs)
    first = b.phi(I64)
    first.add_incoming(own_first, pre)
    b.cbranch(b.icmp_signed("<", first, total), run_start, done)
    b.position_at_end(run_start)
    last = b.select(b.icmp_signed("<", b.add(first, run), total), b.add(first, run), total)
    # (x, y, z) of the program id, divided out once per run and then stepped (three 64-bit
    # divisions per program cost a vector add's program about a tenth of its time)
    start = (b.srem(first, nx), b.srem(b.sdiv(first, nx), ny), b.sdiv(first, b.mul(nx, ny)))
    b.branch(header)
    b.position_at_end(header)
    index = b.phi(I64)
    index.add_incoming(first, run_start)
    x, y, z = (b.phi(I64) for _ in range(3))
    for phi, value in zip((x, y, z), start, strict=True):
        phi.add_incoming(value, run_start)
    failed = b.load(status_pointer, typ=I64)  # a failed bounds check stops the grid
    unfailed = worker.append_basic_block("unfailed")
    b.cbranch(b.icmp_signed("==", failed, zero), unfailed, done)
    b.position_at_end(unfailed)
    b.cbranch(b.icmp_signed("<", index, last), body, run_end)
    b.position_at_end(body)
    ids = [b.trunc(v, I32) for v in (x, y, z, nx, ny, nz)]
    b.call(program, [args_pointer, *ids, own_frame, status_pointer])
    next_x = b.add(x, one)
    x_wraps = b.icmp_signed("==", next_x, nx)
    next_y = b.select(x_wraps, b.add(y, one), y)
    y_wraps = b.icmp_signed("==", next_y, ny)
    for phi, value in ((index, b.add(index, one)), (x, b.select(x_wraps, zero, next_x)),
                       (y, b.select(y_wraps, zero, next_y)),
                       (z, b.select(y_wraps, b.add(z, one), z))):
        phi.add_incoming(value, b.block)
    b.branch(header)
    b.position_at_end(run_end)
    first.add_incoming(b.add(first, step), run_end)
    b.branch(runs)
    b.position_at_end(done)
    b.ret_void()

