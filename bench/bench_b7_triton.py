"""B7: Triton tutorial kernels on the CPU through the tilegen backend (issue 14), side by
side (run once as tests by default; `--benchmark-only` times them):

- `tilegen-triton` against `torch` (eager, 2 intra-op threads) on each tutorial's shapes
  (bench/triton_cases.py: FULL): vector add, fused softmax (simple and persistent), the
  autotuned matmul, dropout, layer norm forward and backward, fused attention against
  `scaled_dot_product_attention`, libdevice asin, grouped GEMM, persistent matmul;
- `tilegen-triton` against `triton-interpret` (TRITON_INTERPRET=1, in a child process that
  runs one case per request) on small shapes (SMALL);
- the compile time of each tutorial kernel, cold (Triton's cache bypassed) and from
  Triton's cache.

The grid runs over TILEGEN_NUM_THREADS threads (default: all cores). Each result is
checked against torch (the interpreter's too) before any timed round.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from bench.common import torch_threads  # noqa: E402
from bench.triton_cases import FULL, SMALL, Work  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TORCH_THREADS = 2


def _describe(benchmark, group: str, provider: str, work: Work, threads) -> None:
    benchmark.group = f"B7 {group}"
    info = {"provider": provider, "threads": threads}
    if work.flops:
        info["flops"] = work.flops
    if work.nbytes:
        info["bytes"] = work.nbytes
    benchmark.extra_info.update(info)


def _check(what: str, actual, expected, work: Work) -> None:
    if work.rtol == float("inf"):  # another random stream: only the shape is comparable
        assert actual.shape == expected.shape, what
        return
    torch.testing.assert_close(actual.float(), expected.float(), rtol=work.rtol,
                               atol=work.atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("provider", ["tilegen-triton", "torch"])
@pytest.mark.parametrize("case", list(FULL))
def test_b7_against_torch(benchmark, case, provider):
    work = FULL[case]()
    with torch_threads(TORCH_THREADS):
        reference = work.torch()
        run = work.kernel if provider == "tilegen-triton" else work.torch
        _check(f"{case} ({provider})", run(), reference, work)
        threads = tilegen.triton_backend.driver.num_threads() \
            if provider == "tilegen-triton" else TORCH_THREADS
        _describe(benchmark, case, provider, work, threads)
        benchmark(run)


class InterpreterPeer:
    """The child process running SMALL cases under TRITON_INTERPRET=1."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "triton_interpret_peer.py"), str(ROOT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def request(self, *fields: str) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("\t".join(fields) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the TRITON_INTERPRET=1 peer failed on {fields}: {answer!r}")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def interpreter():
    peer = InterpreterPeer()
    yield peer
    peer.close()


@pytest.mark.parametrize("provider", ["tilegen-triton", "triton-interpret"])
@pytest.mark.parametrize("case", list(SMALL))
def test_b7_against_the_interpreter(benchmark, case, provider, interpreter, tmp_path):
    work = SMALL[case]()
    reference = work.torch()
    if provider == "tilegen-triton":
        run = work.kernel
        _check(f"{case} (tilegen)", run(), reference, work)
    else:
        saved = tmp_path / "interpreted.pt"
        interpreter.request("save", case, str(saved))
        interpreted = torch.load(saved)
        _check(f"{case} (interpreter)", interpreted, reference, work)
        if work.rtol == float("inf"):  # dropout: the same Philox stream, bit for bit
            assert torch.equal(interpreted, work.kernel()), case

        def run():
            interpreter.request("run", case)
    _describe(benchmark, f"small: {case}", provider, work, 1 if provider != "tilegen-triton"
              else tilegen.triton_backend.driver.num_threads())
    benchmark(run)


def _compile_sources():
    """(name, JITFunction, signature, constexprs) of each tutorial kernel, as a launch
    on the FULL shapes specialises it."""
    from tests.test_triton_tutorials import (
        _layer_norm_fwd_fused,
        _seeded_dropout,
        add_kernel,
        matmul_kernel,
        softmax_kernel_simple,
    )
    from tests.test_triton_tutorials_2 import _attn_fwd, asin_kernel

    def arguments(fn, types, constexprs):
        signature = {name: types.get(name, "constexpr") for name in fn.arg_names}
        return fn, signature, {(fn.arg_names.index(k),): v for k, v in constexprs.items()}

    p32, i32 = "*fp32", "i32"
    return {
        "01 add_kernel": arguments(add_kernel, {"x_ptr": p32, "y_ptr": p32, "output_ptr": p32,
                                                "n_elements": i32}, {"BLOCK_SIZE": 1024}),
        "02 softmax_kernel": arguments(
            softmax_kernel_simple, {"output_ptr": p32, "input_ptr": p32,
                                    "input_row_stride": i32, "output_row_stride": i32,
                                    "n_cols": i32}, {"BLOCK_SIZE": 1024}),
        "03 matmul_kernel": arguments(
            matmul_kernel.fn, {"a_ptr": p32, "b_ptr": p32, "c_ptr": "*fp16", "M": i32,
                               "N": i32, "K": i32, "stride_am": i32, "stride_ak": i32,
                               "stride_bk": i32, "stride_bn": i32, "stride_cm": i32,
                               "stride_cn": i32},
            {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
             "ACTIVATION": ""}),
        "04 _seeded_dropout": arguments(
            _seeded_dropout, {"x_ptr": p32, "output_ptr": p32, "n_elements": i32,
                              "p": "fp32", "seed": i32}, {"BLOCK_SIZE": 1024}),
        "05 _layer_norm_fwd_fused": arguments(
            _layer_norm_fwd_fused, {"X": p32, "Y": p32, "W": p32, "B": p32, "Mean": p32,
                                    "Rstd": p32, "stride": i32, "N": i32, "eps": "fp32"},
            {"BLOCK_SIZE": 4096}),
        "06 _attn_fwd": arguments(
            _attn_fwd, {"Q": p32, "K": p32, "V": p32, "sm_scale": "fp32", "M": p32,
                        "Out": p32, **{name: i32 for name in _attn_fwd.arg_names
                                       if name.startswith("stride_")},
                        "Z": i32, "H": i32},
            {"N_CTX": 1024, "HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 64, "STAGE": 1}),
        "07 asin_kernel": arguments(asin_kernel, {"x_ptr": p32, "y_ptr": p32,
                                                  "n_elements": i32}, {"BLOCK_SIZE": 1024}),
    }


COMPILE_SOURCES = _compile_sources()


@pytest.mark.parametrize("mode", ["cold", "from Triton's cache"])
@pytest.mark.parametrize("kernel", list(COMPILE_SOURCES))
def test_b7_compile(benchmark, kernel, mode, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    fn, signature, constexprs = COMPILE_SOURCES[kernel]
    source = ASTSource(fn, signature, constexprs=constexprs)
    target = driver.active.get_current_target()
    triton.compile(source, target=target)  # warm the cache (and Triton's own imports)
    if mode == "cold":
        monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    benchmark.group = f"B7 compile {kernel}"
    benchmark.extra_info.update({"provider": "tilegen-triton", "mode": mode})
    compiled = benchmark(lambda: triton.compile(source, target=target))
    assert compiled.asm["obj"]
