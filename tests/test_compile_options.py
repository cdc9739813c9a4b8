"""compile_source/compile_file options: consts= sets const values, functions= picks functions."""

from __future__ import annotations

import numpy as np
import pytest

import tilegen
from kina_frontend import KinaError, Source, check_source, specialize

SOURCE = """const T = 4;
const D = 2 * T;
fn row_sums(x: Tensor[F32, [T, D], @host]) -> Tensor[F32, [T], @host] {
  return sum(x, axis=1);
}
fn twice(x: Tensor[F32, [T], @host]) -> Tensor[F32, [T], @host] { return x * 2.0; }
"""


@pytest.mark.parametrize("t", [1, 7, 33])
def test_consts_set_the_sizes_and_derived_consts_follow(t):
    module = tilegen.compile_source(SOURCE, consts={"T": t})
    x = np.arange(t * 2 * t, dtype=np.float32).reshape(t, 2 * t)
    np.testing.assert_array_equal(module.row_sums(x), x.sum(axis=1))
    with pytest.raises((TypeError, ValueError)):
        module.row_sums(np.ones((t + 1, 2 * t + 2), np.float32))


def test_consts_do_not_change_the_proofs():
    default = check_source(Source("s.kina", SOURCE))
    other = check_source(Source("s.kina", SOURCE), {"T": 9})
    assert [o.claim for o in default.obligations] == [o.claim for o in other.obligations]
    assert other.constants == {"T": 9, "D": 18}
    assert specialize(other).functions[0].params[0].type.shape == (9, 18)


def test_each_const_value_is_its_own_module():
    small = tilegen.compile_source(SOURCE, consts={"T": 3})
    large = tilegen.compile_source(SOURCE, consts={"T": 5})
    assert small is not large
    assert small is tilegen.compile_source(SOURCE, consts={"T": 3})
    assert small.twice(np.ones(3, np.float32)).shape == (3,)
    assert large.twice(np.ones(5, np.float32)).shape == (5,)


@pytest.mark.parametrize(("consts", "message"), [
    ({"D": 3}, "'D', which is defined by an expression"),
    ({"Q": 3}, "'Q', which the program does not declare"),
    ({"T": 0}, "must be a positive integer, got 0"),
    ({"T": 2.5}, "to 2.5, not an integer"),
    ({"T": True}, "to True, not an integer"),
    ({"T": 2**40}, "larger than the largest supported dimension"),
])
def test_bad_consts_are_diagnosed(consts, message):
    with pytest.raises(KinaError, match=message):
        tilegen.compile_source(SOURCE, name="s.kina", consts=consts)


def test_functions_compiles_only_the_named_ones():
    module = tilegen.compile_source(SOURCE, functions=["twice"])
    np.testing.assert_array_equal(module.twice(np.ones(4, np.float32)), np.full(4, 2.0))
    assert not hasattr(module, "row_sums")
    with pytest.raises(KinaError, match="'nope', which s.kina does not define"):
        tilegen.compile_source(SOURCE, name="s.kina", functions=["nope"])


def test_compile_file_takes_the_same_options(tmp_path):
    path = tmp_path / "p.kina"
    path.write_text(SOURCE)
    module = tilegen.compile_file(path, consts={"T": 6}, functions=("row_sums",))
    np.testing.assert_array_equal(module.row_sums(np.ones((6, 12), np.float32)),
                                  np.full(6, 12.0))
