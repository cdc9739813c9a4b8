"""The StoryLM-0 fixture: patterned checkpoint, vocab and toy corpus (BRIEF section 3).

`fixtures/storylm0/` is host data, not a compiler ABI. This module defines what is in it (the
patterned weight recipe, the causal mask, the vocab and the three-window corpus), writes it
reproducibly bit for bit with atomic replaces, and loads it back through a validating loader.
Every loading failure is a `FixtureError` whose message names the file and, where there is
one, the key: `fixtures/storylm0/checkpoint.npz: key 'wq': expected shape (4, 4) float32, ...`.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from storylm._files import atomic_write_bytes, json_bytes, npz_bytes

CHECKPOINT_FORMAT = "storylm0-checkpoint-v0"
VOCAB_FORMAT = "storylm0-vocab-v0"
CORPUS_FORMAT = "storylm0-corpus-v0"

MANIFEST_FILE = "manifest.json"
CHECKPOINT_FILE = "checkpoint.npz"
VOCAB_FILE = "vocab.json"
CORPUS_FILE = "corpus.json"

REPO_ROOT = Path(__file__).resolve().parents[1]
# fixtures/storylm0 in a source checkout; an installed wheel ships it as the package data
# tilegen/fixtures/storylm0 (see pyproject.toml).
DEFAULT_FIXTURE_DIR = next(
    (folder for folder in (REPO_ROOT / "fixtures" / "storylm0",
                           REPO_ROOT / "tilegen" / "fixtures" / "storylm0")
     if (folder / MANIFEST_FILE).is_file()), REPO_ROOT / "fixtures" / "storylm0")


class FixtureError(ValueError):
    """A fixture file is missing, unreadable or does not match the format."""

    def __init__(self, path: str | Path, problem: str, key: str | None = None) -> None:
        self.path = str(path)
        self.key = key
        self.problem = problem
        where = self.path if key is None else f"{self.path}: key {key!r}"
        super().__init__(f"{where}: {problem}")


# --------------------------------------------------------------------------- model constants


@dataclass(frozen=True)
class Widths:
    """StoryLM-0 widths; `as_json` gives the manifest spelling (B, H, Dh, D, V)."""

    batch: int = 1
    heads: int = 2
    head_dim: int = 2
    model_dim: int = 4
    vocab_size: int = 8

    def as_json(self) -> dict[str, int]:
        return {"B": self.batch, "H": self.heads, "Dh": self.head_dim,
                "D": self.model_dim, "V": self.vocab_size}


WIDTHS = Widths()
VOCAB = ("<pad>", "once", "upon", "a", "time", "the", "end", "<unk>")
PAD_ID = 0
MASK_VALUE = -1e9  # finite rather than -inf so masked scores keep finite gradients

TRAINABLE_NAMES = ("embed", "wq", "wk", "wv", "wo", "lm_head")
CHECKPOINT_NAMES = (*TRAINABLE_NAMES, "scale")
ARRAY_SHAPES: Mapping[str, tuple[int, ...]] = {
    "embed": (WIDTHS.vocab_size, WIDTHS.model_dim),
    "wq": (WIDTHS.model_dim, WIDTHS.model_dim),
    "wk": (WIDTHS.model_dim, WIDTHS.model_dim),
    "wv": (WIDTHS.model_dim, WIDTHS.model_dim),
    "wo": (WIDTHS.model_dim, WIDTHS.model_dim),
    "lm_head": (WIDTHS.model_dim, WIDTHS.vocab_size),
    "scale": (1, 1, 1, 1),
}


@dataclass(frozen=True)
class Window:
    """One training window: next-token `targets` for the token `ids` (same length)."""

    ids: tuple[int, ...]
    targets: tuple[int, ...]

    def id_array(self) -> np.ndarray:
        """The ids as the `[1, T]` int64 tensor the programs take."""
        return np.array([self.ids], dtype=np.int64)

    def target_array(self) -> np.ndarray:
        return np.array([self.targets], dtype=np.int64)


# "once upon a time the end" slid by one token, the last window wrapping to "once".
CORPUS_WINDOWS = (
    Window(ids=(1, 2, 3, 4), targets=(2, 3, 4, 5)),
    Window(ids=(2, 3, 4, 5), targets=(3, 4, 5, 6)),
    Window(ids=(3, 4, 5, 6), targets=(4, 5, 6, 1)),
)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A validated checkpoint: the seven arrays (read-only float32), the vocab and the widths."""

    embed: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    lm_head: np.ndarray
    scale: np.ndarray
    vocab: tuple[str, ...]
    widths: Widths

    def arrays(self) -> dict[str, np.ndarray]:
        """The seven arrays by name, in CHECKPOINT_NAMES order."""
        return {name: getattr(self, name) for name in CHECKPOINT_NAMES}


