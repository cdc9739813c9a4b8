"""tilegen.irbuilder.Builder: integer arithmetic on constants folded to what LLVM computes
(signed division truncates, comparisons are signed), and a repeated integer instruction
reused only where the first one dominates (same block, builder appending)."""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir

from tilegen.irbuilder import Builder
from tilegen.pipeline import to_llvm
from tilegen.target import LLVM_LOCK, host_target, new_target_machine

I1, I64 = ir.IntType(1), ir.IntType(64)
BINARY = ("add", "sub", "mul", "and_", "or_", "sdiv", "srem", "shl", "ashr")
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


def _llvm_results(cases):
    """Each (op, a, b) computed by LLVM at run time on arguments it cannot fold."""
    module = ir.Module("reference")
    module.triple = host_target().triple
    names = []
    for number, (op, _, _) in enumerate(cases):
        fn = ir.Function(module, ir.FunctionType(I64, [I64, I64]), f"case{number}")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        x, y = fn.args
        if op in COMPARISONS:
            b.ret(b.zext(b.icmp_signed(op, x, y), I64))
        else:
            b.ret(getattr(b, op)(x, y))
        names.append(fn.name)
    parsed = to_llvm(module, host_target(), optimize_module=False)
    with LLVM_LOCK:
        engine = llvm.create_mcjit_compiler(parsed, new_target_machine(host_target()))
        engine.finalize_object()
        addresses = [engine.get_function_address(name) for name in names]
    kind = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    results = [kind(address)(a, b) for address, (_, a, b) in zip(addresses, cases, strict=True)]
    del engine
    return results


def _folded(op, a, b):
    builder = Builder(ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []),
                                  "f").append_basic_block("entry"))
    x, y = ir.Constant(I64, a), ir.Constant(I64, b)
    value = builder.icmp_signed(op, x, y) if op in COMPARISONS else getattr(builder, op)(x, y)
    return value


def _valid(op, a, b):
    if op in ("sdiv", "srem") and (b == 0 or (a == -(2 ** 63) and b == -1)):
        return False  # undefined in LLVM
    return not (op in ("shl", "ashr") and not 0 <= b < 64)


INT64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
SMALL = st.integers(-100, 100)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(BINARY + COMPARISONS),
                          st.one_of(SMALL, INT64), st.one_of(SMALL, INT64, st.integers(0, 63))),
                min_size=1, max_size=12))
def test_folded_constants_are_what_llvm_computes(cases) -> None:
    cases = [case for case in cases if _valid(*case)]
    if not cases:
        return
    expected = _llvm_results(cases)
    for (op, a, b), want in zip(cases, expected, strict=True):
        value = _folded(op, a, b)
        if isinstance(value, ir.Constant):
            got = int(value.constant)
            if op in COMPARISONS:
                assert got == want, (op, a, b)
            else:  # the constant's signed value, as a 64-bit pattern
                assert (got - want) % (1 << 64) == 0, (op, a, b, got, want)
        else:  # left to LLVM (a result past 64 bits): an instruction, never a wrong constant
            assert isinstance(value, ir.Instruction), (op, a, b)


def test_negative_division_truncates_toward_zero() -> None:
    assert _folded("sdiv", -7, 2).constant == -3
    assert _folded("srem", -7, 2).constant == -1
    assert _folded("sdiv", 7, -2).constant == -3
    assert _folded("srem", 7, -2).constant == 1


def _function():
    fn = ir.Function(ir.Module(), ir.FunctionType(I64, [I64, I64]), "f")
    return fn, Builder(fn.append_basic_block("entry"))


def test_identities_and_constant_selects() -> None:
    fn, b = _function()
    x, _ = fn.args
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    assert b.add(x, zero) is x and b.add(zero, x) is x and b.mul(x, one) is x
    assert b.sub(x, zero) is x
    assert b.select(ir.Constant(I1, 1), x, zero) is x
    assert b.select(ir.Constant(I1, 0), x, zero) is zero
    assert not b.block.instructions


def test_a_repeated_instruction_in_one_block_is_reused() -> None:
    fn, b = _function()
    x, y = fn.args
    first = b.mul(b.add(x, y), ir.Constant(I64, 48))
    again = b.mul(b.add(x, y), ir.Constant(I64, 48))  # a fresh constant object, same value
    assert again is first
    assert len(b.block.instructions) == 2
    assert b.icmp_signed("<", x, y) is b.icmp_signed("<", x, y)
    assert b.icmp_signed("<", x, y) is not b.icmp_signed("<", y, x)
    assert b.sub(x, y) is not b.sub(y, x)


def test_no_reuse_across_blocks_or_before_the_end() -> None:
    fn, b = _function()
    x, y = fn.args
    first = b.add(x, y)
    other = fn.append_basic_block("other")
    b.branch(other)
    b.position_at_end(other)
    assert b.add(x, y) is not first  # the entry block may not dominate `other`
    b.position_before(first)  # inserting before the first: it does not dominate this point
    before = b.add(x, y)
    assert before is not first
    assert fn.blocks[0].instructions.index(before) < fn.blocks[0].instructions.index(first)


@pytest.mark.parametrize("name", ["", "named"])
def test_named_instructions_are_built_as_asked(name) -> None:
    fn, b = _function()
    x, y = fn.args
    one = b.add(x, y, name=name)
    two = b.add(x, y, name=name)
    assert (one is two) == (name == "")
