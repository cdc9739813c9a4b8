"""BF16 matmul (tilegen/gemm_bf16.py, tilegen/gemm_amx.py): bf16 operands, f32 accumulation,
an F32 result.

Every path -- the AMX `tdpbf16ps` kernel (TILEGEN_BF16_DOT=amx, on a CPU with AMX-BF16 whose
OS grants tile data), the `vdpbf16ps` micro-kernel (TILEGEN_BF16_DOT=1, on a CPU with
AVX512-BF16) and the widen-to-f32 path (TILEGEN_BF16_DOT=0) -- against the exact products of
the bf16 inputs (widened to float64 by NumPy), at odd shapes, odd depths (zero-padded pairs
and tiles), depths over one block, batches, transposed operands, mixed programs (F32 cast to
BF16), one and two threads (rows or columns split); the kernel choice per CPU, knob and OS
answer; the instructions in `--emit asm`; and an AMX library in a fresh process.
"""

from __future__ import annotations

import re
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kina_frontend import program_from_text
from tilegen import config, gemm_bf16
from tilegen.api import compile_program
from tilegen.gemm_bf16 import amx_usable, bf16_kernel, dot_available, is_amx_block
from tilegen.loopir import Gemm
from tilegen.runtime import program_of
from tilegen.target import NAMED_TARGETS, host_target

BF16 = ml_dtypes.bfloat16
HOST_HAS_DOT = "+avx512bf16" in host_target().features.split(",")
HOST_AMX, NO_AMX_REASON = amx_usable(host_target())
PATHS = [pytest.param("amx", marks=pytest.mark.skipif(not HOST_AMX, reason=(
             f"no AMX-BF16 here: {NO_AMX_REASON}"))),
         pytest.param("1", marks=pytest.mark.skipif(not HOST_HAS_DOT,
                                                      reason="host has no AVX512-BF16")),
         "0"]
KERNEL_OF_KNOB = {"amx": "amx", "1": "dot", "0": "widen"}


def _ty(shape, dtype="BF16"):
    return f"Tensor[{dtype}, [{', '.join(str(d) for d in shape)}], @host]"


def _compile(source, monkeypatch, dot: str, threads: int = 2):
    monkeypatch.setenv("TILEGEN_BF16_DOT", dot)
    monkeypatch.setenv("TILEGEN_NUM_THREADS", str(threads))
    return compile_program(program_from_text(source))


def _kernels(module, name="f") -> list[str]:
    """The kernel each packed gemm of `name` runs: amx, dot or widen."""
    gemms = [s for s in program_of(module).plans[name].kernel.body if isinstance(s, Gemm)]
    return ["widen" if g.dtype == "f32" else "amx" if is_amx_block(g.tiles) else "dot"
            for g in gemms]


def _bf16(rng, shape):
    return rng.standard_normal(shape).astype(BF16)


def _check(got, a, b):
    """got == a @ b up to f32 accumulation: |error| <= k u sum |a||b| (u = 2^-24)."""
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    exact = np.matmul(wide_a, wide_b)
    depth = a.shape[-1]
    bound = depth * 2.0 ** -24 * np.matmul(np.abs(wide_a), np.abs(wide_b))
    assert got.dtype == np.float32 and got.shape == exact.shape
    worst = np.max(np.abs(got - exact) - bound)
    assert worst <= 1e-30, f"error beyond the f32 accumulation bound by {worst}"


def _pays(m, k, n) -> bool:
    return m * n * k >= 1 << 16 and n >= 8 and k >= 8


# (37, 2100, 45): three AMX depth blocks, the last 52 deep (two tiles, the second padded);
# (13, 600, 70): one row of AMX tiles; (50, 300, 1500): two threads split the columns.
SHAPES = [(1, 1, 1), (17, 5, 3), (17, 33, 5), (333, 1000, 777), (40, 37, 50), (37, 1025, 45),
          (37, 2100, 45), (100, 513, 33), (13, 600, 70), (250, 63, 16), (50, 300, 1500),
          (64, 64, 64)]


@pytest.mark.parametrize("dot", PATHS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_bf16_matmul_matches_exact_products(m, k, n, dot, monkeypatch):
    module = _compile(f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n), 'F32')} "
                      "{ return matmul(a, b); }", monkeypatch, dot)
    rng = np.random.default_rng(m * 31 + k * 7 + n)
    a, b = _bf16(rng, (m, k)), _bf16(rng, (k, n))
    _check(module.f(a, b), a, b)
    if _pays(m, k, n):
        assert _kernels(module) == [KERNEL_OF_KNOB[dot]]


