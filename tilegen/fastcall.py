"""A native Python entry point per compiled function, generated in LLVM IR.

Calling through ctypes costs microseconds: every `array.ctypes.data` builds objects.
Instead, each kernel gets a METH_FASTCALL C function `entry(self, args, nargs)` that
reads the NumPy array structs itself (as numba's dispatcher does): it checks the type,
element type, rank, dims and flags of every argument, that no output overlaps another
buffer, releases the GIL around large kernels, runs the kernel and returns None. Any
mismatch, or a kernel error, returns NotImplemented instead, and the Python wrapper then
takes the slow path, which validates in Python and raises the precise error.

The process-specific addresses the entry compares against (the ndarray type object,
None, NotImplemented) live in a small global table the loader fills after loading, so
the same code works in the JIT and in a shared library. The layout offsets are checked
against live arrays before any fast entry is used (`layout_is_supported`).
"""

from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np
from llvmlite import ir

from kina_frontend.types import DType

from . import loopir as L

I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()

# PyArrayObject / PyArray_Descr field offsets on 64-bit CPython (verified at run time).
OB_TYPE, ARRAY_DATA, ARRAY_ND, ARRAY_DIMS, ARRAY_DESCR, ARRAY_FLAGS = 8, 16, 24, 32, 56, 64
DESCR_BYTEORDER, DESCR_TYPE_NUM = 26, 28
C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x0001, 0x0100, 0x0400

# Slots of the runtime table.
TABLE_NDARRAY, TABLE_NONE, TABLE_NOT_IMPLEMENTED, TABLE_TUPLE, TABLE_OUT_NAME = range(5)
TABLE_SLOTS = 5
TABLE_SYMBOL = "kina_runtime_table"
# CPython object layout: ob_type, then a tuple's ob_size and its items.
OB_SIZE, TUPLE_ITEMS = 16, 24
# nargsf's flag bit that lets a callee borrow args[-1] (PY_VECTORCALL_ARGUMENTS_OFFSET).
ARGUMENTS_OFFSET_BIT = 1 << 63

# Kernels estimated above this many element operations release the GIL while they run.
RELEASE_GIL_WORK = 200_000



def _accepted_type_nums(dtype: str) -> tuple[int, ...]:
    # ml_dtypes' bfloat16 is a user dtype: its number is assigned when ml_dtypes registers
    # it (once per process, before any entry is built, since the DType table imports it).
    target = DType(dtype).numpy
    return tuple(sorted({np.dtype(c).num for c in np.typecodes["All"]
                         if np.dtype(c) == target} | {target.num}))


def declare_runtime_table(module: ir.Module) -> ir.GlobalVariable:
    existing = module.globals.get(TABLE_SYMBOL)
    if existing is not None:
        return existing
    table = ir.GlobalVariable(module, ir.ArrayType(PTR, TABLE_SLOTS), TABLE_SYMBOL)
    table.initializer = ir.Constant(ir.ArrayType(PTR, TABLE_SLOTS), None)
    return table


def _table_slot(b: ir.IRBuilder, table: ir.GlobalVariable, slot: int) -> ir.Value:
    pointer = b.gep(table, [ir.Constant(I64, 0), ir.Constant(I64, slot)],
                    source_etype=table.value_type)
    return b.load(pointer, typ=PTR)


def _field(b: ir.IRBuilder, obj: ir.Value, offset: int, ty) -> ir.Value:
    return b.load(b.gep(obj, [ir.Constant(I64, offset)], source_etype=I8), typ=ty)


def _require(b: ir.IRBuilder, fallback: ir.Block, condition: ir.Value, name: str) -> None:
    """Continue in a new block `name` when `condition` holds, else go to `fallback`."""
    passed = b.function.append_basic_block(name)
    b.cbranch(condition, passed, fallback)
    b.position_at_end(passed)


