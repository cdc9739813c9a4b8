"""Arrays from elsewhere (issue 18): torch CPU tensors, ml_dtypes arrays, DLPack, buffer
and array-interface objects as inputs and as out=, read without a copy when their layout
fits; memory elsewhere or an unsupported dtype is a clear error."""

from __future__ import annotations

import array
import tracemalloc

import numpy as np
import pytest

import tilegen
from tilegen.api import compile_source

SOURCE = """
fn scale_rows(x: Tensor[F32, [512, 1024], @host], ids: Tensor[I64, [3], @host])
    -> (Tensor[F32, [512], @host], Tensor[F32, [1, 3, 1024], @host]) {
  return (sum(x, axis=1), gather(x, reshape(ids, [1, 3])));
}
fn halve(v: Tensor[F32, [6], @host]) -> Tensor[F32, [6], @host] {
  return mul(v, 0.5);
}
"""


@pytest.fixture(scope="module", params=[True, False], ids=["jit", "so"])
def module(request):
    return compile_source(SOURCE, "interop.kina", jit=request.param)


def _reference(x: np.ndarray, ids: np.ndarray):
    return x.astype(np.float64).sum(axis=1), x[ids]


def test_torch_tensors_in_and_out_without_copies(module):
    torch = pytest.importorskip("torch")
    x = torch.randn(512, 1024)
    ids = torch.tensor([5, 0, 511])
    sums, rows = module.scale_rows(x, ids)
    want_sums, want_rows = _reference(x.numpy(), ids.numpy())
    np.testing.assert_allclose(sums, want_sums, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(rows.reshape(3, 1024), want_rows)
    out = (torch.empty(512), torch.empty(1, 3, 1024))
    tracemalloc.start()
    try:
        returned = module.scale_rows(x, ids, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"{peak} bytes allocated: an input or output was copied"
    assert returned[0] is out[0] and returned[1] is out[1]
    np.testing.assert_allclose(out[0].numpy(), want_sums, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(out[1].numpy()[0], want_rows)
    single = torch.empty(6)
    assert module.halve(torch.arange(6.0), out=single) is single
    np.testing.assert_array_equal(single.numpy(), np.arange(6.0) / 2)


def test_torch_views_and_refusals(module):
    torch = pytest.importorskip("torch")
    x = torch.randn(1024, 512).T  # a transposed view: copied once, like a NumPy view
    sums, _ = module.scale_rows(x, torch.tensor([1, 2, 3]))
    np.testing.assert_allclose(sums, x.numpy().astype(np.float64).sum(axis=1), rtol=1e-5,
                               atol=1e-3)
    with pytest.raises(tilegen.ArgumentError, match=r"halve\(\): argument 'v'.*torch.Tensor.*"
                                                    r"(gradient|grad)"):
        module.halve(torch.ones(6, requires_grad=True))
    with pytest.raises(tilegen.ArgumentError, match=r"argument 'v' must have dtype float32, "
                                                    r"got float16"):
        module.halve(torch.ones(6, dtype=torch.float16))
    with pytest.raises(tilegen.ArgumentError, match=r"argument 'v': cannot read this "
                                                    r"torch.Tensor as an array"):
        module.halve(torch.ones(6, dtype=torch.bfloat16))
    with pytest.raises(tilegen.ArgumentError, match=r"out\[0\] must be C-contiguous"):
        module.halve(torch.ones(6), out=torch.empty(12)[::2])
    with pytest.raises(tilegen.ArgumentError, match=r"out\[0\] overlaps"):
        shared = torch.ones(6)
        module.halve(shared, out=shared)


class _OnTheGpu:
    """What a CUDA tensor says about itself through DLPack."""

    def __dlpack__(self, stream=None):
        raise AssertionError("must not be read")

    def __dlpack_device__(self):
        return (2, 0)


def test_memory_elsewhere_is_refused(module):
    with pytest.raises(tilegen.ArgumentError, match=r"halve\(\): argument 'v' is a "
                                                    r".*_OnTheGpu in CUDA memory; tilegen runs "
                                                    r"on the CPU"):
        module.halve(_OnTheGpu())
    with pytest.raises(tilegen.ArgumentError, match=r"out\[0\] is a .*_OnTheGpu in CUDA"):
        module.halve(np.ones(6, np.float32), out=_OnTheGpu())


def test_ml_dtypes_arrays(module):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(tilegen.ArgumentError, match=r"argument 'v' must have dtype float32, "
                                                    r"got bfloat16"):
        module.halve(np.ones(6, ml_dtypes.bfloat16))
    np.testing.assert_array_equal(module.halve(np.ones(6, ml_dtypes.bfloat16)
                                               .astype(np.float32)), np.full(6, 0.5))


class _Interface:
    """An object exposing memory through __array_interface__ only."""

    def __init__(self, base: np.ndarray):
        self.base = base
        self.__array_interface__ = base.__array_interface__


def test_buffers_and_array_interface_in_and_out(module):
    values = array.array("f", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
    np.testing.assert_array_equal(module.halve(values), np.arange(6.0))
    np.testing.assert_array_equal(module.halve(memoryview(values)), np.arange(6.0))
    target = array.array("f", [9.0] * 6)
    assert module.halve(values, out=target) is target
    assert list(target) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    backing = np.zeros(6, np.float32)
    interface = _Interface(backing)
    assert module.halve(_Interface(np.arange(6, dtype=np.float32)), out=interface) is interface
    np.testing.assert_array_equal(backing, np.arange(6.0) / 2)
    with pytest.raises(tilegen.ArgumentError, match=r"out\[0\] is read-only"):
        module.halve(values, out=memoryview(bytes(24)).cast("f"))
    with pytest.raises(tilegen.ArgumentError, match=r"out\[0\] must be an array tilegen can "
                                                    r"write into .* got list"):
        module.halve(values, out=[[0.0] * 6])


def test_jax_cpu_arrays(module):
    jnp = pytest.importorskip("jax.numpy")
    got = module.halve(jnp.arange(6, dtype=jnp.float32))
    np.testing.assert_array_equal(got, np.arange(6.0) / 2)