# --------------------------------------------------------------------------- the recipe


def patterned_weight(k: int, rows: int, cols: int) -> np.ndarray:
    """Section 5 recipe: W_k[i, j] = (((3i + 5j + 7k + 1) mod 9) - 4) / 8, float32."""
    i = np.arange(rows).reshape(rows, 1)
    j = np.arange(cols).reshape(1, cols)
    return ((((3 * i + 5 * j + 7 * k + 1) % 9) - 4) / 8).astype(np.float32)


def attention_scale() -> np.ndarray:
    """1/sqrt(Dh) as the `[1, 1, 1, 1]` float32 tensor the programs broadcast."""
    return np.full((1, 1, 1, 1), 1.0 / np.sqrt(WIDTHS.head_dim), dtype=np.float32)


def causal_mask(length: int) -> np.ndarray:
    """Additive causal mask `[1, 1, T, T]`: 0 where key j <= query i, -1e9 where j > i."""
    query = np.arange(length).reshape(length, 1)
    key = np.arange(length).reshape(1, length)
    mask = np.where(key <= query, 0.0, MASK_VALUE).astype(np.float32)
    return mask.reshape(1, 1, length, length)


def patterned_arrays() -> dict[str, np.ndarray]:
    """The untrained checkpoint: weight k of TRAINABLE_NAMES from the recipe, plus scale."""
    arrays = {name: patterned_weight(k, *ARRAY_SHAPES[name])
              for k, name in enumerate(TRAINABLE_NAMES)}
    arrays["scale"] = attention_scale()
    return arrays


# --------------------------------------------------------------------------- writing


def save_checkpoint(directory: str | Path, weights: Mapping[str, np.ndarray], *,
                    vocab: Sequence[str] = VOCAB,
                    corpus: Sequence[Window] | None = None) -> Path:
    """Write a checkpoint folder in the validated format; returns the folder.

    `weights` holds the six trainable arrays and optionally `scale` (default 1/sqrt(Dh)); they
    must already be float32 of the right shapes. Writes checkpoint.npz, vocab.json, corpus.json
    (only when `corpus` is given) and last manifest.json, each by atomic replace. The data is
    validated with the loader's own checks before anything is written.
    """
    folder = Path(directory)
    arrays = {"scale": attention_scale(), **weights}
    _check_arrays(folder / CHECKPOINT_FILE, arrays)
    tokens = _check_vocab(folder / VOCAB_FILE, list(vocab), "tokens")
    files = {"checkpoint": CHECKPOINT_FILE, "vocab": VOCAB_FILE}
    corpus_document = None if corpus is None else _corpus_json(corpus)
    if corpus_document is not None:
        _check_corpus(folder / CORPUS_FILE, corpus_document, WIDTHS.vocab_size)
        files["corpus"] = CORPUS_FILE

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / CHECKPOINT_FILE,
                       npz_bytes({name: arrays[name] for name in CHECKPOINT_NAMES}))
    atomic_write_bytes(folder / VOCAB_FILE,
                       json_bytes({"format": VOCAB_FORMAT, "tokens": list(tokens)}))
    if corpus_document is not None:
        atomic_write_bytes(folder / CORPUS_FILE, json_bytes(corpus_document))
    manifest = {"format": CHECKPOINT_FORMAT, "widths": WIDTHS.as_json(),
                "vocab": list(tokens), "files": files}
    # The manifest goes last so it never names a file that has not been written yet.
    atomic_write_bytes(folder / MANIFEST_FILE, json_bytes(manifest))
    return folder