@pytest.mark.parametrize("dot", PATHS)
def test_one_thread_gives_the_same_result_as_two(dot, monkeypatch):
    source = f"fn f(a: {_ty((333, 1000))}, b: {_ty((1000, 777))}) -> {_ty((333, 777), 'F32')} " \
             "{ return matmul(a, b); }"
    rng = np.random.default_rng(5)
    a, b = _bf16(rng, (333, 1000)), _bf16(rng, (1000, 777))
    one = _compile(source, monkeypatch, dot, threads=1).f(a, b)
    two = _compile(source, monkeypatch, dot, threads=2).f(a, b)
    _check(one, a, b)
    assert np.array_equal(one, two)


@pytest.mark.parametrize("dot", PATHS)
def test_batched_and_transposed_bf16_operands(dot, monkeypatch):
    source = f"""
fn f(q: {_ty((2, 3, 70, 41))}, k: {_ty((2, 3, 90, 41))}, x: {_ty((5, 67, 39))},
     y: {_ty((5, 39, 48))}, w: {_ty((41, 66))}, r: {_ty((70, 41))})
     -> ({_ty((2, 3, 70, 90), 'F32')},
     {_ty((5, 67, 48), 'F32')}, {_ty((66, 70), 'F32')}) {{
  let scores = matmul(q, transpose(k, [0, 1, 3, 2]));
  let batched = matmul(x, y);
  let across = matmul(transpose(w, [1, 0]), transpose(r, [1, 0]));
  return (scores, batched, across);
}}"""
    module = _compile(source, monkeypatch, dot)
    rng = np.random.default_rng(11)
    q, k, x = _bf16(rng, (2, 3, 70, 41)), _bf16(rng, (2, 3, 90, 41)), _bf16(rng, (5, 67, 39))
    y, w, r = _bf16(rng, (5, 39, 48)), _bf16(rng, (41, 66)), _bf16(rng, (70, 41))
    scores, batched, across = module.f(q, k, x, y, w, r)
    _check(scores, q, np.swapaxes(k, 2, 3))
    _check(batched, x, y)
    _check(across, w.T, r.T)
    assert _kernels(module) == [KERNEL_OF_KNOB[dot]] * 3


@pytest.mark.parametrize("dot", PATHS)
@pytest.mark.parametrize("m,k,n", [(50, 1025, 70), (333, 1000, 777), (20, 17, 300)])
def test_weight_stored_out_by_in(m, k, n, dot, monkeypatch):
    # x @ transpose(w) with w [N, K] (torch's Linear layout): B is read along k.
    module = _compile(f"fn f(a: {_ty((m, k))}, w: {_ty((n, k))}) -> {_ty((m, n), 'F32')} "
                      "{ return matmul(a, transpose(w, [1, 0])); }", monkeypatch, dot)
    rng = np.random.default_rng(k)
    a, w = _bf16(rng, (m, k)), _bf16(rng, (n, k))
    _check(module.f(a, w), a, w.T)
    assert _kernels(module) == [KERNEL_OF_KNOB[dot]]


@pytest.mark.parametrize("dot", PATHS)
def test_mixed_program_f32_activations_and_weights_cast_to_bf16(dot, monkeypatch):
    # BF16 weights, F32 activations cast to BF16, an F32 weight cast to BF16, and the F32
    # result used by F32 ops.
    source = f"""
fn f(x: {_ty((77, 96), 'F32')}, w: {_ty((96, 130))}, v: {_ty((130, 45), 'F32')},
     bias: {_ty((77, 45), 'F32')}) -> ({_ty((77, 45), 'F32')}, {_ty((77, 130), 'F32')}) {{
  let first = matmul(cast(x, BF16), w);
  let h = tanh(first);
  return (matmul(cast(h, BF16), cast(v, BF16)) + bias, first);
}}"""
    module = _compile(source, monkeypatch, dot)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((77, 96)).astype(np.float32)
    w = _bf16(rng, (96, 130))
    v = rng.standard_normal((130, 45)).astype(np.float32)
    bias = rng.standard_normal((77, 45)).astype(np.float32)
    got, first = module.f(x, w, v, bias)
    _check(first, x.astype(BF16), w)  # x rounded to nearest bf16, not used as it is
    h = np.tanh(x.astype(BF16).astype(np.float64) @ w.astype(np.float64))
    exact = h.astype(np.float32).astype(BF16).astype(np.float64) @ \
        v.astype(BF16).astype(np.float64) + bias
    # tanh's f32 result may round to the neighbouring bf16 of the float64 one: one bf16 ulp
    # (2^-8 relative) per element of h, summed over the 130 products.
    bound = 2.0 ** -7 * np.abs(h) @ np.abs(v.astype(np.float64)) + 1e-5
    assert np.all(np.abs(got - exact) <= bound)
    assert _kernels(module) == [KERNEL_OF_KNOB[dot]] * 2


