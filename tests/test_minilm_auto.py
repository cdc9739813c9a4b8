"""`SentenceEncoder(weights="auto")`, the default: which program each padded batch shape
runs (bf16x3 from AUTO_BF16X3_TOKENS tokens where BF16 products run on AMX, F32 otherwise),
that its embeddings are those of the encoder of that weight type, bit for bit, and within
the issue's F32 tolerance of sentence-transformers; that a mix of batch shapes compiles each
shape once; and that without AMX (another target, TILEGEN_BF16_DOT) every shape is F32 and
the encoder says why."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers must not go online

from bench import minilm_data  # noqa: E402
from kina_models.minilm import SentenceEncoder  # noqa: E402
from kina_models.minilm.checkpoint import default_model_dir  # noqa: E402
from kina_models.minilm.encoder import AUTO_BF16X3_TOKENS, bf16_products_on_amx  # noqa: E402

AMX = bf16_products_on_amx()[0]
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


def test_the_threshold_is_past_the_measured_crossover():
    # bf16x3 was about even with F32 at 64 tokens and 17% faster at 128 (docs/models.md).
    assert AUTO_BF16X3_TOKENS == 128


@pytest.mark.parametrize("setting,why", [
    (("TILEGEN_BF16_DOT", "widen"), "TILEGEN_BF16_DOT=widen picks the widen kernel"),
    (("TILEGEN_BF16_DOT", "0"), "TILEGEN_BF16_DOT=0 picks the widen kernel"),
    (("TILEGEN_BF16_DOT", "dot"), "TILEGEN_BF16_DOT=dot picks the dot kernel"),
    (("TILEGEN_TARGET", "x86-64-v3"), "has no amx-tile, amx-bf16"),
])
def test_without_amx_auto_is_f32_and_says_why(setting, why, monkeypatch):
    monkeypatch.setenv(*setting)
    encoder = SentenceEncoder()
    assert not encoder.auto_bf16x3
    assert encoder.program_weights(64, 128) == "f32"
    assert encoder.program_weights(8, 48) == "f32"
    choice = encoder.weight_choice()
    assert choice.startswith("f32 for every batch") and why in choice, choice


def test_weight_choice_names_the_programs(auto_encoder):
    if AMX:
        assert auto_encoder.weight_choice().startswith(
            f"bf16x3 for padded batches of at least {AUTO_BF16X3_TOKENS} tokens, f32 below")
    else:
        assert auto_encoder.weight_choice().startswith("f32 for every batch")
    assert SentenceEncoder(weights="bf16x3").weight_choice() == \
        "bf16x3 for every batch (weights='bf16x3')"


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


@needs_amx
def test_a_mix_of_batch_shapes_compiles_each_shape_once(texts, reference):
    # Batches of 4 sentences sorted by length: padded shapes from 4 x 16 (64 tokens, F32)
    # to 4 x 128 (bf16x3), each compiled on first use and kept; a second encode compiles
    # nothing. Each batch's embeddings are those of its program's encoder.
    encoder = SentenceEncoder()
    compiled: list[tuple[int, int]] = []
    compile_shape = encoder.compile

    def counting(batch, length):
        compiled.append((batch, length))
        return compile_shape(batch, length)
    encoder.compile = counting
    shapes = {batch.ids.shape for batch in encoder.batches(texts, 4)}
    programs = {shape: encoder.program_weights(*shape) for shape in shapes}
    assert set(programs.values()) == {"f32", "bf16x3"}, programs
    got = encoder.encode(texts, batch_size=4)
    assert sorted(compiled) == sorted(shapes)
    assert set(encoder.compiled_shapes) == shapes
    np.testing.assert_array_equal(encoder.encode(texts, batch_size=4), got)
    assert sorted(compiled) == sorted(shapes)
    _check_tolerance(got, reference)
    for weight_type in ("f32", "bf16x3"):
        single = SentenceEncoder(weights=weight_type)
        for batch in single.batches(texts, 4):
            if programs[batch.ids.shape] == weight_type:
                rows = list(batch.rows)
                np.testing.assert_array_equal(got[rows], single.encode(
                    [texts[row] for row in rows], batch_size=4))


def test_the_cli_says_which_program_each_shape_ran_on(capsys):
    from kina_models.minilm.__main__ import main

    assert main(["-v", "a dog", "a cat sat on the mat"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("weights: ")
    assert "batch shape (2, 8): f32" in err  # 16 tokens: below AUTO_BF16X3_TOKENS
