"""Deep programs keep their stack frame bounded (issue 17 item 2).

The gradient of an unrolled tanh RNN keeps a temporary per step alive until the backward
pass; each is under the 64 KiB per-buffer stack threshold, and their sum used to go on
the stack unbounded (the issue's 128 steps: 23 MiB) and crash with SIGSEGV, in the main
thread and in threads. The program is generated here as Kina text, compiled and run in a
subprocess (a crash fails the test instead of killing pytest) with a small stack -- the
main thread's (RLIMIT_STACK) or a thread's (`threading.stack_size`) -- and its gradient is
compared with NumPy's.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tilegen import loopir as L
from tilegen.frame import live_ranges, plan_frame

REPO = Path(__file__).resolve().parents[1]
BATCH, HIDDEN, STEPS = 32, 500, 12  # 12 steps: ~2.2 MiB of temporaries under 64 KiB


def rnn_source(batch: int, hidden: int, steps: int) -> str:
    state = f"Tensor[F32, [{batch}, {hidden}], @host]"
    weights = f"Tensor[F32, [{hidden}, {hidden}], @host]"
    lines = [f"fn step(h: {state}, w: {weights}, x: {state}) -> {state} {{",
             "  return tanh(add(matmul(h, w), x));", "}",
             f"fn loss(h0: {state}, w: {weights}, x: {state}) -> Tensor[F32, [], @host] {{"]
    lines += [f"  let h{t + 1} = step(h{t}, w, x);" for t in range(steps)]
    lines += [f"  return sum(sum(h{steps}, axis=1), axis=0);", "}",
              f"fn grad(h0: {state}, w: {weights}, x: {state})",
              f"    -> (Tensor[F32, [], @host], {weights}) {{",
              "  let (value, d_w) = reverseMode(loss, wrt=[w])(h0, w, x);",
              "  return (value, d_w);", "}"]
    return "\n".join(lines)


def rnn_gradient(h0, w, x, steps: int):
    """loss = sum(h_T), h_{t+1} = tanh(h_t @ w + x); d loss / d w by hand, in float64."""
    h0, w, x = (a.astype(np.float64) for a in (h0, w, x))
    states = [h0]
    for _ in range(steps):
        states.append(np.tanh(states[-1] @ w + x))
    d_state = np.ones_like(h0)
    d_w = np.zeros_like(w)
    for t in reversed(range(steps)):
        d_pre = d_state * (1 - states[t + 1] ** 2)
        d_w += states[t].T @ d_pre
        d_state = d_pre @ w.T
    return states[-1].sum(), d_w


_CHILD = """
import sys, threading
import numpy as np
import tilegen
from tests.test_deep_programs import BATCH, HIDDEN, STEPS, rnn_gradient, rnn_source

where, thread_stack = sys.argv[1], int(sys.argv[2])
if thread_stack:
    threading.stack_size(thread_stack)  # before compiling: the compile sees it
module = tilegen.compile_source(rnn_source(BATCH, HIDDEN, STEPS), "rnn.kina")
rng = np.random.default_rng(0)
h0 = rng.standard_normal((BATCH, HIDDEN)).astype(np.float32)
w = (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
x = (rng.standard_normal((BATCH, HIDDEN)) * 0.1).astype(np.float32)
value_want, grad_want = rnn_gradient(h0, w, x, STEPS)
results = []


def run():
    results.append(module.grad(h0, w, x))


if where in ("main", "both"):
    run()
if where in ("thread", "both"):
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
assert len(results) == (2 if where == "both" else 1)
for value, grad in results:
    np.testing.assert_allclose(float(value), value_want, rtol=1e-4)
    np.testing.assert_allclose(grad, grad_want, rtol=2e-3, atol=2e-3 * np.abs(grad_want).max())
print("ok")
"""


def _run_child(where: str, stack_limit: int | None, thread_stack: int = 0):
    def limit_stack():
        if stack_limit is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_STACK)
            resource.setrlimit(resource.RLIMIT_STACK, (stack_limit, hard))

    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), where,
                             str(thread_stack)], cwd=REPO, preexec_fn=limit_stack,
                            env={"TILEGEN_NUM_THREADS": "2", "PATH": "/usr/bin:/bin",
                                 "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", \
        f"exit {result.returncode}\n{result.stderr[-3000:]}"


def test_deep_rnn_gradient_with_a_2_mib_stack_in_the_main_thread_and_a_thread():
    """RLIMIT_STACK 2 MiB: the main thread and (glibc's default) new threads get 2 MiB."""
    _run_child("both", 2 << 20)


def test_deep_rnn_gradient_in_a_thread_with_a_1_mib_stack():
    _run_child("thread", None, thread_stack=1 << 20)


def _kernel(text: str) -> L.Kernel:
    from tilegen.loopir_parse import parse_kernel

    return parse_kernel(text)


def test_frame_plan_bounds_the_stack_and_shares_the_workspace_only_between_dead_values():
    """60 temporaries of 60 000 bytes: only what fits the budget goes on the stack, and two
    workspace temporaries that are alive at once never share a byte."""
    count = 60
    buffers = "".join(f"  temp   t{i}: f32[15000]\n" for i in range(count))
    # t_i is written at statement i and read at statement i + 3 (and the last ones by the
    # final statement): up to four are alive at once.
    body = []
    for i in range(count):
        source = f"t{i - 3}[k{i}]" if i >= 3 else "x[k0]".replace("k0", f"k{i}")
        body.append(f"  for k{i} in 0..15000 {{ t{i}[k{i}] = {source} }}")
    body.append("  for q in 0..15000 { out0[q] = (t57[q] + (t58[q] + t59[q])) }")
    kernel = _kernel(f"kernel @k\n  input  x: f32[15000]\n{buffers}  output out0: f32[15000]\n"
                     "{\n" + "\n".join(body) + "\n}")
    budget = 256 * 1024
    frame = plan_frame(kernel, budget)
    assert sum(kernel.buffer(n).nbytes for n in frame.stack) <= budget
    assert len(frame.stack) == 4
    ranges = live_ranges(kernel)
    offsets = frame.offsets
    assert set(offsets) | set(frame.stack) == {f"t{i}" for i in range(count)}
    for a in offsets:
        for b in offsets:
            if a >= b:
                continue
            alive_together = ranges[a][0] <= ranges[b][1] and ranges[b][0] <= ranges[a][1]
            apart = offsets[a] + 60_000 <= offsets[b] or offsets[b] + 60_000 <= offsets[a]
            assert apart or not alive_together, (a, b)
    # The peak, not the sum: at most five alive at once.
    assert frame.heap_bytes <= 5 * 60_032
    # Under the budget nothing changes: every small temporary keeps its alloca.
    assert len(plan_frame(kernel, count * 60_000).stack) == count


@pytest.mark.parametrize("steps", [3])
def test_rnn_reference_matches_finite_differences(steps):
    """The NumPy gradient above is itself checked against central differences."""
    rng = np.random.default_rng(1)
    h0, x = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)) * 0.1
    w = rng.standard_normal((3, 3)) / 2
    _, grad = rnn_gradient(h0, w, x, steps)
    eps = 1e-6
    for index in np.ndindex(*w.shape):
        up, down = w.copy(), w.copy()
        up[index] += eps
        down[index] -= eps
        numeric = (rnn_gradient(h0, up, x, steps)[0] - rnn_gradient(h0, down, x, steps)[0]) \
            / (2 * eps)
        assert abs(numeric - grad[index]) < 1e-6
