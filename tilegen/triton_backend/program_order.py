"""Which program ids the grid keeps on one thread: the period of the programs' atomics.

The grid's worker (grid.py) runs the linear program ids in one contiguous run per thread,
unless the kernel's atomics take their addresses from `program_id(0) % P` for a constant P
(tutorial 05's backward: `lock_id = row % GROUP_SIZE_M`, the lock and the partial rows it
guards). Then programs P apart contend for the same lock and rows, and with contiguous halves
the threads meet them in lockstep (`row` and `row + M / 2` agree mod P whenever P divides
M / 2): one waits on the other's lock and the rows move between the cores' caches at every
program. Dealt in runs of R ids in turn (block-cyclic), with T x R dividing P, ids that
agree mod P stay on one thread (`run_length`).

`program_period` finds P: a value is *periodic* with period p when it is a function of
`program_id(0) mod p` (p a constant), *polynomial* when an integer polynomial of
`program_id(0)` (add, sub, mul, views, integer casts that widen), so that its remainder by a
constant c is periodic with period c, and *aperiodic* when it depends on `program_id(0)` in
any other way. Dependence on the other axes' ids is not tracked: programs with different
y or z ids are ones the grid orders apart already when P divides the grid's x extent, which
the driver checks. Values inside regions are treated as their ops say; a region's results
and block arguments that depend on the program id are aperiodic.
"""

from __future__ import annotations

import math

from .tileir import Op, Program, walk

ATOMICS = ("tt.atomic_rmw", "tt.atomic_cas")
_POLYNOMIAL = ("arith.addi", "arith.subi", "arith.muli", "tt.splat", "tt.broadcast",
               "tt.expand_dims", "tt.reshape", "arith.extsi", "arith.extui", "arith.index_cast",
               "tt.addptr")
_REMAINDERS = ("arith.remsi", "arith.remui")
_POLY = -1  # a polynomial of program_id(0); 0 is aperiodic; p > 0 periodic with period p


def program_period(program: Program) -> int:
    """The least common multiple of the periods of the atomics' addresses, when every
    atomic whose address depends on `program_id(0)` is periodic; else 0."""
    constants: dict[int, int] = {}
    for op in walk(program.body):
        if op.name == "arith.constant" and isinstance(op.attr("value"), int):
            constants[op.results[0].id] = op.attr("value")
        elif op.name == "tt.splat" and op.operands and op.operands[0].id in constants:
            constants[op.results[0].id] = constants[op.operands[0].id]
    kind: dict[int, int] = {}  # by value id, for values that depend on program_id(0)
    while True:  # again while a region's results learn of what their regions yield
        before = dict(kind)
        for op in walk(program.body):
            _classify(op, constants, kind)
        if kind == before:
            break
    periods = [kind[op.operands[0].id] for op in walk(program.body)
               if op.name in ATOMICS and op.operands[0].id in kind]
    if not periods or min(periods) <= 0:
        return 0
    return math.lcm(*periods)


def _classify(op: Op, constants: dict[int, int], kind: dict[int, int]) -> None:
    if op.name == "tt.get_program_id" and op.attr("axis") == 0:
        kind[op.results[0].id] = _POLY
        return
    inputs = [kind[value.id] for value in op.operands if value.id in kind]
    if op.regions and any(value.id in kind for region in op.regions
                          for inner in walk(region) for value in inner.operands):
        inputs.append(0)  # what the regions compute from the id may reach the results
    if not inputs:
        return
    for region in op.regions:  # a region's block arguments carry what its op passes in
        kind.update({arg.id: 0 for arg in region.args})
    if op.name in _REMAINDERS and op.operands[1].id in constants and \
            op.operands[0].id in kind and op.operands[1].id not in kind:
        divisor = abs(constants[op.operands[1].id])
        source = kind[op.operands[0].id]
        result = source if source > 0 else divisor if source == _POLY and divisor else 0
    elif 0 in inputs or op.regions:
        result = 0
    elif all(k == _POLY for k in inputs):
        result = _POLY if op.name in _POLYNOMIAL else 0
    else:  # a function of periodic values (and ones that do not depend on the id)
        result = math.lcm(*(k for k in inputs if k > 0)) if _POLY not in inputs else 0
    for value in op.results:
        kind[value.id] = result
