"""StoryLM-0 host side: the fixture files and the independent NumPy reference.

`storylm.fixture` writes and validates `fixtures/storylm0/`; `storylm.reference` is the plain
NumPy oracle (forward, decode rows, rollout, hand-derived gradients, SGD training) that the
compiled Kina programs are checked against. Neither imports the compiler.
"""
