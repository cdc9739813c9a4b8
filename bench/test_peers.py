"""The peers and the B4 oracle are right: they are checked here against storylm.reference
(StoryLM-0) and, for head counts other than two, against PyTorch autograd in float64.

These are plain tests (skipped under --benchmark-only); the benchmarks' own guards then
compare each measured result with these references.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench import storylm_data
from bench.peers import numpy_storylm
from storylm import fixture, reference


def _small_model(heads: int, head_dim: int, vocab: int, length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    dim = heads * head_dim

    def weight(*shape):
        return rng.standard_normal(shape) * 0.5

    model = storylm_data.Model(
        vocab=vocab, model_dim=dim, heads=heads, head_dim=head_dim, length=length,
        embed=weight(vocab, dim), wq=weight(dim, dim), wk=weight(dim, dim), wv=weight(dim, dim),
        wo=weight(dim, dim), lm_head=weight(dim, vocab),
        scale=np.full((1, 1, 1, 1), 1 / np.sqrt(head_dim)),
        mask=fixture.causal_mask(length).astype(np.float64), lr=np.full((1, 1), 0.1))
    ids = rng.integers(0, vocab, size=(1, length))
    ids[0, 1] = ids[0, 0]  # a repeated id: the embedding gradient must accumulate
    targets = rng.integers(0, vocab, size=(1, length))
    return model, ids, targets


def test_numpy_peer_matches_reference_on_storylm0():
    model = storylm_data.storylm0(4).as_float64()
    ids, targets = storylm_data.corpus()[0]
    np.testing.assert_allclose(
        numpy_storylm.forward(*model.forward_args(ids), heads=2),
        reference.forward(*model.forward_args(ids)), rtol=1e-12, atol=1e-12)
    loss, grads = numpy_storylm.nll_and_grads(ids, targets, *model.weights(), model.mask,
                                              model.scale, heads=2)
    want_loss, want = reference.nll_and_grads(ids, targets, *model.weights(), model.mask,
                                              model.scale)
    assert loss == pytest.approx(float(want_loss), rel=1e-12)
    for name, grad in zip(storylm_data.TRAINABLE, grads, strict=True):
        np.testing.assert_allclose(grad, want[name], rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("heads", [1, 4])
def test_numpy_peer_gradients_match_torch_autograd(heads):
    torch = pytest.importorskip("torch")
    from bench.peers import torch_storylm
    model, ids, targets = _small_model(heads=heads, head_dim=3, vocab=11, length=7)
    loss, grads = numpy_storylm.nll_and_grads(ids, targets, *model.weights(), model.mask,
                                              model.scale, heads=heads)
    leaves = [torch.tensor(w, requires_grad=True) for w in model.weights()]
    torch_loss = torch_storylm.nll(torch.tensor(ids), torch.tensor(targets), *leaves,
                                   torch.tensor(model.mask), torch.tensor(model.scale), heads)
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-12)
    for name, grad, leaf in zip(storylm_data.TRAINABLE, grads, leaves, strict=True):
        np.testing.assert_allclose(grad, leaf.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


def test_numba_peer_step_and_forward_match_reference():
    pytest.importorskip("numba")
    from bench.peers import numba_storylm
    model = storylm_data.storylm0(4)
    wide = model.as_float64()
    ids, targets = storylm_data.corpus()[2]
    out = tuple(np.empty_like(w) for w in model.weights())
    loss = numba_storylm.nll_step_into(ids, targets, *model.weights(), model.mask, model.scale,
                                       model.lr, model.heads, *out)
    want_loss, *want = reference.nll_step(ids, targets, *wide.weights(), wide.mask,
                                          wide.scale, wide.lr)
    assert loss == pytest.approx(float(want_loss), rel=1e-5)
    for name, got, expected in zip(storylm_data.TRAINABLE, out, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    logits = np.empty((1, 4, model.vocab), np.float32)
    numba_storylm.forward_into(ids, *model.forward_args(ids)[1:], model.heads, logits)
    np.testing.assert_allclose(logits, reference.forward(*wide.forward_args(ids)), rtol=1e-5,
                               atol=1e-6)


def test_jax_peer_step_matches_reference():
    pytest.importorskip("jax")
    from bench.peers import jax_storylm
    model = storylm_data.storylm0(4)
    wide = model.as_float64()
    ids, targets = storylm_data.corpus()[1]
    loss, weights = jax_storylm.jit_step(model.heads)(
        model.weights(), ids, targets, model.mask, model.scale, model.lr)
    want_loss, *want = reference.nll_step(ids, targets, *wide.weights(), wide.mask,
                                          wide.scale, wide.lr)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    for name, got, expected in zip(storylm_data.TRAINABLE, weights, want, strict=True):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