def write_fixture(directory: str | Path = DEFAULT_FIXTURE_DIR) -> Path:
    """Write the patterned StoryLM-0 fixture (the four files) into `directory`."""
    return save_checkpoint(directory, patterned_arrays(), corpus=CORPUS_WINDOWS)


def _corpus_json(corpus: Sequence[Window]) -> dict[str, Any]:
    windows = [{"ids": list(w.ids), "targets": list(w.targets)} for w in corpus]
    return {"format": CORPUS_FORMAT, "windows": windows}


# --------------------------------------------------------------------------- loading


def load_checkpoint(directory: str | Path = DEFAULT_FIXTURE_DIR) -> Checkpoint:
    """Load and validate manifest.json, the checkpoint and the vocab it names."""
    folder = Path(directory)
    manifest = _load_manifest(folder)
    vocab_path = folder / manifest["files"]["vocab"]
    tokens = _load_vocab_file(vocab_path)
    if list(tokens) != manifest["vocab"]:
        raise FixtureError(vocab_path, f"does not match {folder / MANIFEST_FILE} key 'vocab'",
                           "tokens")
    checkpoint_path = folder / manifest["files"]["checkpoint"]
    arrays = _read_npz(checkpoint_path)
    _check_arrays(checkpoint_path, arrays)
    frozen = {name: _read_only(arrays[name]) for name in CHECKPOINT_NAMES}
    return Checkpoint(**frozen, vocab=tokens, widths=WIDTHS)


def load_vocab(path: str | Path = DEFAULT_FIXTURE_DIR) -> tuple[str, ...]:
    """Load vocab.json (or the vocab file a fixture folder's manifest names)."""
    return _load_vocab_file(_resolve(Path(path), "vocab"))


def _load_vocab_file(vocab_path: Path) -> tuple[str, ...]:
    document = _check_object(vocab_path, _read_json(vocab_path), None, {"format", "tokens"})
    _check_format(vocab_path, document, VOCAB_FORMAT)
    return _check_vocab(vocab_path, document["tokens"], "tokens")


def load_corpus(path: str | Path = DEFAULT_FIXTURE_DIR) -> list[Window]:
    """Load corpus.json (or the corpus file a fixture folder's manifest names)."""
    corpus_path = _resolve(Path(path), "corpus")
    document = _read_json(corpus_path)
    _check_corpus(corpus_path, document, WIDTHS.vocab_size)
    return [Window(ids=tuple(w["ids"]), targets=tuple(w["targets"]))
            for w in document["windows"]]


def _resolve(path: Path, role: str) -> Path:
    """A file path as given, or for a folder the file its manifest names for `role`."""
    if not path.is_dir():
        return path
    files = _load_manifest(path)["files"]
    if role not in files:
        raise FixtureError(path / MANIFEST_FILE, "no file listed", f"files.{role}")
    return path / files[role]


def _load_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_FILE
    manifest = _check_object(path, _read_json(path), None, {"format", "widths", "vocab", "files"})
    _check_format(path, manifest, CHECKPOINT_FORMAT)
    widths = _check_object(path, manifest["widths"], "widths", set(WIDTHS.as_json()))
    for name, expected in WIDTHS.as_json().items():
        if type(widths[name]) is not int or widths[name] != expected:
            raise FixtureError(path, f"expected {expected}, got {widths[name]!r}",
                               f"widths.{name}")
    _check_vocab(path, manifest["vocab"], "vocab")
    files = _check_object(path, manifest["files"], "files", {"checkpoint", "vocab"}, {"corpus"})
    for role, name in files.items():
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise FixtureError(path, f"expected a file name in the fixture folder, got {name!r}",
                               f"files.{role}")
    return manifest


# --------------------------------------------------------------------------- file decoding


# StoryLM-0's files are a few kilobytes; anything far larger is not a fixture file (a
# symlink to /dev/zero, a zip bomb) and is refused before it is read into memory.
MAX_FILE_BYTES = 16 * 1024 * 1024


