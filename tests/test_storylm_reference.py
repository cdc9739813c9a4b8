"""The StoryLM-0 NumPy reference: algebra, decoding, hand gradients, and the Section 24 figures.

Gradients are checked against central finite differences in float64 and against
torch.autograd; causal non-leak is checked in NumPy and in a PyTorch re-implementation.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storylm import fixture, reference
from storylm.fixture import TRAINABLE_NAMES

CYCLE = [1, 2, 3, 4, 5, 6] * 6  # once upon a time the end, repeated


@pytest.fixture(scope="module")
def checkpoint() -> fixture.Checkpoint:
    return fixture.load_checkpoint(fixture.DEFAULT_FIXTURE_DIR)


@pytest.fixture(scope="module")
def corpus() -> list[fixture.Window]:
    return fixture.load_corpus(fixture.DEFAULT_FIXTURE_DIR)


@pytest.fixture(scope="module")
def trained(checkpoint, corpus) -> reference.TrainResult:
    return reference.train(checkpoint, corpus, epochs=40, lr=0.1)


def as_float64(weights) -> dict[str, np.ndarray]:
    arrays = weights.arrays() if isinstance(weights, fixture.Checkpoint) else weights
    return {name: array.astype(np.float64) for name, array in arrays.items()}


def random_weights(seed: int, dtype=np.float64) -> dict[str, np.ndarray]:
    """Generic weights (the patterned ones repeat rows, which could hide index mix-ups)."""
    rng = np.random.RandomState(seed)
    arrays = {name: rng.normal(0, 0.7, shape).astype(dtype)
              for name, shape in fixture.ARRAY_SHAPES.items() if name != "scale"}
    arrays["scale"] = fixture.attention_scale().astype(dtype)
    return arrays


def nll_args(weights, ids, targets):
    mask = fixture.causal_mask(ids.shape[1]).astype(weights["embed"].dtype)
    return (ids, targets, weights["embed"], weights["wq"], weights["wk"], weights["wv"],
            weights["wo"], weights["lm_head"], mask, weights["scale"])


def ids_of(tokens) -> np.ndarray:
    return np.array([tokens], dtype=np.int64)


# --------------------------------------------------------------------------- forward


def test_forward_shape_and_dtype(checkpoint):
    w = checkpoint.arrays()
    logits = reference.forward(ids_of([1, 4, 2, 6]), w["embed"], fixture.causal_mask(4),
                               w["scale"], w["wq"], w["wk"], w["wv"], w["wo"], w["lm_head"])
    assert logits.shape == (1, 4, 8) and logits.dtype == np.float32
    np.testing.assert_array_equal(logits, reference.forward_weights(ids_of([1, 4, 2, 6]), w))


def test_forward_matches_an_einsum_restatement(checkpoint):
    """The same algebra written per head with einsum, in float64."""
    w = as_float64(checkpoint)
    ids = [1, 4, 2, 6, 3]
    x = w["embed"][ids]
    heads = []
    for head in range(2):
        cols = slice(2 * head, 2 * head + 2)
        q, k, v = (x @ w[name][:, cols] for name in ("wq", "wk", "wv"))
        scores = np.einsum("id,jd->ij", q, k) * w["scale"].item()  # float32(1/sqrt(2))
        scores = np.where(np.tri(len(ids), dtype=bool), scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append((probs / probs.sum(axis=1, keepdims=True)) @ v)
    expected = (x + np.concatenate(heads, axis=1) @ w["wo"]) @ w["lm_head"]
    np.testing.assert_allclose(reference.forward_weights(ids_of(ids), w)[0], expected,
                               rtol=1e-12, atol=1e-12)


def test_padded_prefix_matches_the_short_forward(checkpoint):
    """Section 23 (a): rows 0..3 of the padded T = 36 buffer equal the T = 4 forward.

    Equal up to float32 rounding, not bit for bit: NumPy groups the softmax sums and matmuls
    differently at T = 36 and T = 4 (the masked terms are exact zeros, but association moves).
    """
    padded = ids_of([1, 4, 2, 6] + [fixture.PAD_ID] * 32)
    short = reference.forward_weights(ids_of([1, 4, 2, 6]), checkpoint)
    np.testing.assert_allclose(reference.forward_weights(padded, checkpoint)[:, :4], short,
                               rtol=1e-5, atol=1e-6)


def test_softmax_is_stable_and_normalised():
    rows = np.array([[1e4, 1e4 - 1.0, -1e9], [0.0, 0.0, 0.0]], dtype=np.float32)
    probs = reference.softmax(rows, axis=1)
    assert np.all(np.isfinite(probs))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert probs[0, 2] == 0.0
    log_probs = reference.log_softmax(rows, axis=1)
    assert np.all(np.isfinite(log_probs))  # the masked entry stays finite, about -1e9
    np.testing.assert_allclose(log_probs[:, :2], np.log(probs[:, :2]), rtol=1e-6)


def test_mixed_dtypes_are_refused(checkpoint):
    weights = {**checkpoint.arrays(), "wq": checkpoint.wq.astype(np.float64)}
    with pytest.raises(TypeError, match="one float dtype"):
        reference.forward_weights(ids_of([1, 2]), weights)


# --------------------------------------------------------------------------- causal non-leak


@settings(deadline=None)
@given(tokens=st.lists(st.integers(0, 7), min_size=2, max_size=36), new_id=st.integers(0, 7),
       use_trained=st.booleans())
def test_changing_the_last_id_leaves_earlier_rows_unchanged(checkpoint, trained, tokens,
                                                            new_id, use_trained):
    weights = trained.weights if use_trained else checkpoint
    changed = tokens[:-1] + [new_id]
    before = reference.forward_weights(ids_of(tokens), weights)
    after = reference.forward_weights(ids_of(changed), weights)
    np.testing.assert_array_equal(before[:, :-1], after[:, :-1])


# --------------------------------------------------------------------------- decoding


def test_greedy_row_takes_the_first_maximum():
    row = np.array([[[0.5, 2.0, -1.0, 2.0, 2.0, 0.0, 1.0, 1.5]]], dtype=np.float32)
    assert reference.greedy_row(row) == 1


def test_sample_row_is_gumbel_max():
    row = np.array([[[0.3, 0.1, 0.9, -0.2, 0.0, 0.4, 0.2, 0.8]]], dtype=np.float32)
    u = np.array([[[0.2, 0.99, 0.1, 0.5, 0.4, 0.3, 0.6, 0.05]]], dtype=np.float32)
    gumbel = -np.log(-np.log(u.astype(np.float64)))
    expected = int(np.argmax(row.astype(np.float64) / 0.8 + gumbel))
    assert reference.sample_row(row, u, 0.8) == expected == 1
    assert reference.sample_row(row, u, np.array([[0.8]], dtype=np.float32)) == expected
    uniform = np.full_like(u, 0.5)  # equal noise everywhere: sampling is greedy
    assert reference.sample_row(row, uniform, 0.8) == reference.greedy_row(row)


def test_uniform_rows_follow_randomstate_42():
    stream = np.random.RandomState(42)
    rows = [reference.uniform_row(stream) for _ in range(3)]
    expected = np.random.RandomState(42).uniform(1e-6, 1 - 1e-6, size=24).astype(np.float32)
    assert all(row.shape == (1, 1, 8) and row.dtype == np.float32 for row in rows)
    np.testing.assert_array_equal(np.concatenate([row.ravel() for row in rows]), expected)


def test_rollout_follows_the_section_23_loop(checkpoint):
    """Re-derive each token from the final buffer: row P-1+s decides token P+s."""
    for mode in ("greedy", "sample"):
        tokens = reference.rollout([1, 4, 2, 6], checkpoint, mode=mode)
        assert len(tokens) == 36 and tokens[:4] == [1, 4, 2, 6]
        assert tokens == reference.rollout([1, 4, 2, 6], checkpoint, mode=mode)  # repeatable
        logits = reference.forward_weights(ids_of(tokens), checkpoint)
        stream = np.random.RandomState(42)
        for step in range(32):
            row = logits[:, 3 + step:4 + step, :]
            if mode == "greedy":
                expected = reference.greedy_row(row)
            else:
                expected = reference.sample_row(row, reference.uniform_row(stream), 0.8)
            assert tokens[4 + step] == expected, (mode, step)


def test_rollout_short_run_and_bad_arguments(checkpoint):
    assert reference.rollout([1, 2, 3, 4], checkpoint, steps=8) == \
        reference.rollout([1, 2, 3, 4], checkpoint)[:12]
    with pytest.raises(ValueError, match="mode"):
        reference.rollout([1], checkpoint, mode="beam")
    with pytest.raises(ValueError, match="steps <= T"):
        reference.rollout([1, 2, 3, 4, 5], checkpoint, steps=32)


# --------------------------------------------------------------------------- gradients


def finite_difference_grads(weights, ids, targets, step=1e-6) -> dict[str, np.ndarray]:
    grads = {}
    for name in TRAINABLE_NAMES:
        grad = np.zeros_like(weights[name])
        for index in np.ndindex(*grad.shape):
            plus, minus = dict(weights), dict(weights)
            plus[name] = weights[name].copy()
            minus[name] = weights[name].copy()
            plus[name][index] += step
            minus[name][index] -= step
            grad[index] = (reference.nll(*nll_args(plus, ids, targets))
                           - reference.nll(*nll_args(minus, ids, targets))) / (2 * step)
        grads[name] = grad
    return grads


GRADIENT_CASES = {
    "fixture window": ([1, 2, 3, 4], [2, 3, 4, 5]),
    "repeated ids accumulate": ([2, 2, 5, 2, 0], [2, 7, 2, 1, 3]),
    "single token": ([6], [1]),
}


@pytest.mark.parametrize("case", GRADIENT_CASES)
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_hand_gradients_match_finite_differences(checkpoint, case, seed):
    weights = as_float64(checkpoint) if seed is None else random_weights(seed)
    ids, targets = (ids_of(tokens) for tokens in GRADIENT_CASES[case])
    loss, grads = reference.nll_and_grads(*nll_args(weights, ids, targets))
    assert loss == reference.nll(*nll_args(weights, ids, targets))
    assert list(grads) == list(TRAINABLE_NAMES)
    numeric = finite_difference_grads(weights, ids, targets)
    for name in TRAINABLE_NAMES:
        assert grads[name].shape == weights[name].shape and grads[name].dtype == np.float64
        np.testing.assert_allclose(grads[name], numeric[name], rtol=1e-6, atol=1e-8,
                                   err_msg=name)


def test_float32_gradients_track_float64(checkpoint, corpus):
    window = corpus[2]
    loss32, grads32 = reference.window_nll_and_grads(checkpoint, window)
    loss64, grads64 = reference.window_nll_and_grads(as_float64(checkpoint), window)
    assert loss32.dtype == np.float32
    np.testing.assert_allclose(loss32, loss64, rtol=1e-6)
    for name in TRAINABLE_NAMES:
        assert grads32[name].dtype == np.float32
        np.testing.assert_allclose(grads32[name], grads64[name], rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- PyTorch


def torch_forward(torch, ids, w):
    """The brief's algebra restated in PyTorch (second, independent implementation)."""
    length = ids.shape[1]
    mask = torch.triu(torch.full((length, length), -1e9, dtype=w["wq"].dtype), diagonal=1)
    x = w["embed"][ids]

    def heads(projected):
        return projected.reshape(1, length, 2, 2).permute(0, 2, 1, 3)

    q, k, v = heads(x @ w["wq"]), heads(x @ w["wk"]), heads(x @ w["wv"])
    scores = q @ k.transpose(2, 3) * w["scale"] + mask
    attended = (torch.softmax(scores, dim=3) @ v).permute(0, 2, 1, 3).reshape(1, length, 4)
    return (x + attended @ w["wo"]) @ w["lm_head"]


