"""matmul(gather(table, ids), w) computed as gather(matmul(table, w), ids) when the table
has fewer rows than ids are gathered (kina_frontend.transforms.project_before_gather)."""

from __future__ import annotations

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen.api import compile_program
from tilegen.pipeline import prepare
from tilegen.runtime import IdOutOfRangeError


def _source(rows, batch, length, width, out, weight="broadcast"):
    ty = lambda *shape: f"Tensor[F32, [{', '.join(map(str, shape))}], @host]"  # noqa: E731
    if weight == "broadcast":
        w_param, w_use = f"w: {ty(width, out)}", f"broadcast(w, [{batch}, {width}, {out}])"
    else:  # a different matrix per batch
        w_param, w_use = f"w: {ty(batch, width, out)}", "w"
    return (f"fn f(table: {ty(rows, width)}, ids: Tensor[I64, [{batch}, {length}], @host], "
            f"{w_param}) -> {ty(batch, length, out)} {{\n"
            f"  let x = gather(table, ids);\n"
            f"  return add(matmul(x, {w_use}), x);\n"
            f"}}") if out == width else (
            f"fn f(table: {ty(rows, width)}, ids: Tensor[I64, [{batch}, {length}], @host], "
            f"{w_param}) -> {ty(batch, length, out)} {{\n"
            f"  return matmul(gather(table, ids), {w_use});\n}}")


def _ops(program):
    return [op.op for op in prepare(program, "f").body]


@pytest.mark.parametrize("rows,batch,length,width,out", [
    (8, 1, 36, 4, 4),      # StoryLM-0's projections (and the residual reads x itself)
    (5, 2, 7, 3, 11),      # batched, wider output
    (3, 1, 4, 17, 1),      # one output column
])
def test_small_tables_are_projected_before_the_gather(rows, batch, length, width, out):
    program = program_from_text(_source(rows, batch, length, width, out), "proj.kina")
    ops = _ops(program)
    assert ops.index("matmul") < ops.index("gather", ops.index("matmul"))
    module = compile_program(program)
    rng = np.random.default_rng(rows + length + out)
    table = rng.standard_normal((rows, width)).astype(np.float32)
    ids = rng.integers(0, rows, (batch, length))
    w = rng.standard_normal((width, out)).astype(np.float32)
    x = table.astype(np.float64)[ids]
    want = x @ w.astype(np.float64) + (x if out == width else 0)
    np.testing.assert_allclose(module.f(table, ids, w), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,length,weight", [(36, 36, "broadcast"), (40, 6, "broadcast"),
                                                (4, 9, "per batch")])
def test_other_shapes_keep_the_order(rows, length, weight):
    """As many table rows as ids (or more): no saving; a weight per batch: no single
    projection."""
    source = _source(rows, 2, length, 3, 5, weight)
    ops = _ops(program_from_text(source, "keep.kina"))
    assert ops.index("gather") < ops.index("matmul")


def test_an_out_of_range_id_is_reported_at_the_gather():
    source = _source(4, 1, 9, 3, 5)
    module = compile_program(program_from_text(source, "ids.kina"))
    table = np.ones((4, 3), np.float32)
    w = np.ones((3, 5), np.float32)
    ids = np.zeros((1, 9), np.int64)
    ids[0, 6] = 4
    where = r"gather at ids\.kina:2:17: id 4 at position \[0, 6\] of argument 'ids'"
    with pytest.raises(IdOutOfRangeError, match=where):
        module.f(table, ids, w)