def build_entry(module: ir.Module, kernel: L.Kernel, kernel_fn: ir.Function,
                symbol: str) -> ir.Function:
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

    def table_slot(slot):
        return _table_slot(b, table, slot)

    def field(obj, offset, ty):
        return _field(b, obj, offset, ty)

    def require(condition, name):
        _require(b, fallback, condition, name)

    names = list(kernel.inputs) + list(kernel.outputs)
    require(b.icmp_signed("==", nargs, ir.Constant(I64, len(names))), "arity")
    ndarray = table_slot(TABLE_NDARRAY)
    data_pointers, extents = [], []
    # Few blocks: the entry is compiled optnone, where every value live across a branch is
    # spilled. Each argument branches on its type (the rest of the object may not exist),
    # then on its rank (an array of another rank may have fewer dims to read), then once on
    # dtype, byte order, flags and dims together.
    for position, name in enumerate(names):
        buffer = kernel.buffer(name)
        is_output = position >= len(kernel.inputs)
        obj = b.load(b.gep(args, [ir.Constant(I64, position)], source_etype=PTR), typ=PTR)
        require(b.icmp_unsigned("==", field(obj, OB_TYPE, PTR), ndarray), f"type.{position}")
        require(b.icmp_signed("==", field(obj, ARRAY_ND, I32),
                              ir.Constant(I32, len(buffer.shape))), f"rank.{position}")
        descr = field(obj, ARRAY_DESCR, PTR)
        type_num = field(descr, DESCR_TYPE_NUM, I32)
        ok = ir.Constant(ir.IntType(1), 0)
        for accepted in _accepted_type_nums(buffer.dtype):
            ok = b.or_(ok, b.icmp_signed("==", type_num, ir.Constant(I32, accepted)))
        big_endian = b.icmp_unsigned("==", field(descr, DESCR_BYTEORDER, I8),
                                     ir.Constant(I8, ord(">")))
        ok = b.and_(ok, b.not_(big_endian))
        flags = field(obj, ARRAY_FLAGS, I32)
        needed = C_CONTIGUOUS | ALIGNED | (WRITEABLE if is_output else 0)
        ok = b.and_(ok, b.icmp_unsigned("==", b.and_(flags, ir.Constant(I32, needed)),
                                        ir.Constant(I32, needed)))
        if buffer.shape:
            dims = field(obj, ARRAY_DIMS, PTR)
            for axis, extent in enumerate(buffer.shape):
                dim = b.load(b.gep(dims, [ir.Constant(I64, axis)], source_etype=I64), typ=I64)
                ok = b.and_(ok, b.icmp_signed("==", dim, ir.Constant(I64, extent)))
        require(ok, f"array.{position}")
        data = field(obj, ARRAY_DATA, PTR)
        data_pointers.append(data)
        extents.append(buffer.nbytes)
    # Outputs must not overlap any other buffer (they are declared noalias to LLVM).
    starts = b.alloca(I64, size=ir.Constant(I64, len(names)))
    starts.type = PTR
    for position, pointer in enumerate(data_pointers):
        b.store(b.ptrtoint(pointer, I64), b.gep(starts, [ir.Constant(I64, position)],
                                                source_etype=I64))
    checker = _disjointness_check(module, symbol, len(kernel.inputs), extents)
    require(b.call(checker, [starts]), "disjoint")
    error_record = b.alloca(I64, size=ir.Constant(I64, 3))
    error_record.type = PTR
    release = L.work(kernel.body) >= RELEASE_GIL_WORK
    if release:
        save = _declare(module, "PyEval_SaveThread", ir.FunctionType(PTR, []))
        restore = _declare(module, "PyEval_RestoreThread", ir.FunctionType(ir.VoidType(), [PTR]))
        thread_state = b.call(save, [])
    status = b.call(kernel_fn, data_pointers + [error_record])
    if release:
        b.call(restore, [thread_state])
    require(b.icmp_signed("==", status, ir.Constant(I64, 0)), "succeeded")
    incref = _declare(module, "Py_IncRef", ir.FunctionType(ir.VoidType(), [PTR]))
    none = table_slot(TABLE_NONE)
    b.call(incref, [none])
    b.ret(none)
    b.position_at_end(fallback)
    not_implemented = table_slot(TABLE_NOT_IMPLEMENTED)
    b.call(incref, [not_implemented])
    b.ret(not_implemented)
    return entry


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
    decref = _declare(module, "Py_DecRef", ir.FunctionType(ir.VoidType(), [PTR]))
    b.call(decref, [result])  # None, or NotImplemented when the entry declined
    require(b.icmp_unsigned("==", result, _table_slot(b, table, TABLE_NONE)), "ran")
    incref = _declare(module, "Py_IncRef", ir.FunctionType(ir.VoidType(), [PTR]))
    b.call(incref, [out])
    b.ret(out)
    b.position_at_end(fallback)
    vectorcall = _declare(module, "PyObject_Vectorcall",
                          ir.FunctionType(PTR, [PTR, PTR, I64, PTR]))
    b.ret(b.call(vectorcall, [wrapper, args, nargsf, kwnames]))
    return front


# Up to this many output-against-buffer comparisons the check is straight-line code (a few
# nanoseconds per call); above, a loop over the extents. O3 time grows much faster than the
# comparison count: 1 770 of them (30 inputs, 30 outputs) as one `and` chain took InstCombine
# 38 s, and a fine-tuning step of a 6-layer BERT (105 inputs, 102 outputs, 21 000
# comparisons) did not finish in 15 minutes.
STRAIGHT_LINE_COMPARISONS = 128


