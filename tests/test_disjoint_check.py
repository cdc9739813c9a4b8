"""The native entry's output-overlap check (`<symbol>.disjoint`) against a Python oracle.

A wrong "disjoint" would let a kernel run on aliased buffers declared noalias, so the check
is compiled on its own and compared with the oracle on random layouts, overlapping ones,
adjacent ones and shared starts, from one output up to a BERT fine-tuning step's 105 inputs
and 102 outputs (a straight-line comparison chain there took LLVM's InstCombine minutes).
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from tilegen.fastcall import OVERLAP_LANES, _disjointness_check
from tilegen.pipeline import to_llvm
from tilegen.target import LLVM_LOCK, host_target, new_target_machine


def _compiled_check(inputs: int, extents: list[int]):
    module = ir.Module("disjoint")
    module.triple = host_target().triple
    function = _disjointness_check(module, "probe", inputs, extents)
    function.linkage = "external"
    parsed = to_llvm(module, host_target())
    with LLVM_LOCK:
        engine = llvm.create_mcjit_compiler(parsed, new_target_machine(host_target()))
        engine.finalize_object()
        address = engine.get_function_address("probe.disjoint")
    check = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.POINTER(ctypes.c_int64))(address)
    return engine, check


def _oracle(inputs: int, starts: list[int], extents: list[int]) -> bool:
    for out in range(inputs, len(starts)):
        for other in range(len(starts)):
            if other != out and starts[out] < starts[other] + extents[other] and \
                    starts[other] < starts[out] + extents[out]:
                return False
    return True


def _layouts(rng, inputs: int, extents: list[int]):
    """Disjoint layouts (shuffled, some adjacent) and ones with one overlap moved in."""
    count = len(extents)
    for _ in range(40):
        order = rng.permutation(count)
        gaps = rng.integers(0, 3, count) * 8          # 0: adjacent, not overlapping
        starts = [0] * count
        position = 4096
        for index in order:
            starts[index] = position
            position += extents[index] + int(gaps[index])
        yield starts
        out = int(rng.integers(inputs, count))
        other = int(rng.choice([i for i in range(count) if i != out]))
        moved = list(starts)
        shift = int(rng.integers(-extents[out] + 1, extents[other]))
        moved[out] = starts[other] + shift            # overlaps `other`
        yield moved
        yield [starts[0]] * count                     # everything at one address


@pytest.mark.parametrize(("inputs", "outputs"), [(1, 1), (9, 1), (4, 3), (11, 7), (12, 12),
                                                 (40, 30), (105, 102)])
def test_disjointness_check_matches_the_oracle(inputs, outputs):
    rng = np.random.default_rng(inputs * 1000 + outputs)
    extents = [int(e) * 4 for e in rng.integers(1, 40, inputs + outputs)]
    engine, check = _compiled_check(inputs, extents)
    for starts in _layouts(rng, inputs, extents):
        padded = starts + [0] * (-len(starts) % OVERLAP_LANES)  # as the entry pads them
        array = (ctypes.c_int64 * len(padded))(*padded)
        assert check(array) == _oracle(inputs, starts, extents), starts
    del engine
