"""A native Python entry point per compiled function, generated in LLVM IR.

Calling through ctypes costs microseconds: every `array.ctypes.data` builds objects.
Instead, each kernel gets a METH_FASTCALL C function `entry(self, args, nargs)` that
reads the NumPy array structs itself (as numba's dispatcher does): it checks the type,
element type, rank, dims and flags of every argument, that no output overlaps another
buffer, releases the GIL around large kernels, runs the kernel and returns None. Any
mismatch, or a kernel error, returns NotImplemented instead, and the Python wrapper then
takes the slow path, which validates in Python and raises the precise error.

The process-specific addresses the entry compares against (the ndarray type object,
None, NotImplemented) and the CPython functions it calls (Py_IncRef, PyObject_Vectorcall,
PyEval_SaveThread, ...) live in a small global table the loader fills after loading, so
the same code works in the JIT and in a shared library, and the library has no undefined
CPython symbols: a C program links and runs it without libpython (tilegen.cabi). The
layout offsets are checked against live arrays before any fast entry is used
(`layout_is_supported`).
"""

from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np
from llvmlite import ir

from kina_frontend.types import DType

from . import loopir as L
from .symbols import RUNTIME_TABLE

I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()

# PyArrayObject / PyArray_Descr field offsets on 64-bit CPython (verified at run time).
OB_TYPE, ARRAY_DATA, ARRAY_ND, ARRAY_DIMS, ARRAY_DESCR, ARRAY_FLAGS = 8, 16, 24, 32, 56, 64
DESCR_BYTEORDER, DESCR_TYPE_NUM = 26, 28
C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x0001, 0x0100, 0x0400

# Slots of the runtime table: objects, then the CPython functions the entries call.
(TABLE_NDARRAY, TABLE_NONE, TABLE_NOT_IMPLEMENTED, TABLE_TUPLE, TABLE_OUT_NAME,
 TABLE_INCREF, TABLE_DECREF, TABLE_VECTORCALL, TABLE_SAVE_THREAD,
 TABLE_RESTORE_THREAD) = range(10)
TABLE_SLOTS = 10
# Each CPython function by slot: its name in ctypes.pythonapi and its LLVM type.
CPYTHON_FUNCTIONS = {
    TABLE_INCREF: ("Py_IncRef", ir.FunctionType(ir.VoidType(), [PTR])),
    TABLE_DECREF: ("Py_DecRef", ir.FunctionType(ir.VoidType(), [PTR])),
    TABLE_VECTORCALL: ("PyObject_Vectorcall", ir.FunctionType(PTR, [PTR, PTR, I64, PTR])),
    TABLE_SAVE_THREAD: ("PyEval_SaveThread", ir.FunctionType(PTR, [])),
    TABLE_RESTORE_THREAD: ("PyEval_RestoreThread", ir.FunctionType(ir.VoidType(), [PTR])),
}
# CPython object layout: ob_type, then a tuple's ob_size and its items.
OB_SIZE, TUPLE_ITEMS = 16, 24
# nargsf's flag bit that lets a callee borrow args[-1] (PY_VECTORCALL_ARGUMENTS_OFFSET).
ARGUMENTS_OFFSET_BIT = 1 << 63

# Kernels estimated above this many element operations release the GIL while they run.
RELEASE_GIL_WORK = 200_000
# Buffers compared at once by the entry's output-overlap check (one AVX-512 register).
OVERLAP_LANES = 8
# Up to this many arrays the entry checks each argument in straight-line code (the fastest
# per call); a wider function's entry loops over a table of them (`_arrays_check`), whose
# code is the same for any arity: MiniLM's 102 arrays made 4 500 straight-line
# instructions, a tenth of its compile, where a call takes milliseconds anyway.
STRAIGHT_LINE_ARRAYS = 16



def _accepted_type_nums(dtype: str) -> tuple[int, ...]:
    # ml_dtypes' bfloat16 is a user dtype: its number is assigned when ml_dtypes registers
    # it (once per process, before any entry is built, since the DType table imports it).
    target = DType(dtype).numpy
    return tuple(sorted({np.dtype(c).num for c in np.typecodes["All"]
                         if np.dtype(c) == target} | {target.num}))


