"""Parallel kernels after fork (issue 17 item 1).

libgomp's worker pool does not survive `fork`: a child forked after a parallel kernel ran
used to hang forever in its next parallel kernel. Each case runs in a subprocess with a
timeout (so a hang fails the test instead of stalling pytest); there the parent runs
parallel kernels, forks (os.fork, or a multiprocessing pool with the fork start method),
and the child runs every kind of parallel region -- a threaded matmul, a parallel loop, a
scatter split by columns, a BF16 product whose threads take panels from a shared count (on
AMX), an id error from a parallel loop -- and checks each against NumPy.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_PROGRAM = """
fn mm(a: Tensor[F32, [512, 700], @host], b: Tensor[F32, [700, 300], @host])
    -> Tensor[F32, [512, 300], @host] {
  return matmul(a, b);
}
fn rows(x: Tensor[F32, [2048, 256], @host]) -> Tensor[F32, [2048, 256], @host] {
  return softmax(x, axis=1);
}
fn scatter(u: Tensor[F32, [8192, 64], @host], ids: Tensor[I64, [8192], @host])
    -> Tensor[F32, [7, 64], @host] {
  return scatter_add(u, ids, 7);
}
fn bf(p: Tensor[BF16, [333, 1000], @host], q: Tensor[BF16, [1000, 777], @host])
    -> Tensor[F32, [333, 777], @host] {
  return matmul(p, q);
}
fn pick(ids: Tensor[I64, [300001], @host], table: Tensor[F32, [8, 4], @host])
    -> Tensor[F32, [300001, 4], @host] {
  return gather(table, ids);
}
"""

_SCRIPT = """
import multiprocessing, os, sys, time
import ml_dtypes
import numpy as np
import tilegen
import tilegen.forksafe

mode, backend = sys.argv[1], sys.argv[2]
module = tilegen.compile_source(PROGRAM, "fork.kina", jit=backend == "jit")
rng = np.random.default_rng(0)
a = rng.standard_normal((512, 700)).astype(np.float32)
b = rng.standard_normal((700, 300)).astype(np.float32)
x = rng.standard_normal((2048, 256)).astype(np.float32)
u = rng.standard_normal((8192, 64)).astype(np.float32)
ids = rng.integers(0, 7, 8192).astype(np.int64)
bad = np.zeros(300001, np.int64)
bad[[5, 160000]] = 9
table = np.ones((8, 4), np.float32)
p = rng.standard_normal((333, 1000)).astype(ml_dtypes.bfloat16)
q = rng.standard_normal((1000, 777)).astype(ml_dtypes.bfloat16)


def check_all(_=None):
    np.testing.assert_allclose(module.mm(a, b), a.astype(np.float64) @ b, rtol=1e-4,
                               atol=1e-3)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(module.rows(x), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    want = np.zeros((7, 64))
    np.add.at(want, ids, u.astype(np.float64))
    np.testing.assert_allclose(module.scatter(u, ids), want, rtol=1e-4, atol=1e-3)
    # On AMX the threads take this product's panels from a shared count. (Its reference
    # here, not before a fork-first fork: NumPy's BLAS runs its threads on libgomp's pool.)
    pq = p.astype(np.float64) @ q.astype(np.float64)
    np.testing.assert_allclose(module.bf(p, q), pq, rtol=1e-4, atol=1e-3)
    try:
        module.pick(bad, table)
    except tilegen.IdOutOfRangeError as error:
        assert "position [5]" in str(error), error
    else:
        raise AssertionError("no id error")
    return True


if mode != "fork-first":
    check_all()  # the parent's pool exists from here on
if mode in ("fork", "fork-first"):
    pid = os.fork()
    if pid == 0:
        try:
            capped = tilegen.forksafe.STATE[0] == 1
            assert capped == (mode == "fork"), tilegen.forksafe.STATE[0]
            check_all()
        except BaseException as error:
            print("child failed:", repr(error), file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    for _ in range(450):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        sys.exit("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0, status
else:
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(check_all, range(4), chunksize=1) == [True] * 4
check_all()  # the parent still runs on every thread
print("ok")
"""


def _run(mode: str, backend: str) -> subprocess.CompletedProcess:
    script = f"PROGRAM = {_PROGRAM!r}\n" + textwrap.dedent(_SCRIPT)
    try:
        return subprocess.run([sys.executable, "-c", script, mode, backend], cwd=REPO,
                              env={"TILEGEN_NUM_THREADS": "2", "PATH": "/usr/bin:/bin",
                                   "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=150, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{mode}/{backend}: a parallel kernel hung after fork")


@pytest.mark.parametrize("backend", ["jit", "so"])
@pytest.mark.parametrize("mode", ["fork", "pool"])
def test_children_forked_after_a_parallel_kernel_run_every_kernel(mode, backend):
    result = _run(mode, backend)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    # The child says it runs on one thread from now on.
    assert "does not survive fork" in result.stderr, result.stderr


def test_a_child_forked_before_any_parallel_kernel_keeps_its_threads():
    """No pool existed at fork: the child's kernels keep both threads, and no warning."""
    result = _run("fork-first", "jit")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    assert "does not survive fork" not in result.stderr, result.stderr
