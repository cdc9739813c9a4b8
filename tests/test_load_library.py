"""tilegen.load_library: a library written by tilegen loads back as a module with the
calling convention and checks of compile_file (issue 18)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from kina_frontend import KinaError
from tilegen.api import compile_source

SOURCE = """
fn embed(table: Tensor[F32, [8, 4], @host], ids: Tensor[I64, [2, 3], @host])
    -> Tensor[F32, [2, 3, 4], @host] {
  return gather(table, ids);
}
fn twice(x: Tensor[F64, [3, 17], @host]) -> (Tensor[F64, [3, 17], @host],
                                             Tensor[F64, [3], @host]) {
  return (mul(x, 2.0), sum(x, axis=1));
}
@main
fn main() {
  let x = placeholder(Tensor[F64, [3, 17], @host]);
  let (y, s) = twice(x);
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    path = tmp_path_factory.mktemp("lib") / "libguards.so"
    built = compile_source(SOURCE, "guards.kina", jit=False, output=str(path))
    return path, built


def test_loaded_library_computes_and_checks_like_the_original(library):
    path, built = library
    module = tilegen.load_library(path)
    assert sorted(dir(module)) == ["embed", "main", "twice"]
    assert tilegen.program_of(module).path == str(path)
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    ids = np.array([[0, 7, 2], [3, 1, 5]])
    np.testing.assert_array_equal(module.embed(table, ids), table[ids])
    # Compiled functions are plain instance attributes (no __getattr__ on the hot path).
    assert vars(module)["embed"] is module.embed
    x = np.random.default_rng(3).standard_normal((3, 17))
    doubled, sums = module.twice(x)
    np.testing.assert_array_equal(doubled, 2 * x)
    np.testing.assert_allclose(sums, x.sum(axis=1), rtol=1e-14)
    out = (np.empty((3, 17)), np.empty(3))
    assert module.main(x, out=out) == out  # @main is there for Python, not for C
    for call in (lambda m: m.embed(table, ids.astype(np.int32)),
                 lambda m: m.embed(table),
                 lambda m: m.embed(table, np.array([[0, 1, 2], [3, 8, 5]])),
                 lambda m: m.twice(x, out=(x, np.empty(3)))):
        with pytest.raises((TypeError, IndexError)) as loaded:
            call(module)
        with pytest.raises((TypeError, IndexError)) as original:
            call(built)
        assert type(loaded.value) is type(original.value)
        assert str(loaded.value) == str(original.value)
    with pytest.raises(tilegen.IdOutOfRangeError, match=r"gather at guards.kina:4:10: id 8 "
                                                        r"at position \[1, 1\]"):
        module.embed(table, np.array([[0, 1, 2], [3, 8, 5]]))


def test_load_library_refuses_what_it_cannot_run(tmp_path, library):
    path, _ = library
    with pytest.raises(KinaError, match="no such file"):
        tilegen.load_library(tmp_path / "missing.so")
    other_library = next(Path(np.__file__).parent.glob("_core/_multiarray_umath*.so"))
    with pytest.raises(KinaError, match="cannot load .* as a tilegen library"):
        tilegen.load_library(other_library)
    # A library built for CPU features this machine lacks is refused, not run into SIGILL.
    data = path.read_bytes()
    at = data.index(b'"features": "') + len(b'"features": "')
    (tmp_path / "other.so").write_bytes(data[:at] + b"+avx9999," + data[at + 9:])
    with pytest.raises(KinaError, match="needs CPU features this machine lacks: avx9999"):
        tilegen.load_library(tmp_path / "other.so")
