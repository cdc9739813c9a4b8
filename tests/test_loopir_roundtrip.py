"""The loop-nest IR printer round-trips: parse(print(kernel)) == kernel, for the examples'
kernels (gemm, parallel and vector loops, id checks, reductions) and generated programs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import load_program, program_from_text, specialize
from tilegen import config
from tilegen.loopir import format_kernel
from tilegen.loopir_parse import LoopIRParseError, parse_kernel
from tilegen.pipeline import plan_program

from .progen import generate_program

EXAMPLES = ["storylm0_forward", "storylm0_rollout", "storylm0_nll_step",
            "examples/bench/storylm_scaled.kina"]


def _round_trip(kernel) -> None:
    text = format_kernel(kernel)
    parsed = parse_kernel(text)
    assert format_kernel(parsed) == text
    assert parsed == kernel


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_kernels_round_trip(example):
    program = specialize(load_program(example))
    for plan in plan_program(program, None, config.load()):
        _round_trip(plan.kernel)


@pytest.mark.parametrize("seed", range(40))
def test_generated_kernels_round_trip(seed):
    generated = generate_program(np.random.default_rng(seed + 500), 2 + seed % 10)
    program = program_from_text(generated.source)
    for plan in plan_program(program, None, config.load()):
        _round_trip(plan.kernel)


def test_malformed_text_is_a_clear_error():
    with pytest.raises(LoopIRParseError, match="expected"):
        parse_kernel("kernel @k\n  input x: f32[4]\n{\n  out[0] = \n")
    with pytest.raises(LoopIRParseError, match="unknown buffer"):
        parse_kernel("kernel @k\n  output o: f32[2]\n{\n  o[0] = y[0]\n}\n")


def test_malformed_text_is_a_kina_error_at_a_line_and_column():
    from kina_frontend import KinaError

    with pytest.raises(KinaError) as info:
        parse_kernel("kernel @k\n  output o: f32[2]\n{\n  o[0] = y[0]\n}\n")
    assert (info.value.code, info.value.line, info.value.column) == ("K750", 4, 10)
    with pytest.raises(KinaError) as info:
        parse_kernel("kernel @k\n  output o: f32[2]\n{\n  for i in 0..99999999999999999999 {\n")
    assert (info.value.line, info.value.column) == (4, 15)


_SEED_KERNELS = [format_kernel(plan.kernel) for plan in
                 plan_program(specialize(load_program("storylm0_forward")), None, config.load())]


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_loop_ir_parses_or_is_a_located_kina_error(data):
    from kina_frontend import KinaError
    from tests.irfuzz import _mutate

    text = data.draw(st.sampled_from(_SEED_KERNELS))
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(data.draw, text)
    try:
        parse_kernel(text)
    except KinaError as error:
        assert error.line is not None and error.column is not None, str(error)
