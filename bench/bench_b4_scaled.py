"""B4: a scaled StoryLM (same algebra; V = 4096, D = 256, H = 8, Dh = 32, T = 256, B = 1,
weights random x 0.02): one forward, and one training step (sum-NLL, gradients of all six
weights, SGD).

tilegen runs examples/bench/storylm_scaled.kina (the step by reverseMode). Every provider runs
with its default thread count (all cores here); tilegen, NumPy and PyTorch also run pinned to
one thread (`-1t`), which stays comparable when other jobs share the cores. The oracle is the
hand-derived NumPy model (bench/peers/numpy_storylm.py) in float64, itself checked against
storylm.reference and against PyTorch autograd in bench/test_peers.py.

The step's guard checks the gradients through the update: with lr = 0.1 the updates of wq and
wk (gradients ~1e-7 at these weights) fall below float32's resolution of the weights, so the
guard calls the same compiled step with lr = GUARD_LR and compares (w - w') / GUARD_LR with the
reference gradient of each weight (relative to its largest entry), and the loss.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import numpy as np
import pytest

from bench import storylm_data
from bench.common import (
    BENCH_EXAMPLES,
    JAX,
    NUMPY,
    NUMPY_1T,
    TILEGEN,
    TILEGEN_1T,
    TORCH,
    TORCH_1T,
    TORCH_COMPILE,
    Case,
    check_close,
    measure,
    need,
    numpy_single_thread,
    numpy_threads,
    tilegen_threads,
    timed_first_call,
    torch_threads,
    xla_threads,
)
from bench.peers import numpy_storylm

FORWARD_GROUP = "B4 scaled StoryLM forward"
STEP_GROUP = "B4 scaled StoryLM train step"
PROGRAM = BENCH_EXAMPLES / "storylm_scaled.kina"
GUARD_LR = np.full((1, 1), 1e4, np.float32)


@pytest.fixture(scope="module")
def scaled():
    """(model, ids, targets), built once."""
    ids, targets = storylm_data.scaled_batch()
    return storylm_data.scaled_model(), ids, targets


@pytest.fixture(scope="module")
def scaled_reference(scaled):
    """float64 logits, loss and gradients of the oracle."""
    model, ids, targets = scaled
    wide = model.as_float64()
    logits = numpy_storylm.forward(*wide.forward_args(ids), heads=model.heads)
    loss, grads = numpy_storylm.nll_and_grads(ids, targets, *wide.weights(), wide.mask,
                                              wide.scale, heads=model.heads)
    return logits, (loss, grads)


def _forward_guard(reference):
    return lambda logits: check_close(FORWARD_GROUP, logits, reference[0], rtol=1e-4)


def _step_guard(model, reference):
    """Checks a step's result computed with lr = GUARD_LR."""
    expected_loss, expected_grads = reference[1]
    rate = float(GUARD_LR[0, 0])

    def check(result) -> None:
        loss, *weights = (np.asarray(value, dtype=np.float64) for value in result)
        check_close(f"{STEP_GROUP}: nll", loss, expected_loss, rtol=1e-5)
        for name, before, after, expected in zip(storylm_data.TRAINABLE, model.weights(),
                                                 weights, expected_grads, strict=True):
            check_close(f"{STEP_GROUP}: gradient of {name} (from the update)",
                        (before - after) / rate, expected, rtol=1e-4, atol=0.0)

    return check


# --------------------------------------------------------------------------- forward


def _forward_tilegen(model, ids, reference, kina_function, threads: int | None = None) -> Case:
    function = kina_function(PROGRAM, "storylm_scaled_forward", threads=threads)
    args = model.forward_args(ids)
    out = np.empty((1, model.length, model.vocab), np.float32)
    return Case(lambda: function(*args, out=out), _forward_guard(reference),
                threads or tilegen_threads())


def _forward_numpy(model, ids, reference, kina_function, single: bool = False) -> Case:
    args = model.forward_args(ids)
    return Case(lambda: numpy_storylm.forward(*args, heads=model.heads),
                _forward_guard(reference), 1 if single else numpy_threads(),
                context=numpy_single_thread if single else nullcontext)


def _forward_torch(model, ids, reference, kina_function, compiled: bool = False,
                   threads: int | None = None) -> Case:
    torch = need("torch")
    from bench.peers import torch_storylm
    args = torch_storylm.tensors(*model.forward_args(ids))
    heads = model.heads

    def forward(*tensors):
        return torch_storylm.forward(*tensors, heads)

    extra = {}
    if compiled:
        forward = torch_storylm.compiled(forward)
        _, extra["compile_s"] = timed_first_call(lambda: forward(*args))
    guard = _forward_guard(reference)
    return Case(lambda: forward(*args), lambda logits: guard(logits.numpy()),
                threads or torch.get_num_threads(), context=lambda: torch_threads(threads),
                extra=extra)


def _forward_jax(model, ids, reference, kina_function) -> Case:
    need("jax")
    from bench.peers import jax_storylm
    forward = jax_storylm.jit_forward(model.heads)
    args = jax_storylm.device(*model.forward_args(ids))
    _, compile_s = timed_first_call(lambda: forward(*args).block_until_ready())
    guard = _forward_guard(reference)
    return Case(lambda: forward(*args).block_until_ready(), lambda y: guard(np.asarray(y)),
                xla_threads(), extra={"compile_s": compile_s})


