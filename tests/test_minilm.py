"""all-MiniLM-L6-v2 in Kina (kina_models.minilm) against sentence-transformers.

The oracle is sentence-transformers itself (torch, loading the same folder offline); an
independent NumPy float64 model (tests/minilm_reference.py) checks the weight mapping and
the padding rule on its own. The compiled encoder must agree with sentence-transformers
for every sentence (cosine >= 0.99999, max |difference| <= 1e-4), in-process and through a
shared library, and the fine-tuning gradients of the Kina program must agree with torch
autograd for every weight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers must not go online

from bench import minilm_data  # noqa: E402
from kina_models.minilm import WEIGHT_NAMES, ModelFileError, SentenceEncoder  # noqa: E402
from kina_models.minilm.checkpoint import (  # noqa: E402
    default_model_dir,
    expected_shapes,
    is_linear_weight,
)
from kina_models.minilm.tokens import (  # noqa: E402
    batch_rows,
    bucket,
    load_tokenizer,
    make_batches,
    padded_length,
)
from tests import minilm_reference  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = default_model_dir()
PROGRAM_PATH = REPO / "examples" / "minilm_l6.kina"
TOKENIZER_JSON = str(MODEL_DIR / "tokenizer.json")
LONG_TEXT = minilm_data.words(TOKENIZER_JSON, 5000, seed=5000)  # truncated to 256 tokens
COSINE_MIN = 0.99999
ABS_MAX = 1e-4


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(MODEL_DIR), device="cpu")


@pytest.fixture(scope="module")
def tensors():
    from safetensors.numpy import load_file
    return load_file(MODEL_DIR / "model.safetensors")


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    """Every token count 2..260, the unicode cases and a 5 000-token text."""
    return (minilm_data.sentences_of_every_length(TOKENIZER_JSON)
            + list(minilm_data.UNICODE_SENTENCES) + [LONG_TEXT])


def assert_matches(actual: np.ndarray, expected: np.ndarray, sentences: list[str]) -> None:
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    cosine = (actual.astype(np.float64) * expected).sum(axis=1) / (
        np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1))
    worst = np.abs(actual - expected).max(axis=1)
    bad = [(i, float(cosine[i]), float(worst[i]), sentences[i][:40])
           for i in range(len(sentences)) if cosine[i] < COSINE_MIN or worst[i] > ABS_MAX]
    assert not bad, f"{len(bad)} sentences differ (index, cosine, max |diff|, text): {bad[:5]}"


# ---------------------------------------------------------------------------- tokens


def test_tokens_are_those_of_sentence_transformers(st_model, corpus):
    ours = load_tokenizer(MODEL_DIR / "tokenizer.json", 256).encode_batch(corpus)
    theirs = st_model.preprocess(corpus)
    lengths = theirs["attention_mask"].sum(dim=1).tolist()
    for index, (encoding, length) in enumerate(zip(ours, lengths, strict=True)):
        for key, values in (("input_ids", encoding.ids), ("token_type_ids", encoding.type_ids),
                            ("attention_mask", encoding.attention_mask)):
            assert values == theirs[key][index, :length].tolist(), (index, key)
    assert max(lengths) == 256 and len(ours[-1].ids) == 256  # truncated like theirs
    assert [len(e.ids) for e in ours[:255]] == list(range(2, 257))  # every length


def test_one_text_is_tokenized_as_in_a_batch(encoder, st_model, corpus):
    """A single text takes `Tokenizer.encode` (no thread pool), which must give the ids,
    token types and mask sentence-transformers gives it: the short, unicode, empty and
    truncated texts one by one."""
    for text in [corpus[0], corpus[40], *minilm_data.UNICODE_SENTENCES[:4], "", LONG_TEXT]:
        (batch,) = encoder.batches([text], 32)
        theirs = st_model.preprocess([text])
        length = int(theirs["attention_mask"].sum())
        # multiples of 4 up to 32 tokens, of 16 beyond (the default steps)
        padded = -(-length // 4) * 4 if length <= 32 else min(-(-length // 16) * 16, 256)
        assert batch.ids.shape == (1, padded), text[:40]
        for ours, key in ((batch.ids, "input_ids"), (batch.type_ids, "token_type_ids"),
                          (batch.mask, "attention_mask")):
            assert ours[0, :length].tolist() == theirs[key][0, :length].tolist(), key
            assert not ours[0, length:].any()


def test_buckets_and_batches():
    assert [bucket(n, 16, 256) for n in (1, 2, 16, 17, 255, 256)] == [16, 16, 16, 32, 256, 256]
    assert bucket(250, 16, 250) == 250
    assert [padded_length(n, 16, 4, 256) for n in (1, 4, 5, 12, 13, 32, 33, 47, 48, 255)] \
        == [4, 4, 8, 12, 16, 32, 48, 48, 48, 256]
    assert padded_length(250, 16, 4, 250) == 250 and padded_length(7, 16, 16, 256) == 16
    assert [batch_rows(n, 32) for n in (1, 2, 3, 5, 17, 32)] == [1, 2, 4, 8, 32, 32]
    assert batch_rows(13, 12) == 12

    class Encoding:
        def __init__(self, n):
            self.ids = list(range(100, 100 + n))
            self.type_ids = [0] * n
            self.attention_mask = [1] * n

    lengths = [5, 40, 3, 17, 2, 256, 9]
    batches = make_batches([Encoding(n) for n in lengths], 4, 16, 256)
    assert [b.rows for b in batches] == [(5, 1, 3, 6), (0, 2, 4)]   # longest first
    assert [b.ids.shape for b in batches] == [(4, 256), (4, 16)]    # one padding row
    assert [b.ids.shape for b in make_batches([Encoding(n) for n in lengths], 3, 16, 256)] \
        == [(3, 256), (3, 16), (1, 16)]
    assert [b.ids.shape for b in make_batches([Encoding(n) for n in lengths], 3, 16, 256, 4)] \
        == [(3, 256), (3, 12), (1, 4)]
    for batch in batches:
        for row, index in enumerate(batch.rows):
            n = lengths[index]
            assert batch.mask[row].tolist() == [1] * n + [0] * (batch.ids.shape[1] - n)
            assert batch.ids[row, :n].tolist() == list(range(100, 100 + n))
            assert not batch.ids[row, n:].any() and not batch.type_ids[row].any()
        assert not batch.mask[len(batch.rows):].any()   # padding rows are all padding


# ---------------------------------------------------------------------------- the weights


def test_reference_matches_sentence_transformers(st_model, tensors):
    """The NumPy model reads the checkpoint as BERT does: the mapping the program relies on
    (and the padding rule: a sentence's embedding does not depend on its batch)."""
    sentences = ["", "a", "Hello, world!", minilm_data.words(TOKENIZER_JSON, 60, seed=1),
                 "Crème brûlée 東京 🙂", minilm_data.words(TOKENIZER_JSON, 7, seed=2)]
    features = st_model.preprocess(sentences)
    ids, type_ids, mask = (features[k].numpy() for k in
                           ("input_ids", "token_type_ids", "attention_mask"))
    extra = np.zeros((len(sentences), 11), np.int64)          # more padding than needed
    ours = minilm_reference.encode(tensors, *(np.hstack([a, extra])
                                              for a in (ids, type_ids, mask)))
    theirs = st_model.encode(sentences, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=2e-6)


def test_weights_are_read_in_program_order(tensors):
    encoder = SentenceEncoder()
    assert len(encoder.weights) == len(WEIGHT_NAMES) == 101
    shapes = expected_shapes(encoder.config)
    transposed = 0
    for name, array in zip(WEIGHT_NAMES, encoder.weights, strict=True):
        stored = tensors[name]
        assert stored.shape == shapes[name]
        if is_linear_weight(name):   # the program takes Linear weights as [in, out]
            stored = stored.T
            transposed += 1
        np.testing.assert_array_equal(array, stored)
        assert array.dtype == np.float32 and array.flags.c_contiguous
        # in one huge-page arena (kina_models/arena.py), each on a page boundary
        assert array.ctypes.data % 4096 == 0 and not array.flags.writeable
    assert transposed == 6 * 6
    assert len({id(array.base) for array in encoder.weights}) == 1


# ---------------------------------------------------------------------------- bad folders


def _model_copy(tmp_path: Path) -> Path:
    """A folder of links to the model's files (edits replace a link, never the package)."""
    folder = tmp_path / "model"
    for path in MODEL_DIR.rglob("*"):
        if path.is_file():
            target = folder / path.relative_to(MODEL_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    return folder


def _edit_json(key: str, value):
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config[key] = value
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(json.dumps(config))
    return edit


def _replace(name: str, data: bytes | None):
    def edit(folder: Path) -> None:
        (folder / name).unlink()
        if data is not None:
            (folder / name).write_bytes(data)
    return edit


def _truncate(name: str, size: int):
    def edit(folder: Path) -> None:
        data = (MODEL_DIR / name).read_bytes()[:size]
        _replace(name, data)(folder)
    return edit


def _edit_tensors(change):
    def edit(folder: Path) -> None:
        from safetensors.numpy import load_file, save_file
        tensors = load_file(MODEL_DIR / "model.safetensors")
        change(tensors)
        (folder / "model.safetensors").unlink()
        save_file(tensors, folder / "model.safetensors")
    return edit


def _set_tensor(name: str, value: np.ndarray):
    def change(tensors):
        tensors[name] = value
    return change


BAD_FOLDERS = {
    "no config": (_replace("config.json", None), "config.json: missing"),
    "config not JSON": (_replace("config.json", b"{nope"), "config.json: is not valid JSON"),
    "config binary": (_replace("config.json", b"\xff\xfe\x00"), "config.json: cannot be read"),
    "other width": (_edit_json("hidden_size", 768), "config.json: 'hidden_size' is 768"),
    "other activation": (_edit_json("hidden_act", "relu"), "'hidden_act' is 'relu'"),
    "bad vocab": (_edit_json("vocab_size", "many"), "'vocab_size' must be a positive integer"),
    "no sbert config": (_replace("sentence_bert_config.json", None),
                        "sentence_bert_config.json: missing"),
    "too long": (_replace("sentence_bert_config.json", b'{"max_seq_length": 1000}'),
                 "max_seq_length 1000 exceeds the 512 position embeddings"),
    "cls pooling": (_replace("1_Pooling/config.json", b'{"pooling_mode_cls_token": true}'),
                    "1_Pooling/config.json: pooling ['pooling_mode_cls_token']"),
    "no normalize": (_replace("modules.json", json.dumps(
        [{"type": "sentence_transformers.models.Transformer"},
         {"type": "sentence_transformers.models.Pooling"}]).encode()),
        "modules.json: has no Normalize module"),
    "no tokenizer": (_replace("tokenizer.json", None), "tokenizer.json: missing"),
    "bad tokenizer": (_truncate("tokenizer.json", 5000),
                      "tokenizer.json: is not a readable tokenizer file"),
    "no weights": (_replace("model.safetensors", None), "model.safetensors: missing"),
    "truncated weights": (_truncate("model.safetensors", 100_000),
                          "model.safetensors: is not a readable safetensors file"),
    "garbage weights": (_replace("model.safetensors", b"garbage"),
                        "model.safetensors: is not a readable safetensors file"),
    "missing tensor": (_edit_tensors(lambda t: t.pop("encoder.layer.3.output.dense.bias")),
                       "has no tensor 'encoder.layer.3.output.dense.bias'"),
    "wrong shape": (_edit_tensors(_set_tensor("encoder.layer.0.attention.self.key.weight",
                                              np.zeros((384, 383), np.float32))),
                    "'encoder.layer.0.attention.self.key.weight' has shape (384, 383)"),
    "half precision": (_edit_tensors(_set_tensor("embeddings.LayerNorm.bias",
                                                 np.zeros(384, np.float16))),
                       "'embeddings.LayerNorm.bias' is float16, not float32"),
    "nan": (_edit_tensors(_set_tensor("embeddings.LayerNorm.weight",
                                      np.full(384, np.nan, np.float32))),
            "'embeddings.LayerNorm.weight' holds NaN"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_bad_model_files_are_named(tmp_path, case):
    edit, message = BAD_FOLDERS[case]
    folder = _model_copy(tmp_path)
    edit(folder)
    with pytest.raises(ModelFileError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")) as raised:
        SentenceEncoder(folder)
    assert str(raised.value).startswith(str(folder))


def test_not_a_folder(tmp_path):
    with pytest.raises(ModelFileError, match="is not a model folder"):
        SentenceEncoder(tmp_path / "absent")


# ---------------------------------------------------------------------------- compiled



@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A TILEGEN_CACHE_DIR for this module: shapes compiled here are on disk for the CLI's
    process (and the disk path of the encoder's compiles is exercised)."""
    folder = tmp_path_factory.mktemp("tilegen-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TILEGEN_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def whole_lengths():
    """Steps of 256 tokens: the corpus (every length 0-256 and past it) is batches of 32
    texts padded to T = 256, one compiled shape, and the short texts' batches are mostly
    padding."""
    return SentenceEncoder(length_step=256, short_length_step=256)


@pytest.fixture(scope="module")
def encoder(compile_cache):
    return SentenceEncoder()


@pytest.fixture(scope="module")
def corpus_embeddings(st_model, corpus):
    return st_model.encode(corpus, convert_to_numpy=True)


def test_encode_matches_sentence_transformers(whole_lengths, corpus, corpus_embeddings):
    shuffled = np.random.default_rng(15).permutation(len(corpus))
    texts = [corpus[i] for i in shuffled]
    ours = whole_lengths.encode(texts)
    assert_matches(ours, corpus_embeddings[shuffled], texts)
    assert whole_lengths.compiled_shapes == ((32, 256),)


SHORT_TEXTS = ["", "a", "Hello, world!", minilm_data.words(TOKENIZER_JSON, 10, seed=3)]


def test_default_buckets_match(encoder, st_model):
    ours = encoder.encode(SHORT_TEXTS)
    assert_matches(ours, st_model.encode(SHORT_TEXTS, convert_to_numpy=True), SHORT_TEXTS)
    longest = int(st_model.preprocess(SHORT_TEXTS)["attention_mask"].sum(axis=1).max())
    assert longest == 12  # ten one-token words and [CLS], [SEP]: padded to 12, not 16
    assert (4, 12) in encoder.compiled_shapes
    assert any(compile_cache_entries(encoder))


def compile_cache_entries(encoder):
    return Path(os.environ["TILEGEN_CACHE_DIR"]).rglob("*")


def test_encode_forms(encoder, st_model):
    single = encoder.encode(SHORT_TEXTS[2])
    assert single.shape == (384,) and single.dtype == np.float32
    np.testing.assert_array_equal(single, encoder.encode([SHORT_TEXTS[2]])[0])
    assert encoder.encode([]).shape == (0, 384)
    ours = encoder.encode(SHORT_TEXTS, batch_size=1)
    assert_matches(ours, st_model.encode(SHORT_TEXTS, convert_to_numpy=True), SHORT_TEXTS)
    with pytest.raises(TypeError, match=r"sentences\[1\] is int"):
        encoder.encode(["a", 3])
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        encoder.encode(["a"], batch_size=0)


@pytest.mark.parametrize("steps, message", [
    ({"length_step": 0}, "length_step must be a positive integer"),
    ({"short_length_step": 0}, "short_length_step must be an integer from 1 to length_step"),
    ({"length_step": 8, "short_length_step": 16}, r"from 1 to length_step \(8\), got 16"),
    ({"short_length_step": True}, "short_length_step must be an integer"),
])
def test_bad_length_steps_are_refused(steps, message):
    with pytest.raises(ValueError, match=message):
        SentenceEncoder(**steps)


def test_shapes_are_compiled_once(encoder):
    encoder.encode(SHORT_TEXTS)
    before = dict(encoder._compiled)
    encoder.encode(list(reversed(SHORT_TEXTS)))
    assert encoder._compiled == before
    assert encoder.function(4, 12) is before[4, 12][0]  # (function, its weights)


def test_shared_library_matches(st_model):
    encoder = SentenceEncoder(jit=False, length_step=64)
    texts = [minilm_data.words(TOKENIZER_JSON, n, seed=n) for n in (0, 1, 3, 10, 30, 61)]
    texts += ["Übergrößenträger 東京 🙂", ""]
    ours = encoder.encode(texts)
    assert_matches(ours, st_model.encode(texts, convert_to_numpy=True), texts)
    assert encoder.compiled_shapes == ((8, 64),)


def test_cli_prints_the_similarity_matrix(encoder, compile_cache):
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.",
             "Stock markets fell sharply today."]
    encoder.function(*encoder.batches(texts, 32)[0].ids.shape)  # on disk for the CLI
    result = subprocess.run(
        [sys.executable, "-m", "kina_models.minilm", *texts],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    matrix = np.array([[float(v) for v in row[1:4]] for row in rows])
    np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-4)
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-4)
    assert matrix[0, 1] > matrix[0, 2] + 0.2     # the paraphrase is the closer one


def test_cli_takes_the_weight_type(encoder, capsys):
    from kina_models.minilm.__main__ import main

    texts = ["A cat sits on the mat.", "Stock markets fell sharply today."]
    assert main(["--weights", "bf16x3", *texts]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    shown = np.array([[float(v) for v in row[1:3]] for row in rows])
    embeddings = encoder.encode(texts)
    np.testing.assert_allclose(shown, embeddings @ embeddings.T, atol=2e-4)  # 4 decimals
    with pytest.raises(SystemExit):
        main(["--weights", "f16", "x"])


def test_cli_names_a_bad_folder(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kina_models.minilm", "--model-dir", str(tmp_path), "x"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert f"{tmp_path / 'config.json'}: missing" in result.stderr


# ---------------------------------------------------------------------------- fine-tuning


def _torch_contrastive_gradients(st_model, batch, partners):
    """The same loss in torch, on sentence-transformers' BertModel; the gradients in the
    program's layout (Linear weights as [in, out])."""
    import torch
    bert = st_model[0].auto_model
    parameters = dict(bert.named_parameters())
    ids, type_ids, mask = (torch.from_numpy(a) for a in (batch.ids, batch.type_ids, batch.mask))
    bert.zero_grad()
    tokens = bert(input_ids=ids, token_type_ids=type_ids, attention_mask=mask)[0]
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1)
    scores = embeddings @ embeddings.T * 20.0
    itself = torch.eye(len(partners), dtype=torch.bool)
    loss = torch.nn.functional.cross_entropy(scores.masked_fill(itself, -1e9),
                                             torch.from_numpy(partners))
    loss.backward()
    grads = []
    for name in WEIGHT_NAMES:
        grad = parameters[name].grad.numpy()
        grads.append((grad.T if is_linear_weight(name) else grad).copy())
    bert.zero_grad()
    return float(loss.detach()), grads


FINETUNE_PAIRS = [("A man is playing a guitar.", "Someone strums a guitar."),
                  ("The weather is cold today.", "It is freezing outside."),
                  ("How do I bake bread?", "A simple bread recipe for beginners."),
                  ("Cats", "A small kitten sleeps.")]


def _finetune_gradients(encoder, mode: str, batch, partners):
    """contrastive_gradients of examples/minilm_l6.kina, compiled or interpreted."""
    consts = encoder.consts(*batch.ids.shape)
    args = (batch.ids, batch.type_ids, batch.mask, partners, *encoder.weights)
    if mode == "interpreter":
        from kina_frontend import check_source, interpret, load_source, specialize
        program = specialize(check_source(load_source(PROGRAM_PATH), consts))
        return interpret(program, "contrastive_gradients", *args)
    import tilegen
    module = tilegen.compile_file(PROGRAM_PATH, consts=consts,
                                  functions=("contrastive_gradients",))
    return module.contrastive_gradients(*args)


# The interpreter runs the reverseMode transform's tensor IR with each op's NumPy rule; the
# compiled step is that IR through tilegen, one function for the whole backward pass of six
# layers (2.1 MB of LLVM IR with the layers' repeated statements shared: a few seconds).
@pytest.mark.parametrize("mode", ["interpreter", "compiled"])
def test_finetune_gradients_match_torch(st_model, encoder, mode):
    """One contrastive fine-tuning step's gradients for all 101 weights by reverseMode."""
    texts = [text for pair in FINETUNE_PAIRS for text in pair]
    (batch,) = encoder.batches(texts, 8)
    longest = max(len(encoder.tokenizer.encode(text).ids) for text in texts)
    assert batch.ids.shape == (8, -(-longest // 4) * 4)
    # Batch rows are in length order: row r's partner is the row of its pair's other text.
    row_of = {index: row for row, index in enumerate(batch.rows)}
    partners = np.array([row_of[index ^ 1] for index in batch.rows], np.int64)
    loss, *grads = _finetune_gradients(encoder, mode, batch, partners)
    expected_loss, expected_grads = _torch_contrastive_gradients(st_model, batch, partners)
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-4)
    assert len(grads) == len(WEIGHT_NAMES)
    largest = max(float(np.abs(g).max()) for g in expected_grads)
    for name, ours, theirs in zip(WEIGHT_NAMES, grads, expected_grads, strict=True):
        assert ours.dtype == np.float32 and ours.shape == theirs.shape, name
        if name.endswith("attention.self.key.bias"):
            # q . bk is the same for every key of a query, and softmax ignores a shift:
            # the exact gradient is 0, both sides hold rounding noise.
            assert float(np.abs(ours).max()) <= 1e-6 * largest, name
            continue
        scale = float(np.abs(theirs).max())
        assert scale > 1e-6 * largest, name
        error = float(np.abs(ours - theirs).max())
        assert error <= 1e-4 * scale, f"{name}: max |error| {error:.3g}, largest {scale:.3g}"
