"""Fused attention (tilegen/attention.py): softmax(q k^T * scale + mask) @ v compiled as one
blocked online-softmax nest, checked against torch's scaled_dot_product_attention in
float64 (an independent implementation), with causal masks in each spelling Kina has
(`where` on positions, an additive mask built from positions, a mask passed in), padding
masks, odd head widths and sequence lengths from 1 to 2048; that the fused nest is what
runs (no tq x tk buffer in the kernel); that its peak memory does not grow as T^2; and
gradients of the same program through reverseMode (fused too: tests/test_attention_backward.py
tests the backward in depth).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tilegen import config
from tilegen.api import compile_program
from tilegen.loopir import Attention, format_kernel
from tilegen.pipeline import plan_program

SDPA = torch.nn.functional.scaled_dot_product_attention

# How each mask form reads in Kina; `s` is the scaled scores, `future` j > i.
MASKS = {
    "none": "s",
    "causal_where": "where(future, -1e9, s)",
    "causal_additive": "s + cast(where(future, -1e9, 0.0), DT)",
    "causal_cast": "s + cast(future, DT) * -1e9",
    "causal_input": "s + broadcast(causal, [B, H, T, T])",
    "padding": "s + broadcast(reshape((cast(keep, DT) - 1.0) * 1e9, [B, 1, 1, T]), [B, H, T, T])",
}
POSITIONAL = ("causal_where", "causal_additive", "causal_cast")
KEYS, QUERIES = "iota(shape=[B, H, T, T], axis=3)", "iota(shape=[B, H, T, T], axis=2)"
# (score expression, the causal offset the fused nest should find, torch's mask of j, i)
SPELLINGS = [
    (f"where(less({QUERIES}, {KEYS}), -1e9, s)", 0, lambda j, i: j > i),
    (f"where(greater({KEYS}, {QUERIES} + 2), -1e9, s)", 2, lambda j, i: j > i + 2),
    (f"where(greater_equal({KEYS}, {QUERIES} + 1), -1e9, s)", 0, lambda j, i: j >= i + 1),
    # The diagonal masked too: row 0 has no key left, so nothing may be skipped.
    (f"where(greater_equal({KEYS}, {QUERIES}), -1e9, s)", None, lambda j, i: j >= i),
    # -1 is not a masking constant: every key counts, nothing is skipped.
    (f"where(greater({KEYS}, {QUERIES}), -1.0, s)", None, None),
    (f"where(greater({QUERIES}, {KEYS}), -1e9, s)", None, lambda j, i: i > j),
]


def attention_source(b: int, h: int, t: int, d: int, mask: str, dtype: str = "F64",
                     gradient: bool = False) -> str:
    def ty(shape):
        return f"Tensor[{dtype}, [{shape}], @host]"
    extra = {"causal_input": f", causal: {ty('1, 1, T, T')}",
             "padding": ", keep: Tensor[I64, [B, T], @host]"}.get(mask, "")
    extra_args = {"causal_input": ", causal", "padding": ", keep"}.get(mask, "")
    scale = 1 / math.sqrt(d)
    source = f"""
    const B = {b};
    const H = {h};
    const T = {t};
    const D = {d};
    fn attn(q: {ty('B, H, T, D')}, k: {ty('B, H, T, D')}, v: {ty('B, H, T, D')}{extra})
        -> {ty('B, H, T, D')} {{
      let s = q @ transpose(k, [0, 1, 3, 2]) * {scale!r};
      let future = greater(iota(shape=[B, H, T, T], axis=3), iota(shape=[B, H, T, T], axis=2));
      return softmax({MASKS[mask].replace('DT', dtype)}, axis=3) @ v;
    }}
    """
    if gradient:
        source += f"""
    fn loss(q: {ty('B, H, T, D')}, k: {ty('B, H, T, D')}, v: {ty('B, H, T, D')},
            w: {ty('B, H, T, D')}{extra}) -> Tensor[{dtype}, [], @host] {{
      let o = attn(q, k, v{extra_args}) * w;
      return sum(sum(sum(sum(o, axis=3), axis=2), axis=1), axis=0);
    }}
    fn grads(q: {ty('B, H, T, D')}, k: {ty('B, H, T, D')}, v: {ty('B, H, T, D')},
             w: {ty('B, H, T, D')}{extra})
        -> ({ty('B, H, T, D')}, {ty('B, H, T, D')}, {ty('B, H, T, D')}) {{
      let (y, gq, gk, gv) = reverseMode(loss, wrt=[q, k, v])(q, k, v, w{extra_args});
      return (gq, gk, gv);
    }}
    """
    return textwrap.dedent(source)


def _inputs(b, h, t, d, mask, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(dtype) for _ in range(3))
    extra, torch_mask, causal = [], None, False
    if mask in POSITIONAL:
        causal = True
    elif mask == "causal_input":
        extra = [np.triu(np.full((1, 1, t, t), -1e9, dtype), 1)]
        causal = True
    elif mask == "padding":
        lengths = rng.integers(1, t + 1, size=b)
        keep = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int64)
        extra = [keep]
        torch_mask = torch.from_numpy(keep.astype(bool))[:, None, None, :]
    return q, k, v, extra, torch_mask, causal


def _reference(q, k, v, torch_mask, causal, d):
    tensors = [torch.from_numpy(a).double() for a in (q, k, v)]
    return SDPA(*tensors, attn_mask=torch_mask, is_causal=causal,
                scale=1 / math.sqrt(d)).numpy()


@pytest.fixture
def fused(monkeypatch):
    """Every attention pattern fused, whatever its size (the default leaves tiny ones)."""
    monkeypatch.setenv("TILEGEN_FUSED_ATTENTION", "always")


def _kernel(source: str, name: str = "attn"):
    program = program_from_text(source)
    (plan,) = plan_program(program, (name,), config.load())
    return plan.kernel


CASES = [(1, "causal_where", 24), (17, "causal_where", 33), (17, "padding", 24),
         (64, "causal_additive", 33), (64, "none", 24), (257, "causal_where", 24),
         (257, "padding", 33), (257, "causal_cast", 33), (257, "causal_input", 24),
         (1024, "causal_where", 33), (1024, "padding", 24), (2048, "causal_additive", 24)]


@pytest.mark.parametrize(("t", "mask", "d"), CASES)
def test_forward_matches_torch_sdpa(fused, t, mask, d):
    b, h = (2, 2) if t <= 257 else (1, 2)
    source = attention_source(b, h, t, d, mask)
    assert any(isinstance(s, Attention) for s in _kernel(source).body)
    q, k, v, extra, torch_mask, causal = _inputs(b, h, t, d, mask, seed=t)
    got = compile_program(program_from_text(source)).attn(q, k, v, *extra)
    expected = _reference(q, k, v, torch_mask, causal, d)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask", ["causal_where", "padding"])
def test_forward_f32_matches_torch_within_float_rounding(fused, mask):
    b, h, t, d = 2, 3, 129, 40
    source = attention_source(b, h, t, d, mask, dtype="F32")
    assert any(isinstance(s, Attention) for s in _kernel(source).body)
    q, k, v, extra, torch_mask, causal = _inputs(b, h, t, d, mask, dtype=np.float32)
    got = compile_program(program_from_text(source)).attn(q, k, v, *extra)
    expected = _reference(q, k, v, torch_mask, causal, d)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_the_fused_nest_is_what_runs(fused, mask):
    t = 300
    kernel = _kernel(attention_source(1, 2, t, 24, mask))
    (nest,) = [s for s in kernel.body if isinstance(s, Attention)]
    # No buffer of the kernel holds a T x T matrix but a mask passed in as an argument.
    for buffer in kernel.buffers:
        if buffer.role != "input":
            assert buffer.size < t * t, format_kernel(kernel)
    assert (nest.causal == 0) == (mask in POSITIONAL)
    assert "attention out0" in format_kernel(kernel)


@pytest.mark.parametrize(("expression", "offset", "masked"), SPELLINGS)
def test_mask_spellings(fused, expression, offset, masked):
    b, h, t, d = 1, 2, 150, 24
    source = attention_source(b, h, t, d, "none").replace(
        "softmax(s, axis=3)", f"softmax({expression}, axis=3)")
    (nest,) = [s for s in _kernel(source).body if isinstance(s, Attention)]
    assert nest.causal == offset
    q, k, v, *_ = _inputs(b, h, t, d, "none", seed=7)
    got = compile_program(program_from_text(source)).attn(q, k, v)
    scores = torch.from_numpy(q) @ torch.from_numpy(k).transpose(2, 3) / math.sqrt(d)
    j, i = torch.arange(t)[None, :], torch.arange(t)[:, None]
    if masked is None:  # the -1.0 spelling
        scores = torch.where(j > i, torch.tensor(-1.0, dtype=torch.float64), scores)
    else:
        scores = torch.where(masked(j, i), torch.tensor(-1e9, dtype=torch.float64), scores)
    expected = (torch.softmax(scores, dim=3) @ torch.from_numpy(v)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_auto_fuses_long_attention_only(monkeypatch):
    monkeypatch.delenv("TILEGEN_FUSED_ATTENTION", raising=False)
    assert not any(isinstance(s, Attention) for s in
                   _kernel(attention_source(1, 2, 36, 8, "causal_where")).body)
    assert any(isinstance(s, Attention) for s in
               _kernel(attention_source(1, 2, 64, 8, "causal_where")).body)
    monkeypatch.setenv("TILEGEN_FUSED_ATTENTION", "never")
    assert not any(isinstance(s, Attention) for s in
                   _kernel(attention_source(1, 2, 512, 8, "causal_where")).body)


def test_a_reused_probability_matrix_is_not_fused(fused):
    # p is also a result: the pattern does not hold, the ops lower as they are.
    source = """
    fn f(q: Tensor[F64, [2, 80, 8], @host], k: Tensor[F64, [2, 8, 80], @host],
         v: Tensor[F64, [2, 80, 8], @host])
        -> (Tensor[F64, [2, 80, 8], @host], Tensor[F64, [2, 80, 80], @host]) {
      let p = softmax(q @ k, axis=2);
      return (p @ v, p);
    }
    """
    kernel = _kernel(source, "f")
    assert not any(isinstance(s, Attention) for s in kernel.body)
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 80, 8)), rng.standard_normal((2, 8, 80)), \
        rng.standard_normal((2, 80, 8))
    o, p = compile_program(program_from_text(source)).f(q, k, v)
    expected = torch.softmax(torch.from_numpy(q @ k), dim=2).numpy()
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    np.testing.assert_allclose(o, expected @ v, rtol=1e-12)


def test_rank_three_attention_with_another_value_width(fused):
    # No head axis, dv != d, the scale written as a division.
    source = """
    fn f(q: Tensor[F64, [3, 70, 20], @host], k: Tensor[F64, [3, 50, 20], @host],
         v: Tensor[F64, [3, 50, 13], @host]) -> Tensor[F64, [3, 70, 13], @host] {
      return softmax(q @ transpose(k, [0, 2, 1]) / 4.0, axis=2) @ v;
    }
    """
    assert any(isinstance(s, Attention) for s in _kernel(source, "f").body)
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s) for s in ((3, 70, 20), (3, 50, 20), (3, 50, 13)))
    got = compile_program(program_from_text(source)).f(q, k, v)
    tensors = [torch.from_numpy(a) for a in (q, k, v)]
    np.testing.assert_allclose(got, SDPA(*tensors, scale=0.25).numpy(), rtol=1e-10)


@pytest.mark.parametrize(("t", "mask", "d"), [(1, "causal_where", 24), (17, "padding", 33),
                                              (64, "causal_where", 33),
                                              (257, "causal_additive", 24)])
def test_gradients_match_torch(fused, t, mask, d):
    b, h = 1, 2
    source = attention_source(b, h, t, d, mask, gradient=True)
    q, k, v, extra, torch_mask, causal = _inputs(b, h, t, d, mask, seed=t + 1)
    w = np.random.default_rng(t).standard_normal(q.shape)
    got = compile_program(program_from_text(source)).grads(q, k, v, w, *extra)
    tensors = [torch.from_numpy(a).double().requires_grad_() for a in (q, k, v)]
    out = SDPA(*tensors, attn_mask=torch_mask, is_causal=causal, scale=1 / math.sqrt(d))
    (out * torch.from_numpy(w)).sum().backward()
    for name, mine, tensor in zip("qkv", got, tensors, strict=True):
        np.testing.assert_allclose(mine, tensor.grad.numpy(), rtol=1e-9, atol=1e-11,
                                   err_msg=f"d{name}")


_PEAK_PROBE = """
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from kina_frontend import program_from_text
from tilegen.api import compile_program
from tests.test_attention import attention_source
module = compile_program(program_from_text(attention_source(1, 8, 2048, 64, "causal_where",
                                                            dtype="F32")))
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 8, 2048, 64)).astype(np.float32) for _ in range(3))
attn = module.attn  # compiled on first use: before the measurement
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = attn(q, k, v)
assert np.isfinite(out).all()
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.parametrize("mode", ["auto"])
def test_peak_memory_does_not_grow_as_t_squared(mode, tmp_path):
    # T = 2048, 8 heads: a score buffer alone would be 8 * 2048^2 * 4 bytes = 128 MB. The
    # call's own high-water mark (RSS after compiling and making the inputs, in a fresh
    # process) stays far below that: the inputs, output and padded copies are 4 MB each.
    import os
    import pathlib

    root = str(pathlib.Path(__file__).resolve().parent.parent)
    environment = dict(os.environ, TILEGEN_FUSED_ATTENTION=mode, PYTHONPATH=root)
    completed = subprocess.run([sys.executable, "-c", _PEAK_PROBE, root], capture_output=True,
                               text=True, env=environment, timeout=600, cwd=root)
    assert completed.returncode == 0, completed.stderr
    before, after = (int(x) for x in completed.stdout.split())
    grown_mb = (after - before) / 1024  # ru_maxrss is in KB on Linux
    assert grown_mb < 32, f"the call raised peak RSS by {grown_mb:.1f} MB"


