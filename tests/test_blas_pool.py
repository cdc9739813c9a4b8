"""OpenBLAS's threaded calls on libgomp's pool (tilegen/blas_pool.py, issue 18).

Each case runs in a fresh interpreter: the callback is process-wide, and fork, thread
limits and exit are what is being checked. Every result is compared with a float64 (or
complex128) product NumPy computes before tilegen is loaded, on OpenBLAS's own threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The references come first, on OpenBLAS's own threads; then tilegen loads code (and with it
# the callback), and the same products run again.
_PRELUDE = textwrap.dedent("""
    import json, os, sys, threading
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((333, 1000), dtype=np.float32)
    b = rng.standard_normal((1000, 777), dtype=np.float32)
    d = rng.standard_normal((517, 611))
    z = (rng.standard_normal((301, 401)) + 1j * rng.standard_normal((301, 401))).astype(
        np.complex64)
    v = rng.standard_normal(611)
    reference = {"sgemm": a.astype(np.float64) @ b, "dgemm": d @ d.T,
                 "cgemm": z.astype(np.complex128) @ z.conj().T.astype(np.complex128),
                 "dgemv": d @ v}

    def products():
        return {"sgemm": a @ b, "dgemm": d @ d.T, "cgemm": z @ z.conj().T, "dgemv": d @ v}

    def worst(results):
        return max(float(np.max(np.abs(results[k] - reference[k]))
                         / np.max(np.abs(reference[k]))) for k in reference)

    import tilegen
    from tilegen import blas_pool
    m = tilegen.compile_source('''
    fn mm(a: Tensor[F32, [333, 1000], @host], b: Tensor[F32, [1000, 777], @host])
        -> Tensor[F32, [333, 777], @host] { return matmul(a, b); }
    ''', "mm.kina")

    def calls():
        return [shared.counts() for shared in blas_pool.shared_libraries().values()]
""")


def _run(body: str, timeout: float = 120, **env) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
    for name in ("OMP_THREAD_LIMIT", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if name not in env:
            environment.pop(name, None)
    done = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
                          env=environment, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _threads(needed: int) -> None:
    if (os.cpu_count() or 1) < needed:
        pytest.skip(f"OpenBLAS threads its calls only with {needed}+ cores")


def test_numpy_runs_on_the_shared_pool_and_stays_exact():
    _threads(2)
    report = _run("""
        before = calls()
        tilegen_result = m.mm(a, b)
        numpy_results = products()
        print(json.dumps({"status": list(blas_pool.status().values()), "before": before,
                          "after": calls(), "worst": worst(numpy_results),
                          "tilegen": float(np.max(np.abs(tilegen_result - reference["sgemm"])))}))
    """)
    assert report["status"] and set(report["status"]) == {"shared"}, report
    (calls_before, _), = report["before"]
    (calls_after, plain), = report["after"]
    assert calls_after >= calls_before + 3, report  # sgemm, dgemm, cgemm at least
    assert plain == 0, report  # the libgomp team ran them all
    assert report["worst"] < 1e-5, report
    assert report["tilegen"] < 1e-3, report


def test_the_setting_off_leaves_openblas_its_own_threads():
    report = _run("""
        results = products()
        print(json.dumps({"status": blas_pool.status(), "calls": calls(),
                          "worst": worst(results)}))
    """, TILEGEN_SHARE_BLAS_THREADS="0")
    assert report["status"] == {} and report["calls"] == [], report
    assert report["worst"] < 1e-5, report


def test_a_team_libgomp_cannot_give_runs_on_plain_threads():
    # OMP_THREAD_LIMIT=1: libgomp gives a team of one; the jobs of one call wait for each
    # other, so running them one after another would hang. They get threads of their own.
    _threads(2)
    report = _run("""
        results = products()
        print(json.dumps({"calls": calls(), "worst": worst(results)}))
    """, OMP_THREAD_LIMIT="1")
    (calls_made, plain), = report["calls"]
    assert calls_made >= 3 and plain == calls_made, report
    assert report["worst"] < 1e-5, report


def test_a_forked_child_still_gets_its_products():
    # After a parallel region libgomp's pool does not survive fork (tilegen/forksafe.py):
    # the child's threaded NumPy calls must neither hang nor go wrong.
    _threads(2)
    report = _run("""
        import warnings
        warnings.simplefilter("ignore", RuntimeWarning)  # forksafe's one-thread notice
        m.mm(a, b)
        products()
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read)
            results = products()
            os.write(write, json.dumps({"calls": calls(), "worst": worst(results)}).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            message = pipe.read()
        _, status = os.waitpid(child, 0)
        print(json.dumps({"child": json.loads(message), "status": status}))
    """, timeout=60)
    assert report["status"] == 0, report
    assert report["child"]["worst"] < 1e-5, report
    (_, plain), = report["child"]["calls"]
    assert plain >= 3, report


def test_numpy_calls_from_several_threads_at_once():
    # Each job's thread number picks an OpenBLAS buffer: two calls at once must not share.
    _threads(2)
    report = _run("""
        errors = []

        def work(seed):
            local = np.random.default_rng(seed)
            x = local.standard_normal((301, 457))
            y = local.standard_normal((457, 389))
            expected = np.einsum("ik,kj->ij", x, y)  # not BLAS
            for _ in range(15):
                errors.append(float(np.max(np.abs(x @ y - expected))))
                m.mm(a, b)

        workers = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        print(json.dumps({"worst": max(errors), "count": len(errors), "calls": calls()}))
    """, timeout=300)
    assert report["count"] == 60, report
    assert report["worst"] < 1e-9, report
    (calls_made, _), = report["calls"]
    assert calls_made >= 60, report


def test_the_process_exits_cleanly_after_shared_calls():
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + "products(); m.mm(a, b); products()\nprint('{}')"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