def declare_runtime_table(module: ir.Module) -> ir.GlobalVariable:
    existing = module.globals.get(RUNTIME_TABLE)
    if existing is not None:
        return existing
    table = ir.GlobalVariable(module, ir.ArrayType(PTR, TABLE_SLOTS), RUNTIME_TABLE)
    table.initializer = ir.Constant(ir.ArrayType(PTR, TABLE_SLOTS), None)
    return table


def _table_slot(b: ir.IRBuilder, table: ir.GlobalVariable, slot: int) -> ir.Value:
    pointer = b.gep(table, [ir.Constant(I64, 0), ir.Constant(I64, slot)],
                    source_etype=table.value_type)
    return b.load(pointer, typ=PTR)


def _cpython(b: ir.IRBuilder, table: ir.GlobalVariable, slot: int, args: list) -> ir.Value:
    """Call the CPython function in table slot `slot` (never a direct, undefined symbol)."""
    _, fnty = CPYTHON_FUNCTIONS[slot]
    pointer = b.gep(table, [ir.Constant(I64, 0), ir.Constant(I64, slot)],
                    source_etype=table.value_type)
    return b.call(b.load(pointer, typ=fnty.as_pointer()), args)


def _field(b: ir.IRBuilder, obj: ir.Value, offset: int, ty) -> ir.Value:
    return b.load(b.gep(obj, [ir.Constant(I64, offset)], source_etype=I8), typ=ty)


def _require(b: ir.IRBuilder, fallback: ir.Block, condition: ir.Value, name: str) -> None:
    """Continue in a new block `name` when `condition` holds, else go to `fallback`."""
    passed = b.function.append_basic_block(name)
    b.cbranch(condition, passed, fallback)
    b.position_at_end(passed)