def test_cast_of_an_f32_parameter_to_bf16_rounds(monkeypatch):
    # cast(x, BF16) of an F32 parameter is a plain load of x in f32; it must still round.
    module = _compile(f"fn f(x: {_ty((100,), 'F32')}) -> {_ty((100,), 'F32')} "
                      "{ return cast(cast(x, BF16), F32) * 1.0; }", monkeypatch, "0")
    x = np.random.default_rng(4).standard_normal(100).astype(np.float32)
    assert np.array_equal(module.f(x), x.astype(BF16).astype(np.float32))


@pytest.mark.parametrize("dot", PATHS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 90), k=st.integers(8, 140), n=st.integers(8, 90),
       transpose_a=st.booleans(), transpose_b=st.booleans())
def test_generated_bf16_products(m, k, n, transpose_a, transpose_b, dot, monkeypatch):
    a_shape = (k, m) if transpose_a else (m, k)
    b_shape = (n, k) if transpose_b else (k, n)
    a_use = "transpose(a, [1, 0])" if transpose_a else "a"
    b_use = "transpose(b, [1, 0])" if transpose_b else "b"
    module = _compile(f"fn f(a: {_ty(a_shape)}, b: {_ty(b_shape)}) -> {_ty((m, n), 'F32')} "
                      f"{{ return matmul({a_use}, {b_use}); }}", monkeypatch, dot)
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = _bf16(rng, a_shape), _bf16(rng, b_shape)
    _check(module.f(a, b), a.T if transpose_a else a, b.T if transpose_b else b)


def _options(kernel: str, target=None) -> config.Config:
    return config.Config(1, None, False, False, bf16_kernel=kernel,
                         target=target or host_target())


def test_path_choice_follows_the_cpu_features_and_the_knob():
    auto, on, off = (_options(value) for value in ("auto", "dot", "widen"))
    zen4 = "+avx512f,+avx512bf16,-amx-bf16"
    sapphire = "+avx512f,+avx512bf16,+amx-bf16,+amx-tile"
    haswell = "+avx2,+fma,-avx512bf16"
    assert dot_available(auto, zen4) and dot_available(on, zen4)
    assert not dot_available(off, zen4)
    # The AMX cores issue vdpbf16ps at half the FMA rate: not vdpbf16ps unless forced.
    assert not dot_available(auto, sapphire) and dot_available(on, sapphire)
    # Never without the instruction, whatever the knob says.
    assert not any(dot_available(options, haswell) for options in (auto, on, off))


def _cpu(name: str, features: str):
    """A target CPU this machine cannot run (so no OS permission is asked for it)."""
    from dataclasses import replace

    return replace(NAMED_TARGETS["skylake-avx512"], name=name,
                   features=NAMED_TARGETS["skylake-avx512"].features + features)


def test_kernel_choice_per_cpu_and_knob(monkeypatch):
    sapphire = _cpu("sapphire", ",+avx512bf16,+amx-bf16,+amx-tile,+amx-fp16,+avx10.2-512")
    zen4 = _cpu("zen4", ",+avx512bf16,+avx10.2-512")
    haswell = NAMED_TARGETS["x86-64-v3"]
    expected = {  # knob: (sapphire, zen4, haswell)
        "auto": ("amx", "dot", "widen"), "amx": ("amx", "dot", "widen"),
        "dot": ("dot", "dot", "widen"), "widen": ("widen", "widen", "widen")}
    for knob, kernels in expected.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            monkeypatch.setattr(gemm_bf16, "_warned", set())
            got = tuple(bf16_kernel(_options(knob, cpu)) for cpu in (sapphire, zen4, haswell))
        assert got == kernels, knob
        # Asked for by name, AMX that cannot be had is a warning; auto stays quiet.
        assert len(caught) == (2 if knob == "amx" else 0), knob


