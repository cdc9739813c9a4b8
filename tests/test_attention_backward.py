"""The fused attention backward (tilegen/attention_backward.py): reverseMode of
softmax(q k^T * scale + mask) @ v compiled to one `AttentionBackward` statement that
recomputes the scores per block from the forward's row statistics. Gradients are checked
against torch's scaled_dot_product_attention autograd in float64 (an independent
implementation), with causal masks in each positional spelling, padding masks and masks
passed in, odd head widths and sequence lengths from 1 to 2048, on several threads; that
the fused statement is what runs (no tq x tk buffer); that TILEGEN_FUSED_ATTENTION=never
gives the same numbers; and that its peak memory does not grow as T^2.
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tests.test_attention import SDPA, _inputs, attention_source, generated_score, torch_score
from tilegen import config
from tilegen.api import compile_program
from tilegen.attention_ir import AttentionBackward
from tilegen.loopir import Attention, format_kernel
from tilegen.loopir_parse import parse_kernel
from tilegen.pipeline import plan_program

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setenv("TILEGEN_FUSED_ATTENTION", "always")


def _kernel(source: str, name: str = "grads"):
    (plan,) = plan_program(program_from_text(source), (name,), config.load())
    return plan.kernel


def _backward(kernel) -> AttentionBackward:
    (nest,) = [s for s in kernel.body if isinstance(s, AttentionBackward)]
    return nest


def _torch_gradients(q, k, v, w, torch_mask, causal, d):
    tensors = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    out = SDPA(*tensors, attn_mask=torch_mask, is_causal=causal, scale=1 / math.sqrt(d))
    loss = (out * torch.from_numpy(w)).sum()
    loss.backward()
    return float(loss.detach()), [t.grad.numpy() for t in tensors]


def _check(t, mask, d, b=1, h=2, dtype="F64", with_loss=False, rtol=1e-9, atol=1e-11):
    source = attention_source(b, h, t, d, mask, dtype=dtype, gradient=True)
    if with_loss:  # the loss returned too: the forward attention saves the statistics
        big = f"Tensor[{dtype}, [B, H, T, D], @host]"
        source = source.replace("return (gq, gk, gv);", "return (y, gq, gk, gv);").replace(
            f"-> ({big}, {big}, {big})", f"-> (Tensor[{dtype}, [], @host], {big}, {big}, {big})")
    kernel = _kernel(source)
    nest = _backward(kernel)
    for buffer in kernel.buffers:  # no temporary of scores (T x T per head)
        if buffer.role != "input" and t >= 64:
            assert tuple(buffer.shape[-2:]) != (t, t), format_kernel(kernel)
            # (whole-tensor copies of q, k, v, padded and per thread, stay below it too)
            assert d > t // 4 or buffer.size < b * h * t * t, format_kernel(kernel)
    np_dtype = np.float64 if dtype == "F64" else np.float32
    q, k, v, extra, torch_mask, causal = _inputs(b, h, t, d, mask, seed=t + 1, dtype=np_dtype)
    w = np.random.default_rng(t).standard_normal(q.shape).astype(np_dtype)
    got = compile_program(program_from_text(source)).grads(q, k, v, w, *extra)
    loss, expected = _torch_gradients(q, k, v, w, torch_mask, causal, d)
    if with_loss:
        np.testing.assert_allclose(got[0], loss, rtol=rtol)
        got = got[1:]
    for name, mine, reference in zip("qkv", got, expected, strict=True):
        np.testing.assert_allclose(mine, reference, rtol=rtol, atol=atol, err_msg=f"d{name}")
    return kernel, nest


CASES = [(1, "causal_where", 24), (1, "padding", 7), (17, "padding", 33),
         (17, "causal_cast", 24), (64, "causal_where", 33), (64, "none", 24),
         (257, "causal_additive", 24), (257, "padding", 33), (257, "causal_input", 7),
         (1024, "causal_where", 33), (1024, "padding", 24)]


@pytest.mark.parametrize(("t", "mask", "d"), CASES)
def test_gradients_match_torch_sdpa(fused, t, mask, d):
    _, nest = _check(t, mask, d, b=2 if t <= 257 else 1)
    assert (nest.causal == 0) == (mask in ("causal_where", "causal_additive", "causal_cast"))


def test_gradients_at_2048(fused):
    _, nest = _check(2048, "causal_where", 64, h=1)
    assert nest.causal == 0


def test_several_threads(fused, monkeypatch):
    monkeypatch.setenv("TILEGEN_NUM_THREADS", "3")
    for mask in ("causal_where", "padding"):
        _, nest = _check(300, mask, 40, b=2, h=3)
        assert nest.threads == 3


def test_the_loss_and_its_gradients(fused):
    # The forward's own attention saves the row statistics: one forward pass, not two.
    kernel, nest = _check(130, "causal_where", 20, with_loss=True)
    (forward,) = [s for s in kernel.body if isinstance(s, Attention)]
    assert forward.stats == nest.stats and forward.out == nest.o


@pytest.mark.parametrize("mask", ["causal_where", "padding"])
def test_f32_within_float_rounding(fused, mask):
    _check(129, mask, 40, b=2, dtype="F32", rtol=2e-4, atol=2e-5)


def test_never_gives_the_same_gradients(monkeypatch):
    source = attention_source(2, 2, 200, 24, "causal_where", gradient=True)
    q, k, v, *_ = _inputs(2, 2, 200, 24, "causal_where", seed=5)
    w = np.random.default_rng(6).standard_normal(q.shape)
    results = {}
    for mode in ("always", "never"):
        monkeypatch.setenv("TILEGEN_FUSED_ATTENTION", mode)
        kernel = _kernel(source)
        assert any(isinstance(s, AttentionBackward) for s in kernel.body) == (mode == "always")
        results[mode] = compile_program(program_from_text(source)).grads(q, k, v, w)
    for fused_value, unfused_value in zip(results["always"], results["never"], strict=True):
        np.testing.assert_allclose(fused_value, unfused_value, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize(("expression", "offset"), [
    ("where(greater(KEYS, QUERIES + 2), -1e9, s)", 2),
    ("where(greater_equal(KEYS, QUERIES), -1e9, s)", None)])
def test_mask_offsets(fused, expression, offset):
    keys, queries = "iota(shape=[B, H, T, T], axis=3)", "iota(shape=[B, H, T, T], axis=2)"
    t, d = 150, 24
    source = attention_source(1, 2, t, d, "none", gradient=True).replace(
        "softmax(s, axis=3)", "softmax(" + expression.replace("KEYS", keys).replace(
            "QUERIES", queries) + ", axis=3)")
    assert _backward(_kernel(source)).causal == offset
    q, k, v, *_ = _inputs(1, 2, t, d, "none", seed=8)
    w = np.random.default_rng(9).standard_normal(q.shape)
    got = compile_program(program_from_text(source)).grads(q, k, v, w)
    j, i = torch.arange(t)[None, :], torch.arange(t)[:, None]
    masked = (j > i + 2) if offset == 2 else (j >= i)
    tensors = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    scores = tensors[0] @ tensors[1].transpose(2, 3) / math.sqrt(d)
    scores = torch.where(masked, torch.tensor(-1e9, dtype=torch.float64), scores)
    ((torch.softmax(scores, dim=3) @ tensors[2]) * torch.from_numpy(w)).sum().backward()
    for mine, tensor in zip(got, tensors, strict=True):
        np.testing.assert_allclose(mine, tensor.grad.numpy(), rtol=1e-9, atol=1e-11)


def test_a_gradient_of_the_mask_is_not_fused(fused):
    # d/d(bias) sums ds over the batch: a use of ds that is no product, so no fusion.
    source = """
    fn f(q: Tensor[F64, [2, 80, 8], @host], k: Tensor[F64, [2, 80, 8], @host],
         v: Tensor[F64, [2, 80, 8], @host], bias: Tensor[F64, [2, 80, 80], @host])
        -> Tensor[F64, [], @host] {
      let o = softmax(q @ transpose(k, [0, 2, 1]) + bias, axis=2) @ v;
      return sum(sum(sum(o * o, axis=2), axis=1), axis=0);
    }
    fn grads(q: Tensor[F64, [2, 80, 8], @host], k: Tensor[F64, [2, 80, 8], @host],
             v: Tensor[F64, [2, 80, 8], @host], bias: Tensor[F64, [2, 80, 80], @host])
        -> (Tensor[F64, [2, 80, 8], @host], Tensor[F64, [2, 80, 80], @host]) {
      let (y, gq, gb) = reverseMode(f, wrt=[q, bias])(q, k, v, bias);
      return (gq, gb);
    }
    """
    assert not any(isinstance(s, AttentionBackward) for s in _kernel(source).body)
    rng = np.random.default_rng(10)
    arrays = [rng.standard_normal(s) for s in ((2, 80, 8),) * 3 + ((2, 80, 80),)]
    got = compile_program(program_from_text(source)).grads(*arrays)
    tensors = [torch.from_numpy(a).requires_grad_() for a in arrays]
    q, k, v, bias = tensors
    o = torch.softmax(q @ k.transpose(1, 2) + bias, dim=2) @ v
    (o * o).sum().backward()
    np.testing.assert_allclose(got[0], q.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], bias.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask", ["causal_where", "padding", "causal_input"])
def test_the_printed_statement_reads_back(fused, mask):
    kernel = _kernel(attention_source(2, 2, 70, 33, mask, gradient=True))
    _backward(kernel)
    text = format_kernel(kernel)
    assert "attention_backward" in text
    assert parse_kernel(text, verify=True) == kernel
    assert format_kernel(parse_kernel(text)) == text


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.sampled_from([(), (3,), (2, 3)]), tq=st.integers(1, 80), tk=st.integers(1, 80),
       d=st.integers(1, 30), dv=st.integers(1, 30), scale=st.sampled_from(["* 0.3", "/ 2.5", ""]),
       mask=st.sampled_from(["none", "causal", "bias"]), data=st.data())
def test_generated_gradients_match_torch(fused, batch, tq, tk, d, dv, scale, mask, data):
    rank = len(batch) + 2
    ty, score = generated_score(batch, tq, tk, scale, mask)
    total = "o * w"
    for axis in reversed(range(rank)):
        total = f"sum({total}, axis={axis})"
    params = f"q: {ty(tq, d)}, k: {ty(tk, d)}, v: {ty(tk, dv)}, bias: {ty(tq, tk)}, " \
             f"w: {ty(tq, dv)}"
    source = f"""
    fn f({params}) -> Tensor[F64, [], @host] {{
      let o = softmax({score}, axis={rank - 1}) @ v;
      return {total};
    }}
    fn grads({params}) -> ({ty(tq, d)}, {ty(tk, d)}, {ty(tk, dv)}) {{
      let (y, gq, gk, gv) = reverseMode(f, wrt=[q, k, v])(q, k, v, bias, w);
      return (gq, gk, gv);
    }}
    """
    _backward(_kernel(source))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    arrays = [rng.standard_normal(batch + s) for s in ((tq, d), (tk, d), (tk, dv), (tq, tk),
                                                       (tq, dv))]
    got = compile_program(program_from_text(source)).grads(*arrays)
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in arrays[:3])
    scores = torch_score(q, k, arrays[3], scale, mask)
    ((torch.softmax(scores, dim=-1) @ v) * torch.from_numpy(arrays[4])).sum().backward()
    for name, mine, tensor in zip("qkv", got, (q, k, v), strict=True):
        np.testing.assert_allclose(mine, tensor.grad.numpy(), rtol=1e-9, atol=1e-11,
                                   err_msg=f"d{name}")


_PEAK_PROBE = """
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from kina_frontend import program_from_text
from tilegen.api import compile_program
from tests.test_attention import attention_source
source = attention_source(1, 8, 2048, 64, "causal_where", dtype="F32", gradient=True)
module = compile_program(program_from_text(source))
rng = np.random.default_rng(0)
q, k, v, w = (rng.standard_normal((1, 8, 2048, 64)).astype(np.float32) for _ in range(4))
grads = module.grads  # compiled on first use: before the measurement
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = grads(q, k, v, w)
assert all(np.isfinite(g).all() for g in out)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_peak_memory_does_not_grow_as_t_squared():
    # T = 2048, 8 heads: one score-sized buffer alone would be 128 MB (the unfused gradient
    # program keeps several). The fused call's high-water mark grows by its linear
    # buffers only: the three gradients, the copies of q, k, v and the cotangent, the
    # forward pass's output and each thread's dQ slice (4 MB each).
    # Two threads: each has a dQ slice, so the figure is for a fixed count.
    environment = dict(os.environ, TILEGEN_FUSED_ATTENTION="auto", PYTHONPATH=str(ROOT),
                       TILEGEN_NUM_THREADS="2")
    completed = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(ROOT)],
                               capture_output=True, text=True, env=environment, timeout=600,
                               cwd=ROOT)
    assert completed.returncode == 0, completed.stderr
    before, after = (int(x) for x in completed.stdout.split())
    grown_mb = (after - before) / 1024  # ru_maxrss is in KB on Linux
    assert grown_mb < 64, f"the call raised peak RSS by {grown_mb:.1f} MB"


