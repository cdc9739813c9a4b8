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
from dataclasses import replace
from pathlib import Path

import pytest

from kina_frontend import load_program, specialize
from tilegen import config
from tilegen.compile import main
from tilegen.loopir import format_kernel
from tilegen.pipeline import plan_program
from tilegen.target import host_target, named_target

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
EXAMPLES = ("storylm0_forward", "storylm0_rollout", "storylm0_nll_step")
# The machine the goldens were printed on (2 threads, AVX-512, 48 KB L1d, 2 MB L2): only
# these fields of the target steer the loop IR.
GOLDEN_TARGET = replace(named_target("skylake-avx512"), name="golden-host",
                        l1d_bytes=48 << 10, l2_bytes=2 << 20)


def _steering(target):
    return (target.vector_bits, target.vector_registers, target.l1d_bytes, target.l2_bytes)


@pytest.mark.parametrize("example", EXAMPLES)
def test_planned_loops_for_the_golden_target_are_the_golden(example):
    """On any machine: the schedule for the goldens' target is the golden."""
    options = replace(config.load(), num_threads=2, autotune=False, target=GOLDEN_TARGET)
    plans = plan_program(specialize(load_program(example)), None, options)
    printed = "".join(format_kernel(plan.kernel) + "\n\n" for plan in plans)
    assert printed.replace(str(EXAMPLES_DIR), "<examples>") == \
        (GOLDEN_DIR / f"{example}.loops").read_text()


@pytest.mark.skipif(_steering(host_target()) != _steering(GOLDEN_TARGET),
                    reason="the CLI schedules for this machine, not the goldens' one")
@pytest.mark.parametrize("example", EXAMPLES)
def test_emit_loops_is_the_golden(example, monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "2")  # the golden's thread count
    monkeypatch.delenv("TILEGEN_TARGET", raising=False)
    monkeypatch.delenv("TILEGEN_AUTOTUNE", raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([f"{example}.kina", "--emit", "loops"]) == 0
    # Source locations name the examples folder, which differs between clones.
    printed = out.getvalue().replace(str(EXAMPLES_DIR), "<examples>")
    assert printed == (GOLDEN_DIR / f"{example}.loops").read_text()
