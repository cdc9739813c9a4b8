"""The tile IR verifier, run on every imported program: SSA (each value defined once,
before its uses, in scope), elementwise operands shaped like their result, loads and
stores with pointer, value and mask of one shape, and loop and branch terminators that
yield what their op carries. A failure is a TileError naming the op (an importer bug, or
TTIR we misread), before any code is generated."""

from __future__ import annotations

from .elementwise import ELEMENTWISE_OPS
from .tileir import Block, Op, Program, TileError

_TERMINATORS = ("scf.yield", "scf.condition", "tt.reduce.return", "tt.scan.return",
                "tt.return")


def verify_program(program: Program) -> None:
    if tuple(p.value for p in program.params) != program.body.args:
        raise TileError(f"kernel `{program.name}`: the parameters are not the body's "
                        "arguments (tile IR verifier)")
    _verify_block(program, program.body, set())


def _define(program: Program, op: Op | None, value_id: int, defined: set[int]) -> None:
    if value_id in defined:
        where = op.where(program.name) if op else f"kernel `{program.name}`"
        raise TileError(f"{where}: value %{value_id} is defined twice (tile IR verifier)")
    defined.add(value_id)


def _verify_block(program: Program, block: Block, defined: set[int]) -> None:
    scope = set(defined)
    for arg in block.args:
        _define(program, None, arg.id, scope)
    for op in block.ops:
        for operand in op.operands:
            if operand.id not in scope:
                raise TileError(f"{op.where(program.name)}: operand %{operand.id} is used "
                                "before it is defined (tile IR verifier)")
        for region in op.regions:
            _verify_block(program, region, scope)
        _verify_op(program, op)
        for result in op.results:
            _define(program, op, result.id, scope)


def _fail(program: Program, op: Op, message: str) -> TileError:
    return TileError(f"{op.where(program.name)}: {message} (tile IR verifier)")


def _verify_op(program: Program, op: Op) -> None:
    name = op.name
    if name in ELEMENTWISE_OPS and op.results and op.result.type.shape:
        shape = op.result.type.shape
        if any(v.type.shape not in ((), shape) for v in op.operands):
            raise _fail(program, op, "an operand's shape differs from the result's")
    if name == "tt.load":
        shapes = {v.type.shape for v in op.operands} | {op.result.type.shape}
        if len(shapes) != 1:
            raise _fail(program, op, "pointer, mask, other and result shapes differ")
    if name == "tt.store" and len({v.type.shape for v in op.operands}) != 1:
        raise _fail(program, op, "pointer, value and mask shapes differ")
    if name == "scf.for":
        _expect_yield(program, op, op.regions[0], len(op.operands) - 3)
        if len(op.results) != len(op.operands) - 3:
            raise _fail(program, op, "results and carried values differ in number")
    if name == "scf.if" and op.results:
        for region in op.regions:
            _expect_yield(program, op, region, len(op.results))
    if name in ("tt.reduce", "tt.scan"):
        body = op.regions[0]
        if len(body.args) != 2 * len(op.operands) or not body.ops or \
                body.ops[-1].name not in _TERMINATORS:
            raise _fail(program, op, "the combine region does not match the operands")


def _expect_yield(program: Program, op: Op, block: Block, count: int) -> None:
    if not block.ops or block.ops[-1].name != "scf.yield" or \
            len(block.ops[-1].operands) != count:
        raise _fail(program, op, f"the region does not end by yielding {count} value(s)")
