"""Goldens for `--emit loops`: the scheduled loop IR of the StoryLM-0 examples must not
change by accident (a refactoring of the pipeline, a new stage, annotations). Regenerate
after an intended change to the loop IR:

    for f in storylm0_forward storylm0_rollout storylm0_nll_step; do
      TILEGEN_NUM_THREADS=2 python -m tilegen.compile $f.kina --emit loops \
        | sed "s#$PWD/examples#<examples>#g" > tests/golden/$f.loops; done
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from tilegen.compile import main

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
EXAMPLES = ("storylm0_forward", "storylm0_rollout", "storylm0_nll_step")


@pytest.mark.parametrize("example", EXAMPLES)
def test_emit_loops_is_the_golden(example, monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "2")  # the golden's thread count
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([f"{example}.kina", "--emit", "loops"]) == 0
    # Source locations name the examples folder, which differs between clones.
    printed = out.getvalue().replace(str(EXAMPLES_DIR), "<examples>")
    assert printed == (GOLDEN_DIR / f"{example}.loops").read_text()