FORWARD_BUILDERS = {
    TILEGEN: _forward_tilegen,
    TILEGEN_1T: partial(_forward_tilegen, threads=1),
    NUMPY: _forward_numpy,
    NUMPY_1T: partial(_forward_numpy, single=True),
    TORCH: _forward_torch,
    TORCH_1T: partial(_forward_torch, threads=1),
    TORCH_COMPILE: partial(_forward_torch, compiled=True),
    JAX: _forward_jax,
}


@pytest.mark.benchmark(min_rounds=10)
@pytest.mark.parametrize("provider", list(FORWARD_BUILDERS))
def test_b4_forward(benchmark, provider, scaled, scaled_reference, kina_function,
                    full_run_only):
    if provider == TORCH_COMPILE:
        full_run_only("torch.compile's first compile costs 10-30 s")
    model, ids, _ = scaled
    case = FORWARD_BUILDERS[provider](model, ids, scaled_reference, kina_function)
    measure(benchmark, FORWARD_GROUP, provider, case, units=1, unit="call")


# --------------------------------------------------------------------------- training step


def _step_tilegen(model, ids, targets, reference, kina_function,
                  threads: int | None = None) -> Case:
    step = kina_function(PROGRAM, "storylm_scaled_nll_step",
                         threads=threads)
    args = (ids, targets, *model.weights(), model.mask, model.scale)
    out = (np.empty((), np.float32), *(np.empty_like(w) for w in model.weights()))
    return Case(lambda: step(*args, model.lr, out=out), _step_guard(model, reference),
                threads or tilegen_threads(), guard_call=lambda: step(*args, GUARD_LR))


def _step_numpy(model, ids, targets, reference, kina_function, single: bool = False) -> Case:
    embed, wq, wk, wv, wo, lm_head = model.weights()

    def step(lr: np.ndarray) -> tuple[np.ndarray, ...]:
        return numpy_storylm.nll_step(ids, targets, embed, wq, wk, wv, wo, lm_head, model.mask,
                                      model.scale, lr, heads=model.heads)

    return Case(lambda: step(model.lr), _step_guard(model, reference),
                1 if single else numpy_threads(),
                context=numpy_single_thread if single else nullcontext,
                guard_call=lambda: step(GUARD_LR))


def _step_torch(model, ids, targets, reference, kina_function, compiled: bool = False,
                threads: int | None = None) -> Case:
    torch = need("torch")
    from bench.peers import torch_storylm
    args = torch_storylm.tensors(ids, targets, *model.weights(), model.mask, model.scale)
    lr, guard_lr = torch_storylm.tensors(model.lr, GUARD_LR)
    heads = model.heads
    step_function = torch_storylm.functional_step if compiled else torch_storylm.eager_step

    def step(*tensors):
        return step_function(*tensors, heads)

    extra = {}
    if compiled:
        step = torch_storylm.compiled(step)
        _, extra["compile_s"] = timed_first_call(lambda: step(*args, lr))
    guard = _step_guard(model, reference)
    return Case(lambda: step(*args, lr), lambda result: guard([t.numpy() for t in result]),
                threads or torch.get_num_threads(), context=lambda: torch_threads(threads),
                extra=extra, guard_call=lambda: step(*args, guard_lr))


def _step_jax(model, ids, targets, reference, kina_function) -> Case:
    jax = need("jax")
    from bench.peers import jax_storylm
    step = jax_storylm.jit_step(model.heads)
    weights = jax_storylm.device(*model.weights())
    ids, targets, mask, scale, lr, guard_lr = jax_storylm.device(
        ids, targets, model.mask, model.scale, model.lr, GUARD_LR)

    def call(rate=lr):
        return jax.block_until_ready(step(weights, ids, targets, mask, scale, rate))

    _, compile_s = timed_first_call(call)
    guard = _step_guard(model, reference)
    return Case(call, lambda result: guard([result[0], *result[1]]), xla_threads(),
                extra={"compile_s": compile_s}, guard_call=lambda: call(guard_lr))


STEP_BUILDERS = {
    TILEGEN: _step_tilegen,
    TILEGEN_1T: partial(_step_tilegen, threads=1),
    NUMPY: _step_numpy,
    NUMPY_1T: partial(_step_numpy, single=True),
    TORCH: _step_torch,
    TORCH_1T: partial(_step_torch, threads=1),
    TORCH_COMPILE: partial(_step_torch, compiled=True),
    JAX: _step_jax,
}


@pytest.mark.benchmark(min_rounds=10)
@pytest.mark.parametrize("provider", list(STEP_BUILDERS))
def test_b4_train_step(benchmark, provider, scaled, scaled_reference, kina_function,
                       full_run_only):
    full_run_only("one scaled training step per provider (and its compile) is too slow for CI")
    model, ids, targets = scaled
    case = STEP_BUILDERS[provider](model, ids, targets, scaled_reference, kina_function)
    measure(benchmark, STEP_GROUP, provider, case, units=1, unit="step")
