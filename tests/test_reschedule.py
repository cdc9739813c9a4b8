"""Any schedule the loop-IR verifier accepts computes the program: generated programs'
lowered kernels get random loop kinds, vector widths, thread counts and vectorised
reductions (far more combinations than the schedule passes choose), and each kernel that
verifies is compiled and compared with the reference interpreter."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import interpret, program_from_text
from tilegen import config
from tilegen import loopir as L
from tilegen.loopir_verify import LoopIRVerifyError, verify_kernel
from tilegen.pipeline import KernelPlan, lower, prepare
from tilegen.runtime import jit_module

from .progen import generate_program

WIDTHS = (2, 4, 8, 16)


def _reschedule_expr(expr: L.Expr, draw) -> L.Expr:
    expr = L.map_children(expr, lambda child: _reschedule_expr(child, draw))
    if isinstance(expr, L.Reduce):
        return replace(expr, vector_width=draw(st.sampled_from((0,) + WIDTHS)))
    return expr


def _reschedule(stmt: L.Stmt, draw) -> L.Stmt:
    if isinstance(stmt, L.For):
        body = tuple(_reschedule(s, draw) for s in stmt.body)
        kind = draw(st.sampled_from(("serial", "serial", "vector", "parallel")))
        if kind == "vector":
            return replace(stmt, body=body, kind=kind, width=draw(st.sampled_from(WIDTHS)),
                           threads=draw(st.sampled_from((1, 1, 2))))
        width = 2 if kind == "parallel" else 1
        return replace(stmt, body=body, kind=kind, width=width, threads=1)
    if isinstance(stmt, (L.Let, L.Store)):
        return replace(stmt, value=_reschedule_expr(stmt.value, draw))
    return stmt


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.integers(0, 10**6), st.data())
def test_any_verified_schedule_computes_the_program(seed, data):
    generated = generate_program(np.random.default_rng(seed), 2 + seed % 8)
    program = program_from_text(generated.source)
    options = config.load()
    function = prepare(program, generated.function, options)
    kernel = lower(function, options)
    kernel = replace(kernel, body=tuple(_reschedule(s, data.draw) for s in kernel.body))
    try:
        verify_kernel(kernel)
    except LoopIRVerifyError:
        return  # a schedule the verifier refuses never reaches codegen
    module = jit_module([KernelPlan(function, kernel, options.target, options.stack_bytes)])
    got = getattr(module, generated.function)(*generated.inputs)
    got = got if isinstance(got, tuple) else (got,)
    expected = interpret(program, generated.function, *generated.inputs)
    text = L.format_kernel(kernel)
    for want, have in zip(expected, got, strict=True):
        if want.dtype == np.int64:
            np.testing.assert_array_equal(have, want, err_msg=text)
            continue
        finite = want[np.isfinite(want)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        np.testing.assert_allclose(have, want, rtol=2e-4, atol=2e-5 * scale, equal_nan=True,
                                   err_msg=text)