def test_a_hand_written_gradient_with_a_consumer_in_between(fused):
    # The same schedule for a gradient written by hand, in an order where dV's consumer
    # (an SGD update) comes before dQ and dK are computed: lowering moves it after the
    # statement that writes all three. dK in the [d, keys] form (qᵀ @ ds).
    source = """
    const B = 2;
    const T = 90;
    const D = 12;
    fn f(q: Tensor[F64, [B, T, D], @host], k: Tensor[F64, [B, T, D], @host],
         v: Tensor[F64, [B, T, D], @host], dout: Tensor[F64, [B, T, D], @host])
        -> (Tensor[F64, [B, T, D], @host], Tensor[F64, [B, T, D], @host],
            Tensor[F64, [B, D, T], @host]) {
      let p = softmax(q @ transpose(k, [0, 2, 1]) * 0.3, axis=2);
      let dv = transpose(p, [0, 2, 1]) @ dout;
      let updated = v - dv * 0.1;
      let g = dout @ transpose(v, [0, 2, 1]);
      let dx = p * (g - broadcast(reshape(sum(g * p, axis=2), [B, T, 1]), [B, T, T]));
      let ds = dx * 0.3;
      return (updated, ds @ k, transpose(q, [0, 2, 1]) @ ds);
    }
    """
    nest = _backward(_kernel(source, "f"))
    assert [(g.over, g.weight, g.transposed) for g in nest.gradients] == [
        ("queries", "p", False), ("keys", "ds", False), ("queries", "ds", True)]
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal((2, 90, 12)) for _ in range(4)]
    got = compile_program(program_from_text(source)).f(*arrays)
    q, k, v, dout = (torch.from_numpy(a).requires_grad_() for a in arrays)
    out = SDPA(q, k, v, scale=0.3)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    np.testing.assert_allclose(got[0], (v - 0.1 * dv).detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], dq.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got[2], dk.transpose(1, 2).numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", ["F32", "F64"])
