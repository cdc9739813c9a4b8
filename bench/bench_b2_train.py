"""B2: Section 24's whole training run, 40 epochs x 3 windows = 120 SGD steps from the fixture.

One timed call is the whole run from the initial weights; the report also divides by 120 for
the per-step figure. tilegen runs `storylm0_nll_step` (reverseMode + SGD in Kina) from a host
loop that rebinds the weights, ping-ponging between two sets of `out=` buffers so the loop
allocates nothing (outputs may not alias inputs). The guard compares the final loss and the
six trained weights with storylm.reference run in float64.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from bench import storylm_data
from bench.common import (
    EXAMPLES,
    JAX,
    JAX_FORI,
    NUMBA,
    NUMPY,
    TILEGEN,
    TINY_TORCH_THREADS,
    TORCH,
    TORCH_COMPILE,
    Case,
    check_close,
    measure,
    need,
    numpy_threads,
    tilegen_threads,
    timed_first_call,
    tiny_torch_threads,
    xla_threads,
)
from storylm import reference

GROUP = "B2 StoryLM-0 training, 120 steps"
PROGRAM = EXAMPLES / "storylm0_nll_step.kina"
STEPS = storylm_data.TRAIN_EPOCHS * 3


def _schedule() -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, targets) of each of the 120 steps: the three windows in order, 40 times."""
    windows = storylm_data.corpus()
    return [windows[step % len(windows)] for step in range(STEPS)]


def _guard(model: storylm_data.Model):
    wide = model.as_float64()
    embed, wq, wk, wv, wo, lm_head = wide.weights()
    loss = None
    for ids, targets in _schedule():
        loss, embed, wq, wk, wv, wo, lm_head = reference.nll_step(
            ids, targets, embed, wq, wk, wv, wo, lm_head, wide.mask, wide.scale, wide.lr)
    weights = (embed, wq, wk, wv, wo, lm_head)

    def check(result) -> None:
        final_loss, final_weights = result
        check_close(f"{GROUP}: last step's nll", final_loss, loss, rtol=1e-4)
        for name, got, expected in zip(storylm_data.TRAINABLE, final_weights, weights,
                                       strict=True):
            check_close(f"{GROUP}: trained {name}", got, expected, rtol=1e-4)

    return check


def _tilegen(model, kina_function) -> Case:
    step = kina_function(PROGRAM, "storylm0_nll_step")
    constants = (model.mask, model.scale, model.lr)
    buffers = [tuple(np.empty(shape, np.float32) for shape in
                     [(), *(w.shape for w in model.weights())]) for _ in range(2)]
    plan = [(ids, targets, buffers[index % 2]) for index, (ids, targets) in
            enumerate(_schedule())]

    def train():
        weights = model.weights()
        out = buffers[0]
        for ids, targets, out in plan:
            step(ids, targets, *weights, *constants, out=out)
            weights = out[1:]
        return out[0], weights

    return Case(train, _guard(model), tilegen_threads())


def _numpy(model, kina_function) -> Case:
    from bench.peers import numpy_storylm
    constants = (model.mask, model.scale, model.lr)
    plan = _schedule()

    def train():
        weights = model.weights()
        for ids, targets in plan:
            loss, *weights = numpy_storylm.nll_step(ids, targets, *weights, *constants,
                                                    heads=model.heads)
        return loss, weights

    return Case(train, _guard(model), numpy_threads())


def _torch(model, kina_function, compiled: bool = False) -> Case:
    need("torch")
    from bench.peers import torch_storylm
    initial = torch_storylm.tensors(*model.weights())
    constants = torch_storylm.tensors(model.mask, model.scale, model.lr)
    plan = [torch_storylm.tensors(ids, targets) for ids, targets in _schedule()]
    heads = model.heads
    step_function = torch_storylm.functional_step if compiled else torch_storylm.eager_step

    def step(*args):
        return step_function(*args, heads)

    extra = {}
    if compiled:
        step = torch_storylm.compiled(step)
        _, extra["compile_s"] = timed_first_call(lambda: step(*plan[0], *initial, *constants))

    def train():
        weights = initial
        for ids, targets in plan:
            loss, *weights = step(ids, targets, *weights, *constants)
        return loss, weights

    guard = _guard(model)
    return Case(train, lambda result: guard((result[0].numpy(), [w.numpy() for w in
                                                                 result[1]])),
                TINY_TORCH_THREADS, context=tiny_torch_threads, extra=extra)


def _jax(model, kina_function, fori: bool = False) -> Case:
    jax = need("jax")
    from bench.peers import jax_storylm
    initial = jax_storylm.device(*model.weights())
    mask, scale, lr = jax_storylm.device(model.mask, model.scale, model.lr)
    guard = _guard(model)

    def check_jax(result):
        guard((np.asarray(result[0]), [np.asarray(w) for w in result[1]]))

    if fori:
        windows = storylm_data.corpus()
        window_ids, window_targets = jax_storylm.device(np.stack([w[0] for w in windows]),
                                                        np.stack([w[1] for w in windows]))
        train_all = jax_storylm.jit_train_fori(model.heads, STEPS)

        def train_in_one_call():
            return jax.block_until_ready(train_all(initial, window_ids, window_targets, mask,
                                                   scale, lr))

        _, compile_s = timed_first_call(train_in_one_call)
        return Case(train_in_one_call, check_jax, xla_threads(),
                    extra={"compile_s": compile_s})

    step = jax_storylm.jit_step(model.heads)
    plan = [jax_storylm.device(ids, targets) for ids, targets in _schedule()]

    def train():
        weights = initial
        for ids, targets in plan:
            loss, weights = step(weights, ids, targets, mask, scale, lr)
        return jax.block_until_ready((loss, weights))

    _, compile_s = timed_first_call(train)
    return Case(train, check_jax, xla_threads(), extra={"compile_s": compile_s})


def _numba(model, kina_function) -> Case:
    need("numba")
    from bench.peers import numba_storylm
    buffers = [tuple(np.empty(w.shape, np.float32) for w in model.weights()) for _ in range(2)]
    plan = [(ids, targets, buffers[index % 2]) for index, (ids, targets) in
            enumerate(_schedule())]

    def train():
        weights = model.weights()
        for ids, targets, out in plan:
            loss = numba_storylm.nll_step_into(ids, targets, *weights, model.mask, model.scale,
                                               model.lr, model.heads, *out)
            weights = out
        return loss, weights

    _, compile_s = timed_first_call(train)
    return Case(train, _guard(model), 1, extra={"compile_s": compile_s})


BUILDERS = {
    TILEGEN: _tilegen,
    NUMPY: _numpy,
    TORCH: _torch,
    TORCH_COMPILE: partial(_torch, compiled=True),
    JAX: _jax,
    JAX_FORI: partial(_jax, fori=True),
    NUMBA: _numba,
}


@pytest.mark.parametrize("provider", list(BUILDERS))
def test_b2_train(benchmark, provider, storylm0_t4, kina_function, full_run_only):
    if provider == TORCH_COMPILE:
        full_run_only("torch.compile of the training step costs ~30 s")
    case = BUILDERS[provider](storylm0_t4, kina_function)
    measure(benchmark, GROUP, provider, case, units=STEPS, unit="step")
