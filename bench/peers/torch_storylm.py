"""StoryLM in PyTorch: eager forward, autograd training step, and the torch.compile versions.

Tensors come from NumPy with `torch.from_numpy` (no copy). The eager step uses
`torch.autograd.grad` on fresh leaves, the way a functional training loop is written in
eager PyTorch; the compiled step is `torch.func.grad_and_value` under `torch.compile`
(default mode), so the whole step, backward included, is one compiled graph.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.func import grad_and_value


def tensors(*arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Tensors sharing the arrays' memory; read-only arrays (the fixture's) are copied once,
    since PyTorch has no read-only tensors."""
    return tuple(torch.from_numpy(a if a.flags.writeable and a.flags.c_contiguous
                                  else np.array(a, order="C")) for a in arrays)


def forward(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads: int):
    x = embed[ids]
    batch, length, width = x.shape

    def split(projected):
        return projected.reshape(batch, length, heads, width // heads).transpose(1, 2)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    probs = torch.softmax(q @ k.transpose(-1, -2) * scale + mask, dim=-1)
    attended = (probs @ v).transpose(1, 2).reshape(batch, length, width)
    return (x + attended @ wo) @ lm_head


def nll(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, heads: int):
    logits = forward(ids, embed, mask, scale, wq, wk, wv, wo, lm_head, heads)
    return -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).sum()


def eager_step(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, lr, heads: int):
    """(nll, embed', ..., lm_head') with autograd; the inputs are not modified."""
    leaves = [w.detach().requires_grad_(True) for w in (embed, wq, wk, wv, wo, lm_head)]
    embed, wq, wk, wv, wo, lm_head = leaves
    loss = nll(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, heads)
    grads = torch.autograd.grad(loss, leaves)
    with torch.no_grad():
        return (loss.detach(), *(w - lr * g for w, g in zip(leaves, grads, strict=True)))


def functional_step(ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, lr,
                    heads: int):
    """The same step through torch.func, which torch.compile traces as one graph."""
    grads, loss = grad_and_value(nll, argnums=(2, 3, 4, 5, 6, 7))(
        ids, targets, embed, wq, wk, wv, wo, lm_head, mask, scale, heads)
    weights = (embed, wq, wk, wv, wo, lm_head)
    return (loss, *(w - lr * g for w, g in zip(weights, grads, strict=True)))


def compiled(function):
    """torch.compile with its default mode (inductor); `dynamic=False` since every shape here
    is static, as in Kina. Inductor compiles in this process (compile_threads = 1): its
    default pool of compile workers keeps running after the first call and would steal the
    cores from the timed rounds (medians of 100 us with 40 ms outliers here)."""
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = 1
    return torch.compile(function, dynamic=False)