@pytest.mark.parametrize("target", ["x86-64-v3", "skylake-avx512"])
@pytest.mark.parametrize("dot", ["auto", "amx", "1"])
def test_targets_without_bf16_instructions_widen(target, dot, monkeypatch):
    # Whatever the knob asks for, a target without AVX512-BF16 or AMX compiles the same
    # program to the widened f32 kernel, which runs here (the host has both targets'
    # features) and gives the exact products.
    monkeypatch.setenv("TILEGEN_TARGET", target)
    module = _compile(f"fn f(a: {_ty((90, 77))}, b: {_ty((77, 101))}) -> {_ty((90, 101), 'F32')} "
                      "{ return matmul(a, b); }", monkeypatch, dot)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "amx" warns that it cannot be had
        assert _kernels(module) == ["widen"]
    rng = np.random.default_rng(6)
    a, b = _bf16(rng, (90, 77)), _bf16(rng, (77, 101))
    _check(module.f(a, b), a, b)


@pytest.mark.parametrize("value,kernel", [("", "auto"), ("auto", "auto"), ("AMX", "amx"),
                                          ("1", "dot"), ("on", "dot"), ("dot", "dot"),
                                          ("0", "widen"), ("off", "widen"),
                                          ("widen", "widen")])
def test_knob_values(value, kernel, monkeypatch):
    monkeypatch.setenv("TILEGEN_BF16_DOT", value)
    assert config.load().bf16_kernel == kernel


def test_refused_tile_data_falls_back_with_a_warning(monkeypatch):
    # The CPU has AMX but the OS says no (an old kernel, a seccomp filter): the compile
    # warns, takes the next kernel, and the product is still right -- no tile instruction
    # runs, so nothing dies of SIGILL.
    if not all(f in host_target().features.split(",") for f in gemm_bf16.AMX_FEATURES):
        pytest.skip(f"no AMX-BF16 here: {NO_AMX_REASON}")
    monkeypatch.setattr(gemm_bf16, "amx_tile_permission",
                        lambda: (False, "refused for this test"))
    monkeypatch.setattr(gemm_bf16, "_warned", set())
    source = f"fn f(a: {_ty((70, 90))}, b: {_ty((90, 60))}) -> {_ty((70, 60), 'F32')} " \
             "{ return matmul(a, b); }"
    module = _compile(source, monkeypatch, "auto")
    with pytest.warns(RuntimeWarning, match="without AMX: refused for this test"):
        kernels = _kernels(module)  # planned (and the kernel chosen) on first use
    assert kernels == ["dot" if dot_available(config.load()) else "widen"]
    rng = np.random.default_rng(1)
    a, b = _bf16(rng, (70, 90)), _bf16(rng, (90, 60))
    _check(module.f(a, b), a, b)


@pytest.mark.skipif(not HOST_HAS_DOT, reason="host has no AVX512-BF16")
def test_vdpbf16ps_in_emitted_assembly(tmp_path, monkeypatch, capsys):
    from tilegen.compile import main

    path = tmp_path / "mm.kina"
    path.write_text(f"fn mm(a: {_ty((333, 1000))}, b: {_ty((1000, 777))}) -> "
                    f"{_ty((333, 777), 'F32')} {{ return matmul(a, b); }}\n")
    expected = {"1": ("vdpbf16ps",), "0": (), "amx": ("tdpbf16ps", "ldtilecfg")}
    for dot, instructions in expected.items():
        if dot == "amx" and not HOST_AMX:
            continue
        monkeypatch.setenv("TILEGEN_BF16_DOT", dot)
        assert main([str(path), "--emit", "asm"]) == 0
        text = capsys.readouterr().out
        for instruction in ("vdpbf16ps", "tdpbf16ps", "ldtilecfg"):
            assert (instruction in text) is (instruction in instructions), (dot, instruction)


