"""Independent NumPy reference for StoryLM-0 (BRIEF section 3, seed Sections 23 and 24).

This is the oracle the compiled Kina programs are checked against, so it is written plainly
from the brief's algebra, with the backward pass derived by hand; it shares no code with the
compiler. Every function computes in the dtype of the weights it is given: float32, like the
compiled code, or float64 for finite-difference checks. Mixing the two is a TypeError rather
than a silent promotion.

"Weights" below is a mapping with the seven checkpoint arrays (embed wq wk wv wo lm_head
scale); a `storylm.fixture.Checkpoint` is accepted wherever weights are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from storylm.fixture import (
    CHECKPOINT_NAMES,
    PAD_ID,
    TRAINABLE_NAMES,
    WIDTHS,
    Checkpoint,
    Window,
    causal_mask,
)

HEADS = WIDTHS.heads
ROLLOUT_LENGTH = 36  # Section 23: 4 prompt tokens + 32 generated
ROLLOUT_STEPS = 32
SAMPLING_SEED = 42
SAMPLING_TEMPERATURE = 0.8
UNIFORM_LOW = 1e-6  # Section 18 keeps u away from 0 and 1 so -log(-log(u)) is finite
UNIFORM_HIGH = 1 - 1e-6

Weights = Mapping[str, np.ndarray]


# --------------------------------------------------------------------------- forward


@dataclass(frozen=True)
class _Activations:
    """Forward intermediates the backward pass reads. Head tensors are [B, H, T, Dh]."""

    x: np.ndarray  # gathered embeddings [B, T, D]
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    probs: np.ndarray  # attention probabilities [B, H, T, T]
    attended: np.ndarray  # heads merged back [B, T, D]
    hidden: np.ndarray  # x + attended @ wo [B, T, D]
    logits: np.ndarray  # [B, T, V]


def softmax(values: np.ndarray, axis: int) -> np.ndarray:
    """Softmax with the row max subtracted first so exp never overflows."""
    shifted = values - values.max(axis=axis, keepdims=True)
    exps = np.exp(shifted)
    return exps / exps.sum(axis=axis, keepdims=True)


def log_softmax(values: np.ndarray, axis: int) -> np.ndarray:
    shifted = values - values.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _split_heads(projected: np.ndarray) -> np.ndarray:
    """[B, T, D] -> reshape [B, T, H, Dh] -> transpose [0, 2, 1, 3] -> [B, H, T, Dh]."""
    batch, length, width = projected.shape
    return projected.reshape(batch, length, HEADS, width // HEADS).transpose(0, 2, 1, 3)


def _merge_heads(heads: np.ndarray) -> np.ndarray:
    """[B, H, T, Dh] -> transpose [0, 2, 1, 3] -> reshape [B, T, D] (inverse of _split_heads)."""
    batch, heads_count, length, head_dim = heads.shape
    return heads.transpose(0, 2, 1, 3).reshape(batch, length, heads_count * head_dim)


def _check_one_float_dtype(**arrays: np.ndarray) -> None:
    dtypes = {name: np.asarray(array).dtype for name, array in arrays.items()}
    if len(set(dtypes.values())) != 1:
        raise TypeError(f"StoryLM-0 reference inputs must share one float dtype, got {dtypes}")


def _forward_pass(token_ids: np.ndarray, embed: np.ndarray, mask: np.ndarray,
                  scale: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray,
                  wo: np.ndarray, lm_head: np.ndarray) -> _Activations:
    _check_one_float_dtype(embed=embed, causal_mask=mask, scale=scale, wq=wq, wk=wk, wv=wv,
                           wo=wo, lm_head=lm_head)
    x = embed[token_ids]  # gather
    # x @ W on [B, T, D] @ [D, D] is the brief's x @ broadcast(W, [1, D, D]).
    q = _split_heads(x @ wq)
    k = _split_heads(x @ wk)
    v = _split_heads(x @ wv)
    scores = q @ k.transpose(0, 1, 3, 2) * scale + mask
    probs = softmax(scores, axis=3)
    attended = _merge_heads(probs @ v)
    hidden = x + attended @ wo
    logits = hidden @ lm_head
    return _Activations(x=x, q=q, k=k, v=v, probs=probs, attended=attended, hidden=hidden,
                        logits=logits)


def forward(token_ids: np.ndarray, token_embedding: np.ndarray, causal_mask: np.ndarray,
            scale: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray,
            wo: np.ndarray, lm_head: np.ndarray) -> np.ndarray:
    """StoryLM-0 logits [1, T, 8] for token ids [1, T] (parameter order of storylm0_forward)."""
    return _forward_pass(token_ids, token_embedding, causal_mask, scale, wq, wk, wv, wo,
                         lm_head).logits


def forward_weights(token_ids: np.ndarray, weights: Weights | Checkpoint) -> np.ndarray:
    """`forward` with the arrays taken from `weights` and the causal mask built for T."""
    arrays = _as_weights(weights)
    mask = causal_mask(token_ids.shape[1]).astype(arrays["embed"].dtype)
    return forward(token_ids, arrays["embed"], mask, arrays["scale"], arrays["wq"],
                   arrays["wk"], arrays["wv"], arrays["wo"], arrays["lm_head"])


def _as_weights(weights: Weights | Checkpoint) -> dict[str, np.ndarray]:
    arrays = weights.arrays() if isinstance(weights, Checkpoint) else dict(weights)
    missing = [name for name in CHECKPOINT_NAMES if name not in arrays]
    if missing:
        raise KeyError(f"weights lack {', '.join(missing)}")
    return arrays


# --------------------------------------------------------------------------- decoding


def greedy_row(row: np.ndarray) -> int:
    """Section 17: argmax over the V axis of a [1, 1, V] row; the first index wins ties."""
    return int(np.argmax(row, axis=2)[0, 0])


def sample_row(row: np.ndarray, u: np.ndarray, temperature: float | np.ndarray) -> int:
    """Section 18 Gumbel-max: argmax(row / temperature - log(-log(u))), u in (0, 1)."""
    temperature = np.asarray(temperature, dtype=row.dtype)
    perturbed = row / temperature - np.log(-np.log(u))
    return greedy_row(perturbed)


def uniform_row(stream: np.random.RandomState) -> np.ndarray:
    """The next [1, 1, V] float32 row of Section 18 uniforms from `stream`."""
    u = stream.uniform(UNIFORM_LOW, UNIFORM_HIGH, size=WIDTHS.vocab_size)
    return u.astype(np.float32).reshape(1, 1, WIDTHS.vocab_size)


def rollout(prompt: Sequence[int], weights: Weights | Checkpoint, steps: int = ROLLOUT_STEPS,
            T: int = ROLLOUT_LENGTH, mode: str = "greedy", rng_seed: int = SAMPLING_SEED,
            temperature: float = SAMPLING_TEMPERATURE) -> list[int]:
    """Section 23 host loop: re-forward the padded length-T buffer, decode one row per step.

    Step s reads logits row P-1+s and writes token P+s. Sampling draws one row of uniforms
    per step, in order, from RandomState(rng_seed). Returns the prompt and the generated ids.
    """
    if mode not in ("greedy", "sample"):
        raise ValueError(f"mode must be 'greedy' or 'sample', got {mode!r}")
    prompt_length = len(prompt)
    if prompt_length == 0 or prompt_length + steps > T:
        raise ValueError(f"need 1 <= len(prompt) and len(prompt) + steps <= T, "
                         f"got {prompt_length} + {steps} > {T}")
    arrays = _as_weights(weights)
    tokens = np.full((1, T), PAD_ID, dtype=np.int64)
    tokens[0, :prompt_length] = prompt
    uniforms = np.random.RandomState(rng_seed)
    for step in range(steps):
        logits = forward_weights(tokens, arrays)
        read = prompt_length - 1 + step
        row = logits[:, read:read + 1, :]
        if mode == "greedy":
            tokens[0, read + 1] = greedy_row(row)
        else:
            tokens[0, read + 1] = sample_row(row, uniform_row(uniforms), temperature)
    return tokens[0, :prompt_length + steps].tolist()


# --------------------------------------------------------------------------- loss and gradients


def _sum_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Sum over positions of -log_softmax(logits)[t, target_t] (sum, not mean)."""
    log_probs = log_softmax(logits, axis=2)
    picked = np.take_along_axis(log_probs, targets[..., np.newaxis], axis=2)
    return -picked.sum()