def _read_bytes(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise FixtureError(path, "file not found") from None
    except OSError as error:
        raise FixtureError(path, f"cannot read file: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise FixtureError(path, f"larger than the {MAX_FILE_BYTES}-byte limit for fixture "
                                 "files")
    return data


class _JsonContentError(ValueError):
    """Raised from json.loads hooks for content plain JSON parsing would let through."""


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _JsonContentError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _reject_constant(name: str) -> None:
    raise _JsonContentError(f"non-standard JSON constant {name}")


def _read_json(path: Path) -> Any:
    data = _read_bytes(path)
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys,
                          parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise FixtureError(path, "not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise FixtureError(path, f"invalid JSON: {error.msg} at line {error.lineno} "
                                 f"column {error.colno}") from None
    except _JsonContentError as error:
        raise FixtureError(path, f"invalid JSON: {error}") from None
    except RecursionError:
        raise FixtureError(path, "invalid JSON: nested too deeply") from None


# What zipfile and the .npy header readers raise on damaged bytes (bad zip structures, CRC
# mismatches, truncated members, malformed .npy headers).
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error,
                   EOFError, OSError, ValueError, NotImplementedError, RuntimeError,
                   OverflowError, UnicodeDecodeError)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive, read without pickle; member `name.npy` is key `name`."""
    data = _read_bytes(path)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.namelist()
            contents = {member: _read_member(path, archive, member) for member in members}
    except FixtureError:
        raise
    except _ARCHIVE_ERRORS as error:
        raise FixtureError(path, f"not a readable .npz archive ({error})") from None
    arrays: dict[str, np.ndarray] = {}
    for member in members:
        key = member.removesuffix(".npy")
        if member == key or key in arrays:
            raise FixtureError(path, "not an .npy array (or a duplicate member)", member)
        arrays[key] = _read_npy(path, key, contents[member])
    return arrays


def _read_member(path: Path, archive: zipfile.ZipFile, member: str) -> bytes:
    """One member's bytes (CRC-checked), at most MAX_FILE_BYTES whatever the header says."""
    if archive.getinfo(member).file_size > MAX_FILE_BYTES:
        raise FixtureError(path, f"member {member!r} unpacks to "
                                 f"{archive.getinfo(member).file_size} bytes, more than the "
                                 f"{MAX_FILE_BYTES}-byte limit", member.removesuffix(".npy"))
    with archive.open(member) as stream:
        data = stream.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise FixtureError(path, f"member {member!r} unpacks to more than the "
                                 f"{MAX_FILE_BYTES}-byte limit", member.removesuffix(".npy"))
    return data


# The .npy versions whose header readers NumPy exposes; this module itself writes 1.0.
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}


