"""BF16 weights: `kina_frontend.precision.bf16_weights` on a small program (against NumPy with
the same roundings), and all-MiniLM-L6-v2 with BF16 Linear weights
(`SentenceEncoder(weights="bf16")`) within cosine 0.9999 of sentence-transformers' float32
embeddings for every sentence."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers must not go online

from bench import minilm_data  # noqa: E402
from kina_frontend import check_source, specialize  # noqa: E402
from kina_frontend.diagnostics import Source  # noqa: E402
from kina_frontend.precision import bf16_weights  # noqa: E402
from kina_frontend.types import DType  # noqa: E402
from kina_models.minilm import SentenceEncoder  # noqa: E402
from kina_models.minilm.checkpoint import default_model_dir  # noqa: E402
from tilegen.api import compile_program  # noqa: E402
from tilegen.gemm_bf16 import amx_usable  # noqa: E402
from tilegen.target import host_target  # noqa: E402

BF16 = ml_dtypes.bfloat16
COSINE_MIN = 0.9999

SMALL = """
fn layer(x: Tensor[F32, [40, 24], @host], w: Tensor[F32, [24, 30], @host],
         b: Tensor[F32, [40, 30], @host]) -> Tensor[F32, [40, 30], @host] {
  return tanh(x @ w + b);
}
fn f(x: Tensor[F32, [40, 24], @host], w: Tensor[F32, [24, 30], @host],
     v: Tensor[F32, [30, 30], @host], b: Tensor[F32, [40, 30], @host])
    -> (Tensor[F32, [40, 30], @host], Tensor[F32, [24, 30], @host]) {
  let h = layer(x, w, b);
  return (layer(x, w, b) + h @ v, w * 2.0);
}
"""


def _rounded(x):
    return x.astype(BF16).astype(np.float64)


def test_bf16_weights_makes_matmul_weights_bf16_and_keeps_the_rest():
    program = specialize(check_source(Source("small.kina", SMALL), {}))
    transformed, names = bf16_weights(program, "f")
    (function,) = transformed.functions
    assert names == ("w", "v")
    assert [p.type.dtype for p in function.params] == [DType.F32, DType.BF16, DType.BF16,
                                                       DType.F32]
    matmuls = [op for op in function.body if op.op == "matmul"]
    assert len(matmuls) == 3 and all(
        op.operands[0].type.dtype is DType.BF16 for op in matmuls)
    # x is rounded once for both of its products
    assert sum(op.op == "cast" and op.operands[0].name == "x" for op in function.body) == 1

    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 24)).astype(np.float32)
    w = rng.standard_normal((24, 30)).astype(np.float32)
    v = rng.standard_normal((30, 30)).astype(np.float32)
    b = rng.standard_normal((40, 30)).astype(np.float32)
    got, doubled = compile_program(transformed).f(x, w.astype(BF16), v.astype(BF16), b)
    h = np.tanh(_rounded(x) @ _rounded(w) + b)
    expected = h + _rounded(h.astype(np.float32)) @ _rounded(v)
    # tanh's f32 h may round to the bf16 next to that of the float64 h: one bf16 ulp
    # (2^-8 relative) per element of h in the second product
    bound = 2.0 ** -8 * np.abs(h) @ np.abs(_rounded(v)) + 1e-4
    assert np.all(np.abs(got - expected) <= bound)
    assert np.array_equal(doubled, w.astype(BF16).astype(np.float32) * 2)  # widened read


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    tokenizer = str(default_model_dir() / "tokenizer.json")
    return (minilm_data.mixed_batch(tokenizer, count=30)
            + list(minilm_data.UNICODE_SENTENCES)[:1]
            + [minilm_data.words(tokenizer, 300, seed=3)])


@pytest.mark.parametrize("dot", [
    pytest.param("amx", marks=pytest.mark.skipif(
        not amx_usable(host_target())[0],
        reason=f"no AMX-BF16 here: {amx_usable(host_target())[1]}")),
    pytest.param("1", marks=pytest.mark.skipif(
        "+avx512bf16" not in host_target().features.split(","), reason="host has no AVX512-BF16")),
    "0"])
def test_minilm_with_bf16_weights_keeps_the_f32_embeddings(sentences, dot, monkeypatch):
    from sentence_transformers import SentenceTransformer

    monkeypatch.setenv("TILEGEN_BF16_DOT", dot)  # read when the encoder compiles
    model = SentenceTransformer(str(default_model_dir()), device="cpu")
    expected = model.encode(sentences, convert_to_numpy=True).astype(np.float64)
    encoder = SentenceEncoder(weights="bf16", length_step=256, short_length_step=256)
    narrow = [w for w in encoder.weights if w.dtype == BF16]
    assert len(narrow) == 6 * 6  # q, k, v, output, intermediate, output dense per layer
    got = encoder.encode(sentences)
    assert encoder.compiled_shapes == ((32, 256),)
    cosine = (got * expected).sum(axis=1) / (np.linalg.norm(got, axis=1)
                                             * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= COSINE_MIN, [(i, float(c)) for i, c in enumerate(cosine)
                                        if c < COSINE_MIN]
    # BF16 really ran: not the float32 embeddings to float32 accuracy
    assert cosine.min() < 1 - 1e-7
    print(f"TILEGEN_BF16_DOT={dot}: worst cosine {cosine.min():.7f}")


def test_unknown_weight_type_is_refused():
    with pytest.raises(ValueError, match="weights must be one of"):
        SentenceEncoder(weights="f16")
