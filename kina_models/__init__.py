"""Real pretrained models compiled from Kina programs.

`kina_models.minilm` runs the sentence-transformers model all-MiniLM-L6-v2 from the Kina
program `examples/minilm_l6.kina`: `SentenceEncoder().encode(sentences)`.
"""
