"""Id errors from parallel loops name the first bad id in row-major order (issue 17 item 9).

Each thread of a parallel loop stops at the first bad id of its chunk; all used to write
the one error record, so the report was whichever thread wrote last (`position [2050]`
with a bad id at 1000 too). Now each thread has its own record and the lowest thread that
failed -- the one whose chunk comes first -- is reported. Bad ids sit in both threads'
halves, for ids checked at kernel entry and for ids computed in the kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegen
from kina_frontend import program_from_text
from tilegen import loopir as L
from tilegen.api import compile_program

_PROGRAM = """
fn given(ids: Tensor[I64, [300001], @host], table: Tensor[F32, [8, 4], @host])
    -> Tensor[F32, [300001, 4], @host] {
  return gather(table, ids);
}
fn computed(x: Tensor[F32, [4096, 64], @host], table: Tensor[F32, [32, 64], @host])
    -> Tensor[F32, [4096, 64], @host] {
  return gather(table, argmax(x, axis=1));
}
"""


@pytest.fixture(scope="module")
def module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TILEGEN_NUM_THREADS", "2")
        compiled = compile_program(program_from_text(_PROGRAM, "ids.kina"))
    plans = tilegen.program_of(compiled).plans
    for name in ("given", "computed"):
        checks = [loop for loop in L.statements(plans[name].kernel.body)
                  if isinstance(loop, L.For) and loop.kind == "parallel"
                  and any(isinstance(e, L.CheckedId) for s in L.statements(loop.body)
                          if isinstance(s, (L.Let, L.Store)) for e in L.subexpressions(s.value))]
        assert checks, f"{name}: the ids should be checked in a parallel loop"
    return compiled


@pytest.mark.parametrize("bad", [[5, 160000], [149999, 150001], [100, 299999],
                                 [150001, 299000]])
def test_ids_given_as_an_argument(module, bad):
    ids = np.zeros(300001, np.int64)
    ids[bad] = 9
    table = np.ones((8, 4), np.float32)
    for _ in range(30):
        with pytest.raises(tilegen.IdOutOfRangeError, match=rf"id 9 at position \[{bad[0]}\] "):
            module.given(ids, table)


@pytest.mark.parametrize("rows", [[1000, 2050], [2040, 2050], [1, 2049, 4000]])
def test_ids_computed_in_the_kernel(module, rows):
    x = np.zeros((4096, 64), np.float32)
    x[rows, 40] = 1.0  # argmax 40 is outside the 32-row table
    table = np.ones((32, 64), np.float32)
    for _ in range(30):
        with pytest.raises(tilegen.IdOutOfRangeError,
                           match=rf"id 40 at position \[{rows[0]}\] of a computed"):
            module.computed(x, table)