def _disjointness_check(module: ir.Module, symbol: str, inputs: int,
                        extents: list[int]) -> ir.Function:
    """`i1 <symbol>.disjoint(ptr starts)`: whether each output's bytes [start, start +
    extent) overlap no other buffer's. Outside the optnone entry, so that LLVM optimises
    its outputs x buffers comparisons (a training step passes some twenty arrays)."""
    function = ir.Function(module, ir.FunctionType(ir.IntType(1), [PTR]), symbol + ".disjoint")
    function.linkage = "internal"
    function.attributes.add("nounwind")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    comparisons = (len(extents) - inputs) * (len(extents) - 1)
    if comparisons > STRAIGHT_LINE_COMPARISONS:
        _disjointness_loop(b, function, symbol, inputs, extents)
        return function
    starts = [b.load(b.gep(function.args[0], [ir.Constant(I64, position)], source_etype=I64),
                     typ=I64) for position in range(len(extents))]
    ends = [b.add(start, ir.Constant(I64, extent)) for start, extent in zip(starts, extents,
                                                                            strict=True)]
    terms = []
    for out in range(inputs, len(extents)):
        for other in range(len(extents)):
            if other != out:
                terms.append(b.or_(b.icmp_unsigned("<=", ends[out], starts[other]),
                                   b.icmp_unsigned("<=", ends[other], starts[out])))
    # A balanced tree of `and`s: InstCombine is quadratic on one long chain.
    while len(terms) > 1:
        terms = [b.and_(*terms[i:i + 2]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    b.ret(terms[0] if terms else ir.Constant(ir.IntType(1), 1))
    return function


def _disjointness_loop(b: ir.IRBuilder, function: ir.Function, symbol: str, inputs: int,
                       extents: list[int]) -> None:
    """The check as two nested loops over `starts` and a constant table of extents,
    returning false at the first overlap."""
    count = len(extents)
    table_type = ir.ArrayType(I64, count)
    table = ir.GlobalVariable(b.module, table_type, symbol + ".extents")
    table.linkage = "internal"
    table.global_constant = True
    table.initializer = ir.Constant(table_type, extents)

    def load(base, index):
        return b.load(b.gep(base, [index], source_etype=I64), typ=I64)

    def extent(index):
        return b.load(b.gep(table, [ir.Constant(I64, 0), index], source_etype=table_type),
                      typ=I64)

    entry = b.block
    outer = function.append_basic_block("outer")
    inner = function.append_basic_block("inner")
    compare = function.append_basic_block("compare")
    next_other = function.append_basic_block("next_other")
    next_out = function.append_basic_block("next_out")
    overlap = function.append_basic_block("overlap")
    done = function.append_basic_block("done")
    starts = function.args[0]
    b.branch(outer)

    b.position_at_end(outer)
    out = b.phi(I64, "out")
    out.add_incoming(ir.Constant(I64, inputs), entry)
    out_start = load(starts, out)
    out_end = b.add(out_start, extent(out))
    b.branch(inner)

    b.position_at_end(inner)
    other = b.phi(I64, "other")
    other.add_incoming(ir.Constant(I64, 0), outer)
    b.cbranch(b.icmp_unsigned("==", other, out), next_other, compare)

    b.position_at_end(compare)
    other_start = load(starts, other)
    other_end = b.add(other_start, extent(other))
    apart = b.or_(b.icmp_unsigned("<=", out_end, other_start),
                  b.icmp_unsigned("<=", other_end, out_start))
    b.cbranch(apart, next_other, overlap)

    b.position_at_end(next_other)
    following = b.add(other, ir.Constant(I64, 1))
    other.add_incoming(following, next_other)
    b.cbranch(b.icmp_unsigned("<", following, ir.Constant(I64, count)), inner, next_out)

    b.position_at_end(next_out)
    following_out = b.add(out, ir.Constant(I64, 1))
    out.add_incoming(following_out, next_out)
    b.cbranch(b.icmp_unsigned("<", following_out, ir.Constant(I64, count)), outer, done)

    b.position_at_end(overlap)
    b.ret(ir.Constant(ir.IntType(1), 0))
    b.position_at_end(done)
    b.ret(ir.Constant(ir.IntType(1), 1))


def _declare(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(module, fnty, name)


def fill_runtime_table(address: int) -> None:
    table = (ctypes.c_void_p * TABLE_SLOTS).from_address(address)
    table[TABLE_NDARRAY] = id(np.ndarray)
    table[TABLE_NONE] = id(None)
    table[TABLE_NOT_IMPLEMENTED] = id(NotImplemented)
    table[TABLE_TUPLE] = id(tuple)
    # Keyword names in call sites are interned, so `out=` arrives as this very object (a
    # different but equal string only takes the slower wrapper path).
    table[TABLE_OUT_NAME] = id(_OUT_NAME)


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
