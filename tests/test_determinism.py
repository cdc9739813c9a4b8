"""Same program, same inputs: bit-identical outputs across runs, processes and backends.

A child process (this file as a script) computes a SHA-256 of every output for the three
StoryLM-0 programs (forward, rollout with greedy and sampled decoding, the training step),
twenty generated programs, and large kernels that run as parallel loops (a 4096 x 1024
softmax, a 1024^3 and an odd 333 x 1000 x 777 matmul, long reductions, a scatter_add), each
called three times. The parent runs it twice with the JIT and once through .so files, all with
TILEGEN_NUM_THREADS=2, once more with one thread, and compares the digests bit for bit.

    python tests/test_determinism.py jit|so     # prints {output name: sha256}
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
GENERATED = 20
CALLS = 3

LARGE = """
fn softmax_rows(x: Tensor[F32, [4096, 1024], @host]) -> Tensor[F32, [4096, 1024], @host] {
  return softmax(x, axis=1);
}
fn log_softmax_columns(x: Tensor[F32, [1024, 2048], @host])
    -> Tensor[F32, [1024, 2048], @host] {
  return log_softmax(x, axis=0);
}
fn matmul_1024(a: Tensor[F32, [1024, 1024], @host], b: Tensor[F32, [1024, 1024], @host])
    -> Tensor[F32, [1024, 1024], @host] {
  return matmul(a, b);
}
fn matmul_odd(a: Tensor[F32, [333, 1000], @host], b: Tensor[F32, [1000, 777], @host])
    -> Tensor[F32, [333, 777], @host] {
  return matmul(a, b);
}
fn sums(x: Tensor[F32, [2048, 2048], @host])
    -> (Tensor[F32, [2048], @host], Tensor[F32, [2048], @host], Tensor[I64, [2048], @host]) {
  return (sum(x, axis=1), sum(x, axis=0), argmax(x, axis=0));
}
fn scatter(u: Tensor[F32, [8192, 96], @host], ids: Tensor[I64, [8192], @host])
    -> Tensor[F32, [13, 96], @host] {
  return scatter_add(tanh(u), ids, 13);
}
"""


def _digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    header = f"{array.dtype.str}{list(array.shape)}".encode()
    return hashlib.sha256(header + array.tobytes()).hexdigest()


def _calls(report: dict, name: str, function, *args) -> None:
    """Call `function` CALLS times; record the digests and whether the calls agreed."""
    digests = []
    for _ in range(CALLS):
        outputs = function(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        digests.append([_digest(o) for o in outputs])
    report["digests"][name] = digests[0]
    if any(d != digests[0] for d in digests):
        report["unstable within the process"].append(name)


def child(mode: str) -> dict:
    import tilegen
    from storylm import fixture
    from tests.progen import generate_program

    jit = mode == "jit"
    report = {"digests": {}, "unstable within the process": []}
    checkpoint = fixture.load_checkpoint()
    weights = (checkpoint.wq, checkpoint.wk, checkpoint.wv, checkpoint.wo, checkpoint.lm_head)

    forward = tilegen.compile_file(REPO / "examples" / "storylm0_forward.kina", jit=jit)
    ids = np.array([[1, 4, 2, 6]], dtype=np.int64)
    _calls(report, "storylm0_forward", forward.storylm0_forward, ids, checkpoint.embed,
           fixture.causal_mask(4), checkpoint.scale, *weights)

    rollout = tilegen.compile_file(REPO / "examples" / "storylm0_rollout.kina", jit=jit)
    tokens = np.zeros((1, 36), np.int64)
    tokens[0, :4] = [1, 4, 2, 6]
    uniforms = np.random.RandomState(42).uniform(1e-6, 1 - 1e-6, (32, 1, 1, 8))
    for step in range(32):  # the Section 23 loop, greedy
        logits = rollout.storylm0_rollout(tokens, checkpoint.embed, fixture.causal_mask(36),
                                          checkpoint.scale, *weights)
        row = np.ascontiguousarray(logits[:, 3 + step:4 + step, :])
        tokens[0, 4 + step] = rollout.greedy_row(row)[0, 0]
    report["digests"]["storylm0_rollout greedy ids"] = [_digest(tokens)]
    _calls(report, "storylm0_rollout logits", rollout.storylm0_rollout, tokens,
           checkpoint.embed, fixture.causal_mask(36), checkpoint.scale, *weights)
    row = np.ascontiguousarray(logits[:, 10:11, :])
    _calls(report, "sample_row", rollout.sample_row, row, uniforms[0].astype(np.float32),
           np.full((1, 1), 0.8, np.float32))

    step = tilegen.compile_file(REPO / "examples" / "storylm0_nll_step.kina", jit=jit)
    window = fixture.load_corpus()[0]
    _calls(report, "storylm0_nll_step", step.storylm0_nll_step, window.id_array(),
           window.target_array(), checkpoint.embed, *weights, fixture.causal_mask(4),
           checkpoint.scale, np.full((1, 1), 0.1, np.float32))

    for seed in range(GENERATED):
        generated = generate_program(np.random.default_rng(2000 + seed), 4 + seed % 10)
        module = tilegen.compile_source(generated.source, f"generated{seed}.kina", jit=jit)
        _calls(report, f"generated {seed}", getattr(module, generated.function),
               *generated.inputs)

    large = tilegen.compile_source(LARGE, "large.kina", jit=jit)
    rng = np.random.default_rng(7)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    _calls(report, "softmax 4096x1024", large.softmax_rows, normal(4096, 1024) * 4)
    _calls(report, "log_softmax columns 1024x2048", large.log_softmax_columns,
           normal(1024, 2048))
    _calls(report, "matmul 1024^3", large.matmul_1024, normal(1024, 1024), normal(1024, 1024))
    _calls(report, "matmul 333x1000x777", large.matmul_odd, normal(333, 1000),
           normal(1000, 777))
    _calls(report, "sums and argmax 2048x2048", large.sums, normal(2048, 2048))
    _calls(report, "scatter_add 8192x96 into 13 rows", large.scatter, normal(8192, 96),
           rng.integers(0, 13, 8192).astype(np.int64))
    return report


def _run(mode: str, threads: str = "2") -> dict:
    env = {**os.environ, "TILEGEN_NUM_THREADS": threads,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TILEGEN_CACHE_DIR", None)  # every run compiles from scratch
    result = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True,
                            timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, f"{mode} child: status {result.returncode}\n" \
                                   f"{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {"jit-1": _run("jit"), "jit-2": _run("jit"), "so": _run("so"),
            "jit-one-thread": _run("jit", threads="1")}


def _differences(first: dict, second: dict) -> list[str]:
    a, b = first["digests"], second["digests"]
    assert a.keys() == b.keys()
    return [name for name in a if a[name] != b[name]]


def test_calls_repeat_bit_for_bit_within_a_process(runs):
    for name, run in runs.items():
        assert run["unstable within the process"] == [], name


def test_two_jit_processes_agree_bit_for_bit(runs):
    assert _differences(runs["jit-1"], runs["jit-2"]) == []


def test_jit_and_shared_library_agree_bit_for_bit(runs):
    assert _differences(runs["jit-1"], runs["so"]) == []


def test_the_thread_count_does_not_change_the_bits(runs):
    """Parallel loops split independent rows, never a reduction: one thread or two, the
    same bits (with TILEGEN_AUTOTUNE=1 a matmul may pick other tiles, and other bits)."""
    assert _differences(runs["jit-1"], runs["jit-one-thread"]) == []


def test_everything_was_compared(runs):
    names = runs["jit-1"]["digests"]
    assert {"storylm0_forward", "storylm0_rollout greedy ids", "storylm0_nll_step",
            "softmax 4096x1024", "matmul 1024^3"} <= set(names)
    assert sum(name.startswith("generated") for name in names) == GENERATED


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1])))