@pytest.mark.skipif(not HOST_AMX, reason=f"no AMX-BF16 here: {NO_AMX_REASON}")
def test_amx_library_runs_in_a_fresh_process(tmp_path, monkeypatch):
    # A process that never asked Linux for tile data (the loader does not ask): the
    # kernel asks itself before its first tile instruction, instead of dying of SIGILL.
    import subprocess
    import sys
    from pathlib import Path

    from tilegen.compile import main

    source = tmp_path / "mm.kina"
    source.write_text(f"fn mm(a: {_ty((70, 100))}, b: {_ty((100, 45))}) -> "
                      f"{_ty((70, 45), 'F32')} {{ return matmul(a, b); }}\n")
    monkeypatch.setenv("TILEGEN_BF16_DOT", "amx")
    assert main([str(source), "-o", str(tmp_path / "mm.so")]) == 0
    script = f"""
import ml_dtypes, numpy as np, tilegen
rng = np.random.default_rng(0)
a = rng.standard_normal((70, 100)).astype(ml_dtypes.bfloat16)
b = rng.standard_normal((100, 45)).astype(ml_dtypes.bfloat16)
got = tilegen.load_library({str(tmp_path / "mm.so")!r}).mm(a, b)
np.save({str(tmp_path / "got.npy")!r}, got)
np.save({str(tmp_path / "a.npy")!r}, a.astype(np.float32))
np.save({str(tmp_path / "b.npy")!r}, b.astype(np.float32))
"""
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": root}, timeout=120)
    assert done.returncode == 0, done.stderr
    a, b = (np.load(tmp_path / name).astype(BF16) for name in ("a.npy", "b.npy"))
    _check(np.load(tmp_path / "got.npy"), a, b)


@pytest.mark.parametrize("dot", PATHS)
@pytest.mark.parametrize("k", [37, 513])
def test_odd_depth_padding_meets_infinities_as_zeros(k, dot, monkeypatch):
    # The last pair of an odd depth is padded with zeros in both panels; a padding that
    # repeated B's last row (against A's zero) would turn its infinities into NaNs.
    m, n = 40, 50
    module = _compile(f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n), 'F32')} "
                      "{ return matmul(a, b); }", monkeypatch, dot)
    _check_infinite_last_row(module, m, k, n, seed=k)


def _check_infinite_last_row(module, m: int, k: int, n: int, seed: int) -> None:
    """module.f(a, b) with B's last row +inf in every third column against A's last column
    of ones: +inf there (a padding row multiplied in would give NaN), exact elsewhere."""
    rng = np.random.default_rng(seed)
    a, b = _bf16(rng, (m, k)), _bf16(rng, (k, n))
    a[:, -1] = 1.0
    b[-1, ::3] = np.inf
    got = module.f(a, b)
    assert np.all(np.isposinf(got[:, ::3]))
    keep = np.ones(n, bool)
    keep[::3] = False
    _check(got[:, keep], a, b[:, keep])


def test_the_docs_bf16_sample_runs():
    from pathlib import Path

    from tests.markdown import fenced_blocks

    doc = Path(__file__).resolve().parents[1] / "docs" / "kina.md"
    (sample,) = [b for b in fenced_blocks(doc, "kina") if "fn dense" in b]
    module = compile_program(program_from_text(sample))
    rng = np.random.default_rng(8)
    x = rng.standard_normal((128, 384)).astype(np.float32)
    w = _bf16(rng, (384, 1536))
    _check(module.dense(x, w), x.astype(BF16), w)


ZEN4 = NAMED_TARGETS["znver4"]