def test_avx2_target_lanes(fused, monkeypatch, dtype):
    # x86-64-v3 (AVX2, 16 ymm registers): 8 f32 / 4 f64 lanes and two tiles per key block,
    # so padding and blocks differ from the AVX-512 host's; forward and backward both.
    from tilegen.target import named_target

    target = named_target("x86-64-v3")
    if not target.runs_on_host:
        pytest.skip("this machine cannot run x86-64-v3 code")
    monkeypatch.setenv("TILEGEN_TARGET", "x86-64-v3")
    kernel, nest = _check(70, "causal_where", 13, b=2, dtype=dtype,
                          rtol=1e-9 if dtype == "F64" else 2e-4,
                          atol=1e-11 if dtype == "F64" else 2e-5)
    lanes = target.lanes(dtype.lower())
    (forward,) = [s for s in kernel.body if isinstance(s, Attention)]
    assert nest.block_keys == forward.block_keys == 2 * lanes
    assert kernel.buffer(nest.do).shape[-1] == -(-13 // lanes) * lanes


def test_a_statement_for_other_vector_widths_is_refused(fused, monkeypatch, tmp_path):
    # Loop IR lowered for AVX-512 (16-lane padding) compiled for AVX2: a clear error, not
    # wrong strides.
    from kina_frontend.diagnostics import KinaError
    from tilegen import compile_file
    from tilegen.target import named_target

    if named_target("host").lanes("f64") != 8 or not named_target("x86-64-v3").runs_on_host:
        pytest.skip("needs an AVX-512 host")
    path = tmp_path / "grads.loops"
    # Head width 10: 16 wide with 8 f64 lanes, 12 with AVX2's 4.
    path.write_text(format_kernel(_kernel(attention_source(1, 2, 70, 10, "causal_where",
                                                           gradient=True))))
    arrays = [np.zeros((1, 2, 70, 10)) for _ in range(4)]
    with pytest.raises(KinaError, match="other vector widths"):
        compile_file(str(path), target="x86-64-v3").grads(*arrays)


def test_two_layers(fused):
    # The second layer's queries, keys and values are the first layer's output: two
    # backward statements, the first layer's cotangent built from all three gradients of
    # the second.
    source = """
    const T = 75;
    const D = 10;
    fn attn(q: Tensor[F64, [2, T, D], @host], k: Tensor[F64, [2, T, D], @host],
            v: Tensor[F64, [2, T, D], @host]) -> Tensor[F64, [2, T, D], @host] {
      let keys = iota(shape=[2, T, T], axis=2);
      let queries = iota(shape=[2, T, T], axis=1);
      let s = q @ transpose(k, [0, 2, 1]) * 0.4;
      return softmax(where(greater(keys, queries), -1e9, s), axis=2) @ v;
    }
    fn loss(q: Tensor[F64, [2, T, D], @host], k: Tensor[F64, [2, T, D], @host],
            v: Tensor[F64, [2, T, D], @host], w: Tensor[F64, [2, T, D], @host])
        -> Tensor[F64, [], @host] {
      let o = attn(q, k, v);
      return sum(sum(sum(attn(o, o, o) * w, axis=2), axis=1), axis=0);
    }
    fn grads(q: Tensor[F64, [2, T, D], @host], k: Tensor[F64, [2, T, D], @host],
             v: Tensor[F64, [2, T, D], @host], w: Tensor[F64, [2, T, D], @host])
        -> (Tensor[F64, [2, T, D], @host], Tensor[F64, [2, T, D], @host],
            Tensor[F64, [2, T, D], @host]) {
      let (y, gq, gk, gv) = reverseMode(loss, wrt=[q, k, v])(q, k, v, w);
      return (gq, gk, gv);
    }
    """
    assert sum(isinstance(s, AttentionBackward) for s in _kernel(source).body) == 2
    rng = np.random.default_rng(12)
    arrays = [rng.standard_normal((2, 75, 10)) for _ in range(4)]
    got = compile_program(program_from_text(source)).grads(*arrays)
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in arrays[:3])
    o = SDPA(q, k, v, is_causal=True, scale=0.4)
    (SDPA(o, o, o, is_causal=True, scale=0.4) * torch.from_numpy(arrays[3])).sum().backward()
    for name, mine, tensor in zip("qkv", got, (q, k, v), strict=True):
        np.testing.assert_allclose(mine, tensor.grad.numpy(), rtol=1e-9, atol=1e-11,
                                   err_msg=f"d{name}")