def test_a_deep_score_chain_stays_fused(fused):
    # The mask is 46 ops deep, so the chain ops after the scores pass the fusion depth at
    # which lowering stores a view; a stored score would leave the scores unbound.
    mask = "m" + " + m" * 46
    source = f"""
    fn f(q: Tensor[F64, [2, 40, 8], @host], k: Tensor[F64, [2, 8, 40], @host],
         v: Tensor[F64, [2, 40, 8], @host], m: Tensor[F64, [2, 40, 40], @host])
        -> Tensor[F64, [2, 40, 8], @host] {{
      return softmax((q @ k + ({mask}) * 0.01) * 1.0 * 1.0 * 1.0 * 1.0, axis=2) @ v;
    }}
    """
    assert any(isinstance(s, Attention) for s in _kernel(source, "f").body)
    rng = np.random.default_rng(5)
    q, k, v, m = (rng.standard_normal(s) for s in ((2, 40, 8), (2, 8, 40), (2, 40, 8),
                                                   (2, 40, 40)))
    got = compile_program(program_from_text(source)).f(q, k, v, m)
    scores = torch.from_numpy(q @ k + 47 * m * 0.01)
    np.testing.assert_allclose(got, (torch.softmax(scores, dim=2) @ torch.from_numpy(v)).numpy(),
                               rtol=1e-10)