def test_dot_kernel_depth_block_is_all_of_k_up_to_1024():
    # The vdpbf16ps kernel's depth block is all of k up to 1024, whatever L1 holds (its B
    # micro-panel streams from L2); past 1024 the blocks are 1024 deep unless the last would
    # be shorter than 256, which the others take in, as AMX's blocks do.
    from dataclasses import replace

    for l1 in (ZEN4.l1d_bytes, 48 << 10):
        options = _options("auto", replace(ZEN4, l1d_bytes=l1))
        assert bf16_kernel(options) == "dot"
        for k, kc in ((37, 37), (1000, 1000), (1024, 1024), (1152, 1152), (1301, 1024),
                      (2048, 1024), (2049, 1056), (3100, 1056)):
            tiles = gemm_bf16.bf16_tiles(333, 77, k, options)
            assert tiles.kc == kc, (k, tiles.kc)
            blocks = -(-k // kc)
            assert blocks == 1 or (kc % 32 == 0 and k - (blocks - 1) * kc >= 256)
    # B blocks (kc x nc bf16) at most two cores' L2: 1024 columns 1024 deep on Zen 4's 1 MB,
    # 2048 (the f32 kernel's widest) on 2 MB or for shallower blocks.
    for l2, k, nc in ((ZEN4.l2_bytes, 2048, 1024), (ZEN4.l2_bytes, 1000, 1024),
                      (ZEN4.l2_bytes, 384, 2048), (2 << 20, 2048, 2048)):
        options = _options("auto", replace(ZEN4, l2_bytes=l2))
        tiles = gemm_bf16.bf16_tiles(2048, 4096, k, options)
        assert tiles.nc == nc and tiles.nc % tiles.nr == 0, (l2, k, tiles.nc)
        assert gemm_bf16.bf16_tiles(64, 777, k, options).nc == min(nc, 800)


@pytest.mark.skipif(not ZEN4.runs_on_host, reason="this machine cannot run znver4 code")
@pytest.mark.parametrize("m,k,n,kc", [(45, 2049, 77, 1056), (13, 1301, 40, 1024),
                                      (31, 1025, 17, 1025), (100, 301, 33, 301)])
def test_zen4_target_runs_the_dot_kernel_in_depth_blocks(m, k, n, kc, monkeypatch):
    # `--target znver4` (TILEGEN_TARGET) compiles the kernel Zen 4 runs by default, which
    # runs here too: depth blocks of up to 1024 (2049 = 1056 + 993 and 1301 = 1024 + 277,
    # each last block odd: a lone row paired with a zero one; 1025 and 301 in one odd
    # block), odd rows and columns, two threads. B's last row of infinities meets A's ones,
    # never a padding row: +inf in those columns.
    monkeypatch.setenv("TILEGEN_TARGET", "znver4")
    module = _compile(f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n), 'F32')} "
                      "{ return matmul(a, b); }", monkeypatch, "auto")
    (gemm,) = [s for s in program_of(module).plans["f"].kernel.body if isinstance(s, Gemm)]
    assert _kernels(module) == ["dot"] and gemm.tiles.kc == kc
    _check_infinite_last_row(module, m, k, n, seed=m + k + n)


