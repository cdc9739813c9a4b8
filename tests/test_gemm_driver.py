"""The shared gemm driver (tilegen/gemm_driver.py): every fp32 product of a module runs in
one driver function (one per micro-kernel) with its sizes, bounds and leading dimensions
at run time, packing plain operands with the module's copy loops and the others (a
transposed view, a fused producer, a batch entry's slice) with functions of their own.
Generated modules of several products of odd shapes, each checked against float64 NumPy
with the float32 summation bound, on one and two threads."""

from __future__ import annotations

import os
import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tilegen import config, pipeline
from tilegen.api import compile_program
from tilegen.gemm_tiles import GEMM_MIN_WORK
from tilegen.loopir import Gemm


def _ty(shape):
    return f"Tensor[F32, [{', '.join(str(d) for d in shape)}], @host]"


# How a product's operands are read: (A's parameter shape, A's expression), likewise B,
# with the NumPy of each.
A_FORMS = {
    "plain": (lambda m, k: (m, k), "{}", lambda a: a),
    "relu": (lambda m, k: (m, k), "relu({})", lambda a: np.maximum(a, 0.0)),
    "transposed": (lambda m, k: (k, m), "transpose({}, [1, 0])", lambda a: a.T),
}
B_FORMS = {
    "plain": (lambda k, n: (k, n), "{}", lambda b: b),
    "transposed": (lambda k, n: (n, k), "transpose({}, [1, 0])", lambda b: b.T),
    "scaled": (lambda k, n: (k, n), "mul({}, 0.5)", lambda b: 0.5 * b),
}


@st.composite
def _products(draw):
    """2 to 4 products of packed size (more than 32 rows, at least GEMM_MIN_WORK
    multiply-adds), odd sizes allowed, each with its operand forms."""
    products = []
    for _ in range(draw(st.integers(2, 4))):
        m = draw(st.integers(33, 130))
        n = draw(st.integers(9, 130))
        k = max(draw(st.integers(9, 300)), -(-GEMM_MIN_WORK // (m * n)))
        products.append((m, n, k, draw(st.sampled_from(sorted(A_FORMS))),
                         draw(st.sampled_from(sorted(B_FORMS)))))
    return products


def _program(products):
    params, results, returns = [], [], []
    for index, (m, n, k, a_form, b_form) in enumerate(products):
        a_shape, a_expr, _ = A_FORMS[a_form]
        b_shape, b_expr, _ = B_FORMS[b_form]
        params += [f"a{index}: {_ty(a_shape(m, k))}", f"b{index}: {_ty(b_shape(k, n))}"]
        results.append(_ty((m, n)))
        returns.append(f"matmul({a_expr.format(f'a{index}')}, {b_expr.format(f'b{index}')})")
    return (f"fn f({', '.join(params)}) -> ({', '.join(results)}) {{\n"
            f"  return ({', '.join(returns)});\n}}")


def _defined(text: str, prefix: str) -> list[str]:
    return re.findall(rf'^define [^@]*@"({re.escape(prefix)}[^"]*)"\(', text, re.M)


def _compiled(source):
    """(the module, its LLVM IR as codegen builds it, its plan)."""
    program = program_from_text(source)
    (plan,) = pipeline.plan_program(program, None, config.load())
    return compile_program(program), str(pipeline.codegen([plan])), plan


def _own_packing(text: str) -> list[str]:
    """The packing functions of the module's products (not the module-wide copy loops)."""
    return [name for name in _defined(text, "kina.f.")
            if re.search(r"\.pack[ab](\.\d+)?$", name)]


def _with_threads(threads: int, run):
    previous = os.environ.get("TILEGEN_NUM_THREADS")
    os.environ["TILEGEN_NUM_THREADS"] = str(threads)
    try:
        return run()
    finally:
        if previous is None:
            del os.environ["TILEGEN_NUM_THREADS"]
        else:
            os.environ["TILEGEN_NUM_THREADS"] = previous


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(products=_products(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 99))
def test_products_of_a_module_share_one_driver(products, threads, seed):
    source = _program(products)

    module, text, plan = _with_threads(threads, lambda: _compiled(source))
    # One driver for all products of a register block (12 x 32 on AVX-512; 14 x 16 where
    # N is at most one vector), whatever their sizes and depth blocks.
    blocks = {(s.tiles.mr, s.tiles.nr) for s in plan.kernel.body if isinstance(s, Gemm)}
    assert len(_defined(text, "tilegen.gemm.driver.")) == len(blocks), source
    # Each product calls it once (in its parallel region, or its statement's code); a
    # product that occurs twice is one shared statement (tilegen/shared.py).
    distinct = set(products)
    assert len(re.findall(r'call i64 @"tilegen\.gemm\.driver\.', text)) == len(distinct)
    # Plain operands have no packing function of their own.
    own = _own_packing(text)
    assert len(own) == sum((a_form != "plain") + (b_form != "plain")
                           for _, _, _, a_form, b_form in distinct), (source, own)
    rng = np.random.default_rng(seed)
    inputs, expected, bounds = [], [], []
    for m, n, k, a_form, b_form in products:
        a = rng.standard_normal(A_FORMS[a_form][0](m, k)).astype(np.float32)
        b = rng.standard_normal(B_FORMS[b_form][0](k, n)).astype(np.float32)
        inputs += [a, b]
        a64 = A_FORMS[a_form][2](a.astype(np.float64))
        b64 = B_FORMS[b_form][2](b.astype(np.float64))
        expected.append(a64 @ b64)
        bounds.append(4 * np.finfo(np.float32).eps * np.sqrt(k) * (np.abs(a64) @ np.abs(b64)))
    got = module.f(*inputs)
    for result, exact, bound in zip(got, expected, bounds, strict=True):
        assert np.all(np.abs(result - exact) <= bound + 1e-30), source


def test_batched_products_drive_per_entry():
    """A batched product (attention's scores and weighted values: a transposed view with a
    fused producer, and a batch entry's slice of a buffer) runs the driver once per entry
    with that entry's corner, against NumPy: scores pack both operands with functions of
    their own, the weighted values neither."""
    b, h, t, d = 2, 3, 70, 40  # 196 K multiply-adds a product: packed (GEMM_MIN_WORK)
    source = f"""
fn f(q: {_ty((b, h, t, d))}, k: {_ty((b, h, t, d))}, v: {_ty((b, h, t, d))})
    -> ({_ty((b, h, t, t))}, {_ty((b, h, t, d))}) {{
  let scores = matmul(mul(q, 0.25), transpose(k, [0, 1, 3, 2]));
  return (scores, matmul(scores, v));
}}"""
    for threads in (1, 2):
        module, text, _ = _with_threads(threads, lambda: _compiled(source))
        assert len(_defined(text, "tilegen.gemm.driver.")) == 1
        assert len(_own_packing(text)) == 2, _own_packing(text)
        rng = np.random.default_rng(threads)
        q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
        scores, weighted = module.f(q, k, v)
        exact = (0.25 * q.astype(np.float64)) @ np.swapaxes(k.astype(np.float64), 2, 3)
        np.testing.assert_allclose(scores, exact, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(weighted, exact @ v.astype(np.float64), rtol=1e-4,
                                   atol=1e-4)