@pytest.mark.parametrize("mask", ["causal_where", "padding", "causal_input"])
def test_the_printed_nest_reads_back(fused, mask):
    from tilegen.loopir_parse import parse_kernel

    kernel = _kernel(attention_source(2, 2, 70, 33, mask))
    assert any(isinstance(s, Attention) for s in kernel.body)
    text = format_kernel(kernel)
    assert parse_kernel(text) == kernel
    assert format_kernel(parse_kernel(text)) == text


def generated_score(batch: tuple[int, ...], tq: int, tk: int, scale: str, mask: str):
    """For the generated attention programs (forward here, gradients in
    test_attention_backward): the F64 tensor type of [batch..., dims] and the Kina score
    expression of q, k (and bias) with the drawn scale and mask."""
    rank = len(batch) + 2

    def ty(*dims):
        return f"Tensor[F64, [{', '.join(str(x) for x in batch + dims)}], @host]"
    perm = list(range(len(batch))) + [rank - 1, rank - 2]
    score = f"(q @ transpose(k, {perm}) {scale})"
    shape = list(batch) + [tq, tk]
    if mask == "causal":
        score = (f"where(greater(iota(shape={shape}, axis={rank - 1}), "
                 f"iota(shape={shape}, axis={rank - 2})), -1e9, {score})")
    elif mask == "bias":
        score = f"{score} + bias"
    return ty, score