def to_torch(torch, weights, requires_grad=False):
    return {name: torch.tensor(array, requires_grad=requires_grad and name != "scale")
            for name, array in weights.items()}


@pytest.mark.parametrize("seed", [None, 3])
def test_hand_gradients_match_torch_autograd(checkpoint, seed):
    torch = pytest.importorskip("torch")
    weights = as_float64(checkpoint) if seed is None else random_weights(seed)
    ids, targets = ids_of([3, 1, 3, 6, 0, 2]), ids_of([1, 3, 6, 0, 2, 7])
    loss, grads = reference.nll_and_grads(*nll_args(weights, ids, targets))
    tensors = to_torch(torch, weights, requires_grad=True)
    logits = torch_forward(torch, torch.tensor(ids), tensors)
    torch_loss = torch.nn.functional.cross_entropy(logits[0], torch.tensor(targets[0]),
                                                   reduction="sum")
    torch_loss.backward()
    np.testing.assert_allclose(loss, torch_loss.item(), rtol=1e-12)
    for name in TRAINABLE_NAMES:
        np.testing.assert_allclose(grads[name], tensors[name].grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)


def test_torch_forward_agrees_and_does_not_leak(checkpoint, trained):
    torch = pytest.importorskip("torch")
    for weights in (checkpoint.arrays(), trained.weights):
        tensors = to_torch(torch, weights)
        tokens = reference.rollout([1, 4, 2, 6], weights)
        # +1: the patterned embed repeats every 3 rows, so id and id + 3 look alike
        changed = tokens[:-1] + [(tokens[-1] + 1) % 8]
        with torch.no_grad():
            before = torch_forward(torch, torch.tensor(ids_of(tokens)), tensors).numpy()
            after = torch_forward(torch, torch.tensor(ids_of(changed)), tensors).numpy()
        np.testing.assert_array_equal(before[:, :-1], after[:, :-1])
        assert not np.array_equal(before[:, -1], after[:, -1])
        np.testing.assert_allclose(before, reference.forward_weights(ids_of(tokens), weights),
                                   rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- training


def test_sgd_step_and_nll_step(checkpoint, corpus):
    window = corpus[0]
    weights = checkpoint.arrays()
    loss, grads = reference.window_nll_and_grads(weights, window)
    updated = reference.sgd_step(weights, grads, 0.1)
    assert updated["scale"] is weights["scale"]
    for name in TRAINABLE_NAMES:
        assert updated[name].dtype == np.float32
        np.testing.assert_array_equal(updated[name],
                                      weights[name] - np.float32(0.1) * grads[name])
    step = reference.nll_step(*nll_args(weights, window.id_array(), window.target_array()),
                              np.array([[0.1]], dtype=np.float32))
    assert step[0] == loss
    for name, array in zip(TRAINABLE_NAMES, step[1:], strict=True):
        np.testing.assert_array_equal(array, updated[name])


def test_training_reaches_the_brief_figures(trained):
    history = trained.nll_history
    assert len(history) == 41
    assert history[0] == pytest.approx(25.67, abs=0.005)  # brief: 25.67 at init
    assert history[-1] < 0.5  # Section 24 bar
    assert history[-1] == pytest.approx(0.06, abs=0.01)  # brief: about 0.06
    assert all(later <= earlier for earlier, later in itertools.pairwise(history))


def test_trained_greedy_rollout_continues_the_cycle(trained):
    tokens = reference.rollout([1, 2, 3, 4], trained.weights, steps=8)
    assert tokens == [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]  # Section 24 locked cycle
    assert reference.rollout([1, 2, 3, 4], trained.weights) == CYCLE  # all 32 tokens


def test_trained_weights_save_and_reload(tmp_path, trained, corpus):
    folder = fixture.save_checkpoint(tmp_path / "trained", trained.weights, corpus=corpus)
    reloaded = fixture.load_checkpoint(folder)
    for name, array in trained.weights.items():
        np.testing.assert_array_equal(getattr(reloaded, name), array)
    assert reference.corpus_nll(reloaded, fixture.load_corpus(folder)) == trained.nll_history[-1]