def nll(token_ids: np.ndarray, targets: np.ndarray, embed: np.ndarray, wq: np.ndarray,
        wk: np.ndarray, wv: np.ndarray, wo: np.ndarray, lm_head: np.ndarray,
        causal_mask: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Sum-NLL of one window (parameter order of storylm0_nll_step, without lr)."""
    logits = forward(token_ids, embed, causal_mask, scale, wq, wk, wv, wo, lm_head)
    return _sum_nll(logits, targets)


def _weight_grad(inputs: np.ndarray, output_grad: np.ndarray) -> np.ndarray:
    """Gradient of a weight W used as inputs @ W: the broadcast over [B, T] is summed."""
    return inputs.reshape(-1, inputs.shape[-1]).T @ output_grad.reshape(-1, output_grad.shape[-1])


def nll_and_grads(token_ids: np.ndarray, targets: np.ndarray, embed: np.ndarray,
                  wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray,
                  lm_head: np.ndarray, causal_mask: np.ndarray,
                  scale: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Sum-NLL and its gradient for each of the six weights, by the chain rule written out."""
    act = _forward_pass(token_ids, embed, causal_mask, scale, wq, wk, wv, wo, lm_head)
    loss = _sum_nll(act.logits, targets)

    # d(-log_softmax(z)[y]) / dz = softmax(z) - one_hot(y), at every position.
    vocab_size = lm_head.shape[1]
    one_hot = (np.arange(vocab_size) == targets[..., np.newaxis]).astype(embed.dtype)
    d_logits = softmax(act.logits, axis=2) - one_hot
    # logits = hidden @ lm_head
    d_lm_head = _weight_grad(act.hidden, d_logits)
    d_hidden = d_logits @ lm_head.T
    # hidden = x + attended @ wo; the residual hands d_hidden to x unchanged.
    d_wo = _weight_grad(act.attended, d_hidden)
    d_attended = d_hidden @ wo.T
    # attended = merge_heads(probs @ v)
    d_head_out = _split_heads(d_attended)
    d_probs = d_head_out @ act.v.transpose(0, 1, 3, 2)
    d_v = act.probs.transpose(0, 1, 3, 2) @ d_head_out
    # probs = softmax(scores): d_scores = P * (d_P - sum_j(d_P * P)) along each row.
    d_scores = act.probs * (d_probs - (d_probs * act.probs).sum(axis=3, keepdims=True))
    # scores = q @ k^T * scale + mask; scale and mask are constants.
    d_products = d_scores * scale
    d_q = d_products @ act.k
    d_k = d_products.transpose(0, 1, 3, 2) @ act.q
    # q, k, v = split_heads(x @ W); each projection also sends gradient back to x.
    d_x = d_hidden.copy()
    grads = {"wo": d_wo, "lm_head": d_lm_head}
    for name, weight, d_head in (("wq", wq, d_q), ("wk", wk, d_k), ("wv", wv, d_v)):
        d_projected = _merge_heads(d_head)
        grads[name] = _weight_grad(act.x, d_projected)
        d_x += d_projected @ weight.T
    # x = embed[ids]: the gather's adjoint scatter-adds rows; repeated ids accumulate.
    d_embed = np.zeros_like(embed)
    np.add.at(d_embed, token_ids.reshape(-1), d_x.reshape(-1, embed.shape[1]))
    grads["embed"] = d_embed
    return loss, {name: grads[name] for name in TRAINABLE_NAMES}


# --------------------------------------------------------------------------- training


def sgd_step(weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
             lr: float | np.ndarray) -> dict[str, np.ndarray]:
    """Section 11 SGD, w - lr * g, for each weight in `grads`; other arrays pass through."""
    updated = dict(weights)
    for name, grad in grads.items():
        rate = np.asarray(lr, dtype=grad.dtype).reshape(())  # lr may be the [1, 1] tensor
        updated[name] = weights[name] - rate * grad
    return updated


def nll_step(token_ids: np.ndarray, targets: np.ndarray, embed: np.ndarray, wq: np.ndarray,
             wk: np.ndarray, wv: np.ndarray, wo: np.ndarray, lm_head: np.ndarray,
             causal_mask: np.ndarray, scale: np.ndarray,
             lr: float | np.ndarray) -> tuple[np.ndarray, ...]:
    """Reference for storylm0_nll_step: (nll, embed', wq', wk', wv', wo', lm_head')."""
    weights = {"embed": embed, "wq": wq, "wk": wk, "wv": wv, "wo": wo, "lm_head": lm_head}
    loss, grads = nll_and_grads(token_ids, targets, embed, wq, wk, wv, wo, lm_head,
                                causal_mask, scale)
    updated = sgd_step(weights, grads, lr)
    return (loss, *(updated[name] for name in TRAINABLE_NAMES))


def window_nll_and_grads(weights: Weights | Checkpoint,
                         window: Window) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`nll_and_grads` for one corpus window, arrays taken from `weights`."""
    arrays = _as_weights(weights)
    ids = window.id_array()
    mask = causal_mask(ids.shape[1]).astype(arrays["embed"].dtype)
    return nll_and_grads(ids, window.target_array(), arrays["embed"], arrays["wq"],
                         arrays["wk"], arrays["wv"], arrays["wo"], arrays["lm_head"], mask,
                         arrays["scale"])


def corpus_nll(weights: Weights | Checkpoint, corpus: Sequence[Window]) -> float:
    """Sum of the windows' sum-NLLs (the figure Section 24 tracks)."""
    arrays = _as_weights(weights)
    return float(sum(_sum_nll(forward_weights(window.id_array(), arrays), window.target_array())
                     for window in corpus))


@dataclass(frozen=True, eq=False)
class TrainResult:
    """Trained weights (all seven arrays) and corpus sum-NLL at init and after each epoch."""

    weights: dict[str, np.ndarray]
    nll_history: list[float]  # [init, after epoch 1, ..., after epoch `epochs`]


def train(checkpoint: Weights | Checkpoint, corpus: Sequence[Window], epochs: int = 40,
          lr: float = 0.1) -> TrainResult:
    """Section 24 loop: per epoch, one SGD step on each window in order."""
    weights = _as_weights(checkpoint)
    history = [corpus_nll(weights, corpus)]
    for _ in range(epochs):
        for window in corpus:
            _, grads = window_nll_and_grads(weights, window)
            weights = sgd_step(weights, grads, lr)
        history.append(corpus_nll(weights, corpus))
    return TrainResult(weights=weights, nll_history=history)