def test_probabilities_as_their_own_factor_are_not_fused(fused):
    # p @ p: p is its own factor, and its cotangent a sum of two products: the ops lower
    # unfused, and correctly.
    source = """
    fn f(q: Tensor[F64, [2, 70, 70], @host], k: Tensor[F64, [2, 70, 70], @host])
        -> Tensor[F64, [], @host] {
      let p = softmax(q @ transpose(k, [0, 2, 1]), axis=2);
      return sum(sum(sum(p @ p, axis=2), axis=1), axis=0);
    }
    fn grads(q: Tensor[F64, [2, 70, 70], @host], k: Tensor[F64, [2, 70, 70], @host])
        -> Tensor[F64, [2, 70, 70], @host] {
      let (y, gq) = reverseMode(f, wrt=[q])(q, k);
      return gq;
    }
    """
    assert not any(isinstance(s, AttentionBackward) for s in _kernel(source).body)
    rng = np.random.default_rng(13)
    arrays = [rng.standard_normal((2, 70, 70)) * 0.3 for _ in range(2)]
    got = compile_program(program_from_text(source)).grads(*arrays)
    q, k = (torch.from_numpy(a).requires_grad_() for a in arrays)
    p = torch.softmax(q @ k.transpose(1, 2), dim=2)
    (p @ p).sum().backward()
    np.testing.assert_allclose(got, q.grad.numpy(), rtol=1e-9, atol=1e-11)


