"""sigmoid and silu over their whole range, the far negative tail included, against an
independent float64 oracle (scipy.special.expit), in units of the float32 result's ulp.

The tail is where the textbook 1 / (1 + e^-x) breaks: e^-x overflows to inf below x = -88.7
and the quotient becomes 0, while sigmoid still has subnormal values down to x = -103.3 and
silu = x sigmoid(x) normal ones down to about x = -91 (a generated program found
silu(-89) = -0 against -1.98e-37).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

import tilegen

# Dense over the normal range, denser over the tail, plus the edges themselves.
POINTS = np.unique(np.concatenate([
    np.linspace(-110.0, 110.0, 40_001), np.linspace(-104.0, -86.0, 20_001),
    [-np.inf, np.inf, -0.0, 0.0, -88.72, -103.28, -103.98, 88.72],
]).astype(np.float32))


def _compiled(opname: str):
    n = POINTS.size
    source = (f"fn f(x: Tensor[F32, [{n}], @host]) -> Tensor[F32, [{n}], @host] "
              f"{{ return {opname}(x); }}")
    return tilegen.compile_source(source, name=f"{opname}.kina").f


def _ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in ulps of exact rounded to float32 (subnormal ulps below 2^-126)."""
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / ulp


@pytest.fixture(scope="module")
def exact_sigmoid():
    with np.errstate(invalid="ignore"):
        return expit(POINTS.astype(np.float64))


def test_sigmoid_within_4_ulp_everywhere_subnormals_included(exact_sigmoid):
    got = _compiled("sigmoid")(POINTS)
    finite = np.isfinite(POINTS)
    errors = _ulps(got[finite], exact_sigmoid[finite])
    worst = int(np.argmax(errors))
    assert errors[worst] <= 4, (f"sigmoid({POINTS[finite][worst]}) = {got[finite][worst]!r}, "
                                f"exact {exact_sigmoid[finite][worst]!r}")
    assert got[np.isneginf(POINTS)][0] == 0.0 and got[np.isposinf(POINTS)][0] == 1.0
    # Subnormal results stay subnormal instead of collapsing to zero.
    tail = (POINTS > -103.0) & (POINTS < -88.8)
    assert np.all(got[tail] > 0)


def test_silu_within_4_ulp_where_e_to_the_x_is_normal(exact_sigmoid):
    got = _compiled("silu")(POINTS)
    x = POINTS.astype(np.float64)
    finite = np.isfinite(POINTS)
    with np.errstate(invalid="ignore"):  # -inf * 0 at x = -inf, left out below
        exact = x * exact_sigmoid
        errors = _ulps(got, exact)
    normal_e = finite & (x > -87.3)
    worst = int(np.argmax(np.where(normal_e, errors, 0)))
    assert errors[worst] <= 4, f"silu({POINTS[worst]}) = {got[worst]!r}, exact {exact[worst]!r}"
    # Below, e^x is subnormal and carries fewer bits, but a normal result must still come
    # out normal and close (it came out as -0 before).
    normal_result = finite & (x <= -87.3) & (np.abs(exact) >= 2.0 ** -126)
    assert normal_result.sum() > 1000
    relative = np.abs(got[normal_result] - exact[normal_result]) / np.abs(exact[normal_result])
    assert relative.max() < 1e-5, f"worst relative error {relative.max():.3g}"


def test_sigmoid_gradient_in_the_tail_is_finite_and_close():
    # d sigmoid / dx = s (1 - s): reverseMode reuses the forward's sigmoid, so its tail too.
    x = np.array([-95.0, -89.5, -60.0, -3.0, 0.5, 40.0, 95.0], np.float32)
    source = f"""
fn loss(x: Tensor[F32, [{x.size}], @host]) -> Tensor[F32, [], @host] {{
  return sum(sigmoid(x), axis=0);
}}
fn grad(x: Tensor[F32, [{x.size}], @host]) -> (Tensor[F32, [], @host],
                                                Tensor[F32, [{x.size}], @host]) {{
  return reverseMode(loss, wrt=[x])(x);
}}
"""
    _, dx = tilegen.compile_source(source, name="sigmoid_grad.kina").grad(x)
    s = expit(x.astype(np.float64))
    exact = s * (1.0 - s)
    np.testing.assert_allclose(dx, exact, rtol=1e-5, atol=0)
