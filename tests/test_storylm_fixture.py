"""The StoryLM-0 fixture: recipe values, reproducible bytes, and the validating loader."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storylm import fixture
from storylm.fixture import FixtureError

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "fixtures" / "storylm0"
FILES = ("manifest.json", "checkpoint.npz", "vocab.json", "corpus.json")
# (recipe index k, rows, cols) straight from BRIEF section 3
RECIPE = {"embed": (0, 8, 4), "wq": (1, 4, 4), "wk": (2, 4, 4), "wv": (3, 4, 4),
          "wo": (4, 4, 4), "lm_head": (5, 4, 8)}
BRIEF_VOCAB = ["<pad>", "once", "upon", "a", "time", "the", "end", "<unk>"]


def recipe_value(k: int, i: int, j: int) -> float:
    return (((3 * i + 5 * j + 7 * k + 1) % 9) - 4) / 8


# --------------------------------------------------------------------------- recipe values


def test_checkpoint_weights_equal_the_recipe():
    checkpoint = fixture.load_checkpoint(COMMITTED)
    for name, (k, rows, cols) in RECIPE.items():
        array = getattr(checkpoint, name)
        assert array.dtype == np.float32 and array.shape == (rows, cols), name
        for i in range(rows):
            for j in range(cols):
                assert array[i, j] == recipe_value(k, i, j), (name, i, j)


def test_checkpoint_scale_is_inverse_sqrt_head_dim():
    scale = fixture.load_checkpoint(COMMITTED).scale
    assert scale.dtype == np.float32 and scale.shape == (1, 1, 1, 1)
    assert scale[0, 0, 0, 0] == np.float32(1 / math.sqrt(2))


@given(k=st.integers(0, 30), rows=st.integers(1, 12), cols=st.integers(1, 12))
def test_patterned_weight_formula(k, rows, cols):
    weight = fixture.patterned_weight(k, rows, cols)
    expected = [[recipe_value(k, i, j) for j in range(cols)] for i in range(rows)]
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(weight, np.array(expected, dtype=np.float32))


@given(length=st.integers(1, 40))
def test_causal_mask(length):
    mask = fixture.causal_mask(length)
    assert mask.dtype == np.float32 and mask.shape == (1, 1, length, length)
    for i in range(length):
        for j in range(length):
            assert mask[0, 0, i, j] == (0.0 if j <= i else np.float32(-1e9))


def test_json_files_hold_the_brief_contents():
    manifest = json.loads((COMMITTED / "manifest.json").read_text())
    assert manifest == {
        "format": "storylm0-checkpoint-v0",
        "widths": {"B": 1, "H": 2, "Dh": 2, "D": 4, "V": 8},
        "vocab": BRIEF_VOCAB,
        "files": {"checkpoint": "checkpoint.npz", "vocab": "vocab.json",
                  "corpus": "corpus.json"},
    }
    vocab = json.loads((COMMITTED / "vocab.json").read_text())
    assert vocab == {"format": "storylm0-vocab-v0", "tokens": BRIEF_VOCAB}
    corpus = json.loads((COMMITTED / "corpus.json").read_text())
    assert corpus == {"format": "storylm0-corpus-v0", "windows": [
        {"ids": [1, 2, 3, 4], "targets": [2, 3, 4, 5]},
        {"ids": [2, 3, 4, 5], "targets": [3, 4, 5, 6]},
        {"ids": [3, 4, 5, 6], "targets": [4, 5, 6, 1]},
    ]}


def test_loaders_return_the_fixture():
    checkpoint = fixture.load_checkpoint(COMMITTED)
    assert checkpoint.vocab == tuple(BRIEF_VOCAB)
    assert checkpoint.widths == fixture.Widths(batch=1, heads=2, head_dim=2, model_dim=4,
                                               vocab_size=8)
    assert list(checkpoint.arrays()) == ["embed", "wq", "wk", "wv", "wo", "lm_head", "scale"]
    assert fixture.load_vocab(COMMITTED) == tuple(BRIEF_VOCAB)
    assert fixture.load_vocab(COMMITTED / "vocab.json") == tuple(BRIEF_VOCAB)
    windows = fixture.load_corpus(COMMITTED)
    assert windows == fixture.load_corpus(COMMITTED / "corpus.json")
    assert [(w.ids, w.targets) for w in windows] == [
        ((1, 2, 3, 4), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 4, 5, 6)), ((3, 4, 5, 6), (4, 5, 6, 1))]
    assert windows[0].id_array().dtype == np.int64 and windows[0].id_array().shape == (1, 4)


def test_checkpoint_arrays_are_read_only():
    checkpoint = fixture.load_checkpoint(COMMITTED)
    with pytest.raises(ValueError):
        checkpoint.wq[0, 0] = 1.0


def test_plain_numpy_reads_the_checkpoint():
    with np.load(COMMITTED / "checkpoint.npz", allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted(fixture.CHECKPOINT_NAMES)
        np.testing.assert_array_equal(archive["lm_head"], fixture.patterned_weight(5, 4, 8))


# --------------------------------------------------------------------------- reproducibility


def test_regenerating_is_byte_identical(tmp_path):
    first = fixture.write_fixture(tmp_path / "first")
    second = fixture.write_fixture(tmp_path / "second")
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
        assert (first / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    assert sorted(p.name for p in first.iterdir()) == sorted(FILES)  # no temp files left


def run_make_fixtures(*args: str) -> subprocess.CompletedProcess[str]:
    script = REPO_ROOT / "scripts" / "make_fixtures.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          check=False)


def test_make_fixtures_check_passes_on_the_committed_files():
    result = run_make_fixtures("--check")
    assert result.returncode == 0, result.stderr


def test_make_fixtures_check_fails_on_a_changed_file(tmp_path):
    folder = tmp_path / "storylm0"
    assert run_make_fixtures("--out", str(folder)).returncode == 0
    assert run_make_fixtures("--check", "--out", str(folder)).returncode == 0
    (folder / "vocab.json").write_bytes((folder / "vocab.json").read_bytes() + b" ")
    result = run_make_fixtures("--check", "--out", str(folder))
    assert result.returncode == 1
    assert "vocab.json" in result.stderr


# --------------------------------------------------------------------------- rejected inputs


def npz_with(**changes: np.ndarray | None) -> Callable[[Path], None]:
    """A corruption that rewrites checkpoint.npz with arrays replaced (None removes one)."""
    def corrupt(folder: Path) -> None:
        arrays = fixture.patterned_arrays()
        arrays.update(changes)
        buffer = io.BytesIO()
        np.savez(buffer, **{name: a for name, a in arrays.items() if a is not None})
        (folder / "checkpoint.npz").write_bytes(buffer.getvalue())
    return corrupt


def json_edit(name: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        document = json.loads((folder / name).read_text())
        edit(document)
        (folder / name).write_text(json.dumps(document))
    return corrupt


def write_bytes(name: str, make: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        (folder / name).write_bytes(make((folder / name).read_bytes()))
    return corrupt


def with_nan(index: tuple[int, int]) -> np.ndarray:
    weight = fixture.patterned_weight(5, 4, 8)
    weight[index] = np.nan
    return weight


def pickled_object_array(folder: Path) -> None:
    buffer = io.BytesIO()
    arrays = {**fixture.patterned_arrays(), "wv": np.array([None, 1], dtype=object)}
    np.savez(buffer, **arrays)
    (folder / "checkpoint.npz").write_bytes(buffer.getvalue())


def huge_shape_header(folder: Path) -> None:
    """wq.npy whose header declares 10**12 floats but carries 64 bytes of data."""
    member = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**12,)}
    np.lib.format.write_array_header_1_0(member, header)
    member.write(bytes(64))
    with zipfile.ZipFile(folder / "checkpoint.npz", "w") as archive:
        for name, array in fixture.patterned_arrays().items():
            if name != "wq":
                with archive.open(f"{name}.npy", "w") as stream:
                    np.lib.format.write_array(stream, array)
        archive.writestr("wq.npy", member.getvalue())


def set_key(key: str, value: object) -> Callable[[dict], None]:
    path = key.split(".")

    def edit(document: dict) -> None:
        target = document
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return edit


def set_corpus_id(window: int, field: str, index: int, value: object) -> Callable[[dict], None]:
    def edit(document: dict) -> None:
        document["windows"][window][field][index] = value
    return edit


NPZ, MANIFEST, VOCAB, CORPUS = "checkpoint.npz", "manifest.json", "vocab.json", "corpus.json"

# (corruption, file named in the message, key named in the message or None, message text)
CORRUPTIONS = {
    "truncated npz": (write_bytes(NPZ, lambda data: data[: len(data) // 2]), NPZ, None,
                      "not a readable .npz archive"),
    "random bytes npz": (write_bytes(NPZ, lambda _: np.random.RandomState(0).bytes(2072)),
                         NPZ, None, "not a readable .npz archive"),
    "flipped byte in npz data": (write_bytes(NPZ, lambda d: d[:200] + bytes([d[200] ^ 1])
                                             + d[201:]), NPZ, None, "CRC"),
    "empty npz": (write_bytes(NPZ, lambda _: b""), NPZ, None, "not a readable .npz archive"),
    "missing array": (npz_with(wq=None), NPZ, "wq", "missing array"),
    "extra array": (npz_with(bias=np.zeros(4, np.float32)), NPZ, "bias", "unexpected array"),
    "wrong shape": (npz_with(wq=np.zeros((4, 5), np.float32)), NPZ, "wq",
                    "expected shape (4, 4) float32, got (4, 5) float32"),
    "wrong dtype": (npz_with(embed=np.zeros((8, 4), np.float64)), NPZ, "embed",
                    "expected shape (8, 4) float32, got (8, 4) float64"),
    "big-endian dtype": (npz_with(wo=np.zeros((4, 4), ">f4")), NPZ, "wo", "got (4, 4) >f4"),
    "wrong scale shape": (npz_with(scale=np.ones((1, 1), np.float32)), NPZ, "scale",
                          "expected shape (1, 1, 1, 1) float32"),
    "nan": (npz_with(lm_head=with_nan((2, 3))), NPZ, "lm_head",
            "non-finite value nan at index (2, 3)"),
    "pickled object array": (pickled_object_array, NPZ, "wv", "object arrays are not allowed"),
    "header declares a huge shape": (huge_shape_header, NPZ, "wq",
                                     "array data is 64 bytes but its header"),
    "missing checkpoint file": (lambda folder: (folder / NPZ).unlink(), NPZ, None,
                                "file not found"),
    "missing manifest": (lambda folder: (folder / MANIFEST).unlink(), MANIFEST, None,
                         "file not found"),
    "missing vocab file": (lambda folder: (folder / VOCAB).unlink(), VOCAB, None,
                           "file not found"),
    "truncated manifest": (write_bytes(MANIFEST, lambda data: data[:40]), MANIFEST, None,
                           "invalid JSON"),
    "manifest not utf-8": (write_bytes(MANIFEST, lambda _: b"\xff\xfe"), MANIFEST, None,
                           "not UTF-8"),
    "manifest duplicate key": (write_bytes(MANIFEST, lambda d: d.replace(
        b'"format"', b'"format": "x", "format"', 1)), MANIFEST, None, "duplicate key 'format'"),
    "manifest format tag": (json_edit(MANIFEST, set_key("format", "storylm0-checkpoint-v9")),
                            MANIFEST, "format", "expected 'storylm0-checkpoint-v0'"),
    "manifest missing key": (json_edit(MANIFEST, lambda d: d.pop("files")), MANIFEST, "files",
                             "missing key"),
    "manifest extra key": (json_edit(MANIFEST, set_key("seed", 1)), MANIFEST, "seed",
                           "unexpected key"),
    "manifest width": (json_edit(MANIFEST, set_key("widths.D", 5)), MANIFEST, "widths.D",
                       "expected 4, got 5"),
    "manifest width as bool": (json_edit(MANIFEST, set_key("widths.B", True)), MANIFEST,
                               "widths.B", "expected 1, got True"),
    "manifest vocab length": (json_edit(MANIFEST, lambda d: d["vocab"].pop()), MANIFEST,
                              "vocab", "expected 8 tokens (widths.V), got 7"),
    "manifest file outside folder": (json_edit(MANIFEST, set_key("files.vocab", "../v.json")),
                                     MANIFEST, "files.vocab", "expected a file name"),
    "vocab format tag": (json_edit(VOCAB, set_key("format", "words")), VOCAB, "format",
                         "expected 'storylm0-vocab-v0', got 'words'"),
    "vocab length": (json_edit(VOCAB, lambda d: d["tokens"].append("<bos>")), VOCAB, "tokens",
                     "expected 8 tokens (widths.V), got 9"),
    "vocab duplicate token": (json_edit(VOCAB, set_key("tokens", BRIEF_VOCAB[:7] + ["the"])),
                              VOCAB, "tokens[7]", "duplicate token 'the'"),
    "vocab not a list": (json_edit(VOCAB, set_key("tokens", "once upon")), VOCAB, "tokens",
                         "expected a JSON list, got string"),
    "vocab differs from manifest": (json_edit(VOCAB, set_key("tokens", BRIEF_VOCAB[:7] + ["?"])),
                                    VOCAB, "tokens", "does not match"),
}

CORPUS_CORRUPTIONS = {
    "corpus format tag": (json_edit(CORPUS, set_key("format", "storylm0-corpus-v1")), CORPUS,
                          "format", "expected 'storylm0-corpus-v0', got 'storylm0-corpus-v1'"),
    "corpus id too large": (json_edit(CORPUS, set_corpus_id(1, "ids", 2, 8)), CORPUS,
                            "windows[1].ids[2]", "token id 8 out of range [0, 8)"),
    "corpus negative target": (json_edit(CORPUS, set_corpus_id(2, "targets", 0, -1)), CORPUS,
                               "windows[2].targets[0]", "token id -1 out of range"),
    "corpus float id": (json_edit(CORPUS, set_corpus_id(0, "ids", 0, 1.0)), CORPUS,
                        "windows[0].ids[0]", "token id 1.0 out of range"),
    "corpus bool id": (json_edit(CORPUS, set_corpus_id(0, "ids", 0, True)), CORPUS,
                       "windows[0].ids[0]", "token id True out of range"),
    "corpus ragged window": (json_edit(CORPUS, lambda d: d["windows"][1]["targets"].pop()),
                             CORPUS, "windows[1].targets", "expected 4 ids"),
    "corpus missing targets": (json_edit(CORPUS, lambda d: d["windows"][0].pop("targets")),
                               CORPUS, "windows[0].targets", "missing key"),
    "corpus no windows": (json_edit(CORPUS, set_key("windows", [])), CORPUS, "windows",
                          "expected a non-empty JSON list"),
    "corpus NaN constant": (write_bytes(CORPUS, lambda d: d.replace(b"[1, 2, 3, 4]",
                                                                     b"[NaN, 2, 3, 4]", 1)),
                            CORPUS, None, "non-standard JSON constant NaN"),
    "corpus not listed": (json_edit(MANIFEST, lambda d: d["files"].pop("corpus")), MANIFEST,
                          "files.corpus", "no file listed"),
    "missing corpus file": (lambda folder: (folder / CORPUS).unlink(), CORPUS, None,
                            "file not found"),
}


@pytest.fixture
def fixture_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "storylm0"
    shutil.copytree(COMMITTED, folder)
    return folder


def assert_rejected(load: Callable[[Path], object], folder: Path, file_name: str,
                    key: str | None, text: str) -> None:
    with pytest.raises(FixtureError) as caught:
        load(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / file_name}: "), message
    assert caught.value.key == key, message
    if key is not None:
        assert f"key {key!r}: " in message
    assert text in message


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_load_checkpoint_rejects(kind, fixture_copy):
    corrupt, file_name, key, text = CORRUPTIONS[kind]
    corrupt(fixture_copy)
    assert_rejected(fixture.load_checkpoint, fixture_copy, file_name, key, text)


@pytest.mark.parametrize("kind", CORPUS_CORRUPTIONS)
def test_load_corpus_rejects(kind, fixture_copy):
    corrupt, file_name, key, text = CORPUS_CORRUPTIONS[kind]
    corrupt(fixture_copy)
    assert_rejected(fixture.load_corpus, fixture_copy, file_name, key, text)


def test_error_message_matches_the_documented_form(fixture_copy, monkeypatch):
    npz_with(wq=np.zeros((4, 5), np.float32))(fixture_copy)
    monkeypatch.chdir(fixture_copy.parent.parent)
    with pytest.raises(FixtureError) as caught:
        fixture.load_checkpoint(Path(fixture_copy.parent.name) / "storylm0")
    assert str(caught.value) == (f"{fixture_copy.parent.name}/storylm0/checkpoint.npz: "
                                 "key 'wq': expected shape (4, 4) float32, got (4, 5) float32")
    assert isinstance(caught.value, ValueError)


def test_missing_folder_is_a_fixture_error(tmp_path):
    with pytest.raises(FixtureError, match="manifest.json: file not found"):
        fixture.load_checkpoint(tmp_path / "nowhere")


@settings(max_examples=150, deadline=None)
@given(file_name=st.sampled_from(FILES), data=st.data())
def test_damaged_bytes_never_escape_as_other_errors(tmp_path_factory, file_name, data):
    folder = tmp_path_factory.mktemp("fuzz") / "storylm0"
    shutil.copytree(COMMITTED, folder)
    original = (folder / file_name).read_bytes()
    position = data.draw(st.integers(0, len(original) - 1))
    if data.draw(st.booleans()):
        damaged = original[:position]
    else:
        damaged = original[:position] + bytes([data.draw(st.integers(0, 255))]) \
            + original[position + 1:]
    (folder / file_name).write_bytes(damaged)
    for load in (fixture.load_checkpoint, fixture.load_corpus, fixture.load_vocab):
        with contextlib.suppress(FixtureError):
            load(folder)


# --------------------------------------------------------------------------- save_checkpoint


def shifted_weights() -> dict[str, np.ndarray]:
    return {name: fixture.patterned_weight(k, rows, cols) + np.float32(0.25)
            for name, (k, rows, cols) in RECIPE.items()}


def test_save_checkpoint_round_trips(tmp_path):
    weights = shifted_weights()
    folder = fixture.save_checkpoint(tmp_path / "trained", weights)
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.npz", "manifest.json",
                                                        "vocab.json"]
    loaded = fixture.load_checkpoint(folder)
    for name, weight in weights.items():
        np.testing.assert_array_equal(getattr(loaded, name), weight)
    np.testing.assert_array_equal(loaded.scale, fixture.attention_scale())
    with pytest.raises(FixtureError, match="files.corpus"):
        fixture.load_corpus(folder)


def test_save_checkpoint_with_corpus_reproduces_the_fixture(tmp_path):
    folder = fixture.save_checkpoint(tmp_path, fixture.load_checkpoint(COMMITTED).arrays(),
                                     corpus=fixture.load_corpus(COMMITTED))
    for name in FILES:
        assert (folder / name).read_bytes() == (COMMITTED / name).read_bytes(), name


@pytest.mark.parametrize(("change", "key", "text"), [
    ({"wq": np.zeros((4, 4), np.float64)}, "wq", "got (4, 4) float64"),
    ({"wk": None}, "wk", "missing array"),
    ({"bias": np.zeros(4, np.float32)}, "bias", "unexpected array"),
    ({"embed": np.full((8, 4), np.inf, np.float32)}, "embed", "non-finite value inf"),
])
def test_save_checkpoint_rejects_bad_weights_before_writing(tmp_path, change, key, text):
    weights = {**shifted_weights(), **change}
    weights = {name: array for name, array in weights.items() if array is not None}
    with pytest.raises(FixtureError) as caught:
        fixture.save_checkpoint(tmp_path / "out", weights)
    assert caught.value.key == key and text in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_interrupted_save_keeps_the_old_files(fixture_copy, monkeypatch):
    before = {name: (fixture_copy / name).read_bytes() for name in FILES}

    def failing_replace(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt):
        fixture.save_checkpoint(fixture_copy, shifted_weights())
    monkeypatch.undo()
    assert {name: (fixture_copy / name).read_bytes() for name in FILES} == before
    assert sorted(p.name for p in fixture_copy.iterdir()) == sorted(FILES)


def test_npz_members_have_fixed_metadata():
    with zipfile.ZipFile(COMMITTED / "checkpoint.npz") as archive:
        infos = archive.infolist()
    assert [info.filename for info in infos] == [f"{n}.npy" for n in fixture.CHECKPOINT_NAMES]
    assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {info.compress_type for info in infos} == {zipfile.ZIP_STORED}
