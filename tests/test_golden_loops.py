"""The StoryLM-0 loop IR is a golden: refactors of the stages must not change what the
scheduler decides (tests/golden/<example>.loops is `--emit loops` on a 2-thread AVX-512
host with a 48 KB L1 and a 2 MB L2, example paths written as <examples>).

Regenerate after an intended change to the schedule:
    TILEGEN_NUM_THREADS=2 python -m tilegen.compile storylm0_forward.kina --emit loops
(on such a host), with the examples folder replaced by <examples>.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kina_frontend import load_program, specialize
from tilegen import config
from tilegen.loopir import format_kernel
from tilegen.pipeline import plan_program
from tilegen.target import named_target

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
# The machine the goldens were printed on; only these fields steer the loop IR.
GOLDEN_TARGET = replace(named_target("skylake-avx512"), name="golden-host",
                        l1d_bytes=48 << 10, l2_bytes=2 << 20)


@pytest.mark.parametrize("example", ["storylm0_forward", "storylm0_nll_step",
                                     "storylm0_rollout"])
def test_storylm0_loop_ir_is_unchanged(example):
    options = replace(config.load(), num_threads=2, autotune=False, target=GOLDEN_TARGET)
    plans = plan_program(specialize(load_program(example)), None, options)
    text = "".join(format_kernel(plan.kernel) + "\n\n" for plan in plans)
    text = text.replace(str(ROOT / "examples") + "/", "<examples>/")
    assert text == (GOLDEN / f"{example}.loops").read_text()