def test_wide_heads(fused):
    # Head width 300 in f64: fewer row blocks share a key block (their accumulators stay
    # within the stack budget), forward and backward.
    _check(150, "causal_where", 300, b=4, h=2)


@pytest.mark.parametrize("wrt", [("q",), ("k", "v"), ("k",), ("v",)])
def test_gradients_for_some_inputs(fused, wrt):
    # Only the wanted products appear (wrt=[q]: dQ alone, no sum over queries). dV alone
    # needs no softmax rule at all: that program is not the pattern and runs unfused.
    t, d = 90, 20
    source = attention_source(1, 2, t, d, "causal_where", gradient=True)
    source = source[:source.index("fn grads")]
    big = "Tensor[F64, [B, H, T, D], @host]"
    names = ", ".join(f"g{x}" for x in wrt)
    results = big if len(wrt) == 1 else "(" + ", ".join([big] * len(wrt)) + ")"
    source += f"""
    fn grads(q: {big}, k: {big}, v: {big}, w: {big}) -> {results} {{
      let (y, {names}) = reverseMode(loss, wrt=[{', '.join(wrt)}])(q, k, v, w);
      return {names if len(wrt) == 1 else f"({names})"};
    }}
    """
    fused_here = any(isinstance(s, AttentionBackward) for s in _kernel(source).body)
    assert fused_here == (wrt != ("v",))
    q, k, v, *_ = _inputs(1, 2, t, d, "causal_where", seed=3)
    w = np.random.default_rng(4).standard_normal(q.shape)
    got = compile_program(program_from_text(source)).grads(q, k, v, w)
    got = got if isinstance(got, tuple) else (got,)
    _, expected = _torch_gradients(q, k, v, w, None, True, d)
    for name, mine in zip(wrt, got, strict=True):
        np.testing.assert_allclose(mine, expected["qkv".index(name)], rtol=1e-9, atol=1e-11,
                                   err_msg=f"d{name}")