def build_entry(module: ir.Module, kernel: L.Kernel, kernel_fn: ir.Function,
                packed: ir.Function, symbol: str) -> ir.Function:
    """The METH_FASTCALL entry: every argument checked, outputs checked for overlap, the
    kernel run (through its `packed` trampoline, `i64 packed(ptr addresses)`, for wide
    functions), None returned; NotImplemented where a check fails or the kernel did."""
    table = declare_runtime_table(module)
    fnty = ir.FunctionType(PTR, [PTR, PTR, I64])
    entry = ir.Function(module, fnty, symbol)
    # Straight-line checks that LLVM's O3 pipeline and instruction selection spent a third
    # of a cold compile on (~35 ms for nine arguments). Unoptimised they cost ~10 ns more
    # per call (220 -> 232 ns with nine arrays), with the outputs-by-buffers overlap test
    # in an optimised function of its own (in the entry it cost ~50 ns with 20 arrays).
    entry.attributes.add("optnone")
    entry.attributes.add("noinline")
    _self, args, nargs = entry.args
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    fallback = entry.append_basic_block("fallback")

    def require(condition, name):
        _require(b, fallback, condition, name)

    names = list(kernel.inputs) + list(kernel.outputs)
    buffers = [kernel.buffer(name) for name in names]
    require(b.icmp_signed("==", nargs, ir.Constant(I64, len(names))), "arity")
    # One address per buffer (then the error record, for the packed trampoline), in whole
    # vectors for the overlap test, which ignores the lanes past the buffers.
    slots = max(len(names) + 1, -(-len(names) // OVERLAP_LANES) * OVERLAP_LANES)
    addresses = b.alloca(PTR, size=ir.Constant(I64, slots))
    addresses.align = 8
    addresses.type = PTR
    wide = len(names) > STRAIGHT_LINE_ARRAYS
    if wide:
        arrays = _arrays_check(module, symbol, buffers, len(kernel.inputs))
        require(b.call(arrays, [args, addresses]), "arrays")
    else:
        data_pointers = _straight_line_checks(b, table, args, buffers, len(kernel.inputs),
                                              require)
        for position, data in enumerate(data_pointers):
            b.store(data, b.gep(addresses, [ir.Constant(I64, position)], source_etype=PTR))
    checker = _disjointness_check(module, symbol, len(kernel.inputs),
                                  [buffer.nbytes for buffer in buffers])
    require(b.call(checker, [addresses]), "disjoint")
    error_record = b.alloca(I64, size=ir.Constant(I64, 3))
    error_record.type = PTR
    release = L.work(kernel.body) >= RELEASE_GIL_WORK
    if release:
        thread_state = _cpython(b, table, TABLE_SAVE_THREAD, [])
    if wide:
        b.store(error_record, b.gep(addresses, [ir.Constant(I64, len(names))],
                                    source_etype=PTR))
        status = b.call(packed, [addresses])
    else:
        status = b.call(kernel_fn, data_pointers + [error_record])
    if release:
        _cpython(b, table, TABLE_RESTORE_THREAD, [thread_state])
    require(b.icmp_signed("==", status, ir.Constant(I64, 0)), "succeeded")
    none = _table_slot(b, table, TABLE_NONE)
    _cpython(b, table, TABLE_INCREF, [none])
    b.ret(none)
    b.position_at_end(fallback)
    not_implemented = _table_slot(b, table, TABLE_NOT_IMPLEMENTED)
    _cpython(b, table, TABLE_INCREF, [not_implemented])
    b.ret(not_implemented)
    return entry


def _straight_line_checks(b: ir.IRBuilder, table: ir.GlobalVariable, args: ir.Value,
                          buffers: list[L.Buffer], inputs: int, require) -> list[ir.Value]:
    """Each argument's checks in the entry itself (the fastest per call, ~45 instructions
    an argument); returns the data pointers. Few blocks: the entry is compiled optnone,
    where every value live across a branch is spilled. Each argument branches on its type
    (the rest of the object may not exist), then on its rank (an array of another rank may
    have fewer dims to read), then once on dtype, byte order, flags and dims together."""
    ndarray = _table_slot(b, table, TABLE_NDARRAY)
    data_pointers = []
    for position, buffer in enumerate(buffers):
        obj = b.load(b.gep(args, [ir.Constant(I64, position)], source_etype=PTR), typ=PTR)
        require(b.icmp_unsigned("==", _field(b, obj, OB_TYPE, PTR), ndarray),
                f"type.{position}")
        require(b.icmp_signed("==", _field(b, obj, ARRAY_ND, I32),
                              ir.Constant(I32, len(buffer.shape))), f"rank.{position}")
        descr = _field(b, obj, ARRAY_DESCR, PTR)
        type_num = _field(b, descr, DESCR_TYPE_NUM, I32)
        ok = ir.Constant(ir.IntType(1), 0)
        for accepted in _accepted_type_nums(buffer.dtype):
            ok = b.or_(ok, b.icmp_signed("==", type_num, ir.Constant(I32, accepted)))
        big_endian = b.icmp_unsigned("==", _field(b, descr, DESCR_BYTEORDER, I8),
                                     ir.Constant(I8, ord(">")))
        ok = b.and_(ok, b.not_(big_endian))
        flags = _field(b, obj, ARRAY_FLAGS, I32)
        needed = C_CONTIGUOUS | ALIGNED | (WRITEABLE if position >= inputs else 0)
        ok = b.and_(ok, b.icmp_unsigned("==", b.and_(flags, ir.Constant(I32, needed)),
                                        ir.Constant(I32, needed)))
        if buffer.shape:
            dims = _field(b, obj, ARRAY_DIMS, PTR)
            for axis, extent in enumerate(buffer.shape):
                dim = b.load(b.gep(dims, [ir.Constant(I64, axis)], source_etype=I64), typ=I64)
                ok = b.and_(ok, b.icmp_signed("==", dim, ir.Constant(I64, extent)))
        require(ok, f"array.{position}")
        data_pointers.append(_field(b, obj, ARRAY_DATA, PTR))
    return data_pointers


# The per-argument table `_arrays_check` reads: rank, the flags needed, where the shape
# starts in the shapes table, and the accepted type numbers (repeated to fill the slots).
(ARG_RANK, ARG_FLAGS, ARG_SHAPE_AT, ARG_TYPES) = range(4)
TYPE_SLOTS = 4
ARG_FIELDS = ARG_TYPES + TYPE_SLOTS


def _argument_table(buffers: list[L.Buffer], inputs: int) -> tuple[list[int], list[int]]:
    """(argument rows, shapes) for `_arrays_check`."""
    rows, shapes = [], []
    for position, buffer in enumerate(buffers):
        accepted = _accepted_type_nums(buffer.dtype)
        if len(accepted) > TYPE_SLOTS:
            raise ValueError(f"{buffer.dtype} has {len(accepted)} NumPy type numbers")
        needed = C_CONTIGUOUS | ALIGNED | (WRITEABLE if position >= inputs else 0)
        types = list(accepted) + [accepted[0]] * (TYPE_SLOTS - len(accepted))
        rows += [len(buffer.shape), needed, len(shapes), *types]
        shapes += list(buffer.shape)
    return rows, shapes


def _constant_table(module: ir.Module, name: str, values: list[int]) -> ir.GlobalVariable:
    array = ir.ArrayType(I64, max(1, len(values)))
    table = ir.GlobalVariable(module, array, name)
    table.linkage = "private"
    table.global_constant = True
    table.initializer = ir.Constant(array, values or [0])
    return table


def _arrays_check(module: ir.Module, symbol: str, buffers: list[L.Buffer],
                  inputs: int) -> ir.Function:
    """`i1 <symbol>.arrays(ptr args, ptr addresses)`: whether every argument is an ndarray
    of its buffer's rank, dims and element type (native byte order), C-contiguous and
    aligned (and writeable for an output), storing each one's data pointer in
    `addresses`. A loop over a constant table of the arguments: the same code for any
    arity. Each argument's type is checked before anything else is read from it (another
    object may be shorter), and its rank before its dims (an array of lower rank has fewer
    to read)."""
    rows, shapes = _argument_table(buffers, inputs)
    argument_table = _constant_table(module, symbol + ".arguments", rows)
    shape_table = _constant_table(module, symbol + ".shapes", shapes)
    runtime = declare_runtime_table(module)
    function = ir.Function(module, ir.FunctionType(ir.IntType(1), [PTR, PTR]),
                           symbol + ".arrays")
    function.linkage = "internal"
    function.attributes.add("nounwind")
    args, addresses = function.args
    blocks = {name: function.append_basic_block(name) for name in (
        "entry", "next", "argument", "array", "descr", "dims", "dim", "passed", "failed",
        "done")}
    b = ir.IRBuilder(blocks["entry"])
    ndarray = _table_slot(b, runtime, TABLE_NDARRAY)
    b.branch(blocks["next"])

    def row(position, field, ty=I64):
        index = b.add(b.mul(position, ir.Constant(I64, ARG_FIELDS)), ir.Constant(I64, field))
        value = b.load(b.gep(argument_table, [ir.Constant(I64, 0), index],
                             source_etype=argument_table.value_type), typ=I64)
        return value if ty is I64 else b.trunc(value, ty)

    b.position_at_end(blocks["next"])  # for position in 0..len(buffers)
    position = b.phi(I64, "position")
    position.add_incoming(ir.Constant(I64, 0), blocks["entry"])
    b.cbranch(b.icmp_unsigned("<", position, ir.Constant(I64, len(buffers))),
              blocks["argument"], blocks["done"])

    b.position_at_end(blocks["argument"])
    obj = b.load(b.gep(args, [position], source_etype=PTR), typ=PTR)
    b.cbranch(b.icmp_unsigned("==", _field(b, obj, OB_TYPE, PTR), ndarray), blocks["array"],
              blocks["failed"])

    b.position_at_end(blocks["array"])
    rank = row(position, ARG_RANK)
    b.cbranch(b.icmp_signed("==", _field(b, obj, ARRAY_ND, I32), b.trunc(rank, I32)),
              blocks["descr"], blocks["failed"])

    b.position_at_end(blocks["descr"])
    descr = _field(b, obj, ARRAY_DESCR, PTR)
    type_num = _field(b, descr, DESCR_TYPE_NUM, I32)
    ok = ir.Constant(ir.IntType(1), 0)
    for slot in range(TYPE_SLOTS):
        ok = b.or_(ok, b.icmp_signed("==", type_num, row(position, ARG_TYPES + slot, I32)))
    ok = b.and_(ok, b.icmp_unsigned("!=", _field(b, descr, DESCR_BYTEORDER, I8),
                                    ir.Constant(I8, ord(">"))))
    needed = row(position, ARG_FLAGS, I32)
    ok = b.and_(ok, b.icmp_unsigned("==", b.and_(_field(b, obj, ARRAY_FLAGS, I32), needed),
                                    needed))
    dims = _field(b, obj, ARRAY_DIMS, PTR)
    shape_at = row(position, ARG_SHAPE_AT)
    b.cbranch(ok, blocks["dims"], blocks["failed"])

    b.position_at_end(blocks["dims"])  # for axis in 0..rank
    axis = b.phi(I64, "axis")
    axis.add_incoming(ir.Constant(I64, 0), blocks["descr"])
    b.cbranch(b.icmp_signed("<", axis, rank), blocks["dim"], blocks["passed"])

    b.position_at_end(blocks["dim"])
    dim = b.load(b.gep(dims, [axis], source_etype=I64), typ=I64)
    extent = b.load(b.gep(shape_table, [ir.Constant(I64, 0), b.add(shape_at, axis)],
                          source_etype=shape_table.value_type), typ=I64)
    axis.add_incoming(b.add(axis, ir.Constant(I64, 1)), blocks["dim"])
    b.cbranch(b.icmp_signed("==", dim, extent), blocks["dims"], blocks["failed"])

    b.position_at_end(blocks["passed"])
    b.store(_field(b, obj, ARRAY_DATA, PTR), b.gep(addresses, [position], source_etype=PTR))
    position.add_incoming(b.add(position, ir.Constant(I64, 1)), blocks["passed"])
    b.branch(blocks["next"])

    _answer(b, blocks["failed"], blocks["done"])
    return function


def build_keyword_entry(module: ir.Module, kernel: L.Kernel, entry: ir.Function,
                        symbol: str) -> ir.Function:
    """The function users call: a METH_FASTCALL | METH_KEYWORDS builtin whose `self` is
    the Python wrapper. `f(*inputs, out=arrays)` goes straight to `entry` (one output:
    the vectorcall array already holds inputs then `out`; several: the items of an
    `out` tuple); anything else (no out=, a list, other keywords, a check that fails)
    is handed to the wrapper with the same arguments, which allocates outputs or raises
    the precise error. Saves the wrapper's Python frame on the host loop's hot path."""
    table = declare_runtime_table(module)
    fnty = ir.FunctionType(PTR, [PTR, PTR, I64, PTR])
    front = ir.Function(module, fnty, symbol)
    # Like the entry: a few straight-line checks that are not worth LLVM's O3 time.
    front.attributes.add("optnone")
    front.attributes.add("noinline")
    wrapper, args, nargsf, kwnames = front.args
    b = ir.IRBuilder(front.append_basic_block("entry"))
    fallback = front.append_basic_block("fallback")

    def require(condition, name):
        _require(b, fallback, condition, name)

    inputs, outputs = len(kernel.inputs), len(kernel.outputs)
    nargs = b.and_(nargsf, ir.Constant(I64, ARGUMENTS_OFFSET_BIT - 1))
    require(b.and_(b.icmp_signed("==", nargs, ir.Constant(I64, inputs)),
                   b.icmp_unsigned("!=", kwnames, ir.Constant(PTR, None))), "positional")
    only_out = b.and_(
        b.icmp_signed("==", _field(b, kwnames, OB_SIZE, I64), ir.Constant(I64, 1)),
        b.icmp_unsigned("==", _field(b, kwnames, TUPLE_ITEMS, PTR),
                        _table_slot(b, table, TABLE_OUT_NAME)))
    require(only_out, "keyword")
    out = b.load(b.gep(args, [ir.Constant(I64, inputs)], source_etype=PTR), typ=PTR)
    if outputs == 1:
        arrays = args
    else:
        require(b.and_(b.icmp_unsigned("==", _field(b, out, OB_TYPE, PTR),
                                       _table_slot(b, table, TABLE_TUPLE)),
                       b.icmp_signed("==", _field(b, out, OB_SIZE, I64),
                                     ir.Constant(I64, outputs))), "tuple")
        arrays = b.alloca(PTR, size=ir.Constant(I64, inputs + outputs))
        arrays.type = PTR
        for position in range(inputs + outputs):
            source = (b.gep(args, [ir.Constant(I64, position)], source_etype=PTR)
                      if position < inputs else
                      b.gep(out, [ir.Constant(I64, TUPLE_ITEMS + 8 * (position - inputs))],
                            source_etype=I8))
            b.store(b.load(source, typ=PTR),
                    b.gep(arrays, [ir.Constant(I64, position)], source_etype=PTR))
    result = b.call(entry, [ir.Constant(PTR, None), arrays,
                            ir.Constant(I64, inputs + outputs)])
    _cpython(b, table, TABLE_DECREF, [result])  # None, or NotImplemented when it declined
    require(b.icmp_unsigned("==", result, _table_slot(b, table, TABLE_NONE)), "ran")
    _cpython(b, table, TABLE_INCREF, [out])
    b.ret(out)
    b.position_at_end(fallback)
    b.ret(_cpython(b, table, TABLE_VECTORCALL, [wrapper, args, nargsf, kwnames]))
    return front


def _disjointness_check(module: ir.Module, symbol: str, inputs: int,
                        extents: list[int]) -> ir.Function:
    """`i1 <symbol>.disjoint(ptr starts)`: whether each output's bytes [start, start +
    extent) overlap no other buffer's. `starts` holds one address per buffer, in room for
    a whole number of OVERLAP_LANES vectors: the lanes past the buffers (padding, or the
    entry's error record) are ignored. Outside the optnone entry, so that LLVM optimises
    it.

    A loop over the outputs around a loop over the buffers, OVERLAP_LANES at a time in
    vector registers: the code is the same few blocks for any arity (a straight-line
    outputs x buffers comparison chain took O3 seconds at 16 inputs and 16 outputs), and a
    call compares outputs x buffers / OVERLAP_LANES vectors (one output and nine buffers:
    two vector steps)."""
    function = ir.Function(module, ir.FunctionType(ir.IntType(1), [PTR]), symbol + ".disjoint")
    function.linkage = "internal"
    function.attributes.add("nounwind")
    (starts,) = function.args
    count = len(extents)
    chunks = -(-count // OVERLAP_LANES)
    lanes = ir.VectorType(I64, OVERLAP_LANES)
    mask_type = ir.IntType(OVERLAP_LANES)
    padded = extents + [0] * (chunks * OVERLAP_LANES - count)
    extent_table = ir.GlobalVariable(module, ir.ArrayType(I64, len(padded)), symbol + ".extents")
    extent_table.linkage = "private"
    extent_table.global_constant = True
    extent_table.initializer = ir.Constant(ir.ArrayType(I64, len(padded)), padded)
    lane_numbers = ir.Constant(lanes, list(range(OVERLAP_LANES)))
    buffer_count = ir.Constant(lanes, [count] * OVERLAP_LANES)

    blocks = {name: function.append_basic_block(name) for name in (
        "entry", "outputs", "output", "buffers", "chunk", "next_output", "overlap", "disjoint")}
    b = ir.IRBuilder(blocks["entry"])
    b.branch(blocks["outputs"])

    def splat(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
        one = b.insert_element(ir.Constant(lanes, ir.Undefined), value, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(lanes, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, OVERLAP_LANES), None))

    b.position_at_end(blocks["outputs"])  # for out in inputs..count
    out = b.phi(I64, "out")
    out.add_incoming(ir.Constant(I64, inputs), blocks["entry"])
    b.cbranch(b.icmp_unsigned("<", out, ir.Constant(I64, count)), blocks["output"],
              blocks["disjoint"])

    b.position_at_end(blocks["output"])
    start = b.load(b.gep(starts, [out], source_etype=I64), typ=I64)
    extent = b.load(b.gep(extent_table, [ir.Constant(I64, 0), out],
                          source_etype=extent_table.value_type), typ=I64)
    out_start, out_end, out_index = splat(b, start), splat(b, b.add(start, extent)), splat(b, out)
    b.branch(blocks["buffers"])

    b.position_at_end(blocks["buffers"])  # for chunk in 0..chunks
    chunk = b.phi(I64, "chunk")
    chunk.add_incoming(ir.Constant(I64, 0), blocks["output"])
    b.cbranch(b.icmp_unsigned("<", chunk, ir.Constant(I64, chunks)), blocks["chunk"],
              blocks["next_output"])

    b.position_at_end(blocks["chunk"])
    first = b.mul(chunk, ir.Constant(I64, OVERLAP_LANES))
    other_start = b.load(b.gep(starts, [first], source_etype=I64), typ=lanes, align=8)
    other_extent = b.load(b.gep(extent_table, [ir.Constant(I64, 0), first],
                                source_etype=extent_table.value_type), typ=lanes, align=8)
    other_end = b.add(other_start, other_extent)
    index = b.add(splat(b, first), lane_numbers)
    apart = b.or_(b.or_(b.icmp_unsigned("<=", out_end, other_start),
                        b.icmp_unsigned("<=", other_end, out_start)),
                  b.or_(b.icmp_unsigned("==", index, out_index),  # not its own overlap
                        b.icmp_unsigned(">=", index, buffer_count)))  # past the buffers
    all_apart = b.icmp_unsigned("==", b.bitcast(apart, mask_type),
                                ir.Constant(mask_type, (1 << OVERLAP_LANES) - 1))
    chunk.add_incoming(b.add(chunk, ir.Constant(I64, 1)), blocks["chunk"])
    b.cbranch(all_apart, blocks["buffers"], blocks["overlap"])

    b.position_at_end(blocks["next_output"])
    out.add_incoming(b.add(out, ir.Constant(I64, 1)), blocks["next_output"])
    b.branch(blocks["outputs"])

    _answer(b, blocks["overlap"], blocks["disjoint"])
    return function


def _answer(b: ir.IRBuilder, no: ir.Block, yes: ir.Block) -> None:
    """A check's two exits: false from `no`, true from `yes`."""
    b.position_at_end(no)
    b.ret(ir.Constant(ir.IntType(1), 0))
    b.position_at_end(yes)
    b.ret(ir.Constant(ir.IntType(1), 1))


def fill_runtime_table(address: int) -> None:
    table = (ctypes.c_void_p * TABLE_SLOTS).from_address(address)
    table[TABLE_NDARRAY] = id(np.ndarray)
    table[TABLE_NONE] = id(None)
    table[TABLE_NOT_IMPLEMENTED] = id(NotImplemented)
    table[TABLE_TUPLE] = id(tuple)
    # Keyword names in call sites are interned, so `out=` arrives as this very object (a
    # different but equal string only takes the slower wrapper path).
    table[TABLE_OUT_NAME] = id(_OUT_NAME)
    for slot, (name, _) in CPYTHON_FUNCTIONS.items():
        table[slot] = ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


@functools.cache
def layout_is_supported() -> bool:
    """The struct offsets above match this interpreter's NumPy (else: no fast entries)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    try:
        probe = np.empty((3, 5), np.float32)
        base = id(probe)

        def read(offset, ctype):
            return ctype.from_address(base + offset).value

        descr = id(probe.dtype)
        return (read(OB_TYPE, ctypes.c_void_p) == id(np.ndarray)
                and read(ARRAY_DATA, ctypes.c_void_p) == probe.ctypes.data
                and read(ARRAY_ND, ctypes.c_int) == 2
                and ctypes.c_int64.from_address(read(ARRAY_DIMS, ctypes.c_void_p) + 8).value == 5
                and read(ARRAY_DESCR, ctypes.c_void_p) == descr
                and read(ARRAY_FLAGS, ctypes.c_int) & (C_CONTIGUOUS | ALIGNED | WRITEABLE)
                == C_CONTIGUOUS | ALIGNED | WRITEABLE
                and ctypes.c_int.from_address(descr + DESCR_TYPE_NUM).value
                == np.dtype(np.float32).num)
    except (ValueError, OSError):
        return False


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


METH_FASTCALL, METH_KEYWORDS = 0x0080, 0x0002
_OUT_NAME = sys.intern("out")

_new_cfunction = ctypes.pythonapi.PyCFunction_NewEx
_new_cfunction.restype = ctypes.py_object
_new_cfunction.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]


# CPython reads a builtin's PyMethodDef while deallocating it (meth_dealloc checks its
# flags), and a builtin, its Python wrapper and the module that owns the native code form a
# reference cycle that the garbage collector tears down in no particular order, at the
# latest when the interpreter exits and clears every module: a def owned by anything that
# can be cleared may go first (a segfault at exit, seen with two compiled functions). So
# each def gets one reference that is never released, as extension modules keep theirs
# in static memory: about 100 bytes plus the docstring per compiled function.
_keep_forever = ctypes.pythonapi.Py_IncRef
_keep_forever.argtypes = [ctypes.py_object]
_keep_forever.restype = None


def make_builtin(name: str, address: int, self_object=None, keywords: bool = False,
                 doc: str | None = None):
    """A Python builtin function object calling the native fast entry at `address` (with
    `self_object` as its first argument); its def lives as long as the process."""
    flags = METH_FASTCALL | (METH_KEYWORDS if keywords else 0)
    definition = _MethodDef(name.encode(), address, flags,
                            doc.encode() if doc is not None else None)
    _keep_forever(definition)
    return _new_cfunction(ctypes.addressof(definition), self_object, None)
