"""The launcher's argument packing (driver.TilegenLauncher): every kind of runtime argument,
with constexprs and arguments specialised away (ints equal to 1) between them, reaches the
kernel with its value, on the common path (one precompiled struct) and on the debug path
(bounds checks on: slots packed one by one)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = triton.language

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()


@triton.jit
def _mixed(out_ptr, scale, BLOCK: tl.constexpr, shift, x_ptr, big, flag, one, half, n):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = x.to(tl.float64) * scale + shift.to(tl.float64) + big.to(tl.float64) * 1e-12
    y = tl.where(flag, y, -y) + one + half.to(tl.float64)
    tl.store(out_ptr + offsets, y, mask=mask)


@pytest.mark.parametrize("debug", [False, True])
def test_every_argument_kind_reaches_the_kernel(debug):
    n = 37
    x = torch.arange(n, dtype=torch.float32) - 11.5
    out = torch.full((64,), 99.0, dtype=torch.float64)
    scale, shift, big, half = 1.0 / 3.0, -(2 ** 40) - 7, 2 ** 62 + 5, 0.25
    for flag in (True, False):
        compiled = _mixed[(1,)](out, scale, 64, shift, x, big, flag, 1, half, n, debug=debug)
        assert compiled.metadata.debug == debug
        # float64 by hand; Python floats are fp32 arguments, ints beyond 32 bits i64
        fp32 = float(torch.tensor(scale, dtype=torch.float32))
        expected = x.double() * fp32 + float(shift) + float(big) * 1e-12
        expected = (expected if flag else -expected) + 1.0 + half
        torch.testing.assert_close(out[:n], expected, rtol=0, atol=0)
        assert torch.all(out[n:] == 99.0)  # masked-off lanes untouched


def test_a_tensor_off_the_cpu_is_refused():
    x = torch.zeros(8)
    meta = torch.empty(64, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match="runs on the CPU"):
        _mixed[(1,)](meta, 0.5, 64, 0, x, 3, True, 1, 0.5, 8)
