"""`SentenceEncoder(weights="auto")`, the default: which program each padded batch shape
runs (bf16x3 from AUTO_BF16X3_TOKENS tokens where BF16 products run on AMX, F32 otherwise),
that its embeddings are those of the encoder of that weight type, bit for bit, and within
the issue's F32 tolerance of sentence-transformers."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers must not go online

from bench import minilm_data  # noqa: E402
from kina_models.minilm import SentenceEncoder  # noqa: E402
from kina_models.minilm.checkpoint import default_model_dir  # noqa: E402
from kina_models.minilm.encoder import AUTO_BF16X3_TOKENS, _bf16_products_on_amx  # noqa: E402

AMX = _bf16_products_on_amx()
needs_amx = pytest.mark.skipif(not AMX, reason="BF16 products do not run on AMX here")


@pytest.fixture(scope="module")
def auto_encoder():
    return SentenceEncoder()


def test_the_default_is_auto(auto_encoder):
    assert auto_encoder.weight_type == "auto"
    assert auto_encoder.auto_bf16x3 is AMX
    # Only the F32 weights are built until a shape needs the stacks.
    assert all(w.dtype == np.float32 for w in auto_encoder.weights)


def test_shapes_choose_by_token_count(auto_encoder):
    small = (1, 16)
    large = (AUTO_BF16X3_TOKENS // 16, 16)
    assert auto_encoder.program_weights(*small) == "f32"
    assert auto_encoder.program_weights(large[0] - 1, 16) == "f32"
    assert auto_encoder.program_weights(*large) == ("bf16x3" if AMX else "f32")
    for weight_type in ("f32", "bf16", "bf16x3"):
        assert SentenceEncoder(weights=weight_type).program_weights(*large) == weight_type


def test_without_amx_auto_is_f32(monkeypatch):
    monkeypatch.setenv("TILEGEN_BF16_DOT", "widen")  # BF16 products off the AMX tiles
    encoder = SentenceEncoder()
    assert not encoder.auto_bf16x3
    assert encoder.program_weights(64, 128) == "f32"


@pytest.fixture(scope="module")
def texts():
    # 29 texts of 3-120 tokens: one batch, padded past AUTO_BF16X3_TOKENS tokens.
    return minilm_data.mixed_batch(str(default_model_dir() / "tokenizer.json"), count=29)


@pytest.fixture(scope="module")
def reference(texts):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(default_model_dir()), device="cpu")
    return model.encode(texts, batch_size=32, convert_to_numpy=True)


def _check_tolerance(got, expected):
    cosine = np.sum(got * expected, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= 0.99999, cosine.min()
    assert np.abs(got - expected).max() <= 1e-4


@needs_amx
def test_a_large_batch_runs_bf16x3_and_a_sentence_f32(auto_encoder, texts, reference):
    (batch,) = auto_encoder.batches(texts, 32)
    assert batch.ids.size >= AUTO_BF16X3_TOKENS
    assert auto_encoder.program_weights(*batch.ids.shape) == "bf16x3"
    got = auto_encoder.encode(texts)
    bf16x3 = SentenceEncoder(weights="bf16x3").encode(texts)
    np.testing.assert_array_equal(got, bf16x3)
    _check_tolerance(got, reference)

    one = auto_encoder.encode(texts[0])
    np.testing.assert_array_equal(one, SentenceEncoder(weights="f32").encode(texts[0]))
    _check_tolerance(one[None], reference[:1])
    assert {auto_encoder.program_weights(*s) for s in auto_encoder.compiled_shapes} == {
        "f32", "bf16x3"}