def _read_npy(path: Path, key: str, data: bytes) -> np.ndarray:
    """One .npy member. The header is checked against the data size before any allocation,
    so a damaged header declaring a huge shape is an error, not a MemoryError."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _NPY_HEADER_READERS:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran_order, dtype = _NPY_HEADER_READERS[version](stream)
    except _ARCHIVE_ERRORS as error:
        raise FixtureError(path, f"unreadable array header ({error})", key) from None
    if dtype.hasobject:  # what allow_pickle=False refuses
        raise FixtureError(path, f"object arrays are not allowed (dtype {dtype})", key)
    payload = len(data) - stream.tell()
    needed = math.prod(shape) * dtype.itemsize
    if payload != needed or dtype.itemsize == 0:
        raise FixtureError(path, f"array data is {payload} bytes but its header "
                                 f"({shape} {dtype}) needs {needed}", key)
    flat = np.frombuffer(data, dtype=dtype, offset=stream.tell())
    return flat.reshape(shape, order="F" if fortran_order else "C")


def _read_only(array: np.ndarray) -> np.ndarray:
    frozen = np.ascontiguousarray(array).copy()
    frozen.setflags(write=False)
    return frozen


# --------------------------------------------------------------------------- content checks


def _check_arrays(path: Path, arrays: Mapping[str, Any]) -> None:
    """Exactly the seven checkpoint keys, each float32 of its shape with finite values."""
    for name in CHECKPOINT_NAMES:
        if name not in arrays:
            raise FixtureError(path, "missing array", name)
    for name in arrays:
        if name not in ARRAY_SHAPES:
            raise FixtureError(path, f"unexpected array (expected {', '.join(CHECKPOINT_NAMES)})",
                               name)
    for name, shape in ARRAY_SHAPES.items():
        array = arrays[name]
        if not isinstance(array, np.ndarray):
            raise FixtureError(path, f"expected a NumPy array, got {type(array).__name__}", name)
        if array.shape != shape or array.dtype != np.float32:
            raise FixtureError(path, f"expected shape {shape} float32, "
                                     f"got {array.shape} {array.dtype}", name)
        finite = np.isfinite(array)
        if not finite.all():
            index = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise FixtureError(path, f"non-finite value {array[index]} at index {index}", name)


def _check_object(path: Path, value: Any, key: str | None, required: AbstractSet[str],
                  optional: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """`value` is a JSON object with all `required` keys and no keys beyond `optional`."""
    if not isinstance(value, dict):
        raise FixtureError(path, f"expected a JSON object, got {_json_type(value)}", key)
    prefix = "" if key is None else f"{key}."
    missing = sorted(required - value.keys())
    if missing:
        raise FixtureError(path, "missing key", prefix + missing[0])
    unexpected = sorted(value.keys() - required - optional)
    if unexpected:
        raise FixtureError(path, "unexpected key", prefix + unexpected[0])
    return value


def _check_format(path: Path, document: dict[str, Any], expected: str) -> None:
    if document["format"] != expected:
        raise FixtureError(path, f"expected {expected!r}, got {document['format']!r}", "format")


def _check_vocab(path: Path, tokens: Any, key: str) -> tuple[str, ...]:
    """A list of V distinct, non-empty token strings with <pad> at id 0."""
    if not isinstance(tokens, list):
        raise FixtureError(path, f"expected a JSON list, got {_json_type(tokens)}", key)
    if len(tokens) != WIDTHS.vocab_size:
        raise FixtureError(path, f"expected {WIDTHS.vocab_size} tokens (widths.V), "
                                 f"got {len(tokens)}", key)
    for index, token in enumerate(tokens):
        if not isinstance(token, str) or not token:
            raise FixtureError(path, f"expected a non-empty string, got {token!r}",
                               f"{key}[{index}]")
        if token in tokens[:index]:
            raise FixtureError(path, f"duplicate token {token!r}", f"{key}[{index}]")
    if tokens[PAD_ID] != VOCAB[PAD_ID]:
        raise FixtureError(path, f"id {PAD_ID} must be {VOCAB[PAD_ID]!r}, got {tokens[0]!r}",
                           f"{key}[{PAD_ID}]")
    return tuple(tokens)


def _check_corpus(path: Path, document: Any, vocab_size: int) -> None:
    """Format tag and a non-empty list of windows of one length with ids in [0, V)."""
    document = _check_object(path, document, None, {"format", "windows"})
    _check_format(path, document, CORPUS_FORMAT)
    windows = document["windows"]
    if not isinstance(windows, list) or not windows:
        raise FixtureError(path, f"expected a non-empty JSON list, got {windows!r}", "windows")
    length = None
    for number, window in enumerate(windows):
        key = f"windows[{number}]"
        _check_object(path, window, key, {"ids", "targets"})
        for field in ("ids", "targets"):
            _check_token_ids(path, window[field], f"{key}.{field}", vocab_size)
        length = len(window["ids"]) if length is None else length
        for field in ("ids", "targets"):
            if len(window[field]) != length:
                raise FixtureError(path, f"expected {length} ids (the length of "
                                         f"windows[0].ids), got {len(window[field])}",
                                   f"{key}.{field}")


def _check_token_ids(path: Path, ids: Any, key: str, vocab_size: int) -> None:
    if not isinstance(ids, list) or not ids:
        raise FixtureError(path, f"expected a non-empty list of token ids, got {ids!r}", key)
    for index, token_id in enumerate(ids):
        if type(token_id) is not int or not 0 <= token_id < vocab_size:
            raise FixtureError(path, f"token id {token_id!r} out of range [0, {vocab_size})",
                               f"{key}[{index}]")


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