def torch_score(q, k, bias, scale: str, mask: str):
    """generated_score's scores in PyTorch, the reference."""
    scores = q @ k.transpose(-1, -2)
    scores = {"* 0.3": scores * 0.3, "/ 2.5": scores / 2.5, "": scores}[scale]
    tq, tk = scores.shape[-2:]
    if mask == "causal":
        future = torch.arange(tk)[None, :] > torch.arange(tq)[:, None]
        scores = torch.where(future, torch.tensor(-1e9, dtype=torch.float64), scores)
    elif mask == "bias":
        scores = scores + torch.from_numpy(bias)
    return scores


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.sampled_from([(), (3,), (2, 3)]), tq=st.integers(1, 90), tk=st.integers(1, 90),
       d=st.integers(1, 40), dv=st.integers(1, 40), scale=st.sampled_from(["* 0.3", "/ 2.5", ""]),
       mask=st.sampled_from(["none", "causal", "bias"]), data=st.data())
def test_generated_attention_matches_torch(fused, batch, tq, tk, d, dv, scale, mask, data):
    rank = len(batch) + 2
    ty, score = generated_score(batch, tq, tk, scale, mask)
    source = f"""
    fn f(q: {ty(tq, d)}, k: {ty(tk, d)}, v: {ty(tk, dv)}, bias: {ty(tq, tk)}) -> {ty(tq, dv)} {{
      return softmax({score}, axis={rank - 1}) @ v;
    }}
    """
    assert any(isinstance(s, Attention) for s in _kernel(source, "f").body)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    q, k, v, bias = (rng.standard_normal(batch + s) for s in ((tq, d), (tk, d), (tk, dv),
                                                                (tq, tk)))
    got = compile_program(program_from_text(source)).f(q, k, v, bias)
    scores = torch_score(torch.from_numpy(q), torch.from_numpy(k), bias, scale, mask)
    expected = (torch.softmax(scores, dim=-1) @ torch.from_numpy(v)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
