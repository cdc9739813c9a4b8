"""What the tilegen backend refuses, and how: a TileError naming the kernel and its source
line, never a traceback from inside the lowering; and bf16 arithmetic, which it now runs
as torch does on the CPU (in f32, each result rounded to bf16)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import tilegen.triton_backend  # noqa: E402

tilegen.triton_backend.register()

import triton.language as tl  # noqa: E402

from tilegen.triton_backend.tileir import TileError  # noqa: E402


@triton.jit
def bf16_arithmetic(x_ptr, y_ptr, out_ptr, big_ptr, root_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r)
    y = tl.load(y_ptr + r)
    tl.store(out_ptr + r, x * y + x - y / x)
    tl.store(big_ptr + r, (tl.maximum(x, y) > 0.25).to(tl.int8))
    tl.store(root_ptr + r, tl.sqrt(x.to(tl.float32)).to(tl.bfloat16) + y)


def test_bf16_arithmetic_rounds_each_result_as_torch_does():
    generator = torch.Generator().manual_seed(3)
    x = (torch.rand(64, generator=generator) + 0.1).bfloat16()
    y = torch.randn(64, generator=generator).bfloat16()
    out, root = torch.empty_like(x), torch.empty_like(x)
    big = torch.empty(64, dtype=torch.int8)
    bf16_arithmetic[(1,)](x, y, out, big, root, BLOCK=64)
    # Triton's promotion: `*` and `+` stay bf16 (each rounded, as torch rounds them), `/`
    # is true division in f32 and promotes the `-` to f32
    assert torch.equal(out, ((x * y + x).float() - y.float() / x.float()).bfloat16())
    assert torch.equal(big, (torch.maximum(x, y) > 0.25).to(torch.int8))
    assert torch.equal(root, torch.sqrt(x.float()).bfloat16() + y)


@triton.jit
def tuple_argument(pair, out_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(out_ptr + r, tl.load(pair[0] + r) + tl.load(pair[1] + r))


def test_tuple_argument_is_a_tile_error_naming_kernel_and_definition():
    x = torch.zeros(16)
    with pytest.raises(TileError, match=r"kernel `tuple_argument` at .*test_triton_errors\.py"
                                        r":\d+: argument `pair`"):
        tuple_argument[(1,)]((x, x), x, BLOCK=16)


def test_disable_knob_is_read_through_tilegen_config(monkeypatch):
    from tilegen import config
    from tilegen.triton_backend.driver import TilegenDriver

    monkeypatch.setenv("TRITON_DEFAULT_BACKEND", "tilegen")
    for raw, disabled in (("", False), ("0", False), ("1", True), ("true", True)):
        monkeypatch.setenv("TILEGEN_TRITON_DISABLE", raw)
        assert config.triton_disabled() is disabled
        assert TilegenDriver.is_active() is not disabled


def test_the_cache_key_covers_the_compiler_and_the_cpu(monkeypatch):
    """Triton's disk cache must miss when any source the lowering runs changes (the gemm
    micro-kernel lives outside the backend's folder) or when the CPU's features differ
    under the same LLVM CPU name (the artifact is machine code for the host)."""
    import dataclasses
    from pathlib import Path

    from tilegen import cache, target
    from tilegen.triton_backend import compiler

    def fresh_hash() -> str:
        compiler.backend_hash.cache_clear()
        cache.compiler_fingerprint.cache_clear()
        return compiler.backend_hash()

    base = fresh_hash()
    real_read = Path.read_bytes

    def gemm_edited(path):
        data = real_read(path)
        return data + b"\n# edited\n" if path.name == "gemm.py" else data

    with monkeypatch.context() as patch:
        patch.setattr(Path, "read_bytes", gemm_edited)
        assert fresh_hash() != base
    host = target.host_target()
    other = dataclasses.replace(host, features=host.features + ",-avx512bf16")
    with monkeypatch.context() as patch:
        patch.setattr(target, "host_target", lambda: other)
        assert fresh_hash() != base
    assert fresh_hash() == base
    compiler.backend_hash.cache_clear()
    cache.compiler_fingerprint.cache_clear()
