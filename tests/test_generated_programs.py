"""Randomly generated well-typed Kina programs: compiled (JIT and .so) vs the interpreter,
at small sizes and at sizes that take the parallel, packed and fused paths, and their
reverseMode gradients."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kina_frontend import interpret, program_from_text
from tilegen.api import compile_program

from .progen import LARGE, SMALL, Sizes, generate_program

JIT_PROGRAMS = 240
SO_PROGRAMS = 24
LARGE_PROGRAMS = 32
GRADIENT_PROGRAMS = 48


def _check(seed: int, jit: bool, steps: int | None = None, sizes: Sizes = SMALL) -> None:
    generated = generate_program(np.random.default_rng(seed), steps, sizes)
    program = program_from_text(generated.source, f"generated-{seed}.kina")
    expected = interpret(program, generated.function, *generated.inputs)
    function = getattr(compile_program(program, jit=jit), generated.function)
    got = function(*generated.inputs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    if sizes is LARGE:  # threads split these: the same bits on every call all the same
        again = function(*generated.inputs)
        for first, second in zip(got, again if isinstance(again, tuple) else (again,),
                                 strict=True):
            np.testing.assert_array_equal(first, second, err_msg=generated.source)
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


@pytest.mark.parametrize("block", range(4))
def test_generated_programs_at_larger_sizes(block):
    # dims up to 257, tensors up to 300 000 elements: parallel loops, packed products
    per_block = LARGE_PROGRAMS // 4
    for seed in range(20_000 + block * per_block, 20_000 + (block + 1) * per_block):
        _check(seed, jit=True, steps=2 + seed % 13, sizes=LARGE)


def _gradient_program(generated) -> tuple[str, tuple[int, ...]] | None:
    """The generated function's source plus `loss` = sum(first result * c) over every axis
    and `grad` = reverseMode(loss) over its F32 parameters, and c's shape; None when the
    first result is not F32 or no parameter is."""
    header = re.match(r"fn generated\((.*?)\) -> (.*?) \{", generated.source)
    params = re.findall(r"(p\d+): (Tensor\[(\w+), \[([\d, ]*)\], @host\])", header.group(1))
    results = re.findall(r"Tensor\[(\w+), \[([\d, ]*)\], @host\]", header.group(2))
    floats = [name for name, _, dtype, _ in params if dtype == "F32"]
    if results[0][0] != "F32" or not floats:
        return None
    shape = results[0][1]
    declared = ", ".join(f"{name}: {type_}" for name, type_, _, _ in params)
    names = ", ".join(name for name, _, _, _ in params)
    bound = "o0" if len(results) == 1 else f"({', '.join(f'o{i}' for i in range(len(results)))})"
    total = "mul(o0, c)"
    for _ in [d for d in shape.split(",") if d.strip()]:
        total = f"sum({total}, axis=0)"
    c_type = f"Tensor[F32, [{shape}], @host]"
    gradients = ", ".join(["Tensor[F32, [], @host]"] + [
        type_ for name, type_, dtype, _ in params if dtype == "F32"])
    return (generated.source + f"""
fn loss({declared}, c: {c_type}) -> Tensor[F32, [], @host] {{
  let {bound} = generated({names});
  return {total};
}}

fn grad({declared}, c: {c_type}) -> ({gradients}) {{
  return reverseMode(loss, wrt=[{", ".join(floats)}])({names}, c);
}}
""", tuple(int(d) for d in shape.split(",") if d.strip()))


@pytest.mark.parametrize("block", range(4))
def test_generated_gradients_match_the_interpreter(block):
    """reverseMode of generated programs (its transform is checked against finite
    differences in test_autodiff): the compiled gradient program against the interpreter
    running the same transformed program, small sizes and large. One scale for all of a
    program's gradients: a parameter whose gradient cancels to about zero (a layer_norm
    over a broadcast axis) carries the rounding of the others' terms."""
    per_block = GRADIENT_PROGRAMS // 4
    checked = 0
    for seed in range(30_000 + block * per_block, 30_000 + (block + 1) * per_block):
        rng = np.random.default_rng(seed)
        sizes = LARGE if seed % 3 == 0 else SMALL
        generated = generate_program(rng, 2 + seed % 13, sizes)
        made = _gradient_program(generated)
        if made is None:
            continue
        source, c_shape = made
        program = program_from_text(source, f"gradient-{seed}.kina")
        c = rng.standard_normal(c_shape).astype(np.float32)
        inputs = [*generated.inputs, c]
        expected = interpret(program, "grad", *inputs)
        got = compile_program(program).grad(*inputs)
        scale = max(1.0, *(float(np.max(np.abs(w))) for w in expected if w.size))
        for want, have in zip(expected, got, strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-3, atol=1e-4 * scale,
                                       err_msg=source)
        checked += 1
    assert checked >= per_block // 2


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
