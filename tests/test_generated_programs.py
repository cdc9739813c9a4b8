"""Randomly generated well-typed Kina programs: compiled (JIT and .so) vs the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from kina_frontend import interpret, program_from_text
from tilegen.api import compile_program

from .progen import generate_program

JIT_PROGRAMS = 240
SO_PROGRAMS = 24


def _check(seed: int, jit: bool, steps: int | None = None) -> None:
    generated = generate_program(np.random.default_rng(seed), steps)
    program = program_from_text(generated.source, f"generated-{seed}.kina")
    expected = interpret(program, generated.function, *generated.inputs)
    got = getattr(compile_program(program, jit=jit), generated.function)(*generated.inputs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        if want.dtype == np.int64:
            np.testing.assert_array_equal(have, want, err_msg=generated.source)
            continue
        finite = want[np.isfinite(want)]
        scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
        np.testing.assert_allclose(have, want, rtol=2e-4, atol=2e-5 * scale, equal_nan=True,
                                   err_msg=generated.source)


@pytest.mark.parametrize("block", range(12))
def test_generated_programs_jit(block):
    # 12 blocks of 20 programs: 240 programs, 2 to 14 ops each.
    for seed in range(block * 20, block * 20 + 20):
        _check(seed, jit=True, steps=2 + seed % 13)


@pytest.mark.parametrize("seed", range(10_000, 10_000 + SO_PROGRAMS))
def test_generated_programs_shared_library(seed):
    _check(seed, jit=False)


def test_generator_covers_every_op_family():
    seen = set()
    for seed in range(JIT_PROGRAMS):
        seen.update(generate_program(np.random.default_rng(seed), 2 + seed % 13).ops)
    expected = {"add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "transpose",
                "reshape", "broadcast", "sum", "max", "softmax", "log_softmax", "matmul",
                "gather", "one_hot", "argmax", "mean", "min", "relu", "gelu", "gelu_tanh", "erf",
                "sigmoid", "silu", "abs", "maximum", "minimum", "less", "greater", "equal",
                "not_equal", "where", "layer_norm", "rms_norm", "concat", "slice"}
    assert expected <= seen, f"never generated: {sorted(expected - seen)}"