@pytest.mark.skipif(not ZEN4.runs_on_host, reason="this machine cannot run znver4 code")
@pytest.mark.parametrize("m,k,n,narrow", [(45, 300, 777, True), (13, 257, 48, True),
                                          (31, 256, 33, True), (26, 301, 40, True),
                                          (40, 257, 56, False), (14, 300, 17, False),
                                          (9, 300, 64, False), (30, 300, 16, False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_zen4_last_panel_of_at_most_16_columns_runs_a_narrow_kernel(m, k, n, narrow, threads,
                                                                    tmp_path, monkeypatch,
                                                                    capsys):
    # C's last panel of 1 to 16 columns (777 = 24 x 32 + 9, 48 = 32 + 16) runs on a kernel
    # of one vector of B a step; 17 to 31 columns (56 = 32 + 24, 17) and whole panels on the
    # full one (and a product of at most 16 columns, one vector wide already, has none).
    # Exact products either way, the infinities of B's last row in the narrow panel too.
    from tilegen.compile import main

    source = (f"fn f(a: {_ty((m, k))}, b: {_ty((k, n))}) -> {_ty((m, n), 'F32')} "
              "{ return matmul(a, b); }")
    monkeypatch.setenv("TILEGEN_TARGET", "znver4")
    module = _compile(source, monkeypatch, "auto", threads)
    assert _kernels(module) == ["dot"]
    _check_infinite_last_row(module, m, k, n, seed=m * n + threads)
    kina = tmp_path / "f.kina"
    kina.write_text(source + "\n")
    assert main([str(kina), "--emit", "llvm"]) == 0
    text = capsys.readouterr().out
    assert "tilegen.gemm.bf16dot.12x32" in text or n <= 16
    assert bool(re.search(r"@tilegen\.gemm\.bf16dot\.\d+x32\.s\d+\.v1\(", text)) == narrow


def test_zen4_assembly_has_vdpbf16ps_and_no_amx(tmp_path, monkeypatch, capsys):
    from tilegen.compile import main

    path = tmp_path / "mm.kina"
    path.write_text(f"fn mm(a: {_ty((333, 1000))}, b: {_ty((1000, 777))}) -> "
                    f"{_ty((333, 777), 'F32')} {{ return matmul(a, b); }}\n")
    monkeypatch.delenv("TILEGEN_BF16_DOT", raising=False)
    assert main([str(path), "--target", "znver4", "--emit", "asm"]) == 0
    text = capsys.readouterr().out
    assert "vdpbf16ps" in text and "tdpbf16ps" not in text


@pytest.mark.skipif(not ZEN4.runs_on_host, reason="this machine cannot run znver4 code")
@pytest.mark.parametrize("batch,m,k,n,in_place", [
    ((), 333, 1000, 777, True), ((), 37, 300, 45, True), ((), 25, 514, 50, True),
    ((3,), 37, 300, 45, True), ((2,), 12, 998, 33, True), ((), 40, 1536, 50, True),
    ((), 26, 1024, 70, True), ((), 100, 1024, 100, True),
    ((), 40, 2048, 50, False), ((), 37, 301, 45, False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_zen4_dot_kernel_reads_a_row_major_bf16_a_in_place(batch, m, k, n, in_place, threads,
                                                          tmp_path, monkeypatch, capsys):
    # A plain row-major bf16 A whose register block of 12 rows puts at most 6 on one L1
    # set (2000, 600, 1028, 1996, 3072 and 2048 bytes apart: 1, 1, 3, 1, 3 and 6) is read
    # where it is: the kernel's A stride is K itself, not kc rounded up to 16. Only the
    # matrix's ragged last register block (37 = 3 x 12 + 1 rows; 25 = 2 x 12 + 1; 26 = 2 x
    # 12 + 2) is packed, zero rows past M. Rows 4 KB apart (all 12 of a block on one set)
    # and an odd depth (a pair would reach past the row) keep A packed.
    from tilegen.compile import main

    source = (f"fn f(a: {_ty((*batch, m, k))}, b: {_ty((*batch, k, n))}) -> "
              f"{_ty((*batch, m, n), 'F32')} {{ return matmul(a, b); }}")
    monkeypatch.setenv("TILEGEN_TARGET", "znver4")
    module = _compile(source, monkeypatch, "auto", threads)
    assert _kernels(module) == ["dot"]
    rng = np.random.default_rng(m + k + n + threads)
    a, b = _bf16(rng, (*batch, m, k)), _bf16(rng, (*batch, k, n))
    a[..., -1, :] = np.linspace(-3, 3, k).astype(BF16)  # the packed last row's values
    _check(module.f(a, b), a, b)
    if not batch:
        _check_infinite_last_row(module, m, k, n, seed=m * n + threads)
    kina = tmp_path / "f.kina"
    kina.write_text(source + "\n")
    assert main([str(kina), "--emit", "llvm"]) == 0
    strides = set(re.findall(r"@tilegen\.gemm\.bf16dot\.12x32\.s(\d+)\(", capsys.readouterr().out))
    (gemm,) = [s for s in program_of(module).plans["f"].kernel.body if isinstance(s, Gemm)]
    packed_stride = -(-gemm.tiles.kc // 16) * 16
    assert strides == {str(k if in_place else packed_stride)}


def test_dot_a_in_place_rule():
    # Row bytes with no power-of-two factor above 256 spread over L1's sets (AMX's rule
    # for its 16-row tiles).
    assert [gemm_bf16.rows_spread(2 * k) for k in (1000, 300, 514, 384, 1040, 1024, 1536)] \
        == [True, True, True, True, True, False, False]
    # The dot kernel's: how many of a 12-row block's lines share one of L1's 64 sets,
    # counted by hand from (row * bytes // 64) % 64.
    assert [gemm_bf16.rows_per_set(2 * k, 12) for k in (1000, 512, 1024, 1536, 2048, 3072)] \
        == [1, 3, 6, 3, 12, 6]
    assert gemm_bf16.rows_per_set(4096, 1) == 1 and gemm_bf16.rows_per_set(128, 12) == 1


def test_threads_split_columns_of_an_a_read_in_place():
    # An A read in place costs no packing, so a square product's tie (each thread packs
    # 1024 of A's rows and all B's columns, or the reverse) goes to the columns; a tall
    # product whose threads would each read all of A for one panel of B stays split by rows.
    from tilegen.gemm_tiles import splits_columns
    from tilegen.loopir import GemmTiles
    tiles = GemmTiles(mr=12, nr=32, kc=1024, mc=1032, nc=1024)
    assert not splits_columns(1024, 1024, tiles, 2)
    assert splits_columns(1024, 1024, tiles, 2, a_in_place=True)
    assert splits_columns(1536, 1024, tiles, 2, a_in_place=True)
    assert not splits_columns(6000, 64, tiles, 2, a_in_place=True)
    assert not splits_columns(1024, 1024, tiles, 1, a_in_place=True)
