"""A parallel region's context holds only the buffers its body reads (tilegen/parallel.py):
storing every buffer of the kernel into every region's context was half of MiniLM's kernel
code, 230 buffers x 63 regions."""

from __future__ import annotations

import re

import numpy as np

from kina_frontend import program_from_text
from tilegen import config, pipeline
from tilegen.api import compile_program

ROWS, COLS = 509, 1031  # odd, and over the 2^18 element operations that go parallel
EXTRA = 20


def _source() -> str:
    big = f"Tensor[F32, [{ROWS}, {COLS}], @host]"
    small = "Tensor[F32, [3], @host]"
    extras = ", ".join(f"e{i}: {small}" for i in range(EXTRA))
    total = " + ".join(f"e{i}" for i in range(EXTRA))
    return (f"fn f(x: {big}, {extras}) -> ({big}, {small}) "
            f"{{ return (exp(x), {total}); }}")


def test_a_region_captures_only_what_it_reads(monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "2")
    program = program_from_text(_source())
    plan = pipeline.plan_program(program, ("f",), config.load())[0]
    text = str(pipeline.codegen([plan]))
    sizes = [int(n) for n in re.findall(r'%"parallel\.ctx(?:\.\d+)?" = alloca i64, i64 (\d+)',
                                        text)]
    assert sizes, "no parallel region"
    # The thread records, then x and the result: not the 20 small inputs and their sum.
    assert max(sizes) == 3, sizes

    module = compile_program(program)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    extras = [rng.standard_normal(3).astype(np.float32) for _ in range(EXTRA)]
    big, small = module.f(x, *extras)
    np.testing.assert_allclose(big, np.exp(x.astype(np.float64)), rtol=3e-7)
    np.testing.assert_allclose(small, np.sum(np.array(extras, np.float64), axis=0), atol=1e-5)
