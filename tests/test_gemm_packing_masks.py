"""Packing without lane masks where they cannot cut anything (tilegen/gemm.py
`depth_mask`, `column_mask`): with N a multiple of the register block's width and every
depth block a whole number of vectors, a product's own packing loops (a transposed B,
packed through in-register transposes) load and store whole vectors (the masks cost as
many instructions as the loads they guard, and a masked load is slower); otherwise they
keep their masks. Plain row-major operands have no packing of their own: the module's
shared copy loops (tilegen/gemm_driver.py) choose between whole and masked vectors at run
time. Results against float64 NumPy either way, one and two threads."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kina_frontend import program_from_text
from tilegen import config, pipeline
from tilegen.api import compile_program


def _ty(shape):
    return f"Tensor[F32, [{', '.join(str(d) for d in shape)}], @host]"


def _source(m, k, n, transposed):
    if transposed:  # B read along k: x @ w^T, packed by transposing 16 x 16 blocks
        return (f"fn f(a: {_ty((m, k))}, w: {_ty((n, k))}) -> {_ty((m, n))} "
                "{ return matmul(a, transpose(w, [1, 0])); }")
    return f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n))} {{ return a @ b; }}"


def _packing_masked_loads(source) -> tuple[int, str]:
    """Masked loads in the product's own functions (not the module's shared micro-kernels,
    which mask their stores into C, driver and copy loops), and the module's text."""
    (plan,) = pipeline.plan_program(program_from_text(source), None, config.load())
    text = str(pipeline.codegen([plan]))
    count = 0
    for match in re.finditer(r'^define [^\n]*@"([^"]+)"\((.*?)^\}', text, re.M | re.S):
        if not match.group(1).startswith("tilegen.gemm."):
            count += match.group(2).count("llvm.masked.load")
    return count, text


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n,whole", [(64, 512, 96, True), (100, 48, 64, True),
                                         (64, 40, 96, False), (64, 512, 70, False)])
def test_packing_masks_only_where_they_cut(m, k, n, whole, transposed, threads,
                                           monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    source = _source(m, k, n, transposed)
    masked, text = _packing_masked_loads(source)
    if transposed:
        assert (masked == 0) == whole, masked
    else:
        assert masked == 0
        assert ".packa" not in text and ".packb" not in text
        assert "tilegen.gemm.pack_a." in text and "tilegen.gemm.pack_b." in text
    module = compile_program(program_from_text(source))
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    got = module.f(a, b)
    b64 = b.astype(np.float64).T if transposed else b.astype(np.float64)
    exact = a.astype(np.float64) @ b64
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(k) * (np.abs(a) @ np.abs(b64))
    assert np.all(np.abs(got - exact) <= bound + 1e-30)
